"""Fault injection for tests: exceptions nobody planned for, raised where the
product's code runs — inside an activity, or in workflow code at the moment a
pipeline step schedules its work. Test doubles only: a worker built with
these interceptors (next to the product's own), no hook in product code.

The plan rides in the workflow id, so it is the same on every replay of the
turn (workflow code must be deterministic, the faults included):

- `wfault-<k>-<Exception>-...`: workflow code raises `Exception` when the
  turn schedules its k-th activity or local activity (1-based);
- `afault-<activity type>-<Exception>-...` (dots of the type as `~`): the
  activity raises `Exception` on every attempt.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic_core import PydanticSerializationError
from temporalio import activity, workflow
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    ExecuteWorkflowInput,
    Interceptor,
    StartActivityInput,
    StartLocalActivityInput,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
    WorkflowOutboundInterceptor,
)

FAULTS: dict[str, Callable[[], Exception]] = {
    "KeyError": lambda: KeyError("injected-key"),
    "TypeError": lambda: TypeError("injected: 'NoneType' object is not subscriptable"),
    "PydanticSerializationError": lambda: PydanticSerializationError(
        "injected: surrogates not allowed"),
}


def workflow_fault_id(k: int, exception: str, tag: str) -> str:
    return f"wfault-{k}-{exception}-{tag}"


def activity_fault_id(activity_type: str, exception: str, tag: str) -> str:
    return f"afault-{activity_type.replace('.', '~')}-{exception}-{tag}"


def _planned(prefix: str, workflow_id: str) -> tuple[str, str] | None:
    if not workflow_id.startswith(prefix + "-"):
        return None
    where, exception, _tag = workflow_id[len(prefix) + 1:].split("-", 2)
    return where, exception


class Faults(Interceptor):
    """Both kinds; put it last in the worker's interceptors, so the product's
    own (e.g. the activity error classifier) see what it raises."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _ActivityFault(next)

    def workflow_interceptor_class(
            self, input: WorkflowInterceptorClassInput) -> type[WorkflowInboundInterceptor]:
        return _WorkflowFault


class _ActivityFault(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        info = activity.info()
        plan = _planned("afault", info.workflow_id or "")
        if plan is not None and plan[0].replace("~", ".") == info.activity_type:
            raise FAULTS[plan[1]]()
        return await super().execute_activity(input)


class _WorkflowFault(WorkflowInboundInterceptor):
    def init(self, outbound: WorkflowOutboundInterceptor) -> None:
        super().init(_CountingOutbound(outbound))

    async def execute_workflow(self, input: ExecuteWorkflowInput) -> Any:
        return await super().execute_workflow(input)


class _CountingOutbound(WorkflowOutboundInterceptor):
    def __init__(self, next: WorkflowOutboundInterceptor) -> None:
        super().__init__(next)
        self.scheduled = 0

    def _maybe_raise(self) -> None:
        self.scheduled += 1
        plan = _planned("wfault", workflow.info().workflow_id)
        if plan is not None and int(plan[0]) == self.scheduled:
            raise FAULTS[plan[1]]()

    def start_activity(self, input: StartActivityInput) -> workflow.ActivityHandle[Any]:
        self._maybe_raise()
        return super().start_activity(input)

    def start_local_activity(self, input: StartLocalActivityInput
                             ) -> workflow.ActivityHandle[Any]:
        self._maybe_raise()
        return super().start_local_activity(input)
