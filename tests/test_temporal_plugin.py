"""turnstile.TurnstilePlugin on a team's own Client and Worker: one task
queue, the team's own workflow beside the turn's, both complete; the turn's
history replays with a Replayer given the same plugin; and the plugin leaves
a runner without the sandbox as it is and passes the engine, never the
workflow code, through a sandbox."""

from __future__ import annotations

import uuid
from pathlib import Path

import sqlalchemy as sa
from temporalio.client import Client
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner, Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from tests.support.own_workflow import Greet
from tests.support.temporal_server import DevServer
from turnstile import (
    App,
    FunctionModel,
    ModelCall,
    Reply,
    Service,
    Settings,
    ToolContext,
    ToolRegistry,
    TurnInput,
    TurnstileClient,
    TurnstilePlugin,
    call,
    tool,
)
from turnstile.temporal_plugin import sandbox_passthrough

metadata = sa.MetaData()
shelf = sa.Table("plugin_shelf", metadata,
                 sa.Column("id", sa.Integer, primary_key=True),
                 sa.Column("book", sa.Text, nullable=False))


@tool(transactional=True)
def shelveBook(ctx: ToolContext, book: str) -> dict[str, str]:
    """Put a book back on the shelf."""
    with ctx.transaction() as conn:
        conn.execute(sa.insert(shelf).values(book=book))
    return {"shelved": book}


def model(request: ModelCall) -> Reply:
    done = request.result_of("shelveBook")
    if done is None:
        return call("shelveBook", book=request.user_text.split()[-1])
    return f"Shelved {done.result['shelved']}"


APP = App(name="shelf", tables=[shelf], services=[Service(
    name="shelf", tools=ToolRegistry([shelveBook]), system_prompt="You shelve books.",
    offline_model=FunctionModel(model))])


async def test_the_plugin_runs_turns_beside_the_teams_own_workflow(
        tmp_path: Path, temporal_server: DevServer) -> None:
    settings = Settings.from_env({
        "TEMPORAL_ADDRESS": temporal_server.address,
        "DATABASE_URL": f"sqlite:///{tmp_path / 'own.db'}",
        "TURNSTILE_DATA_DIR": str(tmp_path),
        # what the environment says is not where the plugin's turns go
        "TURNSTILE_TASK_QUEUE": "not-this-one",
    })
    plugin = TurnstilePlugin([APP], settings=settings)
    client = await Client.connect(temporal_server.address, plugins=[plugin])
    queue = f"team-{uuid.uuid4().hex[:8]}"
    turns = TurnstileClient(client, settings, task_queue=queue)
    assert turns.settings.task_queue == queue
    async with Worker(client, task_queue=queue, workflows=[Greet]):
        turn = await turns.start_turn(TurnInput(conversation_id=f"c-{queue}", user_id="alice",
                                                message="Shelve B-9"))
        result = await turn.result()
        greeted = await client.execute_workflow(Greet.run, "ada", id=f"greet-{queue}",
                                                task_queue=queue)
    assert result.status == "completed", result.error
    assert result.answer == "Shelved B-9"
    assert greeted == "hello ada"
    with plugin.runtime.db.connect() as conn:
        assert conn.execute(sa.select(shelf.c.book)).scalars().all() == ["B-9"]
    described = await client.get_workflow_handle(turn.id).describe()
    assert described.task_queue == queue

    history = await client.get_workflow_handle(turn.id).fetch_history()
    replayed = await Replayer(workflows=[], plugins=[plugin]).replay_workflow(
        history, raise_on_replay_failure=False)
    assert replayed.replay_failure is None, replayed.replay_failure


def test_the_plugin_keeps_the_workers_runner_and_guards_workflow_code(tmp_path: Path) -> None:
    plugin = TurnstilePlugin([APP], settings=Settings.from_env(
        {"DATABASE_URL": f"sqlite:///{tmp_path / 'x.db'}"}))
    unsandboxed = UnsandboxedWorkflowRunner()
    assert plugin.workflow_runner(unsandboxed) is unsandboxed
    runner = plugin.workflow_runner(None)
    assert isinstance(runner, SandboxedWorkflowRunner)
    passed = runner.restrictions.passthrough_modules
    assert "turnstile.engine" in passed and "regex" in passed
    assert not {"turnstile", "turnstile.workflows"} & passed
    assert sandbox_passthrough(SandboxRestrictions.default).passthrough_modules == passed
