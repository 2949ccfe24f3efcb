"""One logging filter for every handler of the root logger: what a log line
says is masked (turnstile.engine.masking) whoever logged it — our modules,
the Temporal SDK, SQLAlchemy, the sender, the SMTP server. The message is
formatted once, masked, and kept without its arguments."""

from __future__ import annotations

import logging

from turnstile.engine.masking import mask_text


class MaskingFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):  # a broken format string: left as logged
            return True
        masked = mask_text(message)
        if masked != message or record.args:
            record.msg, record.args = masked, None
        if record.exc_info and not record.exc_text:
            record.exc_text = mask_text(logging.Formatter().formatException(record.exc_info))
        elif record.exc_text:
            record.exc_text = mask_text(record.exc_text)
        return True


def install() -> None:
    """Mask every line the root logger's handlers write (call after basicConfig)."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, MaskingFilter) for f in handler.filters):
            handler.addFilter(MaskingFilter())
