"""The token gate: with a token set, every HTTP request must carry it."""

from __future__ import annotations

import hmac
import urllib.parse
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.responses import Response

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
