"""`up` while the stack's worker runs other code than the folder now holds
restarts that worker (turnstile.runtime.devstack: served_code, changed_code);
tests/test_readme_first_app.py sees an edited tool take effect that way."""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path

import pytest

from turnstile.runtime.config import Settings
from turnstile.runtime.devstack import Stack, served_code


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "desk_tools.py").write_text("ANSWER = 1\n")
    hidden = tmp_path / ".venv" / "lib"
    hidden.mkdir(parents=True)
    (hidden / "vendored_thing.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(hidden))
    for name in ("desk_tools", "vendored_thing"):
        monkeypatch.delitem(sys.modules, name, raising=False)
        importlib.import_module(name)
    return tmp_path


def test_the_fingerprint_is_the_folders_imported_code(project: Path) -> None:
    before = served_code(project.resolve())
    assert "desk_tools.py" in before
    assert not any("vendored_thing" in path for path in before)  # hidden folders are not code
    assert not any(path.startswith("turnstile") for path in before)  # installed elsewhere
    (project / "desk_tools.py").write_text("ANSWER = 2\n")
    after = served_code(project.resolve())
    assert after["desk_tools.py"] != before["desk_tools.py"]


def test_a_worker_started_with_other_code_is_named_for_restart(project: Path) -> None:
    env = {"TURNSTILE_DATA_DIR": str(project / ".data"), "TURNSTILE_WORKER_VERSIONING": "off"}
    started = Stack(Settings.from_env(env), env=env, code=served_code(project.resolve()))
    started.pids.mkdir(parents=True)
    started._code_file("worker").write_text(json.dumps(started.code))
    same = Stack(Settings.from_env(env), env=env, code=served_code(project.resolve()))
    assert same.changed_code("worker") == []
    (project / "desk_tools.py").write_text("ANSWER = 3\n")
    (project / "new_tools.py").write_text("")
    importlib.import_module("new_tools")
    edited = Stack(Settings.from_env(env), env=env, code=served_code(project.resolve()))
    assert edited.changed_code("worker") == ["desk_tools.py", "new_tools.py"]
    # no fingerprint (a stack started before this was recorded): nothing to say
    assert Stack(Settings.from_env(env), env=env).changed_code("worker") == []
    os.remove(started._code_file("worker"))
    assert edited.changed_code("worker") == []
