"""Child processes for tests: the test kit's (turnstile.testing.processes)."""

from turnstile.testing.processes import (
    free_port as free_port,
    kill_group as kill_group,
    port_open as port_open,
    spawn as spawn,
    wait_for as wait_for,
)
