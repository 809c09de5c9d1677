"""The collector's ASGI app and its server: ``POST /v1/traces`` (OTLP/HTTP, ``receiver``), the
``/api`` JSON API (``api``), behind the token gate (``gate``) when a token is set, run by
uvicorn with a deadline on each request's head.

The parts: ``decode`` (OTLP request bodies into spans, with opentelemetry-proto), ``receiver``
(bodies in, spans committed, OTLP answers out), ``api`` (the viewer's data), ``gate`` (the
token, or without one the ``Host`` check), and this module (the app, its defaults, the
server). With a token set, every route, the API and the viewer included, requires it; without
one, every route answers only requests whose ``Host`` names this machine.

The viewer adds its routes through ``create_app(..., extra_routes=[...])``; its handlers find the
store at ``request.app.state.store``.
"""

from __future__ import annotations

import contextlib
import socket
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
from starlette.applications import Starlette
from starlette.routing import BaseRoute

from ._internals import CannotListen, Store, is_loopback
from .api import api_routes
from .gate import HostGate, TokenGate
from .live import ChangeWatcher
from .receiver import Limits

__all__ = [
    "DEFAULT_HEADER_TIMEOUT",
    "DEFAULT_HOST",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_DECOMPRESSED_BYTES",
    "DEFAULT_MAX_PENDING_BYTES",
    "DEFAULT_MAX_SPANS_PER_REQUEST",
    "DEFAULT_MAX_TRACE_SPANS",
    "DEFAULT_PORT",
    "CannotListen",
    "api_routes",
    "create_app",
    "is_loopback",
    "serve",
]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 4318
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
DEFAULT_MAX_DECOMPRESSED_BYTES = 128 * 1024 * 1024
# Request bodies held at once, all requests together (as received, and once decompressed).
DEFAULT_MAX_PENDING_BYTES = 256 * 1024 * 1024
# Spans in one request: decoding costs memory per span, so a request of millions of tiny
# spans is refused (413) instead. OTLP exporters send a few thousand at most.
DEFAULT_MAX_SPANS_PER_REQUEST = 50_000
# Spans one trace read returns (``/api/traces/<id>``); past it the answer says ``truncated``.
DEFAULT_MAX_TRACE_SPANS = 20_000
# Seconds a client has to send a whole request head, from the connection's start and from the
# end of each answer on a kept-alive connection.
DEFAULT_HEADER_TIMEOUT = 10.0


def create_app(
    store_path: str | Path | None = None,
    *,
    token: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
    max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
    max_spans_per_request: int = DEFAULT_MAX_SPANS_PER_REQUEST,
    max_trace_spans: int = DEFAULT_MAX_TRACE_SPANS,
    extra_routes: Sequence[BaseRoute] = (),
    store: Store | None = None,
    allowed_hosts: Sequence[str] = (),
) -> Any:
    """The collector as an ASGI app.

    ``store_path`` defaults to the configured store (``LOOPTRACE_STORE``), with its retention
    settings; pass ``store`` to share an open Store. ``extra_routes`` come after ``/v1/traces``
    and ``/api/...`` (the viewer's pages). With ``token``, every request must carry it.
    Without one, a request is answered only if its ``Host`` header names a loopback address,
    ``localhost`` or one of ``allowed_hosts`` (403 otherwise): the defence against DNS
    rebinding.
    """
    if store is None:
        from ._internals import Config

        cfg = Config.from_env()
        if store_path is not None:
            cfg = cfg.replace(store_path=Path(store_path))
        store = Store.from_config(cfg)
    owned_store = store
    changes = ChangeWatcher(store.path)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # Open (and migrate) the store before the first request, off the loop.
        await anyio.to_thread.run_sync(owned_store.stats)
        try:
            yield
        finally:
            await anyio.to_thread.run_sync(changes.close)
            await anyio.to_thread.run_sync(owned_store.close)

    app = Starlette(routes=[*api_routes(), *extra_routes], lifespan=lifespan)
    app.state.store = store
    app.state.changes = changes
    app.state.limits = Limits(
        max_body_bytes, max_decompressed_bytes, max_pending_bytes, max_spans_per_request
    )
    app.state.max_trace_spans = max_trace_spans
    if token:
        app.add_middleware(TokenGate, token=token)
    else:
        app.add_middleware(HostGate, allowed=tuple(allowed_hosts))
    return app


