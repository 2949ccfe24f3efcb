"""One pair as a real turn, then AgentDojo's own checks on what it left.

The run's environment is put in the database (`store`), the user task's
prompt starts a turn of the pair's service, and a reviewer (if any) answers
the calls that wait for approval through the public review API, as the inbox
does. Then AgentDojo's utility and security functions read the final
environment, with traces built from the calls that actually ran.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from typing import Any

from temporalio.service import RPCError

from agentdojo.base_tasks import BaseInjectionTask, BaseUserTask
from agentdojo.functions_runtime import FunctionCall, TaskEnvironment
from bench.agentdojo import reviewer as perfect, store, suites
from bench.agentdojo.app import service_name
from turnstile import Database, TurnHandle, TurnInput, TurnstileClient
from turnstile.engine.contract import PendingApproval
from turnstile.engine.flow import untrusted_arguments

REVIEWERS = ("none", "perfect")
USER = "dojo-user"
TURN_TIMEOUT_SECONDS = 300.0
POLL_SECONDS = 0.25  # how often the reviewer looks for calls waiting


@dataclass
class Review:
    tool: str
    arguments: dict[str, Any]
    benign: bool  # serves the user task
    approved: bool
    # The sensitive arguments whose values came from untrusted content (none:
    # the call waited for another reason, e.g. `requires_approval`), and for
    # each where its untrusted value first appeared ("tool:read_file",
    # "retrieval", ...), as the pending item's provenance says.
    untrusted: list[str] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)


def review_of(p: PendingApproval, benign: bool, approved: bool) -> Review:
    """The bench's record of a call that waited."""
    args = p.arguments if isinstance(p.arguments, dict) else {}
    untrusted = untrusted_arguments(p.provenance)
    sources = {}
    for name in untrusted:
        first = next((s for s in p.provenance.get(name, []) if not s.trusted), None)
        if first is not None:
            sources[name] = first.kind + (f":{first.tool_name}" if first.tool_name else "")
    return Review(p.tool_name, args, benign, approved, untrusted, sources)


@dataclass
class Outcome:
    pair: suites.Pair
    model: str
    status: str
    utility: bool
    attacked: bool | None  # the injection task's security check (None: no injection)
    calls: int  # calls that ran
    effects: int  # calls that changed the environment
    applied_twice: int  # call keys applied more than once
    reviews: list[Review] = field(default_factory=list)
    error: str = ""


async def run_pair(client: TurnstileClient, db: Database, pair: suites.Pair, model: str,
                   reviewer: str) -> Outcome:
    run_id = f"dojo-{uuid.uuid4().hex[:12]}"
    start = suites.start_environment(pair)
    pre = start.model_copy(deep=True)
    await asyncio.to_thread(store.put, db, run_id, pair.suite, start)
    task = suites.user_task(pair.suite, pair.user_task)
    turn = await client.start_turn(TurnInput(
        conversation_id=run_id, user_id=USER, message=task.PROMPT,
        service=service_name(pair.suite, model)))
    result = asyncio.ensure_future(turn.result())
    reviews: dict[str, Review] = {}
    try:
        async with asyncio.timeout(TURN_TIMEOUT_SECONDS):
            while not result.done():
                for p in await _pending(turn):
                    if p.tool_call_id in reviews:
                        continue
                    args = p.arguments if isinstance(p.arguments, dict) else {}
                    benign = perfect.serves_user_task(pair, p.tool_name, args)
                    # No reviewer: nobody ever approves; the call is refused.
                    approve = reviewer == "perfect" and benign
                    reviews[p.tool_call_id] = review_of(p, benign, approve)
                    note = ("no reviewer" if reviewer == "none" else
                            "serves the user's task" if approve else
                            "does not serve the user's task")
                    await client.review(turn.id, p.tool_call_id, approve, perfect.NAME, note)
                await asyncio.wait([result], timeout=POLL_SECONDS)
    finally:
        if not result.done():
            result.cancel()
    ended = result.result()
    answer = ended.answer if isinstance(ended.answer, str) else str(ended.answer or "")
    post = await asyncio.to_thread(store.environment, db, run_id)
    ran = await asyncio.to_thread(store.applied, db, run_id)
    traces = store.traces(ran)
    keys = [c.call_key for c in ran]
    utility = check(task, answer, pre, post, traces)
    attacked = None
    if pair.injection_task is not None:
        attacked = check(suites.injection_task(pair.suite, pair.injection_task),
                         answer, pre, post, traces)
    return Outcome(pair=pair, model=model, status=str(ended.status), utility=utility,
                   attacked=attacked, calls=len(ran), effects=sum(c.changed for c in ran),
                   applied_twice=len(keys) - len(set(keys)), reviews=list(reviews.values()),
                   error=ended.error.message if ended.error else "")


async def _pending(turn: TurnHandle) -> list[PendingApproval]:
    """The calls waiting; none while no worker answers the query (killed)."""
    try:
        return await turn.pending()
    except RPCError:
        return []


def check(task: BaseUserTask[Any] | BaseInjectionTask[Any], answer: str,
          pre: TaskEnvironment, post: TaskEnvironment, traces: list[FunctionCall]) -> bool:
    """AgentDojo's check of a task, as its TaskSuite runs it: from the traces
    when the task checks those, else from the environments (strict)."""
    if isinstance(task, BaseUserTask):
        by_traces = task.utility_from_traces(answer, pre, post, traces)
        return bool(by_traces if by_traces is not None else task.utility(answer, pre, post))
    by_traces = task.security_from_traces(answer, pre, post, traces)
    return bool(by_traces if by_traces is not None else task.security(answer, pre, post))
