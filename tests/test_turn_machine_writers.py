"""One writer of the turn's phase, pending calls and decisions: the state
machine's transitions (turnstile/engine/turn_machine.py). An AST scan of the
workflow code finds any other write of them; and a move the machine refuses,
made in a real turn, ends that turn `failed` with `UnexpectedError` naming
the phase and `IllegalTransition` — no workflow task fails, the conversation
is released and its next turn completes."""

from __future__ import annotations

import ast
import asyncio
import uuid
from pathlib import Path
from typing import Any

from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.worker import (
    Interceptor,
    StartActivityInput,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
    WorkflowOutboundInterceptor,
)

from tests.support.services import make_service
from tests.support.turns import running_worker
from turnstile.activities.data_errors import DataErrors
from turnstile.engine import activity_io as io
from turnstile.engine.contract import TurnStatus
from turnstile.engine.errors import IllegalTransition
from turnstile.testing import FakeOpenAIServer, text_reply

ROOT = Path(__file__).resolve().parents[1]
MACHINE = ROOT / "turnstile" / "engine" / "turn_machine.py"
WORKFLOW_CODE = sorted((ROOT / "turnstile" / "workflows").glob("*.py"))
# What only the machine writes: its state (and TurnState's read-only views
# of it, by the same names), and the machine itself.
GUARDED = {"phase", "step", "pending", "decisions", "steered", "steered_calls",
           "queued_behind", "machine"}
PRIVATE = {"_phase", "_pending", "_decisions", "_steered", "_steered_calls",
           "_queued_behind", "_pending_view", "_decisions_view", "_emit"}
MUTATORS = {"pop", "popitem", "clear", "update", "setdefault", "append", "extend", "insert",
            "remove", "__setitem__", "__delitem__"}
# Writes of the same names that mean something else, each said once.
OTHER_MEANINGS = {
    ("workflows/state.py", "self.machine"): "TurnState.__init__ creates the turn's machine",
    ("workflows/state.py", "self.step"): "TurnStopped.step: where an unexpected error was",
    ("workflows/agent_turn.py", "stop.step"): "the same, set by AgentTurn._unexpected",
    ("workflows/agent_turn.py", "self.decisions"): "AgentTurn's Decisions (the doors)",
    ("workflows/turn_events.py", "self.pending"): "TurnEvents: events not delivered yet",
    ("workflows/turn_end.py", "events.pending"): "the same, put back after a failed release",
    ("workflows/tool_round.py", "w.decisions"): "RoundWrites: decisions the round journals",
    ("workflows/tool_round.py", "self.writes.decisions"): "the same",
}


def _guarded_part(node: ast.expr) -> ast.Attribute | None:
    """The attribute of `node`'s chain (a.b[c].d) that is guarded, if any."""
    while isinstance(node, ast.Attribute | ast.Subscript | ast.Starred):
        if isinstance(node, ast.Attribute) and node.attr in GUARDED | PRIVATE:
            return node
        node = node.value
    return None


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        return [t for target in node.targets for t in _flat(target)]
    if isinstance(node, ast.AugAssign | ast.AnnAssign) and (
            not isinstance(node, ast.AnnAssign) or node.value is not None):
        return _flat(node.target)
    if isinstance(node, ast.Delete):
        return [t for target in node.targets for t in _flat(target)]
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in MUTATORS):
        return [node.func.value]
    return []


def _flat(target: ast.expr) -> list[ast.expr]:
    if isinstance(target, ast.Tuple | ast.List):
        return [t for e in target.elts for t in _flat(e)]
    return [target]


