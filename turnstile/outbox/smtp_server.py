"""A local SMTP server that keeps what it receives, one `.eml` file per
message, so a user (or a test) can read the mails the sender delivered.

    server = LocalSmtpServer(Path(".data/mail"), port=8025).start()
    ...
    server.stop()

or `python -m turnstile.outbox.smtp_server --port 8025 --dir .data/mail` (the
sales app's old name, `turnstile.sales.smtp_server`, runs the same).
It accepts every message (no auth, no relaying): bind it to localhost only.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
import uuid
from datetime import UTC, datetime
from email import message_from_bytes, policy
from email.message import EmailMessage
from pathlib import Path
from typing import Any

from aiosmtpd.controller import Controller

from turnstile.engine.masking import mask_text
from turnstile.runtime.config import Settings

log = logging.getLogger(__name__)


class MailboxHandler:
    """aiosmtpd handler: store each message atomically (write, then rename)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
        name = f"{stamp}-{uuid.uuid4().hex[:8]}.eml"
        tmp = self.directory / f".{name}.tmp"
        tmp.write_bytes(envelope.original_content or envelope.content)
        os.replace(tmp, self.directory / name)
        log.info("stored mail from %s to %s as %s", mask_text(str(envelope.mail_from)),
                 mask_text(", ".join(envelope.rcpt_tos)), name)
        return "250 Message accepted for delivery"


class LocalSmtpServer:
    def __init__(self, directory: Path, host: str = "127.0.0.1", port: int = 8025) -> None:
        self.directory = Path(directory)
        self.host, self.port = host, port
        self._controller: Controller | None = None

    def start(self) -> LocalSmtpServer:
        """Listen in a background thread; returns once the port accepts."""
        # aiosmtpd logs every SMTP command (recipients, at INFO) and every DATA
        # line (at DEBUG) on "mail.log": the mailbox keeps the mail, logs don't.
        logging.getLogger("mail.log").setLevel(logging.WARNING)
        self._controller = Controller(
            MailboxHandler(self.directory), hostname=self.host, port=self.port
        )
        self._controller.start()
        log.info("SMTP server on %s:%d storing mail in %s", self.host, self.port, self.directory)
        return self

    def stop(self) -> None:
        if self._controller is not None:
            self._controller.stop()
            self._controller = None

    def __enter__(self) -> LocalSmtpServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def read_mailbox(directory: Path) -> list[EmailMessage]:
    """Every stored message, oldest first."""
    messages: list[EmailMessage] = []
    for path in sorted(Path(directory).glob("*.eml")):
        # policy.default makes the parser build EmailMessage objects
        messages.append(message_from_bytes(path.read_bytes(), policy=policy.default))
    return messages


def main(argv: list[str] | None = None) -> None:
    settings = Settings.from_env()
    parser = argparse.ArgumentParser(description="Local SMTP server storing .eml files")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=settings.smtp_port)
    parser.add_argument("--dir", type=Path, default=settings.data_dir / "mail")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    from turnstile.runtime import log_masking

    log_masking.install()
    logging.getLogger("mail.log").setLevel(logging.WARNING)  # aiosmtpd logs every command
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with LocalSmtpServer(args.dir, host=args.host, port=args.port):
        print(f"SMTP server listening on {args.host}:{args.port}, mail in {args.dir}", flush=True)
        stop.wait()


if __name__ == "__main__":
    main()
