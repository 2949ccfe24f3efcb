"""Start and follow turns from a terminal.

    python starter.py up|down                (the dev stack: what `make up` / `make down` run)
    python starter.py seed [--rows N]
    python starter.py run "<message>" [--conversation ID] [--user ID] [--service S]
    python starter.py status|pending WORKFLOW_ID
    python starter.py stream WORKFLOW_ID   (partial model text of a streaming service)
    python starter.py approve|reject WORKFLOW_ID TOOL_CALL_ID --reviewer NAME [--note TEXT]
                            [--digest HEX] [--arguments JSON (approve with edits)]
    python starter.py inbox [--host 127.0.0.1] [--port 8234] [--allow-dev-login-on-network]
    python starter.py audit [--since 1h] [--tool T] [--user U] [--status S] [--limit N]
                            [--top [--over N] | --failures] [--json]
    python starter.py usage [--since 7d|ISO] [--until ISO] [--user U] [--service S] [--json]
    python starter.py check [--conversation ID]
    python starter.py conversation show CONVERSATION_ID [--json]   (memory, readable)
    python starter.py grants list [--all] [--json]    (standing approvals)
    python starter.py grants revoke GRANT_ID [--by NAME] [--reason TEXT]
    python starter.py conversation quarantine CONVERSATION_ID SEQ [--by NAME] [--reason TEXT]
                            (set a damaged row aside; `check` lists them as `damaged:`)

One function a subcommand (`COMMANDS`); what they print is in turnstile.cli.printing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from temporalio.client import Client

from turnstile.cli import (
    arguments as cli_args,
    conversation as conversation_cli,
    grants as grants_cli,
)
from turnstile.cli.printing import (
    describe_pending,
    out,
    result_lines,
    signal_command,
)
from turnstile.cli.reports import audit, usage
from turnstile.client import (
    ApprovalRefused,
    ClientError,
    TurnHandle,
    TurnNotFound,
    TurnstileClient,
)
from turnstile.engine.contract import Handlers, TurnInput, TurnResult
from turnstile.runtime import log_masking
from turnstile.runtime.apps import App, AppLoadError, load_apps, tables_by_app, tables_of
from turnstile.runtime.client import TemporalUnreachable, connect, web_ui_url
from turnstile.runtime.config import Settings
from turnstile.stores.db import Database
from turnstile.stores.schema import upgrade

__all__ = ["COMMANDS", "main", "signal_command"]


def apps() -> list[App]:
    """The apps the worker serves (TURNSTILE_APPS): the dev stack runs their
    dev services, `seed` migrates with their tables and fills them."""
    return load_apps(Settings.from_env())


def default_service() -> str:
    """The service a turn naming none gets: the first app's first service."""
    return next((s.name for app in apps() for s in app.services), "")


@dataclass
class Context:
    """What every subcommand may use: the settings, and a Temporal client
    (the one handed in by a caller such as a test, or a new connection)."""

    settings: Settings
    client: Client | None = None

    def db(self) -> Database:
        s = self.settings
        return Database(s.database_url, readonly_url=s.database_readonly_url)

    async def temporal(self) -> Client:
        if self.client is None:
            self.client = await connect(self.settings)
        return self.client

    async def turns(self) -> TurnstileClient:
        # Every call to a turn goes through turnstile.client.
        return TurnstileClient(await self.temporal(), self.settings)


Command = Callable[[argparse.Namespace, Context], Awaitable[int]]


# -- turns ----------------------------------------------------------------------
async def run(args: argparse.Namespace, ctx: Context) -> int:
    """Start a turn; unless --no-follow, print its steps and its result."""
    turns = await ctx.turns()
    turn = TurnInput(conversation_id=args.conversation or f"c-{uuid.uuid4().hex[:8]}",
                     user_id=args.user, message=args.message, service=args.service)
    started = await turns.start_turn(turn, args.workflow_id)
    out(f"started {started.id} (conversation {turn.conversation_id})")
    out(f"Web UI: {web_ui_url(ctx.settings, started.id)}")
    if args.no_follow:
        return 0
    result = await follow(started, turns, auto_approve=args.auto_approve)
    for line in result_lines(result, web_ui_url(ctx.settings, result.workflow_id)):
        out(line)
    if args.show_effects and (turn.service or default_service()) == "sales-assistant":
        from turnstile.sales.report import report_effects

        await asyncio.to_thread(report_effects, ctx.db(), started.id,
                                ctx.settings.data_dir / "mail", out)
    return 0 if result.status.value == "completed" else 1


