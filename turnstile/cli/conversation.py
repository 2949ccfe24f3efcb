"""`python starter.py conversation show CONVERSATION_ID [--json]`: the
conversation as memory holds it (turnstile.stores.transcript) — a readable
transcript, or its JSON (`Transcript.model_validate_json` reads it back).

`python starter.py conversation quarantine CONVERSATION_ID SEQ [--by NAME]
[--reason TEXT] [--force]`: sets a damaged row aside (turnstile.stores.damage;
`starter.py check` lists them as `damaged: ...`): the row is kept in
`quarantined_message` with who set it aside, when and why, and leaves memory,
so the conversation's next turn reads without it (docs/operating.md)."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import logging
import sys

from turnstile.engine.errors import DamagedRow
from turnstile.engine.turn_input_rules import clean_note, id_problem
from turnstile.runtime.config import Settings
from turnstile.stores.db import Database
from turnstile.stores.engines import dispose_engines
from turnstile.stores.quarantine import NotDamaged, quarantine as set_aside
from turnstile.stores.transcript import read_transcript

log = logging.getLogger("turnstile.quarantine")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("conversation", help="a conversation as memory holds it")
    actions = p.add_subparsers(dest="action", required=True)
    show = actions.add_parser(
        "show", help="messages, calls (arguments masked), results with their marks "
        "(rolled back, not run, repaired, superseded), approvals and who decided")
    show.add_argument("conversation_id")
    show.add_argument("--json", action="store_true", help="JSON instead of a transcript")
    q = actions.add_parser(
        "quarantine", help="set a damaged row aside (kept in quarantined_message with who, "
        "when and why; out of memory), so the conversation's next turn can run")
    q.add_argument("conversation_id")
    q.add_argument("seq", type=int)
    q.add_argument("--by", default=None, help="who sets it aside (default: the OS user)")
    q.add_argument("--reason", default=None, help="why (default: the damage found)")
    q.add_argument("--force", action="store_true",
                   help="set the row aside even when it is not damaged")


async def command(args: argparse.Namespace, settings: Settings) -> int:
    db = Database(settings.database_url, readonly_url=settings.database_readonly_url)
    if args.action == "quarantine":
        try:
            return await asyncio.to_thread(quarantine, db, args)
        finally:
            dispose_engines()
    try:
        transcript = await asyncio.to_thread(read_transcript, db, args.conversation_id)
    except DamagedRow as exc:  # named, with the command that sets it aside
        sys.stderr.write(f"{exc}\n")
        return 1
    if not transcript.entries:
        sys.stderr.write(f"no conversation {args.conversation_id!r} in memory "
                         f"({settings.database_url})\n")
        return 1
    if args.json:
        sys.stdout.write(transcript.model_dump_json(indent=2) + "\n")
    else:
        sys.stdout.write("\n".join(transcript.lines()) + "\n")
    return 0


def quarantine(db: Database, args: argparse.Namespace) -> int:
    """Exit 0: set aside; 1: no such row; 2: not damaged (without --force),
    or no valid name for who sets it aside."""
    by = args.by if args.by is not None else getpass.getuser()
    problem = id_problem("--by", by)
    if problem is not None:
        sys.stderr.write(f"starter.py conversation quarantine: {problem}\n")
        return 2
    reason = clean_note(args.reason) if args.reason else None
    try:
        done = set_aside(db, args.conversation_id, args.seq, by, reason, force=args.force)
    except LookupError as exc:
        sys.stderr.write(f"{exc}\n")
        return 1
    except NotDamaged as exc:
        sys.stderr.write(f"{exc}\n")
        return 2
    log.warning("conversation %s: row at seq %d set aside by %s (%s)", done.conversation_id,
                done.seq, done.by, done.reason)
    sys.stdout.write(f"quarantined: {done.conversation_id} seq {done.seq} by {done.by} at "
                     f"{done.at}: {done.reason}\n")
    return 0
