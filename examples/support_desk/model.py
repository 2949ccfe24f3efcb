"""The desk's offline model: a plain function of the request (turnstile's
FunctionModel), so the desk runs end to end without a model server. It reads
the order id from the user's words, looks the order up, refunds it (a large
refund waits for a person) and says what happened."""

from __future__ import annotations

import re

from turnstile import FunctionModel, ModelCall, Reply, call

ORDER_ID = re.compile(r"\b[A-Z]-\d{4}\b")


def desk_model(request: ModelCall) -> Reply:
    found = ORDER_ID.search(request.user_text.upper())
    if found is None:
        return "Which order should I look at? Give me its id, like A-1001."
    order_id = found.group(0)
    looked = request.result_of("lookupOrder")
    if looked is None:
        return call("lookupOrder", order_id=order_id)
    order = looked.result if isinstance(looked.result, dict) else {}
    if looked.is_error or not order.get("found"):
        return f"I could not find order {order_id}."
    refund = request.result_of("issueRefund")
    if refund is None:
        if order.get("status") != "PAID":
            return f"Order {order_id} is {order.get('status')}: there is nothing to refund."
        # Above $100.00 the call waits for a person (issueRefund's approval condition).
        return call("issueRefund", order_id=order_id, amount_cents=int(order["amount_cents"]))
    if refund.is_error:
        return f"The refund of order {order_id} did not go through: {refund.text}"
    paid = refund.result
    return (f"Refunded ${paid['amount_cents'] / 100:.2f} for order {order_id} "
            f"(refund {paid['refund_id']}).")


MODEL = FunctionModel(desk_model)
