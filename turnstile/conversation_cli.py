"""`python starter.py conversation show CONVERSATION_ID [--json]`: the
conversation as memory holds it (turnstile.stores.transcript) — a readable
transcript, or its JSON (`Transcript.model_validate_json` reads it back)."""

from __future__ import annotations

import argparse
import asyncio
import sys

from turnstile.runtime.config import Settings
from turnstile.stores.db import Database
from turnstile.stores.transcript import read_transcript


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("conversation", help="a conversation as memory holds it")
    show = p.add_subparsers(dest="action", required=True).add_parser(
        "show", help="messages, calls (arguments masked), results with their marks "
        "(rolled back, not run, repaired, superseded), approvals and who decided")
    show.add_argument("conversation_id")
    show.add_argument("--json", action="store_true", help="JSON instead of a transcript")


async def command(args: argparse.Namespace, settings: Settings) -> int:
    db = Database(settings.database_url, readonly_url=settings.database_readonly_url)
    transcript = await asyncio.to_thread(read_transcript, db, args.conversation_id)
    if not transcript.entries:
        sys.stderr.write(f"no conversation {args.conversation_id!r} in memory "
                         f"({settings.database_url})\n")
        return 1
    if args.json:
        sys.stdout.write(transcript.model_dump_json(indent=2) + "\n")
    else:
        sys.stdout.write("\n".join(transcript.lines()) + "\n")
    return 0
