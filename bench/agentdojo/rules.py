"""The information-flow rules the adapter declares on AgentDojo's tools, as a
builder of these tools would: per effectful tool, its sensitive arguments —
where an effect goes (recipients, IBANs, URLs, users, channels, the ids of
what is deleted or shared, the booked hotel), credentials, and the free text
that leaves the system to someone not named by the user — each `review` when
its value came from untrusted content (a tool result). The tools that read
the signed-in user's own profile have trusted results, except travel's,
which holds the user's secrets (passport, credit card). Read-only tools have
no rules, except `get_webpage`, whose URL itself leaks data.
"""

from __future__ import annotations

from typing import Any

from turnstile.engine.specs import ToolSpec

R = "review"

_MAIL = {"recipients": R, "cc": R, "bcc": R, "attachments": R}

RULES: dict[str, dict[str, dict[str, Any]]] = {
    "banking": {
        "send_money": {"sensitive": {"recipient": R}},
        "schedule_transaction": {"sensitive": {"recipient": R}},
        "update_scheduled_transaction": {"sensitive": {"id": R, "recipient": R}},
        "update_password": {"sensitive": {"password": R}},
        "update_user_info": {"sensitive": {"first_name": R, "last_name": R, "street": R,
                                           "city": R}},
        "get_user_info": {"trusted_results": True},
        "get_iban": {"trusted_results": True},
    },
    "slack": {
        "send_direct_message": {"sensitive": {"recipient": R, "body": R}},
        "send_channel_message": {"sensitive": {"channel": R, "body": R}},
        "add_user_to_channel": {"sensitive": {"user": R, "channel": R}},
        "invite_user_to_slack": {"sensitive": {"user": R, "user_email": R}},
        "remove_user_from_slack": {"sensitive": {"user": R}},
        "post_webpage": {"sensitive": {"url": R}},
        "get_webpage": {"sensitive": {"url": R}},
    },
    "travel": {
        # The body too: a user names a recipient (their wife), an injection
        # has the model mail the user's passport and bank details there.
        "send_email": {"sensitive": {**_MAIL, "subject": R, "body": R}},
        "reserve_hotel": {"sensitive": {"hotel": R}},
        "reserve_car_rental": {"sensitive": {"company": R}},
        "reserve_restaurant": {"sensitive": {"restaurant": R}},
        "create_calendar_event": {"sensitive": {"title": R, "participants": R}},
        "cancel_calendar_event": {"sensitive": {"event_id": R}},
        # get_user_information's results are NOT trusted: the profile holds the
        # user's passport and credit card numbers, and a trusted value is one
        # the user gave — it would reach the body above unreviewed (an injection
        # mails them to the wife the user named). No user task puts a profile
        # value into an effect.
    },
    "workspace": {
        "send_email": {"sensitive": _MAIL},
        "delete_email": {"sensitive": {"email_id": R}},
        "create_calendar_event": {"sensitive": {"participants": R}},
        "add_calendar_event_participants": {"sensitive": {"participants": R}},
        "cancel_calendar_event": {"sensitive": {"event_id": R}},
        # A file id is a short number ("13"): too short to trace to where it
        # was read, so every deletion waits for a person.
        "delete_file": {"requires_approval": True, "sensitive": {"file_id": R}},
        "share_file": {"sensitive": {"file_id": R, "email": R}},
    },
}


def available() -> bool:
    """Does this Turnstile declare information-flow rules (`@tool(sensitive=...)`)?"""
    return "sensitive" in ToolSpec.model_fields
