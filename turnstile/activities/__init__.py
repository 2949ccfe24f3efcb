"""Activities: everything in a turn that touches the world."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from turnstile.activities.compensation import SagaActivities
from turnstile.activities.conversation_memory import MemoryActivities
from turnstile.activities.grant_activities import GrantActivities
from turnstile.activities.model import ModelActivities
from turnstile.activities.pipeline import PipelineActivities
from turnstile.activities.review import ReviewActivities
from turnstile.activities.runtime import Runtime
from turnstile.activities.service_spec import ServiceActivities
from turnstile.activities.tool_calls import ToolActivities
from turnstile.activities.turn import TurnActivities

__all__ = ["Runtime", "all_activities"]


def all_activities(rt: Runtime) -> list[Callable[..., Any]]:
    mem, model, tools = MemoryActivities(rt), ModelActivities(rt), ToolActivities(rt)
    saga, pipe, svc = SagaActivities(rt), PipelineActivities(rt), ServiceActivities(rt)
    grants = GrantActivities(rt)
    return [TurnActivities(rt, svc, mem).begin_turn, svc.resolve_tools,
            mem.load_memory, mem.append_messages, mem.release_conversation,
            model.call_model, tools.execute_tool, ReviewActivities(rt).review_call,
            saga.compensate_tool, saga.record_compensation_failure,
            pipe.transform_system_message, pipe.retrieve, pipe.input_guardrails,
            pipe.moderate, pipe.output_guardrails, pipe.parse_output, pipe.discard_message,
            pipe.publish_event, grants.claim_grant, grants.issue_grant, grants.revoke_grant]
