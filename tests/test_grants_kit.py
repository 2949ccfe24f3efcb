"""Standing approvals through the public test kit, as an app's own tests
would write them: `TestStack.approve(..., grant=GrantRequest(...))` on the
tests' outbox app (tests/support/outbox_app.py; `sendNotice` needs approval).
A grant for one use in this conversation covers the next turn's same notice
without a reviewer, and not the one after."""

from __future__ import annotations

from pathlib import Path

from tests.support.outbox_app import build_app
from turnstile import GrantRequest, GrantScope
from turnstile.testing import TestStack


async def test_a_grant_from_the_kit_covers_the_next_call_once(tmp_path: Path) -> None:
    async with TestStack(build_app(), tmp_path) as stack:
        first = await stack.start("notify ann@example.com", conversation="c-kit")
        decision = await stack.approve(first, "bob", grant=GrantRequest(
            scope=GrantScope.CONVERSATION, uses=1, reason="same notice again"))
        assert decision.approved and decision.issued_grant
        assert (await first.result()).status == "completed"

        # Covered: no reviewer is asked (run() with nobody to decide would time out).
        second = await stack.run("notify ann@example.com", conversation="c-kit", timeout=30)
        assert second.status == "completed", second.error
        assert [c.name for c in second.tool_calls] == ["sendNotice"]

        # The one use is spent: the third waits for a person again.
        third = await stack.start("notify ann@example.com", conversation="c-kit")
        [waiting] = await stack.pending(third)
        assert waiting.tool_name == "sendNotice"
        await stack.reject(third, "bob", reason="enough")
        assert (await third.result()).status == "completed"
