"""The gates in front of every route: with a token set, every HTTP request must carry it
(``TokenGate``); without one, every request must name this machine in its ``Host`` header
(``HostGate``), which keeps a web page that rebinds its own DNS name to 127.0.0.1 from reading
the collector through the browser of the person running it."""

from __future__ import annotations

import hmac
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from starlette.responses import Response

from ._internals import is_loopback
from .api import JSONResponse

TOKEN_COOKIE = "looptrace_token"

_Scope = MutableMapping[str, Any]
_Message = MutableMapping[str, Any]
_Receive = Callable[[], Awaitable[_Message]]
_Send = Callable[[_Message], Awaitable[None]]
_ASGIApp = Callable[[_Scope, _Receive, _Send], Awaitable[None]]


class TokenGate:
    """Requires the token on every HTTP request: ``Authorization: Bearer <token>``,
    ``x-looptrace-token: <token>``, or the cookie a browser gets by opening ``/?token=<token>``
    once (the token is then removed from the address). Never logs what it was sent."""

    def __init__(self, app: _ASGIApp, token: str) -> None:
        self.app = app
        self.token = token.encode()

    def _ok(self, candidate: bytes | None) -> bool:
        return candidate is not None and hmac.compare_digest(candidate, self.token)

    async def __call__(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        auth = headers.get(b"authorization", b"")
        bearer = auth[7:].strip() if auth[:7].lower() == b"bearer " else None
        if self._ok(bearer) or self._ok(headers.get(b"x-looptrace-token")):
            await self.app(scope, receive, send)
            return
        for part in headers.get(b"cookie", b"").split(b";"):
            name, _, value = part.strip().partition(b"=")
            if name == TOKEN_COOKIE.encode() and self._ok(value):
                await self.app(scope, receive, send)
                return
        query = urllib.parse.parse_qsl(scope.get("query_string", b"").decode("latin-1"))
        given = [v for k, v in query if k == "token"]
        if scope["method"] == "GET" and given and self._ok(given[0].encode()):
            rest = urllib.parse.urlencode([(k, v) for k, v in query if k != "token"])
            # One leading slash: "//host/..." (or "/\\host") in a Location is another site.
            location = "/" + scope["path"].lstrip("/\\") + ("?" + rest if rest else "")
            cookie = f"{TOKEN_COOKIE}={given[0]}; HttpOnly; SameSite=Strict; Path=/"
            await Response(status_code=303, headers={"location": location, "set-cookie": cookie})(
                scope, receive, send
            )
            return
        response = JSONResponse(
            {"error": "missing or wrong token: send 'Authorization: Bearer <token>'"},
            status_code=401,
            headers={"www-authenticate": "Bearer"},
        )
        await response(scope, receive, send)


class HostGate:
    """Answers only requests whose ``Host`` names this machine: a loopback address
    (127.0.0.0/8, ``[::1]``), ``localhost``, or one of ``allowed`` (the address the server was
    told to listen on), with or without a port. Anything else gets 403.

    Without a token, the collector's only protection is that nothing off this machine reaches
    it. A web page can get past that: its DNS name, first resolved to the attacker's server,
    is re-resolved to 127.0.0.1, and the page's scripts then read the collector as the same
    origin. Their requests still carry the page's own name in ``Host``, which is what is
    checked (Jupyter and the dev servers of web frameworks guard the same way). A request
    without ``Host`` (HTTP/1.0) is let through: every browser sends one."""

    def __init__(self, app: _ASGIApp, allowed: Iterable[str] = ()) -> None:
        self.app = app
        self.allowed = frozenset(h.strip("[]").lower() for h in allowed if h)

    def host_ok(self, host: str) -> bool:
        # The Host header is parsed by the standard library's URL splitter; anything besides a
        # host and a port (user info, a path) is refused rather than interpreted.
        try:
            parts = urllib.parse.urlsplit("//" + host)
            name, _ = parts.hostname, parts.port
        except ValueError:
            return False
        if not name or parts.username is not None or parts.path or parts.query or parts.fragment:
            return False
        return is_loopback(name) or name in self.allowed

    async def __call__(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        hosts = [v for k, v in scope["headers"] if k == b"host"]
        if not hosts or (len(hosts) == 1 and self.host_ok(hosts[0].decode("latin-1"))):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        response = JSONResponse(
            {
                "error": "this collector answers only requests addressed to this machine "
                "(Host: 127.0.0.1, localhost or [::1]); set a token to serve other names"
            },
            status_code=403,
        )
        await response(scope, receive, send)
