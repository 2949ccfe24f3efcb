"""Stand-in activities for running the real `AgentTurn` in process: plain
functions registered under the real activity names
(turnstile.engine.activity_io), keeping their state in memory — a script of
model replies, the conversation's memory by slot, a record of every call —
with no database, no model server and no worker subprocess.

They do what the workflow relies on the real ones for, and no more:
`begin_turn` hands over the service's spec (tools by name, policies with the
model's first call of each, as activities.model does); `call_model` stores
the deferred messages and its reply at the slots it is given; `execute_tool`
stores its result at `result_seq`; `append_messages` stores what the
workflow settled itself. So `memory` is what the conversation's store would
hold, and `pairing_problems` checks that every tool call has its result.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from turnstile.cli.worker import workflow_runner
from turnstile.engine import activity_io as io
from turnstile.engine.contract import ApprovalDecision, CallStatus
from turnstile.engine.events import TurnEventRecord
from turnstile.engine.messages import ChatMessage, ToolCall
from turnstile.engine.specs import ServiceSpec
from turnstile.engine.versions import TURN_REVISION
from turnstile.testing.openai_conformance import pairing_violations
from turnstile.workflows import AgentTurn
from turnstile.workflows.agent_turn import FAILS_THE_TURN

# What a stand-in tool does with a call: the result text, or raise (an
# exception fails the attempt; Temporal retries it by the tool's RetrySpec).
ToolBehaviour = Callable[[ToolCall], str]


def tool_reply(*calls: tuple[str, str, dict[str, Any]]) -> ChatMessage:
    """A model reply asking for tool calls: (call id, tool name, arguments)."""
    return ChatMessage(role="assistant", tool_calls=[
        ToolCall(id=cid, name=name, arguments=json.dumps(args)) for cid, name, args in calls])


def done(call: ToolCall) -> str:
    """A stand-in tool's default: it works."""
    return f"{call.name} done"


def text_reply(text: str) -> ChatMessage:
    return ChatMessage(role="assistant", content=text)


