"""Who a request of the inbox is, and the page's protections (docs/inbox.md).

Two identity modes:

- **header** (`TURNSTILE_INBOX_IDENTITY_HEADER`, e.g. `X-Forwarded-User`):
  an authenticating proxy in front of the inbox names the reviewer. The
  header is believed only when it is bound to the proxy: from a configured
  proxy address (`TURNSTILE_INBOX_TRUSTED_PROXIES`, addresses or networks,
  comma-separated) *as seen on the socket* (`scope["client"]`; the inbox is
  served with uvicorn's proxy-header handling off, and no forwarded-for
  header is ever read) and/or with the proxy's shared secret in
  `X-Turnstile-Proxy-Secret` (`TURNSTILE_INBOX_PROXY_SECRET`); each check
  that is configured must pass, and at least one must be. The value is read
  from the request's raw bytes as UTF-8 (or RFC 8187 `UTF-8''%C3%96laf`);
  one that does not decode, is repeated, holds a comma (a proxy that folded
  two into one) or is not a valid identity (turnstile.engine.identity) is
  refused, and the refusal is logged. `TURNSTILE_INBOX_SECRET` (signing the
  session cookies and forms' tokens) must be set: a per-process secret would
  break them across restarts and replicas.
- **development** (no header configured): a name entered once, in a signed,
  expiring session cookie. Anyone may call themselves anyone, so the inbox
  refuses to listen on anything but a loopback address unless told
  (`--allow-dev-login-on-network`).

Sessions: a random id per login (development) or per browser (header mode),
with its issue time, signed; the cookie's `Max-Age` and the signed issue time
(checked here) both end it after `TURNSTILE_INBOX_SESSION_HOURS`. A form's
CSRF token is the HMAC of the session id and the reviewer: random per
session, useless without the session's cookie.

A request without an identity sees no data at all (header mode: a page
saying so; development: the login form).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote_to_bytes

from starlette.requests import Request

from turnstile.engine.identity import name_problem
from turnstile.engine.turn_input_rules import id_problem

log = logging.getLogger(__name__)

COOKIE = "turnstile_reviewer"  # development: the signed session with its reviewer
SESSION_COOKIE = "turnstile_session"  # header mode: the signed session (no name)
LOGIN_COOKIE = "turnstile_login"  # the login form's nonce, before anyone is known
PROXY_SECRET_HEADER = "X-Turnstile-Proxy-Secret"
SESSION_HOURS = 12.0
LOGIN_SECONDS = 3600
# A session issued this far in the future (clock skew between replicas) still counts.
SKEW_SECONDS = 300
RFC8187 = "utf-8''"


class InboxConfigError(RuntimeError):
    """The inbox's settings would make it unsafe; says which and what to set."""


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _networks(text: str) -> list[Network]:
    out: list[Network] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            out.append(ipaddress.ip_network(part, strict=False))
        except ValueError as err:
            raise InboxConfigError(
                f"TURNSTILE_INBOX_TRUSTED_PROXIES: {part!r} is not an address or network") from err
    return out


def _hours(text: str) -> float:
    try:
        hours = float(text)
    except ValueError as err:
        raise InboxConfigError(f"TURNSTILE_INBOX_SESSION_HOURS: {text!r} is not a number") from err
    if not 0 < hours <= 24 * 30:
        raise InboxConfigError("TURNSTILE_INBOX_SESSION_HOURS must be above 0 and at most 720")
    return hours


def _secure_setting(text: str) -> str:
    value = text.strip().lower() or "auto"
    if value not in ("auto", "true", "false"):
        raise InboxConfigError(
            f"TURNSTILE_INBOX_SECURE_COOKIE: {text!r} is not auto, true or false")
    return value


@dataclass(frozen=True)
class Session:
    """One signed session: a random id, when it was issued, and (development)
    the reviewer it names."""

    sid: str
    issued_at: int
    name: str | None = None
    fresh: bool = False  # made for this request: its cookie goes out with the answer


@dataclass
class Identity:
    """Who the request is: `name` (None: anonymous), or `problem` (refused)."""

    name: str | None = None
    problem: str | None = None
    session: Session | None = None


def socket_peer(request: Request) -> str:
    """The peer's address as the socket saw it. The inbox is served with
    uvicorn's proxy-header handling off (app.server), so nothing rewrote it."""
    client = request.scope.get("client")
    return str(client[0]) if client else ""


