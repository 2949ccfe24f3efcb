"""`turnstile worker` is a user of TurnstilePlugin: the worker build_worker
makes gets the turn's workflow, activities, interceptors and failure types
from a plugin (the client's, as `turnstile worker` connects, else one around
the given runtime), once; a stand-in activity under a turn activity's name
and an interceptor of the plugin's types that the worker already has win."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.client import Client

from tests.support.worker_env import WORKER_ENV
from turnstile.activities import Runtime, all_activities
from turnstile.activities.data_errors import DataErrors
from turnstile.activities.log_context import LogContext
from turnstile.cli.worker import build_worker, plugin_for
from turnstile.engine import activity_io as io
from turnstile.runtime.config import Settings
from turnstile.runtime.services import ServiceRegistry
from turnstile.temporal_plugin import TurnstilePlugin
from turnstile.workflows import AgentTurn
from turnstile.workflows.agent_turn import FAILS_THE_TURN


def _runtime(tmp_path: Path, task_queue: str) -> Runtime:
    settings = Settings.from_env({**WORKER_ENV, "TURNSTILE_TASK_QUEUE": task_queue,
                                  "DATABASE_URL": f"sqlite:///{tmp_path / 'w.db'}"})
    return Runtime.build(settings, ServiceRegistry([]))


def _name(fn: Callable[..., Any]) -> str | None:
    return activity._Definition.must_from_callable(fn).name


@activity.defn(name=io.PUBLISH_EVENT)
async def publish_stand_in(*_: Any) -> None:
    """Stands in for the turn's publish_event activity."""


async def test_the_worker_gets_the_turn_from_one_plugin(client: Client, task_queue: str,
                                                        tmp_path: Path) -> None:
    rt = _runtime(tmp_path, task_queue)
    config = build_worker(client, rt).config(active_config=True)
    plugins = [p for p in config.get("plugins", ()) if isinstance(p, TurnstilePlugin)]
    assert len(plugins) == 1 and plugins[0].runtime is rt and not plugins[0].serve
    assert config["workflows"] == [AgentTurn]
    names = [_name(fn) for fn in config["activities"]]
    assert sorted(names, key=str) == sorted((_name(fn) for fn in all_activities(rt)), key=str)
    kinds = [type(i) for i in config.get("interceptors", ())]
    assert kinds.count(DataErrors) == 1 and kinds.count(LogContext) == 1
    assert set(FAILS_THE_TURN) <= set(config.get("workflow_failure_exception_types", ()))
    assert config["task_queue"] == task_queue


async def test_a_client_with_the_plugin_is_not_given_a_second(client: Client, task_queue: str,
                                                              tmp_path: Path) -> None:
    rt = _runtime(tmp_path, task_queue)
    plugin = plugin_for(rt)
    with_plugin = Client(client.service_client, namespace=client.namespace,
                         data_converter=client.data_converter, plugins=[plugin])
    worker = build_worker(with_plugin, rt)
    assert worker.config().get("plugins") == []
    config = worker.config(active_config=True)
    assert [_name(fn) for fn in config["activities"]].count(io.CALL_MODEL) == 1
    assert config["workflows"] == [AgentTurn]


async def test_the_workers_own_stand_ins_and_interceptors_win(client: Client, task_queue: str,
                                                              tmp_path: Path) -> None:
    rt = _runtime(tmp_path, task_queue)
    own = DataErrors()
    config = build_worker(client, rt, activities=[publish_stand_in],
                          interceptors=[own]).config(active_config=True)
    published = [fn for fn in config["activities"] if _name(fn) == io.PUBLISH_EVENT]
    assert published == [publish_stand_in]
    assert len(config["activities"]) == len(all_activities(rt))
    data_errors = [i for i in config.get("interceptors", ()) if isinstance(i, DataErrors)]
    assert data_errors == [own]
