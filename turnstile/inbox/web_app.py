"""`python starter.py inbox`: pending approvals across turns, in the browser.

Starlette + Jinja2 (autoescaped: arguments come from a model and may carry
markup); one small script (static/inbox.js, no build step) refreshes the
list in place (fetch: what a reviewer types stays), shows times relative in
the reviewer's time zone and counts deadlines down. Every decision goes
through `TurnstileClient.review` with the digest of the call the reviewer
saw, so the turn's own rules apply (self-approval, approver lists, already
decided, past the deadline, stale, an edit that fails validation) and a
refusal is shown with its reason.

Identity and the page's protections: turnstile.inbox.security (docs/inbox.md).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import quote

import uvicorn
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from turnstile.client import (
    ApprovalRefused,
    GrantNotFound,
    PendingApprovalView,
    TurnNotFound,
    TurnstileClient,
)
from turnstile.engine.contract import ApprovalDecision
from turnstile.engine.identity import name_problem
from turnstile.engine.masking import mask_text
from turnstile.engine.turn_input_rules import id_problem
from turnstile.inbox import records
from turnstile.inbox.grant_forms import GrantFormProblem, grant_request, offered_fields, page_rows
from turnstile.inbox.security import (
    COOKIE,
    LOGIN_COOKIE,
    LOGIN_SECONDS,
    SESSION_COOKIE,
    Identity,
    InboxSecurity,
    check_host,
    security_headers,
)
from turnstile.inbox.views import (
    EditProblem,
    as_json,
    call_url,
    changed_fields,
    edited_arguments,
    fields,
    matches,
    shown_arguments,
    utc_text,
)
from turnstile.runtime.config import Settings
from turnstile.stores import grant_store
from turnstile.stores.db import Database

__all__ = ["build_app", "serve", "server", "shown_arguments"]

log = logging.getLogger(__name__)
HERE = Path(__file__).parent
TEMPLATES = Environment(loader=FileSystemLoader(HERE / "templates"),
                        autoescape=select_autoescape(default=True, default_for_string=True))
TEMPLATES.filters["utc"] = utc_text
TEMPLATES.globals["call_url"] = call_url
# One path segment, "/" and "." included: no id can leave its segment.
TEMPLATES.filters["segment"] = lambda text: quote(str(text), safe="").replace(".", "%2E")


class Headers(BaseHTTPMiddleware):
    """Every answer: not framed, a CSP whose only inline script is by nonce."""

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        request.state.nonce = secrets.token_urlsafe(16)
        response = await call_next(request)
        response.headers.update(security_headers(request.state.nonce))
        identity = getattr(request.state, "identity", None)
        security: InboxSecurity = request.app.state.inbox.security
        if (isinstance(identity, Identity) and identity.session is not None
                and identity.session.fresh and security.header
                and not getattr(request.state, "logged_out", False)):
            # Header mode: the browser's session (its forms' CSRF tokens), made on
            # its first page and kept for TURNSTILE_INBOX_SESSION_HOURS.
            response.set_cookie(SESSION_COOKIE, security.session_cookie(identity.session),
                                **security.cookie_options(request))
        return response


class Inbox:
    def __init__(self, settings: Settings, client: TurnstileClient | None = None,
                 secret: str | None = None) -> None:
        self.settings = settings
        self.security = InboxSecurity.from_env(secret=secret)
        self.header = self.security.header
        self._client = client
        self.db = Database(settings.database_url, readonly_url=settings.database_readonly_url)

    async def client(self) -> TurnstileClient:
        if self._client is None:  # connected on the server's own event loop
            self._client = await TurnstileClient.connect(self.settings)
        return self._client

    def render(self, request: Request, name: str, status: int = 200,
               **context: Any) -> HTMLResponse:
        identity = getattr(request.state, "identity", None)
        csrf = ""
        if isinstance(identity, Identity) and identity.session and identity.name:
            csrf = self.security.csrf(identity.session, identity.name)
        context.setdefault("csrf", csrf)
        body = TEMPLATES.get_template(name).render(
            header=self.header, web_ui=self.settings.web_ui_url,
            namespace=self.settings.temporal_namespace,
            nonce=getattr(request.state, "nonce", ""), **context)
        return HTMLResponse(body, status_code=status)

    def who(self, request: Request) -> tuple[str | None, Response | None]:
        """The reviewer, or the answer for a request that has none (no data)."""
        identity: Identity = self.security.identify(request)
        if identity.problem:
            return None, self.render(request, "message.html", 400, title="Refused",
                                     text=identity.problem)
        if identity.name is None:
            if self.header:
                return None, self.render(
                    request, "message.html", 401, title="Who are you?",
                    text=f"Sign in through your organisation's proxy (it sets {self.header}).")
            if request.method == "GET":
                return None, RedirectResponse("/login", status_code=303)
            return None, self.render(request, "message.html", 403, title="Who are you?",
                                     text="Deciding needs a reviewer's identity.")
        return identity.name, None

    async def _posted(self, request: Request, reviewer: str, page: str
                      ) -> tuple[dict[str, str], Response | None]:
        """A POSTed form, or the answer refusing it: its CSRF token must be the
        session's (`page`: what to open again)."""
        form = {k: str(v) for k, v in (await request.form()).items()}
        if not self.security.csrf_ok(self.security.identify(request), form.get("csrf", "")):
            return form, self.render(request, "message.html", 403, title="Refused",
                                     text="The form's token does not match (CSRF): open the "
                                          f"{page} again.", reviewer=reviewer)
        return form, None

    async def _read(self, what: Any, *args: Any) -> Any:
        """A database read for a page, or None (said on the page) when it fails."""
        try:
            return await asyncio.to_thread(what, self.db, *args)
        except Exception as err:  # noqa: BLE001 - the page still answers without it
            log.warning("inbox: %s failed: %s", getattr(what, "__name__", what), err)
            return None

    # -- the list ----------------------------------------------------------------
    async def _rows(self, request: Request, reviewer: str) -> dict[str, Any]:
        q = request.query_params
        service, tool, text = (q.get("service", "").strip(), q.get("tool", "").strip(),
                               q.get("q", "").strip())
        found = await (await self.client()).approvals(reviewer=reviewer)
        pending = [p for p in found.pending
                   if matches(service, p.service) and matches(tool, p.tool_name)
                   and matches(text, p.tool_name, p.requester, p.conversation_id, p.workflow_id,
                               *p.highlights.values())]
        unanswered = [u for u in found.unanswered
                      if matches(service, u.service)
                      and matches(text, u.requester, u.conversation_id, u.workflow_id)]
        return {"pending": pending, "unanswered": unanswered, "service": service,
                "tool": tool, "q": text}

    async def index(self, request: Request) -> Response:
        reviewer, refused = self.who(request)
        if refused:
            return refused
        assert reviewer is not None
        return self.render(request, "index.html", reviewer=reviewer,
                           **await self._rows(request, reviewer))

    async def rows(self, request: Request) -> Response:
        """The list's rows only: what the page's script fetches to refresh."""
        reviewer, refused = self.who(request)
        if refused:
            return refused
        assert reviewer is not None
        return self.render(request, "rows.html", **await self._rows(request, reviewer))

    async def decided(self, request: Request) -> Response:
        reviewer, refused = self.who(request)
        if refused:
            return refused
        text = request.query_params.get("q", "").strip()
        rows = await self._read(records.recent_decisions, 100, text)
        return self.render(request, "decided.html", reviewer=reviewer, rows=rows, q=text)

    # -- login (development) and logout ---------------------------------------
    async def login(self, request: Request) -> Response:
        if self.header:
            return self.render(request, "message.html", 404, title="No login here",
                               text=f"Reviewers are identified by the {self.header} header.")
        current = self.security.identify(request).name
        if request.method == "GET":
            nonce = secrets.token_hex(16)
            page = self.render(request, "login.html", error=None, reviewer=current,
                               login_csrf=self.security.login_token(nonce))
            page.set_cookie(LOGIN_COOKIE, nonce,
                            **self.security.cookie_options(request, LOGIN_SECONDS))
            return page
        form = await request.form()
        if not self.security.login_ok(request, str(form.get("csrf", ""))):
            text = ("The login form's token does not match (CSRF): open the login page again.")
            if LOGIN_COOKIE not in request.cookies and self.security.secure(request) and (
                    request.url.scheme == "http"):
                text = ("The login form's cookie did not come back: over plain http from "
                        "another machine the inbox's cookies are Secure (a browser sends them "
                        "over https only). Serve the inbox over https, or set "
                        "TURNSTILE_INBOX_SECURE_COOKIE=false (docs/inbox.md).")
            return self.render(request, "message.html", 403, title="Refused", text=text)
        name = str(form.get("name", "")).strip()
        # A name the identity rule refuses could decide nothing (docs/identity.md).
        problem = id_problem("name", name) or (
            f"name: {name_problem(name)}" if name_problem(name) else None)
        if problem:
            nonce = request.cookies.get(LOGIN_COOKIE, "")
            return self.render(request, "login.html", 400, error=problem, reviewer=current,
                               login_csrf=self.security.login_token(nonce))
        response = RedirectResponse("/", status_code=303)
        # A new session (a new random id, so a new CSRF token) at every login.
        response.set_cookie(COOKIE, self.security.session_cookie(
            self.security.new_session(name)), **self.security.cookie_options(request))
        response.delete_cookie(LOGIN_COOKIE, path="/", secure=self.security.secure(request),
                               httponly=True, samesite="strict")
        return response

    async def logout(self, request: Request) -> Response:
        identity = self.security.identify(request)
        form = {k: str(v) for k, v in (await request.form()).items()}
        if identity.name is not None and not self.security.csrf_ok(identity,
                                                                    form.get("csrf", "")):
            return self.render(request, "message.html", 403, title="Refused",
                               text="The form's token does not match (CSRF).")
        request.state.logged_out = True
        response = RedirectResponse("/" if self.header else "/login", status_code=303)
        for name in (COOKIE, SESSION_COOKIE, LOGIN_COOKIE):
            response.delete_cookie(name, path="/", secure=self.security.secure(request),
                                   httponly=True, samesite="strict")
        return response

    # -- one call ----------------------------------------------------------------
    async def old_call_link(self, request: Request) -> Response:
        """`/calls/{workflow_id}/{tool_call_id}` (the v0.4 route, still in the
        contract): GET goes to the call's page, whose ids are query parameters
        (docs/inbox.md); a decision POSTed here is taken as on that page."""
        if request.method == "POST":
            return await self.call(request)
        return RedirectResponse(call_url(request.path_params["workflow_id"],
                                         request.path_params["tool_call_id"]),
                                status_code=303)

    async def call(self, request: Request) -> Response:
        workflow_id = (request.query_params.get("workflow")
                       or request.path_params.get("workflow_id", ""))
        call_id = request.query_params.get("call") or request.path_params.get("tool_call_id", "")
        reviewer, refused = self.who(request)
        if refused:
            return refused
        assert reviewer is not None
        if not workflow_id or not call_id:
            return self.render(request, "message.html", 400, title="Which call?",
                               text="A call's page needs ?workflow=ID&call=ID.",
                               reviewer=reviewer)
        client = await self.client()
        context: dict[str, Any] = {"form": {}}
        status = 200
        if request.method == "POST":
            form, refused = await self._posted(request, reviewer, "call's page")
            if refused:
                return refused
            status = await self._decide(client, workflow_id, call_id, reviewer, form, context)
        view = await client.pending_approval(workflow_id, call_id)
        if view is not None:
            # What the user asked and the turn's notes: masked as the audit log masks.
            view = view.model_copy(update={
                "message": None if view.message is None else mask_text(view.message),
                "notes": [mask_text(n) for n in view.notes]})
            shown = shown_arguments(view.arguments, view.highlights)
            context.update(fields=fields(shown, view.highlights), arguments_json=as_json(shown),
                           grant_fields=offered_fields(view.grant_offer),
                           messages=await self._read(records.recent_messages,
                                                     view.conversation_id))
        else:
            context["decided"] = await self._read(records.decision_of, workflow_id, call_id)
        if "decision" in context:
            context["next_call"] = await self._next_call(client, reviewer, workflow_id, call_id)
        return self.render(request, "call.html", status, reviewer=reviewer, view=view,
                           workflow_id=workflow_id, tool_call_id=call_id, **context)

    async def _decide(self, client: TurnstileClient, workflow_id: str, call_id: str,
                      reviewer: str, form: dict[str, str], context: dict[str, Any]) -> int:
        approved = form.get("decision") == "approve"
        digest = form.get("arguments_digest") or None
        arguments = None
        view = None
        if approved:
            view = await client.pending_approval(workflow_id, call_id)
            if view is not None:
                try:
                    arguments = edited_arguments(view.arguments, list(view.highlights), form)
                except EditProblem as problem:
                    context.update(refused=str(problem), form=form)
                    return 400
                context["edited"] = changed_fields(view.arguments, arguments)
        grant = None
        if approved and view is not None:
            try:
                grant = grant_request(form, view.grant_offer, arguments if arguments is not None
                                      else view.arguments if isinstance(view.arguments, dict)
                                      else {})
            except GrantFormProblem as problem:
                context.update(refused=str(problem), form=form)
                return 400
        try:
            decision: ApprovalDecision = await client.review(
                workflow_id, call_id, approved, reviewer, form.get("note", ""),
                arguments=arguments, arguments_digest=digest, grant=grant)
        except (ApprovalRefused, TurnNotFound) as err:
            # The reviewer's edits stay in the form, to be corrected.
            context.update(refused=str(err), form=form if arguments is not None else {})
            return 409
        context["decision"] = decision
        return 200

    # -- standing approvals -------------------------------------------------------
    async def grants(self, request: Request) -> Response:
        """`/grants`: the standing approvals, live ones (`?all=1`: every one),
        each with a revoke form; POST revokes one as the reviewer."""
        reviewer, refused = self.who(request)
        if refused:
            return refused
        assert reviewer is not None
        context: dict[str, Any] = {}
        status = 200
        if request.method == "POST":
            form, refused = await self._posted(request, reviewer, "grants page")
            if refused:
                return refused
            try:
                revoked = await (await self.client()).revoke_grant(
                    form.get("grant_id", ""), reviewer, form.get("reason", ""))
                context["revoked"] = revoked
            except (GrantNotFound, ApprovalRefused) as err:
                context["refused"] = str(err)
                status = 404 if isinstance(err, GrantNotFound) else 400
        everything = request.query_params.get("all") == "1"
        found = await self._read(partial(grant_store.listed, include_ended=everything))
        return self.render(request, "grants.html", status, reviewer=reviewer, all=everything,
                           rows=None if found is None else page_rows(found), **context)

    async def _next_call(self, client: TurnstileClient, reviewer: str, workflow_id: str,
                         call_id: str) -> PendingApprovalView | None:
        found = await client.approvals(reviewer=reviewer)
        return next((p for p in found.pending
                     if (p.workflow_id, p.tool_call_id) != (workflow_id, call_id)), None)


