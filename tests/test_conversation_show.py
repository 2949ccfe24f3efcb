"""`starter.py conversation show ID [--json]` and TurnstileClient.conversation:
memory as it is, readable — a cancelled turn's rolled-back and not-run calls,
the approval and who gave it, arguments masked as the audit masks them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from examples.support_desk import build_app
from tests.support.temporal_server import DevServer
from turnstile.stores.transcript import Transcript, read_transcript
from turnstile.testing import ScriptedModel, TestStack, call

ROOT = Path(__file__).resolve().parent.parent


def show(stack: TestStack, *args: str) -> subprocess.CompletedProcess[str]:
    assert stack.rt is not None
    env = {**os.environ, "DATABASE_URL": stack.rt.settings.database_url}
    return subprocess.run([sys.executable, "starter.py", "conversation", "show", *args],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)


async def test_a_cancelled_turn_reads_as_memory_holds_it(tmp_path: Path,
                                                          temporal_server: DevServer) -> None:
    script = ScriptedModel([
        call("issueRefund", order_id="A-1002", amount_cents=48000),
        call("issueRefund", order_id="A-1002", amount_cents=47000),  # waits: above $100
        "done",
    ])
    app = build_app()
    async with TestStack(app, tmp_path, model=script,
                         temporal_address=temporal_server.address) as stack:
        assert app.seed is not None
        app.seed(stack.db, None)
        turn = await stack.start("refund ada@example.com's orders", conversation="c-show",
                                 user="alice")
        await stack.approve(turn, "bob", note="checked the receipt")
        await stack.pending(turn)  # the second call waits
        await stack.cancel(turn)

        text = show(stack, "c-show")
        assert text.returncode == 0, text.stderr
        out = text.stdout
        assert "ROLLED BACK" in out and "Not run" in out
        assert "[ROLLED BACK]" in out and "[NOT RUN]" in out
        assert "approved by bob" in out and "checked the receipt" in out
        assert "ada@example.com" in out  # the user's words, as memory holds them

        as_json = show(stack, "c-show", "--json")
        assert as_json.returncode == 0, as_json.stderr
        transcript = Transcript.model_validate_json(as_json.stdout)
        assert transcript == read_transcript(stack.db, "c-show")
        assert Transcript.model_validate_json(transcript.model_dump_json()) == transcript
        results = [e for e in transcript.entries if e.role == "tool"]
        assert [e.marks for e in results] == [["rolled back"], ["not run"]]
        calls = [c for e in transcript.entries for c in e.calls]
        assert [(c.name, c.arguments["order_id"]) for c in calls] == [
            ("issueRefund", "A-1002"), ("issueRefund", "A-1002")]
        assert calls[0].decision is not None and calls[0].decision.reviewer == "bob"
        assert transcript.user_id == "alice"

        assert stack.client is not None
        assert await stack.client.conversation("c-show") == transcript

        missing = show(stack, "c-nobody")
        assert missing.returncode == 1 and "no conversation 'c-nobody'" in missing.stderr


def test_arguments_are_masked_as_the_audit_masks_them() -> None:
    from turnstile.stores.transcript import _arguments

    masked = _arguments('{"to": "ops@example.com", "order_id": "A-1001"}')
    assert masked["order_id"] == "A-1001"
    assert "ops@example.com" not in str(masked)
