"""Turnstile as someone else's dependency: the wheel built from this checkout,
installed into a fresh virtualenv in a temporary folder outside it (only what
pip resolves from the index, at the versions of constraints.txt), holds the
`turnstile` namespace and nothing else top-level; its `turnstile` console
script serves and runs a turn of an app in that folder (`turnstile worker
--app loans:app`, `turnstile run`); the app's own script runs a turn with
turnstile.testing.TestStack, approved with edits; and the app's own tests
run there with plain `pytest` (pytest-asyncio, no settings file), one of them
on an HTTP model served by the kit's FakeOpenAIServer (the `testing`
extra). No PYTHONPATH, no file of this checkout but the wheel.

It needs the package index (or pip's cache): TURNSTILE_SKIP_INSTALL_TEST=1
skips it where there is none — never in CI (CI=true)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import uuid
import zipfile
from pathlib import Path

import pytest

from tests.support.processes import kill_group, spawn, wait_for
from tests.support.temporal_server import DevServer

ROOT = Path(__file__).resolve().parent.parent
OUTSIDE = Path(__file__).resolve().parent / "outside"

pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.skipif(os.environ.get("TURNSTILE_SKIP_INSTALL_TEST") == "1"
                       and os.environ.get("CI") != "true",
                       reason="TURNSTILE_SKIP_INSTALL_TEST=1: no package index here"),
]


def clean_env(**more: str) -> dict[str, str]:
    """The environment of a shell in the user's folder: nothing of this
    checkout's virtualenv, import path or settings."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")
           and not k.startswith(("TURNSTILE_", "TEMPORAL_", "LLM_"))
           and k not in ("DATABASE_URL", "SMTP_HOST", "SMTP_PORT")}
    return {**env, **more}


def build_wheel(into: Path) -> Path:
    """The wheel, built from a copy of the package's files (setuptools writes
    build/ and egg-info next to the sources: not into the checkout)."""
    src = into / "src"
    shutil.copytree(ROOT / "turnstile", src / "turnstile",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    # Built as pip builds it for an install: in an isolated environment with
    # the build-system requirements of pyproject.toml.
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "-w", str(into / "dist"), str(src)],
                   check=True, env=clean_env(), timeout=180)
    (wheel,) = (into / "dist").glob("turnstile-*.whl")
    return wheel