async def follow(turn: TurnHandle, turns: TurnstileClient,
                 auto_approve: str | None = None, poll: float = 0.25) -> TurnResult:
    """Print each step and tool call as it happens; return the result."""
    seen, announced = 0, set()
    result_task = asyncio.ensure_future(turn.result())
    while not result_task.done():
        try:
            progress = await turn.status()
        except Exception:  # noqa: BLE001 - not yet queryable (no workflow task run yet)
            progress = None
        if progress:  # absolute offsets: the turn keeps its latest events only
            for ev in progress.events[max(0, seen - progress.events_offset):]:
                out(f"  [{ev.step}] {ev.detail}")
            seen = progress.events_offset + len(progress.events)
            for p in progress.pending_approvals:
                if p.tool_call_id in announced:
                    continue
                announced.add(p.tool_call_id)
                for line in describe_pending(p):
                    out(line)
                out(f"  approve with:\n    {signal_command(turn.id, p, auto_approve or 'YOU')}")
                out(f"  reject with:\n    "
                    f"{signal_command(turn.id, p, auto_approve or 'YOU', Handlers.REJECT)}")
                if auto_approve:
                    out(f"  (demo: approving as {auto_approve!r})")
                    await review(turns, turn.id, True, p.tool_call_id, auto_approve,
                                 "approved by the make run demo")
        await asyncio.wait([result_task], timeout=poll)
    result = result_task.result()
    final = await turn.status()
    for ev in final.events[max(0, seen - final.events_offset):]:
        out(f"  [{ev.step}] {ev.detail}")
    return result


async def status(args: argparse.Namespace, ctx: Context) -> int:
    handle = (await ctx.turns()).turn(args.workflow_id)
    out((await handle.status()).model_dump_json(indent=2))
    return 0


async def pending(args: argparse.Namespace, ctx: Context) -> int:
    handle = (await ctx.turns()).turn(args.workflow_id)
    out(json.dumps([p.model_dump() for p in await handle.pending()], indent=2))
    return 0


async def stream(args: argparse.Namespace, ctx: Context) -> int:
    """Follow `turn_stream` (step 8) until the turn has ended."""
    from turnstile.stores.streaming import follow_stream

    handle = (await ctx.turns()).turn(args.workflow_id)

    def write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    await follow_stream(ctx.db(), handle.id, handle.running, write)
    out()
    return 0


async def approve(args: argparse.Namespace, ctx: Context) -> int:
    edited = None
    if getattr(args, "arguments", None) is not None:
        try:
            edited = json.loads(args.arguments)
        except ValueError as err:
            out(f"--arguments is not JSON: {err}")
            return 2
        if not isinstance(edited, dict):
            out("--arguments must be a JSON object: the complete edited arguments")
            return 2
    return await review(await ctx.turns(), args.workflow_id, args.cmd == "approve",
                        args.tool_call_id, args.reviewer, args.note, arguments=edited,
                        digest=getattr(args, "digest", None))


async def review(turns: TurnstileClient, workflow_id: str, approved: bool,
                 call_id: str, reviewer: str, note: str, *,
                 arguments: dict[str, object] | None = None, digest: str | None = None) -> int:
    """`approve`/`reject` through the `review` update (turnstile.client): print
    the decision that took effect, or the refusal and its reason (exit 1) —
    never "sent" (a reviewer name that is no identity, a lone surrogate from
    undecodable argv bytes included, is refused by the turn and audited).
    `arguments`: the reviewer's complete edited arguments;
    `digest`: the pending call's arguments_digest the reviewer saw."""
    verb = "approve" if approved else "reject"
    shown = call_id.encode("utf-8", "backslashreplace").decode("utf-8")  # argv's surrogates
    try:
        taken = await turns.review(workflow_id, call_id, approved, reviewer, note,
                                   arguments=arguments, arguments_digest=digest)
    except ApprovalRefused as err:
        out(f"{verb} refused for {shown}: {err.reason}")
        return 1
    except TurnNotFound as err:  # no such turn, or it has ended
        out(f"{verb} refused for {shown}: {err}")
        return 1
    verdict = ("approved with edits" if taken.arguments is not None else "approved"
               ) if taken.approved else "rejected"
    out(f"{taken.tool_name} {taken.tool_call_id} {verdict} by {taken.reviewer} "
        f"at {taken.decided_at}")
    return 0


# -- the database ------------------------------------------------------------------
async def seed(args: argparse.Namespace, ctx: Context) -> int:
    """Migrate with the served apps' tables, then fill each app's demo data."""
    db, served = ctx.db(), apps()
    upgrade(db, apps=tables_by_app(served))
    for app in served:
        if app.seed is not None:
            out(f"{app.name}: {app.seed(db, args.rows)} ({ctx.settings.database_url})")
    return 0


async def check(args: argparse.Namespace, ctx: Context) -> int:
    """Memory, journal, audit, approvals and the world tables agree? Exit 1 on
    a disagreement, 2 if Temporal cannot say whether a lock's holder runs.
    Consistent but worth a person's look: "note:" lines; a running turn's
    conversation: "skipped:"."""
    from turnstile.sales.check import check as check_all

    # Temporal is asked only about locked conversations.
    report = await check_all(ctx.db(), ctx.temporal, args.conversation,
                             tables_of(apps()))
    for line in report.lines():
        out(line)
    return report.exit_code


