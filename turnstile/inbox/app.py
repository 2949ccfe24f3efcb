"""`python starter.py inbox`: pending approvals across turns, in the browser.

Starlette + Jinja2 (autoescaped: arguments come from a model and may carry
markup), no JavaScript: the list refreshes itself every few seconds, forms
post. Every decision goes through `TurnstileClient.review`, so the turn's own
rules apply (self-approval, approver lists, already decided, past the
deadline) and a refusal is shown with its reason.

Who the reviewer is:

- `TURNSTILE_INBOX_IDENTITY_HEADER` set (e.g. `X-Forwarded-User`): the value
  of that header, set by an authenticating proxy in front of the inbox; a
  request without it may look but not act.
- unset (development): a name entered once per browser session, kept in a
  signed cookie.

Forms carry a CSRF token bound to the reviewer (an HMAC of the identity with
the process's secret, `TURNSTILE_INBOX_SECRET` or a random one per start).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from pathlib import Path
from typing import Any
from urllib.parse import quote

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from turnstile.client import ApprovalRefused, TurnNotFound, TurnstileClient
from turnstile.engine.identity import name_problem
from turnstile.engine.masking import mask_value
from turnstile.engine.turn_input_rules import id_problem
from turnstile.runtime.config import Settings

COOKIE = "turnstile_reviewer"


def shown_arguments(arguments: Any, review_fields: Any) -> Any:
    """The arguments as the reviewer sees them: masked as the audit log masks
    them, except the fields the reviewer must see to decide (the tool's
    review fields, e.g. an e-mail's recipient)."""
    if not isinstance(arguments, dict):
        return mask_value(arguments)
    keep = set(review_fields)
    return {k: (v if k in keep else mask_value(v)) for k, v in arguments.items()}
TEMPLATES = Environment(loader=FileSystemLoader(Path(__file__).parent / "templates"),
                        autoescape=select_autoescape(default=True, default_for_string=True))


class Inbox:
    def __init__(self, settings: Settings, client: TurnstileClient | None = None,
                 secret: str | None = None) -> None:
        self.settings = settings
        self.header = os.environ.get("TURNSTILE_INBOX_IDENTITY_HEADER") or None
        self.web_ui = settings.web_ui_url
        key = secret or os.environ.get("TURNSTILE_INBOX_SECRET") or secrets.token_hex(32)
        self.secret = key.encode()
        self._client = client

    async def client(self) -> TurnstileClient:
        if self._client is None:  # connected on the server's own event loop
            self._client = await TurnstileClient.connect(self.settings)
        return self._client

    # -- identity and CSRF -----------------------------------------------------
    def _sign(self, value: str) -> str:
        return hmac.new(self.secret, value.encode(), hashlib.sha256).hexdigest()

    def reviewer(self, request: Request) -> str | None:
        if self.header:
            name = request.headers.get(self.header, "").strip()
            return name or None
        raw = request.cookies.get(COOKIE, "")
        name, _, mac = raw.rpartition(".")
        if name and hmac.compare_digest(mac, self._sign("name:" + name)):
            from urllib.parse import unquote

            return unquote(name)
        return None

    def csrf(self, reviewer: str) -> str:
        return self._sign("csrf:" + reviewer)

    def render(self, name: str, status: int = 200, **context: Any) -> HTMLResponse:
        body = TEMPLATES.get_template(name).render(
            header=self.header, web_ui=self.web_ui,
            namespace=self.settings.temporal_namespace, **context)
        return HTMLResponse(body, status_code=status)

    # -- pages -------------------------------------------------------------------
    async def index(self, request: Request) -> Response:
        reviewer = self.reviewer(request)
        if reviewer is None and not self.header:
            return RedirectResponse("/login", status_code=303)
        service = request.query_params.get("service") or None
        tool = request.query_params.get("tool") or None
        pending = await (await self.client()).pending_approvals(reviewer=reviewer,
                                                                 service=service)
        if tool:
            pending = [p for p in pending if p.tool_name == tool]
        return self.render("index.html", reviewer=reviewer, pending=pending,
                           service=service or "", tool=tool or "")

    async def login(self, request: Request) -> Response:
        if self.header:
            return self.render("message.html", 404, title="No login here",
                               text=f"Reviewers are identified by the {self.header} header.")
        if request.method == "GET":
            return self.render("login.html", error=None)
        form = await request.form()
        name = str(form.get("name", "")).strip()
        # A name the identity rule refuses could decide nothing (docs/identity.md).
        problem = id_problem("name", name) or (
            f"name: {name_problem(name)}" if name_problem(name) else None)
        if problem:
            return self.render("login.html", 400, error=problem)
        response = RedirectResponse("/", status_code=303)
        value = quote(name, safe="")
        response.set_cookie(COOKIE, f"{value}.{self._sign('name:' + value)}", httponly=True,
                            samesite="strict")
        return response

    async def call(self, request: Request) -> Response:
        workflow_id = request.path_params["workflow_id"]
        call_id = request.path_params["tool_call_id"]
        reviewer = self.reviewer(request)
        client = await self.client()
        outcome: dict[str, Any] = {}
        status = 200
        if request.method == "POST":
            form = await request.form()
            if reviewer is None:
                return self.render("message.html", 403, title="Who are you?",
                                   text="Deciding needs a reviewer's identity.")
            if not hmac.compare_digest(str(form.get("csrf", "")), self.csrf(reviewer)):
                return self.render("message.html", 403, title="Refused",
                                   text="The form's token does not match (CSRF).")
            approved = form.get("decision") == "approve"
            try:
                outcome["decision"] = await client.review(
                    workflow_id, call_id, approved, reviewer, str(form.get("note", "")))
            except (ApprovalRefused, TurnNotFound) as err:
                outcome["refused"] = str(err)
                status = 409
        view = await client.pending_approval(workflow_id, call_id)
        # JSON as the reviewer reads it (characters, not \u escapes); Jinja escapes it.
        arguments = json.dumps(shown_arguments(view.arguments, view.highlights),
                               ensure_ascii=False, indent=2, default=str) if view else None
        return self.render("call.html", status, reviewer=reviewer, view=view, arguments=arguments,
                           workflow_id=workflow_id, tool_call_id=call_id,
                           csrf=self.csrf(reviewer) if reviewer else "",
                           **outcome)


def build_app(settings: Settings | None = None, client: TurnstileClient | None = None,
              secret: str | None = None) -> Starlette:
    inbox = Inbox(settings or Settings.from_env(), client, secret)
    return Starlette(routes=[
        Route("/", inbox.index),
        Route("/login", inbox.login, methods=["GET", "POST"]),
        Route("/calls/{workflow_id}/{tool_call_id}", inbox.call, methods=["GET", "POST"]),
    ])


def serve(host: str = "127.0.0.1", port: int = 8234) -> None:
    import uvicorn

    uvicorn.run(build_app(), host=host, port=port, log_level="info")
