"""The minimal loop through a real dev server and a fake model over HTTP."""

from __future__ import annotations

import json

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from tests.support.services import make_service
from tests.support.turns import running_worker
from turnstile.engine.contract import CallStatus, TurnStatus
from turnstile.stores.memory import MemoryStore
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply


async def test_tool_round_trip_and_memory(client: Client, task_queue: str, tmp_path,
                                          fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(tool_reply(("call-1", "add", {"a": 2, "b": 3})), text_reply("2 + 3 = 5"))
    url = f"sqlite:///{tmp_path}/t.db"
    async with running_worker(client, task_queue, url, [make_service()],
                              llm_url=fake_llm.url, max_cached_workflows=0) as turns:
        handle = await turns.start("what is 2+3?", conversation="c-add")
        result = await handle.result()
        assert result.status == TurnStatus.COMPLETED
        assert result.answer == "2 + 3 = 5"
        assert result.round_trips == 1
        assert [(c.name, c.status, c.arguments) for c in result.tool_calls] == [
            ("add", CallStatus.COMPLETED, {"a": 2, "b": 3})]

        # The second model request carried the tool result after the call.
        second = fake_llm.requests[1]["messages"]
        assert [m["role"] for m in second] == ["system", "user", "assistant", "tool"]
        assert second[0]["content"] == "You are a test assistant for qa."
        assert json.loads(second[3]["content"]) == {"sum": 5}
        assert second[3]["tool_call_id"] == "call-1"
        assert {t["function"]["name"] for t in fake_llm.requests[0]["tools"]} >= {"add"}

        # One activity per model call and per tool call, the tool named in the summary.
        history = await handle.fetch_history()
        scheduled = [e.activity_task_scheduled_event_attributes for e in history.events
                     if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED]
        kinds = [a.activity_type.name for a in scheduled]
        assert kinds.count("turnstile.call_model") == 2
        assert kinds.count("turnstile.execute_tool") == 1

        # A second turn on the same conversation sees the first one's messages.
        fake_llm.script(text_reply("you asked about 2+3"))
        again = await turns.run("what did I ask?", conversation="c-add")
        assert again.status == TurnStatus.COMPLETED
        roles = [m["role"] for m in fake_llm.requests[2]["messages"]]
        assert roles == ["system", "user", "assistant", "tool", "assistant", "user"]
        stored = MemoryStore(turns.rt.db).messages("c-add")
        assert [m.role for m in stored][-2:] == ["user", "assistant"]
        assert len([m for m in stored if m.role == "system"]) == 1