async def stack(args: argparse.Namespace, ctx: Context) -> int:
    """`make up` / `make down`: the dev stack with the apps' dev services."""
    from turnstile.runtime import devstack
    from turnstile.runtime.plugins import load_services

    served = apps()
    if args.cmd == "up":  # a plugin that cannot be imported: one line here, not the worker's log
        load_services(ctx.settings, [s for app in served for s in app.services])
    return await asyncio.to_thread(devstack.main, [args.cmd], served)


async def inbox(args: argparse.Namespace, ctx: Context) -> int:
    from turnstile.inbox.security import InboxConfigError
    from turnstile.inbox.web_app import serve

    try:
        await asyncio.to_thread(serve, args.host, args.port, args.allow_dev_login_on_network)
    except InboxConfigError as unsafe:
        out(f"refusing to start the inbox: {unsafe}")
        return 2
    return 0


async def conversation(args: argparse.Namespace, ctx: Context) -> int:
    return await conversation_cli.command(args, ctx.settings)


async def grants(args: argparse.Namespace, ctx: Context) -> int:
    return await grants_cli.command(args, ctx.settings)


COMMANDS: dict[str, Command] = {
    "up": stack, "down": stack,
    "seed": seed, "run": run, "status": status, "pending": pending, "stream": stream,
    "approve": approve, "reject": approve, "inbox": inbox, "audit": audit, "usage": usage,
    "check": check, "conversation": conversation, "grants": grants,
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("up", "down"):
        sub.add_parser(name, help=f"`make {name}`: the dev stack (turnstile.runtime.devstack)")
    sub.add_parser("seed", help="create the schema and fill the apps' demo data (the "
                   "sales app: sales_record)").add_argument("--rows", type=int, default=None)
    p_run = sub.add_parser("run", help="start a turn and follow it")
    p_run.add_argument("message")
    p_run.add_argument("--conversation", default=None)
    p_run.add_argument("--user", default="alice")
    p_run.add_argument("--service", default="",
                       help="default: the first service of the first app served")
    p_run.add_argument("--workflow-id", default=None)
    p_run.add_argument("--auto-approve", metavar="REVIEWER", default=None,
                       help="approve pending tool calls as REVIEWER (demo)")
    p_run.add_argument("--no-follow", action="store_true")
    p_run.add_argument("--show-effects", action="store_true",
                       help="afterwards, show the e-mail tasks, mails and audit rows (demo)")
    for name in ("status", "pending"):
        sub.add_parser(name).add_argument("workflow_id")
    sub.add_parser("stream", help="print a turn's partial model output as it arrives "
                   "(services with streaming on)").add_argument("workflow_id")
    for name in ("approve", "reject"):
        p_review = sub.add_parser(name)
        p_review.add_argument("workflow_id")
        p_review.add_argument("tool_call_id")
        p_review.add_argument("--reviewer", required=True)
        p_review.add_argument("--note", default="")
        p_review.add_argument("--digest", default=None,
                              help="the arguments_digest shown with the pending call: "
                                   "refused as stale if the call changed since")
        if name == "approve":
            p_review.add_argument("--arguments", default=None, metavar="JSON",
                                  help="approve with edits: the complete edited arguments")
    cli_args.add_audit(sub)
    cli_args.add_usage(sub)
    p_inbox = sub.add_parser("inbox", help="the approvals inbox in the browser")
    p_inbox.add_argument("--host", default="127.0.0.1")
    p_inbox.add_argument("--port", type=int, default=8234)
    p_inbox.add_argument("--allow-dev-login-on-network", action="store_true",
                         help="serve the development login (anyone may name themselves) on a "
                              "non-loopback --host anyway")
    sub.add_parser("check", help="compare memory, journal, audit, approvals and "
                   "the world tables; exit 1 on any disagreement or anything "
                   "awaiting repair, 2 if Temporal cannot say whether a lock's "
                   "holder runs").add_argument("--conversation", default=None)
    conversation_cli.add_parser(sub)
    grants_cli.add_parser(sub)
    return p


async def main(argv: list[str] | None = None, client: Client | None = None) -> int:
    args = parser().parse_args(argv)
    return await COMMANDS[args.cmd](args, Context(Settings.from_env(), client))


def run_main(argv: list[str] | None = None) -> None:
    """The command line (`turnstile COMMAND ...`, `python starter.py ...`): exits."""
    log_masking.setup(logging.WARNING, Settings.from_env().log_format,
                      text_format=logging.BASIC_FORMAT)
    try:
        code = asyncio.run(main(argv))
    except ClientError as refused:  # e.g. no such turn: one line, not a traceback
        print(f"error: {refused}", file=sys.stderr)
        code = 1
    except (TemporalUnreachable, AppLoadError) as unreachable:
        print(f"error: {unreachable}", file=sys.stderr)
        code = 2
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: the Temporal SDK's native runtime was seen to
    # crash there (SIGSEGV, 1 run in ~20 of `starter.py approve`) after the
    # command had done its work, turning a success into exit -11.
    os._exit(code)


if __name__ == "__main__":
    run_main()
