"""Fixtures live in tests/support/, one module per real dependency."""

pytest_plugins = [
    "tests.support.databases",
    "tests.support.temporal_server",
    "tests.support.fake_llm",
    "tests.support.mcp_fixtures",
    "tests.support.spans",
    "tests.support.tiers",
]
