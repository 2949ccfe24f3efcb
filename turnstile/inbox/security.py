"""Who a request of the inbox is, and the page's protections (docs/inbox.md).

Two identity modes:

- **header** (`TURNSTILE_INBOX_IDENTITY_HEADER`, e.g. `X-Forwarded-User`):
  an authenticating proxy in front of the inbox names the reviewer. The
  header is believed only when it is bound to the proxy: from a configured
  proxy address (`TURNSTILE_INBOX_TRUSTED_PROXIES`, addresses or networks,
  comma-separated) and/or with the proxy's shared secret in
  `X-Turnstile-Proxy-Secret` (`TURNSTILE_INBOX_PROXY_SECRET`); each check
  that is configured must pass, and at least one must be. A request whose
  identity header is repeated (or holds a comma: a proxy that folded two
  into one) is refused: a proxy that appends its header would otherwise let
  the client's own come first. `TURNSTILE_INBOX_SECRET` (signing the forms'
  tokens) must be set: a per-process secret would break tokens across
  restarts and replicas.
- **development** (no header configured): a name entered once, in a signed
  cookie. Anyone may call themselves anyone, so the inbox refuses to listen
  on anything but a loopback address unless told
  (`--allow-dev-login-on-network`).

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
from dataclasses import dataclass, field
from urllib.parse import quote, unquote

from starlette.requests import Request

log = logging.getLogger(__name__)

COOKIE = "turnstile_reviewer"
LOGIN_COOKIE = "turnstile_login"
PROXY_SECRET_HEADER = "X-Turnstile-Proxy-Secret"


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


@dataclass
class Identity:
    """Who the request is: `name` (None: anonymous), or `problem` (refused)."""

    name: str | None = None
    problem: str | None = None


@dataclass
class InboxSecurity:
    header: str | None = None
    secret: bytes = b""
    trusted: list[Network] = field(default_factory=list)
    proxy_secret: str | None = None

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None,
                 secret: str | None = None) -> InboxSecurity:
        e = os.environ if env is None else env
        header = (e.get("TURNSTILE_INBOX_IDENTITY_HEADER") or "").strip() or None
        key = secret or e.get("TURNSTILE_INBOX_SECRET") or ""
        trusted = _networks(e.get("TURNSTILE_INBOX_TRUSTED_PROXIES") or "")
        proxy_secret = e.get("TURNSTILE_INBOX_PROXY_SECRET") or None
        if header:
            if not key:
                raise InboxConfigError(
                    "header identity needs TURNSTILE_INBOX_SECRET (the same on every "
                    "replica and across restarts: it signs the forms' tokens)")
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
                   proxy_secret=proxy_secret)

    # -- signing -----------------------------------------------------------------
    def sign(self, value: str) -> str:
        return hmac.new(self.secret, value.encode(), hashlib.sha256).hexdigest()

    def csrf(self, reviewer: str) -> str:
        return self.sign("csrf:" + reviewer)

    def csrf_ok(self, reviewer: str, token: str) -> bool:
        return hmac.compare_digest(token, self.csrf(reviewer))

    # -- identity ----------------------------------------------------------------
    def identify(self, request: Request) -> Identity:
        if self.header:
            return self._from_header(request)
        raw = request.cookies.get(COOKIE, "")
        name, _, mac = raw.rpartition(".")
        if name and hmac.compare_digest(mac, self.sign("name:" + name)):
            return Identity(unquote(name))
        return Identity()

    def _from_header(self, request: Request) -> Identity:
        assert self.header is not None
        values = request.headers.getlist(self.header)
        if not values:
            return Identity()
        if self.trusted:
            peer = request.client.host if request.client else ""
            try:
                address = ipaddress.ip_address(peer)
            except ValueError:
                address = None
            if address is None or not any(address in net for net in self.trusted):
                return Identity(problem=f"{self.header} is accepted only from the "
                                        f"configured proxy (this request came from {peer!r})")
        if self.proxy_secret is not None:
            given = request.headers.getlist(PROXY_SECRET_HEADER)
            if len(given) != 1 or not hmac.compare_digest(given[0].encode(),
                                                          self.proxy_secret.encode()):
                return Identity(problem=f"{self.header} is accepted only with the proxy's "
                                        f"secret ({PROXY_SECRET_HEADER})")
        if len(values) != 1 or "," in values[0]:
            return Identity(problem=f"{self.header} must name exactly one reviewer "
                                    f"({len(values)} value(s) sent)")
        name = values[0].strip()
        return Identity(name or None)

    def login_cookie(self, name: str) -> str:
        value = quote(name, safe="")
        return f"{value}.{self.sign('name:' + value)}"

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
