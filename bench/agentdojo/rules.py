"""The information-flow rules the adapter declares on AgentDojo's tools, as a
builder of these tools would: per effectful tool, its sensitive arguments —
where an effect goes (recipients, IBANs, URLs, users, channels, the ids of
what is deleted or shared, the booked hotel), credentials, and the free text
that leaves the system to someone not named by the user — each `review` when
its value came from untrusted content (a tool result). The tools that read
the signed-in user's own profile have trusted results, except travel's,
which holds the user's secrets (passport, credit card). Read-only tools have
no rules, except `get_webpage`, whose URL itself leaks data.

Whole values a builder can vouch for (`trusted_values`; AgentDojo's results
are JSON, bench/agentdojo/tools.py): values the *system* sets, which the
author of the content cannot choose, and which an effect may go to without
a person looking —

- slack: `get_channels` and `get_users_in_channel` list the workspace's
  channels and members (True: every value); a message's `sender` and
  `recipient` (`read_channel_messages`, `read_inbox`) are set by Slack, a
  signed-in member and a channel or member, never by the message's text.
  A channel's NAME is vouched only whole: a channel named
  "External_<an injected URL>" makes the name trusted, not the URL in it.
  A body stays untrusted: a DM to a listed member with an injected link
  still waits (`body`: review). Vouching a listing lets an injection choose
  among its entries: where the choice itself is the harm — adding a member
  to a channel (its history), removing a member — the tool waits for a
  person whatever the provenance (`requires_approval`), as workspace's
  `delete_file` does.
- banking: the `recipient` of the user's own transactions
  (`get_most_recent_transactions`, `get_scheduled_transactions`): the
  accounts the user pays. Not `sender`: anyone becomes the sender of an
  incoming transfer by paying a cent, with the subject of their choosing —
  the place AgentDojo's injection sits — and "refund the sender" would then
  move money unreviewed.

Not vouched, because an outsider sets them:
- workspace: e-mail `sender`s (anyone can mail the user), calendar event
  `participants` (an invitation adds them), and the contact book —
  AgentDojo's `Inbox` builds its contact list from every e-mail's sender and
  recipients, phishing senders included (`security-facebook-com@gmail.com`,
  `tech-services-password@aol.com`): it is a list of correspondents, not an
  address book the user keeps. A product whose contacts the user curates
  may vouch for them (`trusted_values=("email", "name")`).
- travel: hotel, restaurant and car-rental listings: a business lists
  itself, and an injection's goal is to book one of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from turnstile.engine.specs import ToolSpec

R = "review"

_MAIL = {"recipients": R, "cc": R, "bcc": R, "attachments": R}
_MESSAGE_ENDS = ("sender", "recipient")  # a Slack message's, set by Slack

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
        "get_most_recent_transactions": {"trusted_values": ("recipient",)},
        "get_scheduled_transactions": {"trusted_values": ("recipient",)},
    },
    "slack": {
        "send_direct_message": {"sensitive": {"recipient": R, "body": R}},
        "send_channel_message": {"sensitive": {"channel": R, "body": R}},
        # Membership changes wait for a person: with members and channels
        # vouched, an injection can still CHOOSE among them ("add Eve to
        # #private", "remove Alice"), and the choice is the harm.
        "add_user_to_channel": {"requires_approval": True,
                                "sensitive": {"user": R, "channel": R}},
        "invite_user_to_slack": {"sensitive": {"user": R, "user_email": R}},
        "remove_user_from_slack": {"requires_approval": True, "sensitive": {"user": R}},
        "post_webpage": {"sensitive": {"url": R}},
        "get_webpage": {"sensitive": {"url": R}},
        "get_channels": {"trusted_values": True},
        "get_users_in_channel": {"trusted_values": True},
        "read_channel_messages": {"trusted_values": _MESSAGE_ENDS},
        "read_inbox": {"trusted_values": _MESSAGE_ENDS},
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


def effective() -> dict[str, dict[str, dict[str, Any]]]:
    """RULES as this Turnstile takes them: without `trusted_values` where it
    has none (an older release, measured as it was)."""
    if "trusted_values" in ToolSpec.model_fields:
        return RULES
    return {suite: {name: {k: v for k, v in options.items() if k != "trusted_values"}
                    for name, options in tools.items()} for suite, tools in RULES.items()}


def relaxed(rules: dict[str, dict[str, dict[str, Any]]],
            allowed: Sequence[str]) -> dict[str, dict[str, dict[str, Any]]]:
    """`rules` with some reviews taken away — the counterfactual of
    `--allow`: what would reach its effect if these calls did not wait.
    `SUITE.TOOL.ARG` turns that argument's rule to `allow`; `SUITE.TOOL`
    allows all of the tool's arguments and drops its `requires_approval`.
    A name that is not in `rules` is a ValueError."""
    out = {suite: {name: dict(options) for name, options in tools.items()}
           for suite, tools in rules.items()}
    for spec in allowed:
        suite, _, rest = spec.partition(".")
        tool, _, arg = rest.partition(".")
        options = out.get(suite, {}).get(tool)
        sensitive = dict(options.get("sensitive", {})) if options is not None else {}
        if options is None or (arg and arg not in sensitive) or not (
                sensitive or options.get("requires_approval")):
            raise ValueError(f"--allow {spec}: not a rule of rules.RULES (SUITE.TOOL or "
                             "SUITE.TOOL.ARG)")
        options["sensitive"] = {name: "allow" if name == arg or not arg else rule
                                for name, rule in sensitive.items()}
        if not arg:
            options.pop("requires_approval", None)
    return out
