"""The test kit's model server as an app's tests meet it
(turnstile.testing.FakeOpenAIServer): importing the kit needs no `openai`;
the server, which checks requests against `openai`'s request types, names
the extra that brings them; it refuses what a real endpoint refuses and
stops at the end of its `with` block."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from turnstile.testing import FakeOpenAIServer, RawReply, text_reply

WITHOUT_OPENAI = "import sys; sys.modules['openai'] = None\n"


def test_the_kit_imports_without_openai_and_the_server_names_its_extra() -> None:
    code = WITHOUT_OPENAI + (
        "import turnstile.testing as kit\n"
        "assert 'openai' not in [m.split('.')[0] for m in sys.modules if sys.modules[m]]\n"
        "kit.FakeOpenAIServer()\n")
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert ran.returncode == 1, ran.stderr
    last = ran.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: FakeOpenAIServer checks requests"), ran.stderr
    assert "pip install 'turnstile[testing]'" in last


def test_it_answers_what_is_scripted_refuses_what_openai_refuses_and_stops() -> None:
    with FakeOpenAIServer() as server:
        server.script(text_reply("hello"), RawReply(429, '{"error": "slow down"}',
                                                    {"retry-after": "1"}))
        ok = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        answered = httpx.post(f"{server.url}/chat/completions", json=ok)
        assert answered.json()["choices"][0]["message"]["content"] == "hello"
        limited = httpx.post(f"{server.url}/chat/completions", json=ok)
        assert (limited.status_code, limited.headers["retry-after"]) == (429, "1")
        unknown_key = {**ok, "reasoning_effort_level": "high"}
        refused = httpx.post(f"{server.url}/chat/completions", json=unknown_key)
        assert refused.status_code == 400
        assert "reasoning_effort_level" in server.refusals[-1]
        assert [r["messages"][0]["content"] for r in server.requests] == ["hi"] * 3
        url = server.url
    with pytest.raises(httpx.ConnectError):
        httpx.post(f"{url}/chat/completions", json=ok, timeout=2)
