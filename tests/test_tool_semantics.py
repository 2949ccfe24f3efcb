"""The tool-calling rules (docs/design.md, "Tool calling") through real turns:
real dev server, scripted model over HTTP, real database. Assertions are on
what the model received next, the turn result, the audit rows and the
activity attempts.

Every decision of the loop is table-tested without a server in
test_tool_round_rules.py (policy variants: unknown tool or argument error
failing fast, the A/B loop breaker...); this file keeps one real turn per
rule, to show the workflow and the activities carry each decision out."""

from __future__ import annotations

import json
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle

from tests.support.services import make_service
from tests.support.turns import running_worker
from turnstile.engine.contract import CallStatus, TurnStatus
from turnstile.stores.audit import AuditLog
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply


def tool_messages(request: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in request["messages"] if m["role"] == "tool"]


async def attempts(handle: WorkflowHandle, activity: str = "turnstile.execute_tool") -> list[int]:
    """For each activity of that type, in order, the attempt that ended it
    (Temporal records the started event of the last attempt only)."""
    history = await handle.fetch_history()
    by_id = {e.event_id: e.activity_task_scheduled_event_attributes.activity_type.name
             for e in history.events
             if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED}
    return [e.activity_task_started_event_attributes.attempt for e in history.events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
            and by_id[e.activity_task_started_event_attributes.scheduled_event_id] == activity]


def db_url(tmp_path) -> str:  # type: ignore[no-untyped-def]
    return f"sqlite:///{tmp_path}/t.db"


