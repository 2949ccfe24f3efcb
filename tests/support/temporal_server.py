"""One Temporal dev server for the whole test run, as a subprocess.

Not `WorkflowEnvironment`: processes that used it were measured to abort at
interpreter exit after passing (docs/design.md, "Measured Temporal facts").
A dev server started from the `temporal` binary and reached with
`Client.connect` exits cleanly (turnstile.testing.processes.DevServer, the
test kit's, which TestStack starts too).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from turnstile.testing.processes import DevServer, free_port


@pytest.fixture(scope="session")
def temporal_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevServer]:
    logdir = tmp_path_factory.mktemp("temporal")
    server = DevServer(free_port(), logdir / "server.log")
    yield server
    server.stop()


async def connect(address: str, attempts: int = 100) -> Client:
    """Connect once the namespace answers (the server may still be starting)."""
    for attempt in range(attempts):
        try:
            c = await Client.connect(address, data_converter=pydantic_data_converter)
            await c.count_workflows()
            return c
        except RuntimeError:
            if attempt == attempts - 1:
                raise
            await asyncio.sleep(0.2)
    raise AssertionError("unreachable")


@pytest.fixture(scope="session")
async def client(temporal_server: DevServer) -> Client:
    return await connect(temporal_server.address)


@pytest.fixture
def task_queue() -> str:
    return f"tq-{uuid.uuid4().hex[:10]}"
