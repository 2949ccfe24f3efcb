"""`turnstile`, the console script: `turnstile worker [--app MOD:ATTR ...]`
runs the worker (turnstile.cli.worker); every other command (`up`, `down`,
`run`, `approve`, `reject`, `conversation show`, `check`, `audit`, `inbox`,
...) is turnstile.cli.starter's, with the same arguments as
`python starter.py` in the repository. Settings come from the environment,
as for the worker (docs/contract.md).

The working directory is put first on the import path, as `python -m` does,
so `--app myapp:app` (or TURNSTILE_APPS) finds the modules of the folder the
command runs in."""

from __future__ import annotations

import os
import sys

USAGE = """usage: turnstile COMMAND [ARGS ...]

  turnstile worker [--app MOD:ATTR ...] [--no-sender | --sender-only] [--processes N]
  turnstile up | down                  the embedded dev stack (Temporal, dev services, worker)
  turnstile run MESSAGE [--conversation ID] [--user ID] [--auto-approve REVIEWER]
  turnstile approve | reject WORKFLOW_ID TOOL_CALL_ID --reviewer NAME [--arguments JSON]
  turnstile conversation show CONVERSATION_ID [--json]
  turnstile grants list [--all] [--json] | grants revoke GRANT_ID [--by NAME]
  turnstile check | audit | usage | inbox | seed | status | pending | stream ...

`turnstile COMMAND --help` says more. Settings: the TURNSTILE_* and TEMPORAL_*
environment (docs/contract.md)."""


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE)
        raise SystemExit(0 if args else 2)
    if args[0] == "worker":
        from turnstile.cli import worker

        worker.main(args[1:])
        return
    from turnstile.cli import starter

    starter.run_main(args)


if __name__ == "__main__":
    main()
