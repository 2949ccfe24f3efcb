"""The desk's tools: look up an order, refund it (small refunds at once,
large ones after a person approves: an approval by condition). The refund's
compensation reverses a refund undone by a rollback, never left paid."""

from __future__ import annotations

import uuid
from typing import Annotated, Any

import sqlalchemy as sa
from pydantic import Field

from examples.support_desk.tables import desk_order, desk_refund
from turnstile import ToolArgumentError, ToolContext, Undo, tool

# Above this a refund waits for a person (issueRefund's approval condition).
APPROVAL_ABOVE_CENTS = 10_000

OrderId = Annotated[str, Field(pattern=r"^[A-Z]-\d{4}$", description="e.g. A-1001")]
Cents = Annotated[int, Field(gt=0, description="the refund in cents")]


@tool(idempotent=True, repeatable=True)
def lookupOrder(ctx: ToolContext, order_id: OrderId) -> dict[str, Any]:
    """Find an order by its id: customer, amount, status."""
    with ctx.transaction() as conn:
        row = conn.execute(sa.select(desk_order).where(desk_order.c.order_id == order_id)) \
            .mappings().first()
    if row is None:
        return {"found": False, "order_id": order_id}
    return {"found": True, **dict(row)}


def _refund(ctx: ToolContext, order_id: str, amount_cents: int) -> dict[str, Any]:
    with ctx.transaction() as conn:
        done = conn.execute(sa.select(desk_refund.c.refund_id).where(
            desk_refund.c.call_key == ctx.idempotency_key)).scalar()
        if done is not None:
            return {"refund_id": done, "order_id": order_id, "amount_cents": amount_cents}
        order = conn.execute(sa.select(desk_order).where(desk_order.c.order_id == order_id)) \
            .mappings().first()
        if order is None:
            raise ToolArgumentError(f"no order {order_id}: look it up first")
        if order["status"] != "PAID" or amount_cents > order["amount_cents"]:
            raise ToolArgumentError(f"order {order_id} is {order['status']} for "
                                    f"{order['amount_cents']} cents: cannot refund "
                                    f"{amount_cents}")
        refund_id = f"R-{uuid.uuid4().hex[:8]}"
        conn.execute(sa.insert(desk_refund).values(
            refund_id=refund_id, call_key=ctx.idempotency_key, order_id=order_id,
            amount_cents=amount_cents, status="PAID_OUT"))
        conn.execute(sa.update(desk_order).where(desk_order.c.order_id == order_id)
                     .values(status="REFUNDED"))
    return {"refund_id": refund_id, "order_id": order_id, "amount_cents": amount_cents}


def large_refund(args: Any) -> str | None:
    """The approval condition: a person approves refunds above $100.00."""
    if args.amount_cents > APPROVAL_ABOVE_CENTS:
        return (f"a refund of ${args.amount_cents / 100:,.2f} is above "
                f"${APPROVAL_ABOVE_CENTS / 100:,.2f}")
    return None


# Information flow (docs/information-flow.md): an order id the user did not
# give (one a tool's result or a document named) waits for a person; the
# amount may come from the order as looked up (the refund cannot exceed it).
@tool(transactional=True, approval=large_refund, review_fields=["order_id", "amount_cents"],
      sensitive={"order_id": "review", "amount_cents": "allow"})
def issueRefund(ctx: ToolContext, order_id: OrderId, amount_cents: Cents) -> dict[str, Any]:
    """Refund an order; above $100.00 (10000 cents) a person approves it first."""
    return _refund(ctx, order_id, amount_cents)


def reverse_refund(ctx: ToolContext, args: Any, result: Any) -> Undo:
    """The compensation: the refund is reversed and the order is PAID again."""
    refund_id = result.get("refund_id") if isinstance(result, dict) else None
    with ctx.transaction() as conn:
        conn.execute(sa.update(desk_refund).where(desk_refund.c.refund_id == refund_id)
                     .values(status="REVERSED"))
        conn.execute(sa.update(desk_order).where(desk_order.c.order_id == args.order_id)
                     .values(status="PAID"))
    return Undo(f"refund {refund_id} reversed")


issueRefund.compensation(reverse_refund)