def build_app(settings: Settings | None = None, client: TurnstileClient | None = None,
              secret: str | None = None) -> Starlette:
    inbox = Inbox(settings or Settings.from_env(), client, secret)
    app = Starlette(routes=[
        Route("/", inbox.index),
        Route("/rows", inbox.rows),
        Route("/decided", inbox.decided),
        Route("/grants", inbox.grants, methods=["GET", "POST"]),
        Route("/login", inbox.login, methods=["GET", "POST"]),
        Route("/logout", inbox.logout, methods=["POST"]),
        # A workflow id may hold anything ("/", "..", "%2F"): the ids are query
        # parameters, which no browser or proxy normalises (views.call_url).
        Route("/call", inbox.call, methods=["GET", "POST"]),
        Route("/calls/{workflow_id:path}/{tool_call_id}", inbox.old_call_link,
              methods=["GET", "POST"]),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ])
    app.add_middleware(Headers)
    app.state.inbox = inbox
    return app


def server(app: Starlette, host: str = "127.0.0.1", port: int = 8234,
           log_level: str = "info") -> uvicorn.Server:
    """The inbox's uvicorn server, as `serve` runs it (and the tests do).

    uvicorn's proxy-header handling is off: by default it rewrites the
    request's peer from `X-Forwarded-For` for peers in FORWARDED_ALLOW_IPS
    (127.0.0.1), which would let anyone on this host choose the address the
    trusted-proxy check sees. The inbox reads the socket's peer and no
    forwarded-for header, ever (docs/inbox.md, docs/security.md)."""
    return uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level,
                                         proxy_headers=False, forwarded_allow_ips=""))


def serve(host: str = "127.0.0.1", port: int = 8234,
          allow_dev_login_on_network: bool = False) -> None:
    app = build_app()
    check_host(host, app.state.inbox.security, allow_dev_login_on_network)
    server(app, host, port).run()
