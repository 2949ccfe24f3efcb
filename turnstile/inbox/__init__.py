"""The approvals inbox: a small server-rendered web app over turnstile.client.
Needs the 'inbox' extra (`pip install 'turnstile[inbox]'`)."""

from turnstile.extras import require_extra

require_extra("inbox", "The approvals inbox")