def raw_header(request: Request, name: str) -> list[bytes]:
    """Every value of header `name`, as the bytes that came in (Starlette's
    str form is Latin-1: `Ölaf` sent as UTF-8 would read `Ã\\x96laf`)."""
    key = name.lower().encode("latin-1")
    return [v for k, v in request.scope.get("headers", []) if k.lower() == key]


def decoded_identity(raw: bytes) -> tuple[str | None, str | None]:
    """(name, None), or (None, why the header's value names nobody).

    UTF-8, strictly; a value in RFC 8187's form (`UTF-8''%C3%96laf`, for a
    proxy that can send only ASCII) is percent-decoded as UTF-8. Then the
    identity rule (docs/identity.md) must accept the name."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        return None, (f"the value is not UTF-8 (byte 0x{raw[err.start]:02x} at position "
                      f"{err.start}): send the name as UTF-8 or as RFC 8187 UTF-8''…")
    text = text.strip(" \t")
    if text[:len(RFC8187)].lower() == RFC8187:
        try:
            text = unquote_to_bytes(text[len(RFC8187):]).decode("utf-8")
        except UnicodeDecodeError:
            return None, "the RFC 8187 value does not decode as UTF-8"
    if "," in text:
        return None, "it holds a comma (two names folded into one)"
    problem = id_problem("the name", text) or name_problem(text)
    if problem:
        return None, problem
    return text, None


@dataclass
class InboxSecurity:
    header: str | None = None
    secret: bytes = b""
    trusted: list[Network] = field(default_factory=list)
    proxy_secret: str | None = None
    session_seconds: int = int(SESSION_HOURS * 3600)
    secure_cookie: str = "auto"  # auto | true | false
    clock: Callable[[], float] = time.time

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None,
                 secret: str | None = None) -> InboxSecurity:
        e = os.environ if env is None else env
        header = (e.get("TURNSTILE_INBOX_IDENTITY_HEADER") or "").strip() or None
        key = secret or e.get("TURNSTILE_INBOX_SECRET") or ""
        trusted = _networks(e.get("TURNSTILE_INBOX_TRUSTED_PROXIES") or "")
        proxy_secret = e.get("TURNSTILE_INBOX_PROXY_SECRET") or None
        hours = _hours(e.get("TURNSTILE_INBOX_SESSION_HOURS") or str(SESSION_HOURS))
        secure = _secure_setting(e.get("TURNSTILE_INBOX_SECURE_COOKIE") or "auto")
        if header:
            if not key:
                raise InboxConfigError(
                    "header identity needs TURNSTILE_INBOX_SECRET (the same on every "
                    "replica and across restarts: it signs the sessions and forms' tokens)")
            if not trusted and not proxy_secret:
                raise InboxConfigError(
                    f"nothing binds {header} to your proxy: set TURNSTILE_INBOX_TRUSTED_PROXIES "
                    f"(its addresses) and/or TURNSTILE_INBOX_PROXY_SECRET (sent by the proxy "
                    f"in {PROXY_SECRET_HEADER})")
        elif not key:
            log.warning("TURNSTILE_INBOX_SECRET is not set: development logins last until "
                        "the inbox restarts")
            key = secrets.token_hex(32)
        return cls(header=header, secret=key.encode(), trusted=trusted,
                   proxy_secret=proxy_secret, session_seconds=int(hours * 3600),
                   secure_cookie=secure)

    # -- signing -----------------------------------------------------------------
    def sign(self, value: str) -> str:
        return hmac.new(self.secret, value.encode(), hashlib.sha256).hexdigest()

    # -- sessions ----------------------------------------------------------------
    def new_session(self, name: str | None = None) -> Session:
        return Session(secrets.token_hex(16), int(self.clock()), name, fresh=True)

    def session_cookie(self, session: Session) -> str:
        payload = f"{session.sid}.{session.issued_at}"
        if session.name is not None:
            payload += "." + quote(session.name, safe="")
        return f"{payload}.{self.sign('session:' + payload)}"

    def read_session(self, raw: str, named: bool) -> Session | None:
        """The session a cookie holds, None when it is forged, malformed or expired."""
        payload, _, mac = raw.rpartition(".")
        if not payload or not hmac.compare_digest(mac, self.sign("session:" + payload)):
            return None
        parts = payload.split(".", 2)
        if len(parts) != (3 if named else 2) or not parts[1].isdigit():
            return None
        issued = int(parts[1])
        now = self.clock()
        if not issued - SKEW_SECONDS <= now < issued + self.session_seconds:
            return None
        name = unquote_to_bytes(parts[2]).decode("utf-8", "replace") if named else None
        return Session(parts[0], issued, name)

    def secure(self, request: Request) -> bool:
        """Whether cookies carry `Secure`: always with `true`, never with
        `false`; with `auto`, unless the request came over plain http from a
        loopback peer in development (the local browser on http://127.0.0.1)."""
        if self.secure_cookie != "auto":
            return self.secure_cookie == "true"
        if self.header or request.scope.get("scheme") in ("https", "wss"):
            return True
        return not loopback(socket_peer(request))

    def cookie_options(self, request: Request, max_age: int | None = None) -> dict[str, Any]:
        return {"httponly": True, "samesite": "strict", "secure": self.secure(request),
                "path": "/", "max_age": self.session_seconds if max_age is None else max_age}

    # -- CSRF ----------------------------------------------------------------------
    def csrf(self, session: Session, reviewer: str) -> str:
        return self.sign(f"csrf:{session.sid}:{reviewer}")

    def csrf_ok(self, identity: Identity, token: str) -> bool:
        if identity.session is None or identity.name is None or identity.session.fresh:
            return False
        return hmac.compare_digest(token, self.csrf(identity.session, identity.name))

    # -- identity ----------------------------------------------------------------
    def identify(self, request: Request) -> Identity:
        cached = getattr(request.state, "identity", None)
        if isinstance(cached, Identity):
            return cached
        if self.header:
            found = self._from_header(request)
        else:
            session = self.read_session(request.cookies.get(COOKIE, ""), named=True)
            found = Identity(session.name, session=session) if session else Identity()
        if found.problem:
            log.warning("inbox refused a request's identity: %s (peer %r, %s %s)",
                        found.problem, socket_peer(request), request.method, request.url.path)
        request.state.identity = found
        return found

    def _from_header(self, request: Request) -> Identity:
        assert self.header is not None
        values = raw_header(request, self.header)
        if not values:
            return Identity()
        peer = socket_peer(request)
        if self.trusted:
            try:
                address = ipaddress.ip_address(peer)
            except ValueError:
                address = None
            if address is None or not any(address in net for net in self.trusted):
                return Identity(problem=f"{self.header} is accepted only from the "
                                        f"configured proxy (this request came from {peer!r}; "
                                        f"forwarded-for headers are never read)")
        if self.proxy_secret is not None:
            given = raw_header(request, PROXY_SECRET_HEADER)
            if len(given) != 1 or not hmac.compare_digest(given[0],
                                                          self.proxy_secret.encode()):
                return Identity(problem=f"{self.header} is accepted only with the proxy's "
                                        f"secret ({PROXY_SECRET_HEADER})")
        if len(values) != 1:
            return Identity(problem=f"{self.header} must name exactly one reviewer "
                                    f"({len(values)} value(s) sent)")
        name, problem = decoded_identity(values[0])
        if problem or name is None:
            return Identity(problem=f"{self.header} names no reviewer: {problem}")
        session = self.read_session(request.cookies.get(SESSION_COOKIE, ""), named=False)
        return Identity(name, session=session or self.new_session())

    # -- the login form's CSRF (before anyone is known) ------------------------
    def login_token(self, nonce: str) -> str:
        return self.sign("login:" + nonce)

    def login_ok(self, request: Request, token: str) -> bool:
        nonce = request.cookies.get(LOGIN_COOKIE, "")
        return bool(nonce) and hmac.compare_digest(token, self.login_token(nonce))


def loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_host(host: str, security: InboxSecurity, allow_dev_login_on_network: bool) -> None:
    """Refuse to serve the development login beyond this machine unless forced."""
    if security.header or loopback(host) or allow_dev_login_on_network:
        return
    raise InboxConfigError(
        f"the development login (anyone may call themselves anyone) on {host!r} would be "
        f"open to the network: set TURNSTILE_INBOX_IDENTITY_HEADER behind an authenticating "
        f"proxy, listen on 127.0.0.1, or pass --allow-dev-login-on-network")


def security_headers(nonce: str) -> dict[str, str]:
    """Not framed, no inline script but the page's own (by nonce), nothing
    loaded from elsewhere."""
    return {
        "Content-Security-Policy": (
            "default-src 'none'; script-src 'self' 'nonce-" + nonce + "'; style-src 'self'; "
            "img-src 'self'; connect-src 'self'; form-action 'self'; base-uri 'none'; "
            "frame-ancestors 'none'"),
        "X-Frame-Options": "DENY",
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "same-origin",
        "Cache-Control": "no-store",
    }
