"""The worker's event loop (turnstile.runtime.event_loop, TURNSTILE_EVENT_LOOP)."""

from __future__ import annotations

import asyncio
import sys

import pytest

from turnstile.engine.errors import ConfigurationError
from turnstile.runtime import event_loop
from turnstile.runtime.config import Settings

uvloop = pytest.importorskip("uvloop")


async def _loop_type() -> type:
    return type(asyncio.get_running_loop())


def test_auto_runs_on_uvloop_where_installed() -> None:
    assert Settings.from_env({}).event_loop == "auto"
    assert event_loop.run(_loop_type(), "auto") is uvloop.Loop
    assert event_loop.run(_loop_type(), "uvloop") is uvloop.Loop


def test_asyncio_runs_on_asyncios_own_loop() -> None:
    kind = Settings.from_env({"TURNSTILE_EVENT_LOOP": " Asyncio "}).event_loop
    assert kind == "asyncio"
    assert issubclass(event_loop.run(_loop_type(), kind), asyncio.BaseEventLoop)


def test_without_uvloop_auto_falls_back_and_uvloop_is_an_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # `import uvloop` raises ImportError
    assert event_loop.loop_factory("auto") is asyncio.new_event_loop
    with pytest.raises(ConfigurationError, match="uvloop is not installed"):
        event_loop.loop_factory("uvloop")
    main = _loop_type()
    with pytest.raises(ConfigurationError, match="uvloop is not installed"):
        event_loop.run(main, "uvloop")
    assert main.cr_frame is None  # closed, not left unawaited


def test_an_unknown_loop_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="TURNSTILE_EVENT_LOOP must be one of"):
        Settings.from_env({"TURNSTILE_EVENT_LOOP": "trio"})
