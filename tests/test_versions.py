"""The defaults of the specs a turn's history records belong to the turn's
version. History keeps only the fields of a spec that differ from their
defaults (turnstile.engine.activity_io.recorded), so a history replays with
the defaults of the code that reads it: changing one is a change of version.
This test pins them; when it fails, bump TURN_VERSION
(turnstile/engine/versions.py), move tests/histories/*.json to
tests/histories/v<old>/, re-record (`python -m tests.record_histories`) and
regenerate tests/data/recorded_defaults.json."""

from __future__ import annotations

import json
from pathlib import Path

from turnstile.engine.activity_io import BeginTurnResult, MemorySnapshot, ModelCallResult
from turnstile.engine.messages import ChatMessage
from turnstile.engine.specs import LoopPolicy, ServiceSpec, ToolSpec
from turnstile.engine.versions import TURN_VERSION

PINNED = Path(__file__).parent / "data" / "recorded_defaults.json"


def test_defaults_recorded_by_omission_are_those_of_this_version() -> None:
    pinned = json.loads(PINNED.read_text())
    now = {"turn_version": TURN_VERSION,
           "ServiceSpec": ServiceSpec(name="").model_dump(mode="json"),
           "ToolSpec": ToolSpec(name="", description="", parameters={}).model_dump(mode="json")}
    assert now == pinned, "a default recorded by omission changed: see this module's docstring"


def test_a_recorded_spec_reads_back_as_itself() -> None:
    spec = ServiceSpec(name="s", system_prompt="hi", loop=LoopPolicy(max_round_trips=7))
    begun = BeginTurnResult(spec=spec, tool_names=["t"],
                            memory=MemorySnapshot(next_seq=3, message_count=3))
    data = json.loads(begun.model_dump_json())
    assert data["spec"] == {"name": "s", "system_prompt": "hi", "loop": {"max_round_trips": 7}}
    assert BeginTurnResult.model_validate(data) == begun
    tool = ToolSpec(name="t", description="", parameters={}, requires_approval=True)
    result = ModelCallResult(message=ChatMessage(role="assistant", content="x"), tools=[tool])
    again = ModelCallResult.model_validate_json(result.model_dump_json())
    assert again.tools == [tool]
    assert json.loads(result.model_dump_json())["tools"] == [
        {"name": "t", "description": "", "parameters": {}, "requires_approval": True}]
