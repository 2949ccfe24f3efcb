"""Log lines: masked whoever wrote them, as text or as JSON.

- One logging filter for every handler of the root logger: what a log line
  says is masked (turnstile.engine.masking) whoever logged it — our modules,
  the Temporal SDK, SQLAlchemy, the sender, the SMTP server. The message is
  formatted once, masked, and kept without its arguments; a database's
  details about a refused row (DETAIL, the statement) are removed from it
  and from the exception text; the SDK's context (`workflow_id`, ...) is
  masked the same way, so an id reads the same on every line and sink.
- `TURNSTILE_LOG_FORMAT=json`: one JSON object per line — `time`, `level`,
  `logger`, `message`, the current OpenTelemetry `trace_id`/`span_id` when a
  span is recording, and the Temporal SDK's workflow or activity context
  (`workflow_id`, `run_id`, `activity_type`, `attempt`, ...) when it adds one,
  and the `conversation_id` and `tool_call_id` of the activity that logs
  (`log_fields`, set for every activity by activities.log_context).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

from opentelemetry import trace

from turnstile.engine.masking import mask_text, without_db_details

_fields: ContextVar[dict[str, str] | None] = ContextVar("turnstile_log_fields", default=None)


@contextmanager
def log_fields(**fields: str | None) -> Iterator[None]:
    """Fields every JSON log line written inside carries, also from the
    threads of `asyncio.to_thread` (it copies the context)."""
    token = _fields.set({**(_fields.get() or {}), **{k: v for k, v in fields.items() if v}})
    try:
        yield
    finally:
        _fields.reset(token)


# The Temporal SDK's structured context on its records (`extra`): its ids are
# written as every other sink writes them.
SDK_EXTRAS = ("temporal_workflow", "temporal_activity")


def clean(text: str) -> str:
    """What a log line may say: a database's details about the row it
    refused removed, addresses and phone numbers masked."""
    return mask_text(without_db_details(text))


class MaskingFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        for key in SDK_EXTRAS:
            extra = getattr(record, key, None)
            if isinstance(extra, dict):  # a copy: the SDK's dict is not ours to change
                setattr(record, key, {k: clean(v) if isinstance(v, str) else v
                                      for k, v in extra.items()})
        try:
            message = record.getMessage()
        except (TypeError, ValueError):  # a broken format string: left as logged
            return True
        masked = clean(message)
        if masked != message or record.args:
            record.msg, record.args = masked, None
        if hasattr(record, "message"):  # formatted already by a handler before this one
            record.message = masked
        if record.exc_info and not record.exc_text:
            record.exc_text = clean(logging.Formatter().formatException(record.exc_info))
        elif record.exc_text:
            record.exc_text = clean(record.exc_text)
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record (after masking: the filter ran first)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds"),
            "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        span = trace.get_current_span().get_span_context()
        if span.is_valid:
            line["trace_id"] = format(span.trace_id, "032x")
            line["span_id"] = format(span.span_id, "016x")
        line.update({k: mask_text(v) for k, v in (_fields.get() or {}).items()})
        for key in SDK_EXTRAS:  # the SDK's context: its ids written as everywhere else
            extra = getattr(record, key, None)
            if isinstance(extra, dict):
                line.update({k: mask_text(v) if isinstance(v, str) else v
                             for k, v in extra.items() if isinstance(v, str | int)})
        if record.exc_info:
            line["exception"] = record.exc_text or self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def setup(level: int, log_format: str = "text",
          text_format: str = "%(asctime)s %(levelname)s %(name)s: %(message)s") -> None:
    """The process's logging: `log_format` "json" or "text", masked either way."""
    logging.basicConfig(level=level, format=text_format)
    # httpx writes an INFO line per request ("HTTP Request: POST ..."): three
    # per turn that say what the model call's span and metrics say, each
    # formatted and masked (~0.5 ms of worker CPU per turn). Kept at DEBUG.
    if level > logging.DEBUG:
        logging.getLogger("httpx").setLevel(logging.WARNING)
    if log_format == "json":
        for handler in logging.getLogger().handlers:
            handler.setFormatter(JsonFormatter())
    install()


def install() -> None:
    """Mask every line the root logger's handlers write (call after basicConfig)."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, MaskingFilter) for f in handler.filters):
            handler.addFilter(MaskingFilter())
