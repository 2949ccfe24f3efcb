"""The README's "Your first tool and service", copied out of the README as
printed and run the way it says, in a folder of its own: TURNSTILE_APPS=my_agent:app,
`turnstile up` / `run` / `down` (the dev stack's worker against the test's
Temporal server), a fresh database in the folder's .data/, the app's function
model. The turn completes with the tool's effect, and no sales table exists;
the app edited while the stack runs, `turnstile up` restarts the worker with it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import sqlalchemy as sa

from tests.support.temporal_server import DevServer

ROOT = Path(__file__).resolve().parent.parent
SALES_TABLES = {"sales_record", "sales_daily_total", "follow_up_task", "email_task", "approver"}


def readme_app() -> str:
    readme = (ROOT / "README.md").read_text()
    shown = re.search(r"<!-- example: my_agent.py [^>]*-->\n```python\n(.*?)```", readme, re.S)
    assert shown is not None, "the README lost its first tool and service"
    return shown.group(1)


def test_the_readme_section_is_complete_code() -> None:
    code = readme_app()
    assert "from turnstile import" in code and "app = App(" in code
    compile(code, "my_agent.py", "exec")


async def test_the_first_app_runs_as_the_readme_says(tmp_path: Path,
                                                     temporal_server: DevServer) -> None:
    # In a folder of the user's own, not the checkout, and no PYTHONPATH: the
    # `turnstile` command of the installed package (`python -m turnstile`,
    # the console script's module), its data in the folder's .data/.
    (tmp_path / "my_agent.py").write_text(readme_app())
    db_url = f"sqlite:///{tmp_path / '.data' / 'turnstile.db'}"
    env = {**os.environ, "TURNSTILE_APPS": "my_agent:app",
           "TEMPORAL_ADDRESS": temporal_server.address,
           "TURNSTILE_TASK_QUEUE": f"readme-{uuid.uuid4().hex[:8]}",
           "TURNSTILE_WORKER_VERSIONING": "off", "TURNSTILE_WORKFLOW_SANDBOX": "strict",
           "TURNSTILE_WORKER_PROCESSES": "1"}
    for name in ("LLM_BASE_URL", "TURNSTILE_PLUGINS", "TURNSTILE_MCP_SERVERS", "PYTHONPATH",
                 "DATABASE_URL", "TURNSTILE_DATA_DIR"):
        env.pop(name, None)

    def turnstile(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "turnstile", *args], capture_output=True,
                              text=True, env=env, cwd=tmp_path, timeout=120)

    log = tmp_path / ".data" / "logs" / "worker.log"
    up = turnstile("up")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        run = turnstile("run", "buy milk", "--user", "alice", "--conversation", "c-readme")
        assert run.returncode == 0, run.stdout + run.stderr + log.read_text()[-2000:]
        # The app edited while the stack runs: `up` restarts the worker with it.
        (tmp_path / "my_agent.py").write_text(readme_app().replace('f"Saved: ', 'f"Noted: '))
        again = turnstile("up")
        assert again.returncode == 0, again.stdout + again.stderr
        assert "my_agent.py): restarting it" in again.stdout + again.stderr
        edited = turnstile("run", "buy bread", "--user", "alice", "--conversation", "c-readme")
    finally:
        down = turnstile("down")
    assert down.returncode == 0, down.stdout + down.stderr
    assert "Saved: buy milk" in run.stdout
    assert edited.returncode == 0, edited.stdout + edited.stderr + log.read_text()[-2000:]
    assert "Noted: buy bread" in edited.stdout
    engine = sa.create_engine(db_url)
    try:
        tables = set(sa.inspect(engine).get_table_names())
        with engine.connect() as conn:
            saved = conn.execute(sa.text("SELECT text FROM note")).scalars().all()
    finally:
        engine.dispose()
    assert saved == ["buy milk", "buy bread"]
    assert "note" in tables and not tables & SALES_TABLES
    assert b"e-mail sender" not in log.read_bytes()  # no background process of the sales app
