"""The web viewer that ``looptrace serve`` shows next to its OTLP receiver.

Every page is the same static shell (``static/index.html``); ``static/app.js`` reads the path,
fetches the collector's JSON API (``/api/...``) and builds the page with DOM calls. Nothing that
comes from a span is ever parsed as HTML: the script sets ``textContent`` and attributes only,
and the ``Content-Security-Policy`` sent here forbids inline scripts and anything not served by
this process, so the viewer works offline and a span named ``<script>`` stays text.

    /                       recent traces (filters and paging in the query string)
    /traces/{trace_id}      one trace: waterfall and span details (``#span=<id>`` selects)
    /sessions               sessions (``session.id``): traces, users, tokens and cost each
    /sessions/{session_id}  one session's traces in conversation order
    /experiments            experiments with case, error and score summaries
    /experiments/{id}       one experiment's cases
    /compare?a=<id>&b=<id>  two experiments side by side
    /lag                    event-loop lag over time
    /static/...             the shell's CSS and JS (hand-written; no build step)

The data comes from the collector's JSON API (``collector/app.py``); this module serves files
only: ``create_app(path, extra_routes=viewer.routes())``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import Receive, Scope, Send

__all__ = ["CSP", "STATIC_DIR", "routes"]

STATIC_DIR = Path(__file__).with_name("static")

# 'self' only: no CDN, no inline script, no eval, no framing by other sites. Styles the script
# sets through element.style (CSSOM) are not inline styles in the CSP sense, so they are allowed.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
_SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

PAGE_PATHS = (
    "/",
    "/traces",
    "/traces/{trace_id}",
    "/sessions",
    "/sessions/{session_id:path}",
    "/experiments",
    "/experiments/{experiment_id}",
    "/compare",
    "/lag",
)


class _SecureStatic(StaticFiles):
    """Static files with the viewer's security headers (and revalidation, not stale JS)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers.extend(
                    (k.lower().encode(), v.encode()) for k, v in _SECURITY_HEADERS.items()
                )
                message = {**message, "headers": headers}
            await send(message)

        await super().__call__(scope, receive, send_with_headers)


async def _page(request: Request) -> Response:
    return FileResponse(STATIC_DIR / "index.html", headers=_SECURITY_HEADERS)


def routes() -> list[BaseRoute]:
    """The viewer's pages and static files, for ``create_app(..., extra_routes=routes())``."""
    out: list[BaseRoute] = [Route(p, _page, methods=["GET", "HEAD"]) for p in PAGE_PATHS]
    out.append(Mount("/static", app=_SecureStatic(directory=STATIC_DIR), name="static"))
    return out
