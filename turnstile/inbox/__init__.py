"""The approvals inbox: a small server-rendered web app over turnstile.client."""
