"""The worker, the starter and the client connect with Temporal's environment
configuration (temporalio.envconfig), as the `temporal` CLI does: a profile
in a TOML file, overridden by TEMPORAL_* variables."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from tests.support.temporal_server import DevServer
from turnstile.runtime.client import connect
from turnstile.runtime.config import Settings

ROOT = Path(__file__).resolve().parents[1]


def profiles(tmp_path: Path, address: str) -> Path:
    path = tmp_path / "temporal.toml"
    path.write_text(f'''
[profile.default]
address = "127.0.0.1:1"

[profile.staging]
address = "{address}"
namespace = "default"

[profile.cloud]
address = "example.tmprl.cloud:7233"
namespace = "turnstile.a1b2c"
api_key = "key-from-profile"
''')
    return path


@pytest.mark.live
async def test_a_profile_names_the_cluster(temporal_server: DevServer, tmp_path: Path) -> None:
    config = profiles(tmp_path, temporal_server.address)
    settings = Settings.from_env({"TEMPORAL_CONFIG_FILE": str(config),
                                  "TEMPORAL_PROFILE": "staging"})
    assert settings.temporal_address == temporal_server.address
    client = await connect(settings)
    assert (await client.count_workflows()).count >= 0
    # The starter reads the same: `status` of an unknown turn reaches the server
    # and says it is not there (a wrong address would fail to connect).
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(ROOT / "starter.py"), "status", "no-such-turn",
        env={"PATH": "/usr/bin:/bin", "TEMPORAL_CONFIG_FILE": str(config),
             "TEMPORAL_PROFILE": "staging", "TURNSTILE_DATA_DIR": str(tmp_path)},
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 1 and err.decode().startswith(
        "error: turn 'no-such-turn' is not running or does not exist"), err
    # The default profile names an address where nothing answers: exit 2, one line.
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(ROOT / "starter.py"), "status", "no-such-turn",
        env={"PATH": "/usr/bin:/bin", "TEMPORAL_CONFIG_FILE": str(config),
             "TURNSTILE_DATA_DIR": str(tmp_path)},
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2 and err.decode().startswith(
        "error: cannot reach Temporal at 127.0.0.1:1"), err


def test_variables_override_the_profile(tmp_path: Path) -> None:
    config = profiles(tmp_path, "127.0.0.1:7233")
    settings = Settings.from_env({"TEMPORAL_CONFIG_FILE": str(config),
                                  "TEMPORAL_PROFILE": "cloud",
                                  "TEMPORAL_ADDRESS": "override.example:7233"})
    assert settings.temporal_address == "override.example:7233"
    assert settings.temporal_namespace == "turnstile.a1b2c"
    options = settings.temporal_profile.to_client_connect_config()
    assert options.get("api_key") == "key-from-profile" and options.get("tls") is True


def test_without_a_profile_the_defaults_hold(tmp_path: Path) -> None:
    settings = Settings.from_env({"TEMPORAL_CONFIG_FILE": str(tmp_path / "absent.toml")})
    assert (settings.temporal_address, settings.temporal_namespace) == (
        "localhost:7233", "default")
