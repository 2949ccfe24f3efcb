"""The README's "Your first tool and service", copied out of the README as
printed and run the way it says: TURNSTILE_APPS=my_agent:app, the real
worker.py and starter.py, a fresh database, the app's function model. The
turn completes with the tool's effect, and no sales table exists."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import sqlalchemy as sa

from tests.support.processes import kill_group, spawn, wait_for
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
    (tmp_path / "my_agent.py").write_text(readme_app())
    db_url = f"sqlite:///{tmp_path / 'fresh.db'}"
    env = {**os.environ, "TURNSTILE_APPS": "my_agent:app",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
           "DATABASE_URL": db_url, "TEMPORAL_ADDRESS": temporal_server.address,
           "TURNSTILE_TASK_QUEUE": f"readme-{uuid.uuid4().hex[:8]}",
           "TURNSTILE_DATA_DIR": str(tmp_path / "data"),
           "TURNSTILE_WORKER_VERSIONING": "off", "TURNSTILE_WORKFLOW_SANDBOX": "strict"}
    for name in ("LLM_BASE_URL", "TURNSTILE_PLUGINS", "TURNSTILE_MCP_SERVERS"):
        env.pop(name, None)
    log = tmp_path / "worker.log"
    worker = spawn([sys.executable, str(ROOT / "worker.py")], log, env=env, cwd=ROOT)
    try:
        wait_for(lambda: b"worker serving task queue" in log.read_bytes()
                 or worker.poll() is not None, 60, "the worker")
        assert worker.poll() is None, log.read_text()[-2000:]
        run = subprocess.run(
            [sys.executable, "starter.py", "run", "buy milk", "--user", "alice",
             "--conversation", "c-readme"],
            capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    finally:
        kill_group(worker)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Saved: buy milk" in run.stdout
    engine = sa.create_engine(db_url)
    try:
        tables = set(sa.inspect(engine).get_table_names())
        with engine.connect() as conn:
            saved = conn.execute(sa.text("SELECT text FROM note")).scalars().all()
    finally:
        engine.dispose()
    assert saved == ["buy milk"]
    assert "note" in tables and not tables & SALES_TABLES
    assert b"e-mail sender" not in log.read_bytes()  # no background process of the sales app
