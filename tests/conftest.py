"""Fixtures live in tests/support/, one module per real dependency; the
model server's are here, as docs/testing.md shows an app's own tests
writing them."""

from collections.abc import Iterator

import pytest

from turnstile.testing import FakeOpenAIServer

pytest_plugins = [
    "tests.support.databases",
    "tests.support.temporal_server",
    "tests.support.mcp_fixtures",
    "tests.support.spans",
    "tests.support.tiers",
    "tests.support.worker_loss",
]


def pytest_asyncio_loop_factories(config, item):  # type: ignore[no-untyped-def]
    """Tests run on the loop the worker runs on (turnstile.runtime.event_loop:
    uvloop where installed); the model client's transport, which works on the
    loop's sockets directly, on asyncio's own loop as well."""
    import asyncio

    from turnstile.runtime.event_loop import loop_factory

    product = loop_factory("auto")
    if item.path.name == "test_http_transport.py" and product is not asyncio.new_event_loop:
        return {"uvloop": product, "asyncio": asyncio.new_event_loop}
    return {"default": product}


@pytest.fixture(scope="session")
def _fake_llm_server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as server:
        yield server


@pytest.fixture
def fake_llm(_fake_llm_server: FakeOpenAIServer) -> Iterator[FakeOpenAIServer]:
    """The test kit's strict OpenAI-compatible server (turnstile.testing), one
    for the session, reset around each test."""
    _fake_llm_server.reset()
    yield _fake_llm_server
    _fake_llm_server.reset()
