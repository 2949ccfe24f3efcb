"""The test kit's dev server (turnstile.testing.processes.DevServer) retries
a start that lost its port: here the frontend's port is taken by a listener
of the test's own, as the server's own choice of ports for its internal
services sometimes takes it (its log then says "Failed to start gRPC
listener" and the server panics moments after the frontend answers)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from turnstile.testing.processes import DevServer, free_port, port_open

pytestmark = pytest.mark.live


def test_a_start_whose_port_is_taken_moves_to_another(tmp_path: Path) -> None:
    taken = free_port()
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", taken))
        holder.listen()
        server = DevServer(taken, tmp_path / "temporal.log")
        try:
            assert server.port != taken and server.address == f"127.0.0.1:{server.port}"
            assert server.proc.poll() is None and port_open(server.port)
        finally:
            server.stop()
    assert (tmp_path / "temporal.log").read_text(errors="replace").count("address already in use")