class StandIns:
    """One service's stand-in activities and what they saw."""

    def __init__(self, spec: ServiceSpec, replies: list[ChatMessage],
                 tools: dict[str, ToolBehaviour] | None = None) -> None:
        self.spec = spec
        self.replies = list(replies)
        self.tools = tools or {}
        self.memory: dict[int, ChatMessage] = {}  # the conversation's store, by slot
        self.conflicts: list[str] = []  # a slot written twice with different messages
        self.model_calls: list[io.ModelCallInput] = []
        self.reviewed: list[str] = []  # call ids validated before a reviewer was asked
        self.grant_claims: list[str] = []  # call ids that looked for a standing approval
        self.attempts: list[tuple[str, int]] = []  # (call id, attempt) of execute_tool
        self.executed: list[str] = []  # call ids whose tool ran to a result
        self.approvals: dict[str, ApprovalDecision] = {}  # what execute_tool ran under
        self.compensated: list[io.CompensateInput] = []
        self.compensation_failures: list[io.CompensationFailure] = []
        self.appends: list[io.AppendMessagesInput] = []
        self.releases: list[io.ReleaseInput] = []
        self.published: list[str] = []  # kinds of events sent by publish_event

    # -- memory ---------------------------------------------------------------
    def _store(self, seq: int, message: ChatMessage) -> None:
        kept = self.memory.get(seq)
        if kept is not None and kept != message:
            self.conflicts.append(f"slot {seq}: {kept!r} then {message!r}")
        self.memory[seq] = message

    def messages(self) -> list[ChatMessage]:
        return [self.memory[k] for k in sorted(self.memory)]

    def result_of(self, call_id: str) -> list[ChatMessage]:
        return [m for m in self.messages() if m.role == "tool" and m.tool_call_id == call_id]

    def pairing_problems(self) -> list[str]:
        """Every tool call in memory answered exactly once, nothing else amiss."""
        slots = sorted(self.memory)
        gaps = [f"slot {s} is empty" for s in range(slots[-1] + 1) if s not in self.memory] \
            if slots else []
        wire = [{"role": m.role, "tool_call_id": m.tool_call_id,
                 "tool_calls": [{"id": c.id} for c in m.tool_calls]} for m in self.messages()]
        return gaps + self.conflicts + pairing_violations(wire)

    def decisions(self) -> list[tuple[str, bool, str]]:
        """(call id, approved, reviewer) of the decisions the workflow handed
        on to be journaled: with the call it let run (execute_tool), or with
        the results it wrote itself (append_messages)."""
        handed = [d for a in self.appends for d in a.decisions] + list(self.approvals.values())
        return [(d.tool_call_id, d.approved, d.reviewer) for d in handed]

    # -- the turn's bookkeeping -------------------------------------------------
    def _snapshot(self) -> io.MemorySnapshot:
        return io.MemorySnapshot(next_seq=max(self.memory, default=-1) + 1,
                                 message_count=len(self.memory))

    @activity.defn(name=io.BEGIN_TURN)
    async def begin_turn(self, req: io.BeginTurnInput) -> io.BeginTurnResult:
        # As activities.turn: tools by name, "turn started" delivered here.
        return io.BeginTurnResult(
            spec=self.spec.model_copy(update={"tools": []}),
            tool_names=[t.name for t in self.spec.tools], memory=self._snapshot(),
            revision=TURN_REVISION, opened=io.Opened(events_delivered=True))

    @activity.defn(name=io.LOAD_MEMORY)
    async def load_memory(self, req: io.LoadMemoryInput) -> io.MemorySnapshot:
        return self._snapshot()

    @activity.defn(name=io.APPEND_MESSAGES)
    async def append_messages(self, req: io.AppendMessagesInput) -> None:
        self.appends.append(req)
        for i, m in enumerate(req.messages):
            self._store(req.start_seq + i, m)

    @activity.defn(name=io.RELEASE_CONVERSATION)
    async def release_conversation(self, req: io.ReleaseInput) -> None:
        self.releases.append(req)

    @activity.defn(name=io.PUBLISH_EVENT)
    async def publish_event(self, event: TurnEventRecord) -> list[str]:
        self.published.append(event.kind)
        return []

    # -- the model ------------------------------------------------------------------
    @activity.defn(name=io.CALL_MODEL)
    async def call_model(self, req: io.ModelCallInput) -> io.ModelCallResult:
        self.model_calls.append(req)
        for i, m in enumerate(req.prelude):
            self._store(req.prelude_seq + i, m)
        if not self.replies:
            raise ApplicationError("the stand-in model's script is exhausted",
                                   type="ScriptExhausted", non_retryable=True)
        message = self.replies.pop(0)
        self._store(req.response_seq, message)
        known = set(req.known_policies)
        policies = []
        for call in message.tool_calls:
            tool = self.spec.tool(call.name)
            if tool is not None and call.name not in known:
                policies.append(tool.policy())
                known.add(call.name)
        return io.ModelCallResult(
            message=message, provider="stand-in", model="stand-in", tools=policies,
            finish_reason="tool_calls" if message.tool_calls else "stop")

    @activity.defn(name=io.RESOLVE_TOOLS)
    async def resolve_tools(self, req: io.ResolveToolsInput) -> io.ResolvedTools:
        return io.ResolvedTools()

    # -- tools and the saga ---------------------------------------------------------
    @activity.defn(name=io.REVIEW_CALL)
    async def review_call(self, req: io.ReviewCallInput) -> io.ReviewedCall:
        self.reviewed.append(req.call.id)
        return io.ReviewedCall(valid=True)

    @activity.defn(name=io.CLAIM_GRANT)
    async def claim_grant(self, req: io.ClaimGrantInput) -> io.GrantClaim:
        # No standing approvals here: every call that asks waits for a person.
        self.grant_claims.append(req.call.id)
        return io.GrantClaim()

    @activity.defn(name=io.EXECUTE_TOOL)
    async def execute_tool(self, req: io.ToolExecInput) -> io.ToolOutcome:
        call = req.call
        self.attempts.append((call.id, activity.info().attempt))
        if req.approval is not None:
            self.approvals[call.id] = req.approval
        behaviour = self.tools.get(call.name, done)
        text = behaviour(call)  # raises: this attempt fails
        self.executed.append(call.id)
        self._store(req.result_seq, ChatMessage(role="tool", content=text,
                                                tool_call_id=call.id))
        return io.ToolOutcome(call_id=call.id, name=call.name, status=CallStatus.COMPLETED,
                              is_error=False, preview=text)

    @activity.defn(name=io.COMPENSATE_TOOL)
    async def compensate_tool(self, req: io.CompensateInput) -> io.CompensateResult:
        self.compensated.append(req)
        return io.CompensateResult(call_id=req.call.id, description=f"undid {req.call.name}")

    @activity.defn(name=io.RECORD_COMPENSATION_FAILURE)
    async def record_compensation_failure(self, req: io.CompensationFailure) -> None:
        self.compensation_failures.append(req)

    def activities(self) -> list[Callable[..., Any]]:
        return [self.begin_turn, self.load_memory, self.append_messages,
                self.release_conversation, self.publish_event, self.call_model,
                self.resolve_tools, self.review_call, self.claim_grant, self.execute_tool,
                self.compensate_tool, self.record_compensation_failure]


@asynccontextmanager
async def stand_in_worker(client: Client, task_queue: str,
                          stand_ins: StandIns) -> AsyncIterator[Worker]:
    """The real workflow on an in-process worker with the real worker's
    workflow options (worker.build_worker): the strict sandbox tests run
    turns under, and the exceptions that fail the turn instead of its task."""
    worker = Worker(client, task_queue=task_queue, workflows=[AgentTurn],
                    activities=stand_ins.activities(),
                    workflow_runner=workflow_runner("strict"),
                    workflow_failure_exception_types=list(FAILS_THE_TURN),
                    max_workflow_task_external_storage_concurrency=1)
    async with worker:
        yield worker