def listen(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host``:``port`` (port 0: any free one), as uvicorn would bind it
    (IPv6 for an address with a colon, brackets allowed; IPv4 for a name). Raises
    :class:`CannotListen`. On Windows the address is claimed exclusively: there ``SO_REUSEADDR``
    would let the bind succeed on a port another server is listening on."""
    address = host.strip("[]")
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        if sys.platform == "win32":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_EXCLUSIVEADDRUSE, 1)  # type: ignore[attr-defined,unused-ignore]
        else:
            # Only lets a restart bind over connections of the last run still in TIME_WAIT.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
    except OSError as exc:
        sock.close()
        raise CannotListen(exc.errno, exc.strerror or str(exc)) from None
    return sock


def header_timeout_protocol(seconds: float) -> Any:
    """uvicorn's h11 protocol with a deadline for each request's head: a client that has not
    sent a whole request line and headers ``seconds`` after connecting (or after the previous
    answer, on a kept-alive connection) is disconnected. uvicorn bounds the head's size but
    not its pace, so a client sending a byte at a time would hold a connection for ever."""
    import asyncio

    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeaderTimeoutProtocol(H11Protocol):
        _head_deadline: asyncio.TimerHandle | None = None
        _cycle_waited: Any = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._await_head()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._await_head()

        def handle_events(self) -> None:
            super().handle_events()
            # A new request/response cycle means a whole head arrived.
            if self._head_deadline is not None and self.cycle is not self._cycle_waited:
                self._head_deadline.cancel()
                self._head_deadline = None

        def connection_lost(self, exc: Exception | None) -> None:
            if self._head_deadline is not None:
                self._head_deadline.cancel()
                self._head_deadline = None
            super().connection_lost(exc)

        def _await_head(self) -> None:
            if self._head_deadline is not None:
                self._head_deadline.cancel()
            self._cycle_waited = self.cycle
            self._head_deadline = self.loop.call_later(seconds, self._head_late)

        def _head_late(self) -> None:
            self._head_deadline = None
            if self.cycle is self._cycle_waited and not self.transport.is_closing():
                self.transport.close()

    return HeaderTimeoutProtocol


def serve(
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    store_path: str | Path | None = None,
    *,
    token: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
    max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
    max_spans_per_request: int = DEFAULT_MAX_SPANS_PER_REQUEST,
    header_timeout: float = DEFAULT_HEADER_TIMEOUT,
    extra_routes: Sequence[BaseRoute] = (),
    log_level: str = "warning",
    ready: Callable[[str, int], None] | None = None,
) -> None:
    """Run the collector with uvicorn until interrupted. Refuses a non-loopback ``host``
    without a ``token`` (ValueError).

    The address is bound before anything else happens: :class:`CannotListen` if it cannot
    be, and only then ``ready(host, port)`` (the port bound: ``port=0`` picks a free one), so a
    caller announces an address that is already its own. A server that fails to start after
    that (the application's startup failed) raises RuntimeError.
    """
    import uvicorn

    if not is_loopback(host) and not token:
        raise ValueError(
            f"refusing to listen on {host} without a token: anyone who can reach it could write "
            "traces and read them back; set --token or LOOPTRACE_TOKEN"
        )
    app = create_app(
        store_path,
        token=token,
        max_body_bytes=max_body_bytes,
        max_decompressed_bytes=max_decompressed_bytes,
        max_pending_bytes=max_pending_bytes,
        max_spans_per_request=max_spans_per_request,
        extra_routes=extra_routes,
        allowed_hosts=(host,),
    )
    sock = listen(host, port)
    config = uvicorn.Config(
        app,
        log_level=log_level,
        # The access log would print query strings (a viewer link may carry ?token=); headers
        # are never logged by anything here.
        access_log=False,
        server_header=False,
        lifespan="on",
        http=header_timeout_protocol(header_timeout),
    )
    server = uvicorn.Server(config)
    try:
        # Listening already: a client that connects as soon as it reads the announcement
        # waits in the backlog for the server, instead of being refused.
        sock.listen(config.backlog)
        if ready is not None:
            ready(host, sock.getsockname()[1])
        try:
            server.run(sockets=[sock])
        except SystemExit as exc:
            # uvicorn exits the process when the application's startup fails; the caller
            # decides what that means, with the reason uvicorn has logged.
            raise RuntimeError(
                f"the collector did not start (uvicorn exit status {exc.code})"
            ) from None
    finally:
        sock.close()