def top_level_names(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as z:
        return {name.split("/")[0] for name in z.namelist()
                if not name.split("/")[0].endswith(".dist-info")}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    built = build_wheel(tmp_path_factory.mktemp("wheel"))
    assert top_level_names(built) == {"turnstile"}
    return built


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> tuple[Path, Path]:
    """(the user's folder, its virtualenv's bin/): the core install, no extras."""
    base = tmp_path_factory.mktemp("outside")
    assert not base.resolve().is_relative_to(ROOT)
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    bin_dir = venv / "bin"
    subprocess.run([str(bin_dir / "python"), "-m", "pip", "install", "--quiet",
                    "--disable-pip-version-check", "-c", str(ROOT / "constraints.txt"),
                    str(wheel)], check=True, env=clean_env(), timeout=600, cwd=base)
    # The app's own tests need the test kit's `testing` extra (its model
    # server's request types), a pytest and pytest-asyncio (at this repository's pins).
    subprocess.run([str(bin_dir / "python"), "-m", "pip", "install", "--quiet",
                    "--disable-pip-version-check", "-c", str(ROOT / "constraints.txt"),
                    f"{wheel}[testing]", *dev_pins("pytest", "pytest-asyncio")],
                   check=True, env=clean_env(), timeout=300, cwd=base)
    folder = base / "library"
    folder.mkdir()
    for name in ("loans.py", "check_loans.py"):
        shutil.copy(OUTSIDE / name, folder / name)
    shutil.copy(OUTSIDE / "loans_tests.py", folder / "test_loans.py")
    return folder, bin_dir


def dev_pins(*names: str) -> list[str]:
    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["dev"]
    return [pin for pin in dev if pin.partition("==")[0] in names]


def test_only_the_turnstile_namespace_is_installed(installed: tuple[Path, Path]) -> None:
    folder, bin_dir = installed
    python = str(bin_dir / "python")
    for top in ("workflows", "activities", "worker", "starter"):
        leaked = subprocess.run([python, "-c", f"import {top}"], cwd=folder,
                                env=clean_env(), capture_output=True, text=True, timeout=60)
        assert leaked.returncode != 0 and "ModuleNotFoundError" in leaked.stderr, top
    where = subprocess.run([python, "-c", "import turnstile.workflows, turnstile.cli.worker; "
                            "print(turnstile.__file__)"], cwd=folder, env=clean_env(),
                           capture_output=True, text=True, timeout=60, check=True)
    assert "site-packages" in where.stdout and str(ROOT) not in where.stdout
    helped = subprocess.run([str(bin_dir / "turnstile"), "--help"], cwd=folder,
                            env=clean_env(), capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0, helped.stderr
    assert "turnstile worker [--app MOD:ATTR" in helped.stdout


def test_a_missing_extra_names_itself(installed: tuple[Path, Path]) -> None:
    """The core install has none of the extras; each optional part, asked
    for, says which extra to install."""
    folder, bin_dir = installed
    tried = {
        "inbox": "import turnstile.inbox.web_app",
        "mcp": "from turnstile.runtime.mcp import MCPToolset",
        "postgres": "from turnstile.stores.engines import sqlalchemy_url; "
                    "sqlalchemy_url('postgresql://u@h/db')",
    }
    for extra, code in tried.items():
        ran = subprocess.run([str(bin_dir / "python"), "-c", code], cwd=folder,
                             env=clean_env(), capture_output=True, text=True, timeout=60)
        assert ran.returncode != 0, extra
        last = ran.stderr.strip().splitlines()[-1]
        assert last.startswith("turnstile.extras.MissingExtra: "), ran.stderr
        assert f"pip install 'turnstile[{extra}]'" in last, last


def test_installs_beside_other_minor_versions_of_pydantic_and_sqlalchemy(
        tmp_path: Path, wheel: Path) -> None:
    """A project that already holds pydantic 2 and SQLAlchemy 2 at other
    versions: the wheel installs without this repository's constraints, pip
    keeps what is inside Turnstile's ranges and moves the rest within the
    major version, and a turn's database opens."""
    ranges = {req.partition(">=")[0]: req for req in tomllib.loads(
        (ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
        if req.startswith(("pydantic>=", "sqlalchemy>="))}
    assert set(ranges) == {"pydantic", "sqlalchemy"}
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
           "--disable-pip-version-check"]
    # The project's own pins: a newer pydantic patch than constraints.txt's
    # (inside the range) and an older SQLAlchemy minor (below it).
    held = {"pydantic": "2.14.4", "sqlalchemy": "2.0.44"}
    subprocess.run([*pip, *(f"{name}=={v}" for name, v in held.items())],
                   check=True, env=clean_env(), timeout=300, cwd=tmp_path)
    installed = subprocess.run([*pip, str(wheel)], env=clean_env(),
                               capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert installed.returncode == 0, installed.stderr[-3000:]
    probe = ("import importlib.metadata as m, turnstile, tempfile, pathlib\n"
             "from turnstile.stores.db import Database\n"
             "from turnstile.stores.schema import upgrade\n"
             "d = pathlib.Path(tempfile.mkdtemp())\n"
             "upgrade(Database(f'sqlite:///{d}/t.db'))\n"
             "print(m.version('pydantic'), m.version('sqlalchemy'))\n")
    ran = subprocess.run([str(venv / "bin" / "python"), "-c", probe], cwd=tmp_path,
                         env=clean_env(), capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr[-3000:]
    pydantic, sqlalchemy = ran.stdout.split()
    assert pydantic == held["pydantic"]  # inside the range: kept
    major, minor, _ = (int(x) for x in sqlalchemy.split(".")[:3])
    assert (major, minor) >= (2, 1) and major == 2  # moved within SQLAlchemy 2


def test_the_apps_own_script_runs_a_turn_with_the_test_kit(
        installed: tuple[Path, Path]) -> None:
    folder, bin_dir = installed
    ran = subprocess.run([str(bin_dir / "python"), "check_loans.py"], cwd=folder,
                         env=clean_env(), capture_output=True, text=True, timeout=240)
    assert ran.returncode == 0, ran.stdout + ran.stderr[-3000:]
    assert ran.stdout.splitlines()[-1] == "ok", ran.stdout
    assert "loan: recorded once, as edited" in ran.stdout


def test_the_apps_own_tests_run_with_plain_pytest(installed: tuple[Path, Path]) -> None:
    folder, bin_dir = installed
    ran = subprocess.run([str(bin_dir / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "test_loans.py"], cwd=folder, env=clean_env(), capture_output=True,
                         text=True, timeout=240)
    assert ran.returncode == 0, ran.stdout[-4000:] + ran.stderr[-2000:]
    assert "6 passed" in ran.stdout, ran.stdout


def test_the_console_script_serves_and_runs_a_turn(installed: tuple[Path, Path],
                                                   temporal_server: DevServer) -> None:
    folder, bin_dir = installed
    env = clean_env(TEMPORAL_ADDRESS=temporal_server.address,
                    TURNSTILE_TASK_QUEUE=f"outside-{uuid.uuid4().hex[:8]}",
                    TURNSTILE_WORKER_VERSIONING="off", TURNSTILE_UPGRADE_CHECK="off",
                    TURNSTILE_APPS="loans:app")
    log = folder / "worker.log"
    worker = spawn([str(bin_dir / "turnstile"), "worker", "--app", "loans:app"], log,
                   env=env, cwd=folder)
    try:
        wait_for(lambda: b"worker serving task queue" in log.read_bytes()
                 or worker.poll() is not None, 90, "the worker")
        assert worker.poll() is None, log.read_text()[-3000:]
        run = subprocess.run([str(bin_dir / "turnstile"), "run", "Please lend B-7",
                              "--user", "alice", "--auto-approve", "bob"],
                             cwd=folder, env=env, capture_output=True, text=True, timeout=180)
    finally:
        kill_group(worker)
    assert run.returncode == 0, run.stdout + run.stderr + log.read_text()[-3000:]
    assert "Lent B-7 to m-1" in run.stdout
    assert (folder / ".data" / "turnstile.db").is_file()  # the folder's own data directory
