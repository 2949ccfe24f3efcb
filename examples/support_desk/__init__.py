"""A support desk, built only on `turnstile` (the public API): the second app.

    TURNSTILE_APPS=examples.support_desk:app make run DEMO_MESSAGE="Please refund order A-1002"

It looks up an order in its own table (`desk_order`), refunds it through a
payment tool whose compensation reverses the refund when the turn rolls back,
and needs a person's approval for a refund above $100.00. Offline, its model
is a function (examples/support_desk/model.py); a real model (LLM_BASE_URL)
is asked with the service's ModelSettings (app.py, MODEL_SETTINGS). Tests:
tests/test_example_support_desk.py (turnstile.testing).
"""

from examples.support_desk.app import app as app, build_app as build_app

__all__ = ["app", "build_app"]
