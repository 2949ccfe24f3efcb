"""The typed references workflow code schedules activities by
(turnstile.engine.activity_io) agree with the activities the worker registers:
same name, same input model, same result type. And the wire shapes that typing
changed internally are the same JSON as before."""

from __future__ import annotations

import typing
from typing import Any

from temporalio import activity

from turnstile.activities import all_activities
from turnstile.engine import activity_io as io
from turnstile.engine.contract import CallStatus, RollbackCause, TurnResult, TurnStatus
from turnstile.engine.messages import Usage


def refs() -> dict[str, io.ActivityRef[Any, Any]]:
    return {r.name: r for r in vars(io).values() if isinstance(r, io.ActivityRef)}


def test_every_reference_matches_its_registered_activity() -> None:
    registered = {}
    for fn in all_activities(None):  # type: ignore[arg-type]  # only binds the methods
        defn = activity._Definition.from_callable(fn)
        assert defn is not None and defn.name is not None
        registered[defn.name] = fn
    by_name = refs()
    # Every activity the workflow schedules by reference is registered...
    assert set(by_name) <= set(registered)
    # ...and only the local event activity is scheduled without one.
    assert set(registered) - set(by_name) == {io.PUBLISH_EVENT}
    for name, ref in by_name.items():
        hints = typing.get_type_hints(registered[name])
        (param,) = [v for k, v in hints.items() if k != "return"]
        assert param is ref.input_type, name
        assert hints["return"] is ref.result_type, name


def test_result_json_keeps_its_shape() -> None:
    result = TurnResult(status=TurnStatus.COMPLETED,
                        usage=Usage(prompt_tokens=3, completion_tokens=4))
    data = result.model_dump(mode="json")
    assert data["usage"] == {"prompt_tokens": 3, "completion_tokens": 4}
    assert data["status"] == "completed"
    # A result written before `usage` was typed still reads.
    old = TurnResult.model_validate({"status": "failed", "usage": {}})
    assert old.usage == Usage()


def test_rollback_cause_reads_the_dict_older_turns_send() -> None:
    cause = io.CompensateInput.model_validate({
        "conversation_id": "c", "user_id": "u", "service": "s",
        "call": {"id": "c1", "name": "t", "arguments": "{}"},
        "cause": {"type": "FatalToolFailure", "message": "boom", "call_id": "c2"}}).cause
    assert cause == RollbackCause(type="FatalToolFailure", message="boom", call_id="c2")
    assert cause.model_dump() == {"type": "FatalToolFailure", "message": "boom", "call_id": "c2"}


def test_tool_outcome_status_is_the_enum_on_both_sides() -> None:
    out = io.ToolOutcome.model_validate_json(
        '{"call_id": "c", "name": "t", "status": "invalid_arguments", "is_error": true, '
        '"preview": "x"}')
    assert out.status is CallStatus.INVALID_ARGUMENTS
    assert out.model_dump(mode="json")["status"] == "invalid_arguments"


def test_release_reads_the_payload_it_sent_as_load_memory_input() -> None:
    # Until release_conversation had its own type it sent LoadMemoryInput with
    # the release's fields: such a payload (a release in flight across an
    # upgrade) reads into ReleaseInput, and ReleaseInput sends the same JSON.
    sent = {"conversation_id": "c", "user_id": "u", "execution_chain": "run-1",
            "next_seq": 7, "events": [{"kind": "turn_completed", "event_id": "w/r/turn_completed",
                                       "workflow_id": "w", "run_id": "r", "conversation_id": "c",
                                       "user_id": "u", "service": "s", "at": "2026-01-01T00:00:00",
                                       "status": "completed"}]}
    release = io.ReleaseInput.model_validate(sent)
    assert (release.next_seq, release.execution_chain) == (7, "run-1")
    assert [e.kind for e in release.events] == ["turn_completed"]
    assert release.model_dump(mode="json").keys() == sent.keys()
    # A load_memory payload carrying the release's fields (null, []) still reads.
    load = io.LoadMemoryInput.model_validate({**sent, "next_seq": None, "events": []})
    assert load == io.LoadMemoryInput(conversation_id="c", user_id="u", execution_chain="run-1")


def test_each_activity_takes_an_input_type_of_its_own() -> None:
    """No activity reuses another's input model with fields only it reads."""
    by_input: dict[type, list[str]] = {}
    for ref in refs().values():
        by_input.setdefault(ref.input_type, []).append(ref.name)
    assert {t.__name__: names for t, names in by_input.items() if len(names) > 1} == {}