async def test_argument_error_goes_back_to_the_model_and_is_not_retried(
        client: Client, task_queue: str, tmp_path, fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(tool_reply(("c1", "add", {"a": 1, "b": -5})),
                    tool_reply(("c2", "add", {"a": 1, "b": 5})), text_reply("6"))
    async with running_worker(client, task_queue, db_url(tmp_path), [make_service()],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.start("add")
        result = await handle.result()
        audit = AuditLog(turns.rt.db).rows(handle.id)
    assert result.status == TurnStatus.COMPLETED
    assert [c.status for c in result.tool_calls] == [CallStatus.INVALID_ARGUMENTS,
                                                     CallStatus.COMPLETED]
    told = tool_messages(fake_llm.requests[1])[0]["content"]
    assert "invalid arguments for add" in told and "b:" in told and "greater than or equal" in told
    assert await attempts(handle) == [1, 1]
    assert [(r.tool_name, r.status) for r in audit] == [("add", "FAILED"),
                                                              ("add", "COMPLETED")]


async def test_argument_error_budget_per_tool(client: Client, task_queue: str, tmp_path,
                                              fake_llm: FakeOpenAIServer) -> None:
    bad = [tool_reply((f"c{i}", "add", {"a": "x", "b": 1})) for i in range(3)]
    fake_llm.script(*bad)
    async with running_worker(client, task_queue, db_url(tmp_path),
                              [make_service(argument_error_budget=2)],
                              llm_url=fake_llm.url) as turns:
        result = await turns.run("add")
    assert result.status == TurnStatus.FAILED
    assert result.error is not None and result.error.type == "ToolArgumentError"
    assert len(result.tool_calls) == 3  # two tolerated, the third ends the turn


async def test_execution_error_retried_then_reported_to_model(
        client: Client, task_queue: str, tmp_path, fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(tool_reply(("c1", "alwaysFails", {"reason": "db down"})),
                    text_reply("sorry, the backend is down"))
    async with running_worker(client, task_queue, db_url(tmp_path), [make_service()],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.start("go")
        result = await handle.result()
        audit = AuditLog(turns.rt.db).rows(handle.id)
    assert result.status == TurnStatus.COMPLETED
    assert result.tool_calls[0].status == CallStatus.FAILED and result.tool_calls[0].is_error
    assert await attempts(handle) == [2]  # the tool's RetryPolicy: 2 attempts
    told = tool_messages(fake_llm.requests[1])[0]
    assert "db down" in told["content"] and "alwaysFails failed" in told["content"]
    assert [r.status for r in audit] == ["FAILED"]


async def test_non_retryable_execution_error_runs_once(client: Client, task_queue: str,
                                                       tmp_path,
                                                       fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(tool_reply(("c1", "refuses", {})), text_reply("ok"))
    async with running_worker(client, task_queue, db_url(tmp_path), [make_service()],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.start("go")
        result = await handle.result()
    assert result.status == TurnStatus.COMPLETED
    assert await attempts(handle) == [1]  # maximum_attempts=5, but non-retryable
    assert "refused for good" in tool_messages(fake_llm.requests[1])[0]["content"]


async def test_unknown_tool_tells_model_the_real_ones(client: Client, task_queue: str, tmp_path,
                                                      fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(tool_reply(("c1", "deleteEverything", {})), text_reply("ok"))
    async with running_worker(client, task_queue, db_url(tmp_path), [make_service()],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.start("go")
        result = await handle.result()
        audit = AuditLog(turns.rt.db).rows(handle.id)
    assert result.status == TurnStatus.COMPLETED
    assert result.tool_calls[0].status == CallStatus.UNKNOWN_TOOL
    told = tool_messages(fake_llm.requests[1])[0]
    assert "'deleteEverything' does not exist" in told["content"]
    assert "add" in told["content"] and "echo" in told["content"]
    assert await attempts(handle) == []  # nothing was executed
    assert [(r.tool_name, r.status) for r in audit] == [("deleteEverything", "FAILED")]


async def test_round_trip_cap_names_the_cap(client: Client, task_queue: str, tmp_path,
                                            fake_llm: FakeOpenAIServer) -> None:
    fake_llm.default = lambda req: tool_reply((f"c{len(req['messages'])}", "add",
                                               {"a": 1, "b": 1}))
    async with running_worker(client, task_queue, db_url(tmp_path),
                              [make_service(max_round_trips=3,
                                            breakers={"enabled": False})],
                              llm_url=fake_llm.url) as turns:
        result = await turns.run("loop forever")
    assert result.status == TurnStatus.FAILED
    assert result.error is not None and result.error.type == "RoundTripCapExceeded"
    assert "round-trip cap 3" in result.error.message
    assert result.round_trips == 4
    # The 4th response's call did not run, but memory holds a result for it.
    assert [c.status for c in result.tool_calls] == [CallStatus.COMPLETED] * 3 + [
        CallStatus.FAILED]
    assert "round-trip cap 3" in (result.tool_calls[-1].result_preview or "")


async def test_calls_of_one_response_run_concurrently_results_in_call_order(
        client: Client, task_queue: str, tmp_path, fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(tool_reply(("slow", "slowUpsert", {"note": "first", "seconds": 1.5}),
                               ("fast", "echo", {"text": "second"})), text_reply("both"))
    async with running_worker(client, task_queue, db_url(tmp_path), [make_service()],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.start("two at once")
        result = await handle.result()
    assert result.status == TurnStatus.COMPLETED
    history = await handle.fetch_history()
    tools = {e.event_id for e in history.events
             if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
             and e.activity_task_scheduled_event_attributes.activity_type.name
             == "turnstile.execute_tool"}
    done = [e.event_id for e in history.events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
            and e.activity_task_completed_event_attributes.scheduled_event_id in tools]
    assert len(tools) == 2 and max(tools) < min(done)  # both scheduled before either finished
    results = tool_messages(fake_llm.requests[1])
    assert [m["tool_call_id"] for m in results] == ["slow", "fast"]  # call order, not finish order
    assert json.loads(results[1]["content"]) == {"echo": "second"}


async def test_dynamic_tools_add_only_and_state_survives_new_worker(
        client: Client, task_queue: str, tmp_path, fake_llm: FakeOpenAIServer) -> None:
    def names(req: dict[str, Any]) -> set[str]:
        return {t["function"]["name"] for t in req["tools"]}

    fake_llm.script(tool_reply(("u1", "unlock", {"code": "open-sesame"})),
                    tool_reply(("s1", "secret", {})), text_reply("42"))
    async with running_worker(client, task_queue, db_url(tmp_path), [make_service()],
                              llm_url=fake_llm.url) as turns:
        result = await turns.run("unlock", conversation="c-dyn")
    assert result.status == TurnStatus.COMPLETED
    assert "secret" not in names(fake_llm.requests[0])
    assert "secret" in names(fake_llm.requests[1])
    assert [c.status for c in result.tool_calls] == [CallStatus.COMPLETED] * 2
    # The unlock state was persisted with the tool result: a new worker (new
    # runtime, nothing in process memory) offers the tool from the first request.
    fake_llm.reset()
    fake_llm.script(text_reply("still here"))
    async with running_worker(client, task_queue, db_url(tmp_path), [make_service()],
                              llm_url=fake_llm.url) as turns:
        again = await turns.run("again", conversation="c-dyn")
    assert again.status == TurnStatus.COMPLETED
    assert "secret" in names(fake_llm.requests[0])


async def test_breaker_disables_tool_after_consecutive_failures(
        client: Client, task_queue: str, tmp_path, fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(*[tool_reply((f"f{i}", "alwaysFails", {})) for i in range(4)],
                    text_reply("gave up"))
    async with running_worker(client, task_queue, db_url(tmp_path),
                              [make_service(breakers={"consecutive_failures": 3})],
                              llm_url=fake_llm.url) as turns:
        handle = await turns.start("keep trying")
        result = await handle.result()
        audit = AuditLog(turns.rt.db).rows(handle.id)
    assert result.status == TurnStatus.COMPLETED
    assert await attempts(handle) == [2, 2, 2]  # 3 calls x 2 attempts; the 4th never ran
    fourth = tool_messages(fake_llm.requests[4])[-1]["content"]
    assert "disabled for the rest of this turn after 3 consecutive failures" in fourth
    assert len(audit) == 4 and "disabled" in audit[-1].error_message


async def test_breaker_too_many_tool_executions(client: Client, task_queue: str, tmp_path,
                                                fake_llm: FakeOpenAIServer) -> None:
    # Each sum new (the same read again and again ends in the answer first:
    # tests/test_same_reads.py).
    fake_llm.default = lambda req: tool_reply((f"c{len(req['messages'])}", "add",
                                               {"a": len(req["messages"]), "b": 1}))
    async with running_worker(client, task_queue, db_url(tmp_path),
                              [make_service(breakers={"max_tool_executions": 4})],
                              llm_url=fake_llm.url) as turns:
        result = await turns.run("busy")
    assert result.status == TurnStatus.FAILED
    assert result.error is not None and result.error.type == "TooManyToolCalls"
    assert "task too complex" in result.error.message
    assert "split it into steps" in result.error.message
    assert [c.status for c in result.tool_calls].count(CallStatus.COMPLETED) == 4
