"""`python starter.py grants list|revoke ID` (and `turnstile grants ...`):
the standing approvals (docs/approvals.md, "Standing approvals (grants)").
Constraint values and scope keys are shown masked, as the audit log shows
arguments."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
from typing import Any

from turnstile.cli.printing import out, table
from turnstile.engine.grant_models import Grant
from turnstile.engine.identity import name_problem
from turnstile.engine.masking import mask_json_text, mask_text
from turnstile.runtime.config import Settings
from turnstile.stores import grant_store
from turnstile.stores.db import Database
from turnstile.stores.engines import dispose_engines

COLUMNS = ["grant_id", "tool_name", "scope", "constraints", "uses", "until", "issued_by",
           "state"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("grants", help="standing approvals: list them, revoke one")
    verbs = p.add_subparsers(dest="grants_cmd", required=True)
    p_list = verbs.add_parser("list", help="the live grants (--all: revoked, expired and "
                                          "used up too)")
    p_list.add_argument("--all", action="store_true")
    p_list.add_argument("--json", action="store_true")
    p_revoke = verbs.add_parser("revoke", help="revoke a grant: it covers no call from now")
    p_revoke.add_argument("grant_id")
    p_revoke.add_argument("--by", default=None, help="who revokes (default: the login name)")
    p_revoke.add_argument("--reason", default="")


def shown(grant: Grant) -> dict[str, Any]:
    """A grant as the command prints it: masked, one line's worth."""
    data = grant.model_dump(mode="json")
    constraints = json.dumps(data["constraints"], sort_keys=True, separators=(",", ":"))
    state = (f"revoked by {grant.revoked_by}" if grant.revoked_at else
             "used up" if grant.uses_left == 0 else "live")
    return {**data, "constraints": mask_json_text(constraints),
            "scope": f"{grant.scope.value}:{mask_text(grant.scope_key)}",
            "uses": f"{grant.uses}/{grant.max_uses}", "state": state}


async def command(args: argparse.Namespace, settings: Settings) -> int:
    db = Database(settings.database_url, readonly_url=settings.database_readonly_url)
    try:
        if args.grants_cmd == "list":
            grants = await asyncio.to_thread(grant_store.listed, db, include_ended=args.all)
            rows = [shown(g) for g in grants]
            if args.json:
                for row in rows:
                    out(json.dumps(row, sort_keys=True))
                return 0
            out(f"{len(rows)} grant(s){' (all)' if args.all else ' (live)'}")
            for line in table(rows, COLUMNS) if rows else []:
                out(line)
            return 0
        by = (args.by or getpass.getuser()).strip()
        problem = name_problem(by) if by else "empty"
        if problem:
            out(f"revoke refused: {by!r} is {problem}")
            return 2
        try:
            grant = await asyncio.to_thread(grant_store.revoke, db, args.grant_id, by,
                                            args.reason)
        except grant_store.GrantNotFound as err:
            out(f"revoke refused: {err}")
            return 1
        out(f"grant {grant.grant_id} revoked by {grant.revoked_by} at {grant.revoked_at} "
            f"({grant.uses}/{grant.max_uses} uses taken)")
        return 0
    finally:
        dispose_engines()
