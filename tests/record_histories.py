"""Record the histories replayed by tests/test_replay.py.

    .venv/bin/python -m tests.record_histories [NAME ...]

Runs the main scenarios — the demo turn (offline planner, approval, e-mail
queued), an approval rejection, a compensation, a breaker trip, an answer
cut twice at the length limit (continuation, then `truncated`), an answer
withheld by the provider's content filter — and the paths of approvals v2
(docs/steering.md, docs/approvals.md): a turn waiting for an approval steered
by a new message (`steered`) and the new turn that steered it
(`steered_new_turn`), a turn queued behind one waiting for an approval
(`queued`), a new message refused meanwhile (`new_message_refused`), and an
e-mail approved with the reviewer's edits through the `review` update
(`approved_with_edits`), and the repeat breaker by meaning
(`repeat_by_meaning`, revision 5) and dead ends (`dead_end_recovered`,
`dead_end_calls`, revision 6), information-flow rules (`flow_review`,
`flow_refused`, revision 7) and standing approvals (`grant_issued`,
`grant_covered`, revision 8) and made-up tool results
(`fabricated_result_reasked`, `fabricated_result_failed`, revision 9) and
the same read over and over (`same_reads_answered`, revision 10) — on
a fresh dev server and writes each history to tests/histories/NAME.json (only
the NAMEs given, if any). Commit the files: replaying them on every run makes
a workflow change that would break turns in flight fail CI. Re-record only
for a deliberate, versioned change (turnstile.engine.versions: bump
TURN_VERSION, keep the old files in tests/histories/v<N>/ for
tests/test_upgrade.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import tempfile
from collections.abc import Awaitable, Callable
from datetime import date
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowHandle, WorkflowQueryFailedError
from temporalio.service import RPCError

from tests import test_information_flow as flow_desk
from tests.support.processes import free_port
from tests.support.services import make_service
from tests.support.temporal_server import DevServer, connect
from tests.support.turns import Turns, running_worker, wait_pending
from turnstile.engine.approvals import arguments_digest
from turnstile.engine.contract import (
    ApproveSignal,
    Handlers,
    PendingApproval,
    RejectSignal,
    ReviewInput,
    TurnPhase,
    TurnProgress,
)
from turnstile.engine.grant_models import Equals, GrantRequest
from turnstile.engine.model_settings import ModelSettings
from turnstile.providers.function_model import FunctionModel
from turnstile.runtime.services import Service
from turnstile.sales.planner import demo_planner
from turnstile.sales.seed import seed
from turnstile.sales.service import build_sales_service
from turnstile.stores.db import Database
from turnstile.stores.schema import ensure_schema
from turnstile.testing import FakeOpenAIServer, text_reply, tool_reply

OUT = Path(__file__).parent / "histories"
MEASURED = Path(__file__).parent.parent / (
    "bench/results/real_model/llama-server-1.5b-text-calls.json")
DEMO = "Find customers whose sales last week exceeded 50,000 and email ops@example.com to follow up"
TODAY = date(2026, 11, 25)


async def approve_all(handle: WorkflowHandle, reviewer: str, approve: bool = True) -> None:
    done: set[str] = set()
    while True:
        try:
            await asyncio.wait_for(asyncio.shield(handle.result()), 0.1)
            return
        except TimeoutError:
            pass
        for p in await handle.query("pending_approvals", result_type=list[PendingApproval]):
            if p.tool_call_id in done:
                continue
            done.add(p.tool_call_id)
            signal: Any = (ApproveSignal(tool_call_id=p.tool_call_id, reviewer=reviewer)
                           if approve else RejectSignal(tool_call_id=p.tool_call_id,
                                                        reviewer=reviewer, reason="no"))
            await handle.signal("approve" if approve else "reject", signal)


async def save(name: str, handle: WorkflowHandle) -> None:
    await handle.result()
    history = await handle.fetch_history()
    (OUT / f"{name}.json").write_text(history.to_json())
    logging.info("recorded %s (%d events)", name, len(history.events))


def ended(text: str | None, reason: str) -> dict[str, Any]:
    reply = text_reply(text or "")
    reply["choices"][0]["finish_reason"] = reason
    reply["choices"][0]["message"]["content"] = text
    return reply


async def scenario(client: Client, fake: FakeOpenAIServer, tmp: Path, name: str,
                   services: list, provider: Any,  # type: ignore[type-arg]
                   body: Callable[[Turns], Awaitable[WorkflowHandle]]) -> None:
    if sys.argv[1:] and name not in sys.argv[1:]:
        return
    async with running_worker(client, f"rec-{name}", f"sqlite:///{tmp}/{name}.db", services,
                              provider=provider, llm_url=None if provider else fake.url) as turns:
        await save(name, await body(turns))


async def scenarios(client: Client, fake: FakeOpenAIServer, tmp: Path, names: list[str],
                    services: list[Service],
                    body: Callable[[Turns], Awaitable[list[WorkflowHandle]]]) -> None:
    """A scenario of several turns on one worker: one history per name, in
    the order `body` returns their handles."""
    if sys.argv[1:] and not set(names) & set(sys.argv[1:]):
        return
    async with running_worker(client, f"rec-{names[0]}", f"sqlite:///{tmp}/{names[0]}.db",
                              services, llm_url=fake.url) as turns:
        handles = await body(turns)
        for name, handle in zip(names, handles, strict=True):
            await save(name, handle)


def mail(call_id: str, subject: str, to: str = "ops@example.com") -> dict[str, Any]:
    return tool_reply((call_id, "createEmailTask", {"to": to, "subject": subject,
                                                    "body": "Please follow up."}))


def sales_service(on_new_message: str) -> Service:
    service = build_sales_service()
    service.on_new_message = on_new_message  # type: ignore[assignment]
    return service


async def queued_status(handle: WorkflowHandle) -> None:
    """Until the turn says it is queued (it has begun and found the
    conversation held)."""
    for _ in range(400):
        try:
            seen = await handle.query(Handlers.STATUS, result_type=TurnProgress)
            if seen.step == TurnPhase.QUEUED:
                return
        except (RPCError, WorkflowQueryFailedError):  # no workflow task has run yet
            pass
        await asyncio.sleep(0.05)
    raise TimeoutError(f"{handle.id} never said it was queued")


async def record_approvals_v2(client: Client, fake: FakeOpenAIServer, tmp: Path) -> None:
    """Steer, queue, refuse (docs/steering.md) and approve with edits."""

    async def steered(turns: Turns) -> list[WorkflowHandle]:
        fake.script(mail("e1", "Old subject"), mail("e2", "New subject"),
                    text_reply("Queued the new mail."))
        waiting = await turns.start("mail ops", service="sales-assistant",
                                    conversation="c-steer", workflow_id="steered")
        await wait_pending(waiting)
        new = await turns.start("no wait: use the subject 'New subject'",
                                service="sales-assistant", conversation="c-steer",
                                workflow_id="steered-new-turn")
        await waiting.result()
        await approve_all(new, "ops-lead")
        return [waiting, new]

    await scenarios(client, fake, tmp, ["steered", "steered_new_turn"],
                    [sales_service("steer")], steered)

    async def queued(turns: Turns) -> list[WorkflowHandle]:
        fake.script(mail("e1", "One"), text_reply("Mail queued."), text_reply("Hello."))
        waiting = await turns.start("mail one", service="sales-assistant",
                                    conversation="c-queue", workflow_id="queue-holder")
        await wait_pending(waiting)
        behind = await turns.start("hello?", service="sales-assistant",
                                   conversation="c-queue", workflow_id="queued")
        await queued_status(behind)
        await approve_all(waiting, "ops-lead")
        await behind.result()
        return [behind]

    await scenarios(client, fake, tmp, ["queued"], [sales_service("queue")], queued)

    async def refused(turns: Turns) -> list[WorkflowHandle]:
        fake.script(mail("e1", "One"), text_reply("Not sent."))
        waiting = await turns.start("mail one", service="sales-assistant",
                                    conversation="c-refuse", workflow_id="refuse-holder")
        await wait_pending(waiting)
        new = await turns.start("hello?", service="sales-assistant",
                                conversation="c-refuse", workflow_id="new-message-refused")
        await new.result()
        await approve_all(waiting, "ops-lead", approve=False)
        return [new]

    await scenarios(client, fake, tmp, ["new_message_refused"], [sales_service("refuse")],
                    refused)

    async def edited(turns: Turns) -> list[WorkflowHandle]:
        fake.script(mail("e1", "Renewal"), text_reply("Queued the edited mail."))
        h = await turns.start("remind ops", service="sales-assistant", conversation="c-edits",
                              workflow_id="approved-with-edits")
        [p] = await wait_pending(h)
        arguments = {**p.arguments, "to": "sales@example.com", "subject": "Renewal (final)"}
        await h.execute_update(Handlers.REVIEW, {
            "tool_call_id": p.tool_call_id, "reviewer": "bob", "approved": True,
            "note": "sales handles it", "arguments": arguments,
            "arguments_digest": arguments_digest(p.arguments)})
        return [h]

    await scenarios(client, fake, tmp, ["approved_with_edits"], [sales_service("steer")],
                    edited)


async def record_small_models(client: Client, fake: FakeOpenAIServer, tmp: Path) -> None:
    """The loop's rules for small models: a repeated effectful
    call settled without running, an empty answer asked for again, and calls
    written as text read as calls (`ModelSettings.text_tool_calls`)."""

    async def repeated(turns: Turns) -> WorkflowHandle:
        fake.script(tool_reply(("w1", "slowWrite", {"note": "k", "seconds": 0})),
                    tool_reply(("w2", "slowWrite", {"note": "k", "seconds": 0})),
                    text_reply("Written once."))
        return await turns.start("write k", workflow_id="repeat-breaker")

    await scenario(client, fake, tmp, "repeat_breaker", [make_service()], None, repeated)

    async def empty(turns: Turns) -> WorkflowHandle:
        fake.script(text_reply(""), text_reply("Nobody."))
        return await turns.start("who?", workflow_id="empty-answer")

    await scenario(client, fake, tmp, "empty_answer", [make_service()], None, empty)

    async def as_text(turns: Turns) -> WorkflowHandle:
        fake.script(text_reply('<tools>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n'
                               "</tools>"), text_reply("3"))
        return await turns.start("add 1 and 2", workflow_id="text-tool-calls")

    service = make_service()
    service.model = ModelSettings(text_tool_calls=True, tool_results="text")
    await scenario(client, fake, tmp, "text_tool_calls", [service], None, as_text)


async def record_by_meaning(client: Client, fake: FakeOpenAIServer, tmp: Path) -> None:
    """Revision 5: the repeat breaker by meaning. One sales turn:
    an e-mail, the same one with the address in capitals (a repeat, never
    reviewed), one with another subject (reviewed, with the first among its
    `similar_effects`), then two in one response that differ by a trailing
    space (the second waits for the first and is its repeat)."""

    async def by_meaning(turns: Turns) -> WorkflowHandle:
        fake.script(mail("e1", "Follow up"), mail("e2", "Follow up", to="OPS@example.com"),
                    mail("e3", "Second"),
                    tool_reply(("e4", "createEmailTask", {"to": "ops@example.com",
                                                          "subject": "Third",
                                                          "body": "Please follow up."}),
                               ("e5", "createEmailTask", {"to": "ops@example.com",
                                                          "subject": "Third ",
                                                          "body": "Please follow up."})),
                    text_reply("Three e-mails queued."))
        h = await turns.start("mail ops", service="sales-assistant",
                              workflow_id="repeat-by-meaning", conversation="c-meaning")
        await approve_all(h, "ops-lead")
        return h

    await scenario(client, fake, tmp, "repeat_by_meaning", [build_sales_service()], None,
                   by_meaning)


async def record_dead_ends(client: Client, fake: FakeOpenAIServer, tmp: Path) -> None:
    """Revision 6: dead ends. `dead_end_recovered`: a tool that
    fails three times is disabled and no longer offered, a call without the
    arguments its tool needs, a bare `functions.echo:`, the request without
    tools, an answer. `dead_end_calls`: the llama-cpp-python finding — a real
    e-mail, then `functions.createEmailTask:` until the turn ends
    `DeadEndCalls`."""

    async def recovered(turns: Turns) -> WorkflowHandle:
        fake.script(*[tool_reply((f"f{i}", "refuses", {})) for i in range(3)],
                    tool_reply(("e1", "echo", {})), text_reply("functions.echo:"),
                    text_reply("Nothing could be done."))
        return await turns.start("try", workflow_id="dead-end-recovered")

    await scenario(client, fake, tmp, "dead_end_recovered", [make_service()], None, recovered)

    async def stopped(turns: Turns) -> WorkflowHandle:
        fake.script(text_reply("functions.createEmailTask:\n" + json.dumps(
                        {"to": "ops@example.com", "subject": "Follow up", "body": "C0001"})),
                    *[text_reply("functions.createEmailTask:") for _ in range(6)])
        h = await turns.start("mail ops", service="sales-assistant",
                              workflow_id="dead-end-calls", conversation="c-dead-end")
        await approve_all(h, "ops-lead")
        return h

    service = build_sales_service()
    service.model = ModelSettings(text_tool_calls=True, tool_results="text")
    await scenario(client, fake, tmp, "dead_end_calls", [service], None, stopped)


async def record_flow(client: Client, fake: FakeOpenAIServer, tmp: Path) -> None:
    """Revision 7: information-flow rules, on the desk of
    tests/test_information_flow.py with its compromised model.
    `flow_review`: an e-mail to the address a read message injected waits
    for a reviewer shown where it came from, and is approved. `flow_refused`:
    a payment to the IBAN it injected is refused, and the model is told."""

    def on(name: str, message: str, approve: bool) -> Callable[[Turns], Awaitable[
            WorkflowHandle]]:
        async def body(turns: Turns) -> WorkflowHandle:
            flow_desk.prepared(f"sqlite:///{tmp}/{name}.db")
            h = await turns.start(message, service="flow", workflow_id=name.replace("_", "-"),
                                  conversation=f"c-{name}")
            if approve:
                await approve_all(h, "ops-lead")
            return h
        return body

    provider = FunctionModel(flow_desk.compromised)
    await scenario(client, fake, tmp, "flow_review", [flow_desk.desk()], provider,
                   on("flow_review", "summarise my inbox", approve=True))
    await scenario(client, fake, tmp, "flow_refused", [flow_desk.desk()], provider,
                   on("flow_refused", "check my inbox and pay what it says", approve=False))


async def record_grants(client: Client, fake: FakeOpenAIServer, tmp: Path) -> None:
    """Revision 8: standing approvals. `grant_issued`: two e-mails to ops in
    one response; the first is approved through the `review` update with a
    grant (issue_grant), which then covers the second (claimed at once).
    `grant_covered`: the next turn's e-mail to ops runs under the grant,
    no reviewer asked (claim_grant)."""

    async def granted(turns: Turns) -> list[WorkflowHandle]:
        fake.script(tool_reply(("g1", "createEmailTask", {"to": "ops@example.com",
                                                          "subject": "One",
                                                          "body": "Please follow up."}),
                               ("g2", "createEmailTask", {"to": "ops@example.com",
                                                          "subject": "Two",
                                                          "body": "Please follow up."})),
                    text_reply("Two e-mails queued."))
        first = await turns.start("mail ops twice", service="sales-assistant",
                                  workflow_id="grant-issued", conversation="c-grant")
        [p, _] = await wait_pending(first, 2)
        await first.execute_update(Handlers.REVIEW, ReviewInput(
            tool_call_id=p.tool_call_id, reviewer="ops-lead", approved=True,
            grant=GrantRequest(uses=3, constraints={"to": Equals(value="ops@example.com")})))
        await first.result()
        fake.script(mail("g3", "Three"), text_reply("Queued."))
        second = await turns.start("mail ops again", service="sales-assistant",
                                   workflow_id="grant-covered", conversation="c-grant")
        await second.result()
        return [first, second]

    await scenarios(client, fake, tmp, ["grant_issued", "grant_covered"],
                    [build_sales_service()], granted)


async def record_fabricated_results(client: Client, fake: FakeOpenAIServer, tmp: Path) -> None:
    """Revision 9: a tool result the model wrote itself, on the sales app with
    the measured settings. `fabricated_result_reasked`: the measured reply (a
    made-up `<tool_response>` for a createEmailTask never called) is
    discarded, the model asked once more without tools, and its honest answer
    completes the turn. `fabricated_result_failed`: the same reply again after
    the ask: `FabricatedToolResult`. (`fabricated_result_before`, the same
    reply completing a turn begun at revision 8, was recorded with that
    revision's code, commit 7f9f22c, by the `reasked` scenario; this code
    records such a turn at revision 9.)"""
    made_up = json.loads(MEASURED.read_text())[3]["answer"]
    service = build_sales_service()
    service.model = ModelSettings(text_tool_calls=True, tool_results="text")

    def made_up_then(*then: str) -> Callable[[Turns], Awaitable[WorkflowHandle]]:
        name = "fabricated-result-" + ("reasked" if then else "failed")

        async def body(turns: Turns) -> WorkflowHandle:
            fake.script(text_reply(made_up), *[text_reply(t) for t in then or (made_up,)])
            return await turns.start("mail ops the customers", service="sales-assistant",
                                     workflow_id=name, conversation=f"c-{name}")
        return body

    await scenario(client, fake, tmp, "fabricated_result_reasked", [service], None,
                   made_up_then("I did not e-mail ops: no e-mail was sent."))
    await scenario(client, fake, tmp, "fabricated_result_failed", [service], None,
                   made_up_then())


async def record_same_reads(client: Client, fake: FakeOpenAIServer, tmp: Path,
                            name: str) -> None:
    """A model that reads the same thing again and again: `add` (repeatable)
    with the same arguments in every response while `add` is offered, a
    plain answer once it is not; a round-trip cap of 5. Recorded at revision
    9 as `same_reads_before` (five reads, the sixth stopped by the cap:
    `RoundTripCapExceeded`; commit 5b7f429), and from revision 10 as
    `same_reads_answered` (three reads, then `add` withheld and the answer)."""

    def model(request: dict[str, Any]) -> dict[str, Any]:
        if "add" not in [t["function"]["name"] for t in request.get("tools", [])]:
            return text_reply("The sum is 5.")
        return tool_reply((f"s{len(request['messages'])}", "add", {"a": 2, "b": 3}))

    async def body(turns: Turns) -> WorkflowHandle:
        fake.default = model
        try:
            h = await turns.start("add 2 and 3", workflow_id=name.replace("_", "-"),
                                  conversation=f"c-{name}")
            await h.result()
        finally:
            fake.default = None
        return h

    await scenario(client, fake, tmp, name, [make_service(max_round_trips=5)], None, body)


async def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    OUT.mkdir(exist_ok=True)
    server = DevServer(free_port(), Path(tempfile.mkdtemp()) / "server.log")
    fake = FakeOpenAIServer()
    try:
        client = await connect(server.address)
        tmp = Path(tempfile.mkdtemp())
        db = Database(f"sqlite:///{tmp}/demo.db")
        ensure_schema(db)
        seed(db, rows=2000, today=TODAY)

        async def demo(turns: Turns) -> WorkflowHandle:
            h = await turns.start(DEMO, service="sales-assistant", workflow_id="demo-turn",
                                  conversation="c-demo")
            await approve_all(h, "ops-lead")
            return h

        await scenario(client, fake, tmp, "demo", [build_sales_service()],
                       demo_planner(today=lambda: TODAY), demo)

        async def rejected(turns: Turns) -> WorkflowHandle:
            fake.script(tool_reply(("p1", "sendMoneySlowly", {"to": "bob", "amount": 3})),
                        text_reply("not paid"))
            h = await turns.start("pay bob", workflow_id="approval-rejected")
            await approve_all(h, "carol", approve=False)
            return h

        await scenario(client, fake, tmp, "approval_rejected", [make_service()], None, rejected)

        async def compensation(turns: Turns) -> WorkflowHandle:
            fake.script(tool_reply(("r1", "reserve", {"item": "table"})),
                        tool_reply(("r2", "reserve", {"item": "chairs"})),
                        tool_reply(("m1", "mustSucceed", {})))
            return await turns.start("book", workflow_id="compensation")

        await scenario(client, fake, tmp, "compensation", [make_service()], None, compensation)

        async def breaker(turns: Turns) -> WorkflowHandle:
            fake.default = lambda req: tool_reply((f"c{len(req['messages'])}", "add",
                                                   {"a": 1, "b": 1}))
            return await turns.start("busy", workflow_id="breaker-trip")

        await scenario(client, fake, tmp, "breaker_trip",
                       [make_service(breakers={"max_tool_executions": 3})], None, breaker)

        async def truncated(turns: Turns) -> WorkflowHandle:
            fake.script(ended("part one,", "length"), ended(" part two,", "length"))
            return await turns.start("tell it all", workflow_id="truncated")

        await scenario(client, fake, tmp, "truncated", [make_service()], None, truncated)

        async def filtered(turns: Turns) -> WorkflowHandle:
            fake.script(ended(None, "content_filter"))
            return await turns.start("something filtered", workflow_id="content-filtered")

        await scenario(client, fake, tmp, "content_filtered", [make_service()], None, filtered)
        await record_approvals_v2(client, fake, tmp)
        await record_small_models(client, fake, tmp)
        await record_by_meaning(client, fake, tmp)
        await record_dead_ends(client, fake, tmp)
        await record_flow(client, fake, tmp)
        await record_grants(client, fake, tmp)
        await record_fabricated_results(client, fake, tmp)
        await record_same_reads(client, fake, tmp, "same_reads_answered")
    finally:
        fake.close()
        server.stop()


if __name__ == "__main__":
    asyncio.run(main())
