"""The sales app's outbox: `email_task` rows, the public outbox's state
machine (turnstile.outbox.store) bound to that table and the sales roles
(`turnstile_email` queues, `turnstile_sender` does the rest). The functions
here are that store's methods, under the names the sales tools, tests and
benches use."""

from __future__ import annotations

from turnstile.outbox.store import (
    POSSIBLY_SENT as POSSIBLY_SENT,
    EmailStatus as EmailStatus,
    EmailTask as EmailTask,
    message_id_for as message_id_for,
)
from turnstile.sales.schema import EMAIL_OUTBOX

_store = EMAIL_OUTBOX.store

get = _store.get
get_in = _store.get_in
enqueue = _store.enqueue
enqueue_in = _store.enqueue_in
by_key_in = _store.by_key_in
find_by_key = _store.find_by_key
cancel = _store.cancel
cancel_in = _store.cancel_in
requeue = _store.requeue
requeue_in = _store.requeue_in
due = _store.due
claim = _store.claim
claim_due = _store.claim_due
release = _store.release
mark_sent = _store.mark_sent
mark_failed = _store.mark_failed
recover_stale = _store.recover_stale
