"""`make up` while the stack is up with other settings says which differ and
that `make down` comes first (turnstile.runtime.devstack), exit 2."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from turnstile.runtime import devstack
from turnstile.runtime.config import Settings
from turnstile.runtime.devstack import SettingsChanged, Stack, watched_settings


def running_stack(tmp_path: Path, env: dict[str, str]) -> Stack:
    """A stack whose Temporal and worker are 'up': their pid files name this
    (live) process, so `up` starts nothing."""
    env = {"TURNSTILE_DATA_DIR": str(tmp_path), "TURNSTILE_WORKER_VERSIONING": "off", **env}
    stack = Stack(Settings.from_env(env), env=env)
    stack.pids.mkdir(parents=True, exist_ok=True)
    for name in ("temporal", "worker"):
        (stack.pids / f"{name}.pid").write_text(str(os.getpid()))
    return stack


def test_up_with_the_same_settings_goes_on(tmp_path: Path) -> None:
    started = running_stack(tmp_path, {"LLM_MODEL": "m"})
    started._settings_file("worker").write_text(json.dumps(started.env))
    running_stack(tmp_path, {"LLM_MODEL": "m"}).up()  # nothing to say, nothing started


def test_up_with_other_settings_says_which_and_how_to_restart(tmp_path: Path) -> None:
    started = running_stack(tmp_path, {"TURNSTILE_APPS": "turnstile.sales.app:build_sales_app",
                                       "LLM_API_KEY": "sk-old"})
    started._settings_file("worker").write_text(json.dumps(started.env))
    again = running_stack(tmp_path, {"TURNSTILE_METRICS_PORT": "9464",
                                     "TURNSTILE_APPS": "examples.support_desk:app",
                                     "LLM_API_KEY": "sk-new"})
    with pytest.raises(SettingsChanged) as err:
        again.up()
    text = str(err.value)
    assert "TURNSTILE_METRICS_PORT: unset when the stack started, now '9464'" in text
    assert ("TURNSTILE_APPS: 'turnstile.sales.app:build_sales_app' when the stack started, "
            "now 'examples.support_desk:app'") in text
    assert "LLM_API_KEY" in text and "sk-old" not in text and "sk-new" not in text
    assert "`make down` first" in text
    # the variables the stack sets for its own workers, and others, do not count
    assert "TURNSTILE_BUILD_ID" not in watched_settings({"TURNSTILE_BUILD_ID": "x", "HOME": "/"})
    assert watched_settings({"HOME": "/", "SMTP_PORT": "25"}) == {"SMTP_PORT": "25"}


def test_the_command_exits_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started = running_stack(tmp_path, {})
    started._settings_file("worker").write_text(json.dumps(started.env))
    for key in list(os.environ):
        if key.startswith(devstack.WATCHED):
            monkeypatch.delenv(key)
    monkeypatch.setenv("TURNSTILE_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("TURNSTILE_WORKER_VERSIONING", "off")
    monkeypatch.setenv("TURNSTILE_METRICS_PORT", "9464")
    assert devstack.main(["up"]) == 2
