"""The local SMTP server (turnstile.outbox.smtp_server) under the sales app's
old name: `python -m turnstile.sales.smtp_server` (docker-compose) runs it."""

from __future__ import annotations

from turnstile.outbox.smtp_server import (
    LocalSmtpServer as LocalSmtpServer,
    MailboxHandler as MailboxHandler,
    main as main,
    read_mailbox as read_mailbox,
)

if __name__ == "__main__":
    main()
