"""Search attributes are true after every ending: a turn that
waited for an approval and then completed, ended on a rejection, or was
cancelled while it waited says `TurnstilePendingApprovals=0` and
`TurnstileStatus` = its ending, so `TurnstilePendingApprovals > 0` (the
README's query) finds none of them — while it found all three as they
waited."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import CancelledError

from tests.support.services import make_service
from tests.support.turns import running_worker, wait_pending
from tests.support.waiting import wait_until
from turnstile.engine.contract import ApproveSignal, RejectSignal, TurnStatus
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply
from turnstile.workflows.state import SA_PENDING, SA_STATUS


def pay_then_answer(request: dict[str, Any]) -> dict[str, Any]:
    messages = request["messages"]
    if messages[-1].get("role") == "tool":
        return text_reply("done")
    return tool_reply((f"p{len(messages)}", "sendMoneySlowly",
                       {"to": "bob@example.com", "amount": 10}))


async def ids(client: Client, query: str) -> set[str]:
    return {w.id async for w in client.list_workflows(query)}


async def test_no_ending_keeps_a_pending_approval(
        client: Client, task_queue: str, tmp_path: Any, fake_llm: FakeOpenAIServer) -> None:
    fake_llm.default = pay_then_answer
    tag = uuid.uuid4().hex[:8]
    services = [make_service(), make_service("test-reject", on_rejection="fail")]
    async with running_worker(client, task_queue, f"sqlite:///{tmp_path}/t.db", services,
                              llm_url=fake_llm.url) as turns:
        assert turns.rt.search_attributes
        approved = await turns.start("pay", conversation=f"c-a-{tag}")
        rejected = await turns.start("pay", conversation=f"c-r-{tag}", service="test-reject")
        cancelled = await turns.start("pay", conversation=f"c-c-{tag}")
        handles = {approved.id: approved, rejected.id: rejected, cancelled.id: cancelled}
        calls = {wf: (await wait_pending(h))[0].tool_call_id for wf, h in handles.items()}
        within = " OR ".join(f'WorkflowId = "{wf}"' for wf in handles)
        waiting = f"TurnstilePendingApprovals > 0 AND ({within})"
        # The query finds them while they wait: what follows can fail.
        assert await wait_until(lambda: _all(client, waiting, set(handles)), timeout=10)

        await approved.signal("approve", ApproveSignal(tool_call_id=calls[approved.id],
                                                       reviewer="carol"))
        await rejected.signal("reject", RejectSignal(tool_call_id=calls[rejected.id],
                                                     reviewer="carol", reason="no"))
        await cancelled.cancel()
        assert (await approved.result()).status == TurnStatus.COMPLETED
        assert (await rejected.result()).status == TurnStatus.FAILED
        with pytest.raises(WorkflowFailureError) as err:
            await cancelled.result()
        assert isinstance(err.value.cause, CancelledError)

        endings = {approved.id: "completed", rejected.id: "failed", cancelled.id: "cancelled"}
        for wf, handle in handles.items():
            attrs = (await handle.describe()).typed_search_attributes
            assert attrs.get(SA_PENDING) == 0, wf
            assert attrs.get(SA_STATUS) == endings[wf], (wf, attrs.get(SA_STATUS))
        ended = f"TurnstileStatus IN ('completed', 'failed', 'cancelled') AND ({within})"
        assert await wait_until(lambda: _all(client, ended, set(handles)), timeout=10)
        assert await ids(client, waiting) == set()


async def _all(client: Client, query: str, expected: set[str]) -> bool:
    return await ids(client, query) == expected
