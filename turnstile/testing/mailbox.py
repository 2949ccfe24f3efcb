"""A local SMTP server that keeps what it receives (aiosmtpd), for tests."""

from __future__ import annotations

import email
import email.policy
from email.message import EmailMessage
from typing import Any

from aiosmtpd.controller import Controller

from turnstile.testing.processes import free_port


class Mailbox:
    """SMTP on 127.0.0.1:`port`; `messages` holds every mail delivered."""

    def __init__(self, port: int | None = None) -> None:
        self.messages: list[EmailMessage] = []
        self.port = port or free_port()
        self._controller = Controller(self, hostname="127.0.0.1", port=self.port)

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
        parsed = email.message_from_bytes(envelope.content, policy=email.policy.default)
        assert isinstance(parsed, EmailMessage)
        self.messages.append(parsed)
        return "250 OK"

    def start(self) -> Mailbox:
        self._controller.start()
        return self

    def stop(self) -> None:
        self._controller.stop()
