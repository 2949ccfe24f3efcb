"""One round of the tool loop: the calls of one model response. What to do with
each call is decided by `turnstile.engine.tool_round_rules`; this module
schedules and records it.

Several calls run concurrently, a single one alone; each result lands in the
memory slot reserved for it, so results reach the model in call order
whatever order they finish in. Calls the workflow settles itself (unknown
tool, rejection, disabled tool, retries exhausted) are written in one batch
with their audit rows.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from temporalio import workflow
from temporalio.exceptions import ActivityError, CancelledError

with workflow.unsafe.imports_passed_through():
    from turnstile.engine import (
        activity_io as io,
        attributes as attr,
        repeats,
        tool_round_rules as rules,
    )
    from turnstile.engine.approvals import ran_call
    from turnstile.engine.breakers import Breakers, RanCall
    from turnstile.engine.contract import (
        ApprovalDecision,
        AuditStatus,
        CallStatus,
        ToolCallRecord,
        TurnInput,
        TurnStatus,
    )
    from turnstile.engine.flow import FlowVerdict, Provenance, refusal_text, untrusted_arguments
    from turnstile.engine.masking import mask_json_text
    from turnstile.engine.messages import ChatMessage, ToolCall
    from turnstile.engine.specs import ServiceSpec, ToolSpec
    from turnstile.engine.turn_rules import parsed_arguments
    from turnstile.engine.versions import REPEAT_BREAKER
    from turnstile.workflows import standing_approvals as standing
    from turnstile.workflows.approval_wait import await_decision
    from turnstile.workflows.state import TurnState, TurnStopped, failure_reason, recorded_arguments
    from turnstile.workflows.steer_signal import steered_rejection
    from turnstile.workflows.tool_options import listing_options, tool_options


CANCELLED_RUNNING_TEXT = (
    "The turn was cancelled while this call to {name} was running. It may or may not have "
    "taken effect: check its effect before relying on it or trying again.")
CANCELLED_UNRUN_TEXT = "Not run: the turn was cancelled before this call to {name} ran."


@dataclass
class RoundWrites:
    """What the workflow itself must write after the round."""

    messages: list[tuple[int, ChatMessage]] = field(default_factory=list)
    audit: list[io.AuditEntry] = field(default_factory=list)
    decisions: list[ApprovalDecision] = field(default_factory=list)

    def settle(self, seq: int, call: ToolCall, status: CallStatus, text: str, *,
               is_error: bool = True, audit: AuditStatus = AuditStatus.FAILED,
               attributes: dict[str, object] | None = None,
               approval_reason: str | None = None,
               provenance: Provenance | None = None) -> None:
        self.messages.append((seq, ChatMessage(
            role="tool", content=text, tool_call_id=call.id, is_error=is_error,
            attributes={attr.TOOL_NAME: call.name, attr.OUTCOME: status.value,
                        **(attributes or {})})))
        self.audit.append(io.AuditEntry(call_id=call.id, tool_name=call.name,
                                        arguments=call.arguments, status=audit,
                                        error=f"{status.value}: {text[:300]}",
                                        approval_reason=approval_reason,
                                        provenance=provenance))


class ToolRound:
    def __init__(self, state: TurnState, turn: TurnInput, spec: ServiceSpec,
                 breakers: Breakers) -> None:
        self.s, self.turn, self.spec, self.breakers = state, turn, spec, breakers
        self.writes = RoundWrites()
        # Calls without a result yet, by slot: (call, record, running?).
        self.open: dict[int, tuple[ToolCall, ToolCallRecord, bool]] = {}
        self.in_round: dict[str, int] = {}  # calls of each tool in this response
        self.keys: dict[int, str] = {}  # validated comparison keys, by slot (revision 5)

    async def run(self, calls: list[ToolCall], base_seq: int) -> None:
        records = [self.s.new_call(c) for c in calls]
        for c in calls:
            self.in_round[c.name] = self.in_round.get(c.name, 0) + 1
        self.open = {base_seq + i: (c, r, False)
                     for i, (c, r) in enumerate(zip(calls, records, strict=True))}
        jobs = [self._one(c, r, base_seq + i)
                for i, (c, r) in enumerate(zip(calls, records, strict=True))]
        # On cancel, AgentTurn settles what is left open (settle_cancelled).
        outcomes = await asyncio.gather(*jobs, return_exceptions=True)
        await self._write()
        for o in outcomes:  # the first failure ends the turn, after every call settled
            if isinstance(o, BaseException):
                raise o

    def settle_cancelled(self) -> list[tuple[ToolCall, ToolCallRecord]]:
        """The turn was cancelled during this round: every call without a
        result gets one. Returns the calls that were running (their effect is
        unknown; the caller undoes the compensable ones)."""
        running = []
        for seq, (call, rec, was_running) in sorted(self.open.items()):
            if was_running:
                running.append((call, rec))
                status, text = CallStatus.INTERRUPTED, CANCELLED_RUNNING_TEXT
            else:
                status, text = CallStatus.FAILED, CANCELLED_UNRUN_TEXT
            self.s.finish(rec, status, text.format(name=call.name))
            self.writes.settle(seq, call, status, text.format(name=call.name))
        self.open = {}
        return running

    async def _write(self) -> None:
        """One local activity per run of consecutive slots (usually one per
        round), each with the audit rows and decisions of its calls, plus the
        decisions refused while this round waited for approvals."""
        w = self.writes
        refusals = self.s.take_refusals()
        for seq, run in _consecutive(sorted(w.messages, key=lambda x: x[0])):
            ids = {m.tool_call_id for m in run}
            await self.s.append(run, seq=seq,
                                audit=[a for a in w.audit if a.call_id in ids] + refusals,
                                decisions=[d for d in w.decisions if d.tool_call_id in ids])
            refusals = []
        w.messages, w.audit, w.decisions = [], [], []
        if refusals:
            await self.s.append([], audit=refusals)

    async def write_cancelled(self) -> None:
        await self._write()

    async def _one(self, call: ToolCall, rec: ToolCallRecord, seq: int) -> None:
        tool = self.spec.tool(call.name)
        loop = self.spec.loop
        by_meaning = self.s.revision.repeats_by_meaning
        if not by_meaning:
            await self._after_twin(call, tool, seq)
        # A disabled tool says so (its breaker tripped after the earlier
        # success); only a tool that may still run is settled as a repeat.
        if not self.breakers.is_disabled(call.name) and self._repeated(rec, seq, call, tool):
            return
        if self.breakers.is_withheld(call.name):  # revision 10 (only then recorded)
            self._settle(rec, seq, call, rules.Settle(CallStatus.FAILED,
                                                      repeats.withheld_text(call.name),
                                                      breaker_failure=False))
            return
        decision = rules.before_call(call.name, tool, self.s.tool_names,
                                     self.breakers.is_disabled(call.name), loop)
        if (isinstance(decision, rules.Execute) and tool is not None
                and self.s.revision.dead_ends_end_turn):
            decision = rules.without_arguments(call.name, call.arguments, tool, loop) or decision
        if isinstance(decision, rules.Settle):
            self._settle(rec, seq, call, decision)
            return
        assert tool is not None  # before_call settles an unknown tool
        reviewed = None
        # A tool that asks by condition (ToolSpec.approval_condition, only in
        # specs recorded since 0.5, so no turn begun earlier takes this path)
        # is reviewed like one that always asks; the activity's answer, in
        # history, says whether it waits and why.
        conditional = tool.approval_condition
        # From revision 7 a tool with sensitive arguments has their provenance
        # derived and its information-flow rules applied (ReviewedCall.flow).
        flow = self.s.revision.flow_rules_checked and bool(tool.sensitive)
        if decision.needs_approval or conditional or flow or (
                by_meaning and repeats.needs_validated_key(
                    self.breakers, tool, call.name, self.in_round.get(call.name, 0))):
            reviewed = await self._review(
                call, similar=by_meaning and (decision.needs_approval or conditional or flow),
                conditional=conditional, flow=flow)
            if not reviewed.valid:
                # Never ask a reviewer about arguments that fail validation.
                count = self.s.argument_errors.get(call.name, 0)
                self.s.argument_errors[call.name] = count + 1
                self._settle(rec, seq, call, rules.after_validation(reviewed.error, count, loop))
                return
            if by_meaning and await self._repeated_by_meaning(rec, seq, call, tool,
                                                              reviewed.repeat_key):
                return
        verdict = reviewed.flow if reviewed is not None else None
        provenance = verdict.provenance if verdict is not None else None
        if verdict is not None and verdict.rule == "refuse":
            self._refuse(rec, seq, call, verdict)
            return
        flow_waits = verdict is not None and verdict.rule == "review"
        # Why it waits: a condition's words, or the rules' (the argument and its source).
        waits_because = (reviewed.reason if reviewed is not None else None) or (
            verdict.reason if verdict is not None and flow_waits else None)
        approval = None
        if reviewed is not None and (decision.needs_approval or reviewed.reason is not None
                                     or flow_waits):
            # The loop's "await approval" step (steered: rejected at once instead).
            if self.s.steered is not None:
                approval = steered_rejection(self.s, call)
            else:
                # From revision 8 a standing approval that covers the call approves
                # it; one never covers sensitive arguments from untrusted content
                # unless it says so (the flow rules' provenance names them).
                grant = (await standing.claim(self.s, call, untrusted_arguments(provenance or {}))
                         if self.s.revision.standing_approvals else None)
                if grant is not None and grant.grant_id:
                    approval = standing.covered(call, grant)
                    self.s.event("approval", f"{call.name} approved by grant {grant.grant_id}")
                else:
                    approval = await await_decision(self.s, rules.approval_step(
                        call, tool, reviewed.notes, workflow.now(), waits_because,
                        reviewed.similar_effects, provenance,
                        grant_offer=standing.offer(grant, parsed_arguments(call.arguments))
                        if grant else None,
                        grant_candidates=grant.candidates if grant else None))
        # Why it waited (a condition's or the flow rules' words), for the call's audit row.
        reason = waits_because if approval is not None else None
        if approval is not None:
            rejected = rules.after_review(call.name, approval, loop)
            if rejected is not None and call.id in self.s.steered_calls:
                rejected = replace(rejected, stop=None)  # the turn ends `steered` instead
            if rejected is not None:
                self.writes.decisions.append(approval)
                self._settle(rec, seq, call, rejected, reason, provenance)
                return
        model_call, call = call, ran_call(call, approval)
        if call is not model_call:  # approved with edits: the tool runs with the reviewer's
            rec.arguments = recorded_arguments(call)
        self.s.event("tool_call", f"{call.name} {bounded_arguments(call.arguments)}")
        self.open[seq] = (call, rec, True)
        try:
            out = await self.s.execute(
                io.execute_tool,
                io.ToolExecInput(conversation_id=self.turn.conversation_id,
                                 user_id=self.turn.user_id, service=self.turn.service,
                                 call=model_call, result_seq=seq, approval=approval,
                                 execution_chain=self.s.chain, approval_reason=reason,
                                 provenance=provenance),
                tool.summary or call.name, tool_options(tool))
        except ActivityError as exc:
            if isinstance(exc.cause, CancelledError):
                # Cancelled with the turn: its effect is unknown; the call stays
                # open for AgentTurn's cancel path (settle_cancelled).
                raise asyncio.CancelledError() from exc
            if approval is not None:  # the call ran under a decision: journal it too
                self.writes.decisions.append(approval)
            self._settle(rec, seq, call, rules.after_retries(call.name, failure_reason(exc), tool),
                         reason, provenance)
            return
        self.open.pop(seq, None)  # the activity wrote the result
        self.s.finish(rec, out.status, out.preview)
        if out.status is CallStatus.COMPLETED and not out.is_error:
            keys = ((reviewed.repeat_key if reviewed else "", out.repeat_key) if by_meaning
                    else ())
            repeats.remember(self.breakers, call.name, [model_call.arguments, call.arguments],
                             RanCall(call_id=call.id, preview=out.preview), keys)
            if self.s.revision.same_reads_answer:
                repeats.same_read(self.breakers, tool, call.name, call.arguments, out.preview)
        effects = rules.after_outcome(out.status, out.is_error, out.preview, tool,
                                      self.s.argument_errors.get(call.name, 0), loop)
        self._breaker(call.name, executed=effects.executed, failed=effects.failed)
        if effects.compensable:
            self.s.compensable.append((call, rec))
        if effects.argument_error:
            self.s.argument_errors[call.name] = self.s.argument_errors.get(call.name, 0) + 1
        if effects.stop is not None:
            raise TurnStopped(TurnStatus.FAILED, effects.stop, call_id=call.id)

    def _settle(self, rec: ToolCallRecord, seq: int, call: ToolCall, how: rules.Settle,
                approval_reason: str | None = None,
                provenance: Provenance | None = None) -> None:
        """Record a call the workflow settled itself; end the turn if the rule says so."""
        self.open.pop(seq, None)
        self.s.finish(rec, how.status, how.text)
        self.writes.settle(seq, call, how.status, how.text, approval_reason=approval_reason,
                           provenance=provenance)
        if how.breaker_failure:
            self._breaker(call.name, executed=how.executed, failed=True)
        if how.stop is not None:
            raise TurnStopped(TurnStatus.FAILED, how.stop, call_id=call.id)

    def _refuse(self, rec: ToolCallRecord, seq: int, call: ToolCall,
                verdict: FlowVerdict) -> None:
        """A call its information-flow rules refuse: not run, the model told
        which argument came from where (is_error), audited FLOW_REFUSED with
        the provenance. No breaker counts it: the tool did not fail."""
        text = refusal_text(call.name, verdict.reason)
        self.open.pop(seq, None)
        self.s.finish(rec, CallStatus.REJECTED, text)
        self.writes.settle(seq, call, CallStatus.REJECTED, text, audit=AuditStatus.FLOW_REFUSED,
                           provenance=verdict.provenance)
        self.s.event("tool_call", f"{call.name} refused by its flow rules: "
                                  f"{', '.join(verdict.untrusted)} from untrusted content")

    async def _after_twin(self, call: ToolCall, tool: ToolSpec | None, seq: int) -> None:
        """An identical call earlier in the same response (a tool the repeat
        breaker guards): wait until it has its result, so that, if it
        completed, this one is a repeat of it instead of a second effect."""
        if not repeats.guarded(tool, self.breakers.policy):
            return
        key = repeats.repeat_key(call.name, call.arguments)
        twin = next((s for s, (c, _, _) in sorted(self.open.items()) if s < seq and key
                     and repeats.repeat_key(c.name, c.arguments) == key), None)
        if twin is None or not workflow.patched(REPEAT_BREAKER):
            return
        await workflow.wait_condition(lambda: twin not in self.open)

    def _repeated(self, rec: ToolCallRecord, seq: int, call: ToolCall,
                  tool: ToolSpec | None) -> bool:
        """The repeat breaker (turnstile.engine.repeats): settle a call that
        repeats one of this turn that completed (its arguments identical as
        JSON), without running it or asking a reviewer. True when it did."""
        earlier = repeats.earlier_run(self.breakers, tool, call.name, call.arguments)
        # From revision 5 a turn needs no marker: its revision says which path it took.
        if earlier is None or not (self.s.revision.repeats_by_meaning
                                   or workflow.patched(REPEAT_BREAKER)):
            return False
        self._settle_repeat(rec, seq, call, earlier, by_meaning=False)
        return True

    async def _repeated_by_meaning(self, rec: ToolCallRecord, seq: int, call: ToolCall,
                                   tool: ToolSpec, key: str) -> bool:
        """From revision 5: settle a validated call whose comparison key
        (`key`, turnstile.engine.equivalence) is that of a call of this turn
        that completed. A call of the same response with the same key runs
        first: this one waits for its result. True when it settled the call."""
        if not key or not repeats.guarded(tool, self.breakers.policy):
            return False
        self.keys[seq] = key
        twins = sorted(s for s, (c, _, _) in self.open.items() if s < seq and c.name == call.name)
        for twin in twins:
            await workflow.wait_condition(self._keyed_or_closed(twin))
            if self.keys.get(twin) == key:
                await workflow.wait_condition(self._closed(twin))
        earlier = repeats.earlier_by_key(self.breakers, tool, key)
        if earlier is None:
            return False
        self._settle_repeat(rec, seq, call, earlier, by_meaning=True)
        return True

    def _keyed_or_closed(self, seq: int) -> Callable[[], bool]:
        return lambda: seq in self.keys or seq not in self.open

    def _closed(self, seq: int) -> Callable[[], bool]:
        return lambda: seq not in self.open

    def _settle_repeat(self, rec: ToolCallRecord, seq: int, call: ToolCall, earlier: RanCall,
                       *, by_meaning: bool) -> None:
        text = repeats.repeated_text(call.name, earlier, by_meaning)
        self.open.pop(seq, None)
        self.s.finish(rec, CallStatus.REPEATED, text)
        rec.is_error = False  # the effect exists: not an error to retry
        self.writes.settle(seq, call, CallStatus.REPEATED, text, is_error=False,
                           audit=AuditStatus.REPEATED,
                           attributes={attr.REPEAT_OF: earlier.call_id})
        self.breakers.history.append(call.name)
        self.breakers.repeats += 1
        self.s.event("breaker", f"{call.name}: same {'effect' if by_meaning else 'arguments'} "
                                f"as {earlier.call_id}, which completed; not run again")

    def _breaker(self, name: str, executed: bool, failed: bool) -> None:
        if self.breakers.record(name, executed=executed, failed=failed):
            self.s.event("breaker", f"{name} disabled after "
                                    f"{self.spec.loop.breakers.consecutive_failures} "
                                    "consecutive failures")

    async def _review(self, call: ToolCall, *, similar: bool = False,
                      conditional: bool = False, flow: bool = False) -> io.ReviewedCall:
        """Validate a call before a reviewer sees it (`similar`: and find the
        conversation's earlier effects that look alike), or before the repeat
        breaker compares it (revision 5); for a tool that asks by condition,
        also whether a reviewer must see it (`reason`)."""
        by_meaning = self.s.revision.repeats_by_meaning
        ask = io.ReviewCallInput(
            service=self.turn.service, call=call,
            conversation_id=self.turn.conversation_id if by_meaning or conditional else "",
            user_id=self.turn.user_id if conditional else "",
            similar=similar and by_meaning,
            workflow_id=workflow.info().workflow_id if by_meaning else "",
            execution_chain=self.s.chain if by_meaning else "", flow=flow)
        reviewed: io.ReviewedCall = await self.s.activity(
            io.review_call, ask,
            f"review {call.name}", TurnStatus.FAILED, options=listing_options())
        return reviewed


def bounded_arguments(arguments: str, limit: int = 4000) -> str:
    """A call's arguments for a progress line: masked, at most 120 characters.
    Large arguments are not parsed here (workflow code has 2 s per activation)."""
    if len(arguments) > limit:
        return f"({len(arguments)} characters of arguments)"
    return mask_json_text(arguments)[:120]


def _consecutive(items: list[tuple[int, ChatMessage]]) -> list[tuple[int, list[ChatMessage]]]:
    """Runs of consecutive memory slots: (first slot, messages)."""
    runs: list[tuple[int, list[ChatMessage]]] = []
    for seq, msg in items:
        if runs and runs[-1][0] + len(runs[-1][1]) == seq:
            runs[-1][1].append(msg)
        else:
            runs.append((seq, [msg]))
    return runs
