"""The settings every worker a test starts runs with, in a subprocess
(tests/support/worker_process.py) or in the test's process
(tests/support/turns.py): one place, so no test waits on a product default
it does not test."""

from __future__ import annotations

# A killed worker's turn moves from its sticky queue to the task queue after
# this long (the product's default, the SDK's, is 10 s): a kill test waits
# 3 s there instead of 10 (tests/test_durability.py checks the history).
STICKY_QUEUE_TIMEOUT_SECONDS = 3.0

WORKER_ENV: dict[str, str] = {
    # Workflow code in Temporal's sandbox, as every test runs it (worker.workflow_runner).
    "TURNSTILE_WORKFLOW_SANDBOX": "strict",
    # Unversioned unless a test asks: each test has its own task queue
    # (tests/test_worker_versioning.py).
    "TURNSTILE_WORKER_VERSIONING": "off",
    "TURNSTILE_STICKY_QUEUE_TIMEOUT_SECONDS": str(STICKY_QUEUE_TIMEOUT_SECONDS),
}