def writes(source: str, name: str) -> list[str]:
    """Every write of a guarded name in `source` (a module named `name`)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in PRIVATE:
            found.append(f"{name}:{node.lineno} touches the machine's {node.attr}")
        for target in _targets(node):
            part = _guarded_part(target)
            if part is None:
                continue
            text = ast.unparse(part)
            if (name, text) not in OTHER_MEANINGS:
                found.append(f"{name}:{target.lineno} writes {ast.unparse(target)}")
    return found


def test_the_scan_finds_each_kind_of_write() -> None:
    source = "\n".join([
        "s.step = TurnPhase.TOOLS",
        "self.s.pending[call.id] = p",
        "s.decisions.pop('c1', None)",
        "del s.pending['c1']",
        "s.steered, s.queued_behind = sig, ''",
        "s.steered_calls.append('c1')",
        "s.machine._phase = TurnPhase.TOOLS",
        "x = s.machine._decisions",
        "step = next_step(message)",  # a local name: not a write of the turn's step
        "progress = TurnProgress(step=s.step, pending_approvals=list(s.pending.values()))",
    ])
    found = writes(source, "workflows/example.py")
    # Lines 1-8 (line 5 writes two; line 7 touches a private and writes it); 9-10 read.
    assert sorted(int(f.split(":")[1].split()[0]) for f in found) == [1, 2, 3, 4, 5, 5, 6, 7, 7, 8]
    assert "workflows/example.py:8 touches the machine's _decisions" in found


def test_only_the_machine_writes_the_phase_the_pending_calls_and_the_decisions() -> None:
    assert len(WORKFLOW_CODE) > 10 and MACHINE.exists()
    found = [w for path in WORKFLOW_CODE
             for w in writes(path.read_text(), str(path.relative_to(ROOT / "turnstile")))]
    assert found == []
    # Each other meaning is still there (else its entry goes).
    for (name, text) in OTHER_MEANINGS:
        assert text in (ROOT / "turnstile" / name).read_text(), (name, text)


def test_the_search_attributes_change_only_through_a_transition() -> None:
    """The one upsert (TurnState.publish) is issued by TurnState.enter, with
    the `Moved` of a transition that changes them; nothing else upserts."""
    calls = {}
    for path in WORKFLOW_CODE:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr in ("publish", "upsert_search_attributes", "upsert_memo"):
                calls.setdefault(node.func.attr, []).append(
                    f"{path.relative_to(ROOT / 'turnstile')}:{ast.unparse(node.func)}")
    assert calls == {"publish": ["workflows/state.py:self.publish"],
                     "upsert_search_attributes": ["workflows/state.py:workflow."
                                                  "upsert_search_attributes"],
                     "upsert_memo": ["workflows/state.py:workflow.upsert_memo"]}


def test_the_turn_state_only_reads_the_machine() -> None:
    """TurnState's phase, pending calls, decisions and steer are properties
    without a setter (writing one raises), reading the machine's views."""
    from turnstile.workflows.state import TurnState

    for name in GUARDED - {"phase", "machine"}:
        prop = getattr(TurnState, name)
        assert isinstance(prop, property) and prop.fset is None, name


# -- at run time: a move the machine refuses ends the turn, typed --------------------
class IllegalBegin(Interceptor):
    """Test double: when the turn schedules its model call, workflow code asks
    the turn's real machine to begin again — a move its table refuses."""

    def workflow_interceptor_class(
            self, input: WorkflowInterceptorClassInput) -> type[WorkflowInboundInterceptor]:
        return _Inbound


class _Inbound(WorkflowInboundInterceptor):
    def init(self, outbound: WorkflowOutboundInterceptor) -> None:
        super().init(_Outbound(outbound))


class _Outbound(WorkflowOutboundInterceptor):
    def start_activity(self, input: StartActivityInput) -> workflow.ActivityHandle[Any]:
        if input.activity == io.CALL_MODEL and workflow.info().workflow_id.startswith(
                "illegal-"):
            workflow.instance().s.machine.begin()
        return super().start_activity(input)


async def test_an_illegal_move_in_a_turn_ends_it_failed_without_a_hang(
        client: Client, task_queue: str, sqlite_url: str, fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(text_reply("again"))  # the next turn's: the refused one asks nothing
    conversation = f"c-{uuid.uuid4().hex[:6]}"
    async with running_worker(client, task_queue, sqlite_url, [make_service()],
                              llm_url=fake_llm.url,
                              interceptors=[DataErrors(), IllegalBegin()]) as turns:
        handle = await turns.start("hello", conversation=conversation,
                                   workflow_id=f"illegal-{uuid.uuid4().hex[:8]}")
        result = await asyncio.wait_for(handle.result(), timeout=60)
        history = (await handle.fetch_history()).events
        after = await asyncio.wait_for(turns.run("again", conversation=conversation),
                                       timeout=60)
    assert result.status == TurnStatus.FAILED, result
    assert result.error is not None and result.error.type == "UnexpectedError"
    assert result.error.exception == IllegalTransition.__name__
    assert result.error.step == "model_call"
    assert "begin from model_call" in result.error.message
    assert not [e for e in history if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED]
    assert after.status == TurnStatus.COMPLETED, after.error
