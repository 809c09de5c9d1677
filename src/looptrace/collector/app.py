"""The collector's ASGI app: ``POST /v1/traces`` (OTLP/HTTP) and the ``/api`` JSON API.

Every request that reaches the store is answered only after its spans are committed (the store
writes with ``synchronous=FULL``). Bodies are limited twice: as they stream in (never read
unbounded) and after decompression (a small gzip/zstd body that expands to gigabytes is refused).
A malformed body changes nothing: decoding happens before the write, and a write is one
transaction. With a token set, every route, the API and the viewer included, requires it.

The viewer adds its routes through ``create_app(..., extra_routes=[...])``; its handlers find the
store at ``request.app.state.store``.
"""

from __future__ import annotations

import contextlib
import functools
import hmac
import math
import os
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from .. import _otlp
from .._net import is_loopback
from .._store import Store, StoreError
from .decode import TooManySpans, decode_request

__all__ = [
    "DEFAULT_HEADER_TIMEOUT",
    "DEFAULT_HOST",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_DECOMPRESSED_BYTES",
    "DEFAULT_MAX_PENDING_BYTES",
    "DEFAULT_MAX_SPANS_PER_REQUEST",
    "DEFAULT_MAX_TRACE_SPANS",
    "DEFAULT_PORT",
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
TOKEN_COOKIE = "looptrace_token"

_Scope = MutableMapping[str, Any]
_Message = MutableMapping[str, Any]
_Receive = Callable[[], Awaitable[_Message]]
_Send = Callable[[_Message], Awaitable[None]]
_ASGIApp = Callable[[_Scope, _Receive, _Send], Awaitable[None]]

_MEDIA_TYPES = {
    _otlp.PROTOBUF_CONTENT_TYPE: "protobuf",
    "application/protobuf": "protobuf",
    _otlp.JSON_CONTENT_TYPE: "json",
}


# --------------------------------------------------------------------------------------------
# responses


def _json_default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        import base64

        return base64.b64encode(bytes(value)).decode("ascii")
    raise TypeError(f"cannot encode {type(value).__name__}")


class JSONResponse(Response):
    """orjson-encoded JSON (bytes attribute values become base64 strings)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, default=_json_default)


def _api_error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _otlp_response(encoding: str, status: int, message: str = "") -> Response:
    """An OTLP/HTTP answer in the request's encoding: an empty ExportTraceServiceResponse on
    success, a google.rpc.Status with ``message`` on failure (what OTLP exporters log)."""
    if encoding == "json":
        body = (
            b"{}"
            if status == 200
            else orjson.dumps({"code": _rpc_code(status), "message": message})
        )
        return Response(body, status_code=status, media_type=_otlp.JSON_CONTENT_TYPE)
    if status == 200:
        return Response(b"", status_code=200, media_type=_otlp.PROTOBUF_CONTENT_TYPE)
    text = message.encode()
    body = b"\x08" + _varint(_rpc_code(status)) + b"\x12" + _varint(len(text)) + text
    return Response(body, status_code=status, media_type=_otlp.PROTOBUF_CONTENT_TYPE)


def _rpc_code(status: int) -> int:
    # google.rpc.Code: INVALID_ARGUMENT, UNAUTHENTICATED, RESOURCE_EXHAUSTED, UNAVAILABLE.
    return {400: 3, 401: 16, 413: 8, 415: 3, 429: 8, 503: 14}.get(status, 2)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _size(n: int) -> str:
    return f"{n / (1024 * 1024):g} MiB" if n >= 1024 * 1024 else f"{n} bytes"


# --------------------------------------------------------------------------------------------
# OTLP receiver


class _Limits:
    def __init__(
        self, max_body: int, max_decompressed: int, max_pending: int, max_spans: int
    ) -> None:
        self.max_body = max_body
        self.max_decompressed = max_decompressed
        self.max_spans = max_spans
        self.pending = _Budget(max_pending)
        # Created on first use, inside the server's event loop.
        self.limiter: anyio.CapacityLimiter | None = None


class _Budget:
    """Bytes of request bodies held by all requests together: taken as a body arrives, given
    back when the request is answered. A request that would pass the budget is answered 429
    with Retry-After, which every OTLP exporter retries. (Decompressed bodies and decoded
    spans are bounded apart: by the decompressed limit and the span cap, times the number of
    requests decoded at once.)"""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self._lock = threading.Lock()  # taken on the loop and in decoding threads

    def take(self, n: int) -> bool:
        with self._lock:
            if self.held + n > self.limit:
                return False
            self.held += n
            return True

    def give(self, n: int) -> None:
        with self._lock:
            self.held -= n


def _busy(encoding: str) -> Response:
    response = _otlp_response(
        encoding, 429, "the collector holds as many request bodies as it takes: retry"
    )
    response.headers["Retry-After"] = "1"
    return response


async def _receive_traces(request: Request) -> Response:
    limits: _Limits = request.app.state.limits
    taken = [0]
    try:
        return await _receive(request, limits, taken)
    finally:
        limits.pending.give(taken[0])


async def _receive(request: Request, limits: _Limits, taken: list[int]) -> Response:
    store: Store = request.app.state.store
    content_type = request.headers.get("content-type", "")
    encoding = _MEDIA_TYPES.get(content_type.split(";", 1)[0].strip().lower())
    if encoding is None:
        return _otlp_response(
            "json",
            415,
            f"unsupported Content-Type {content_type!r}: send application/x-protobuf or "
            "application/json",
        )
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limits.max_body:
        return _otlp_response(
            encoding, 413, f"request body of {declared} bytes exceeds {_size(limits.max_body)}"
        )
    body = bytearray()
    async for chunk in request.stream():
        if len(body) + len(chunk) > limits.max_body:
            # Stop reading: the rest of an oversized body is never buffered.
            return _otlp_response(encoding, 413, f"request body exceeds {_size(limits.max_body)}")
        if not limits.pending.take(len(chunk)):
            return _busy(encoding)
        taken[0] += len(chunk)
        body += chunk
    content_encoding = request.headers.get("content-encoding")

    def decode_and_write() -> Response:
        try:
            spans = decode_request(
                body,
                content_type,
                content_encoding,
                limits.max_decompressed,
                limits.max_spans,
            )
        except _otlp.DecodeError as exc:
            message = str(exc)
            too_big = isinstance(exc, TooManySpans) or message.startswith(
                "decompressed body exceeds"
            )
            return _otlp_response(encoding, 413 if too_big else 400, message)
        body.clear()
        try:
            store.write(spans)
        except (sqlite3.OperationalError, StoreError) as exc:
            response = _otlp_response(encoding, 503, f"store unavailable: {exc}")
            response.headers["Retry-After"] = "1"
            return response
        return _otlp_response(encoding, 200)

    if limits.limiter is None:
        # Bounds how many bodies are decoded at once (each holds its decoded spans).
        limits.limiter = anyio.CapacityLimiter(max(2, os.cpu_count() or 2))
    return await anyio.to_thread.run_sync(decode_and_write, limiter=limits.limiter)


# --------------------------------------------------------------------------------------------
# JSON API (the viewer's data; shapes documented in docs/collector.md)


def _int_param(request: Request, name: str, default: int, lo: int = 0, hi: int = 10_000) -> int:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise _BadRequest(f"{name} must be an integer, got {raw!r}") from None
    if not lo <= value <= hi:
        raise _BadRequest(f"{name} must be between {lo} and {hi}")
    return value


class _BadRequest(Exception):
    pass


async def _in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    return await anyio.to_thread.run_sync(lambda: fn(*args))


async def _api_traces(request: Request) -> Response:
    store: Store = request.app.state.store
    limit = _int_param(request, "limit", 50, 1, 1000)
    offset = _int_param(request, "offset", 0, 0, 10**9)
    status = request.query_params.get("status") or None
    if status not in (None, "ok", "error", "unset", "in_progress"):
        raise _BadRequest("status must be ok, error, unset or in_progress")
    include_lag = request.query_params.get("include_lag", "") in ("1", "true")
    min_ms = _float_param(request, "min_duration_ms")
    # ``range``: seconds back from now, what the list's time-range menu sends; since/until
    # are absolute bounds in nanoseconds.
    seconds_back = _float_param(request, "range")
    since = _int_param(request, "since", -1, -1, 2**63 - 1)
    until = _int_param(request, "until", -1, -1, 2**63 - 1)
    if seconds_back is not None:
        since = max(since, time.time_ns() - int(seconds_back * 1e9))
    traces = await _in_thread(
        functools.partial(
            store.list_traces,
            limit,
            offset,
            request.query_params.get("name") or None,
            status,
            request.query_params.get("experiment") or None,
            include_lag,
            service=request.query_params.get("service") or None,
            min_duration_ns=None if min_ms is None else int(min_ms * 1e6),
            since_ns=None if since < 0 else since,
            until_ns=None if until < 0 else until,
        )
    )
    return JSONResponse({"traces": traces, "limit": limit, "offset": offset})


def _float_param(request: Request, name: str) -> float | None:
    raw = request.query_params.get(name)
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise _BadRequest(f"{name} must be a number") from None
    if not math.isfinite(value) or value < 0:
        raise _BadRequest(f"{name} must be a number of 0 or more")
    return value


async def _api_services(request: Request) -> Response:
    store: Store = request.app.state.store
    return JSONResponse({"services": await _in_thread(store.services)})


async def _api_trace(request: Request) -> Response:
    store: Store = request.app.state.store
    trace_id = request.path_params["trace_id"].lower()
    preview = _int_param(request, "preview", 1000, 0, 10**8)
    cap: int = request.app.state.max_trace_spans
    limit = _int_param(request, "limit", cap, 1, cap)

    def read() -> tuple[Any, Any]:
        # One more than asked: whether the trace goes on past the page, without counting it.
        spans = store.get_trace(trace_id, preview=preview, limit=limit + 1)
        return store.get_trace_summary(trace_id), spans

    summary, spans = await anyio.to_thread.run_sync(read)
    if summary is None:
        return _api_error(404, f"no trace {trace_id}")
    truncated = len(spans) > limit
    return JSONResponse({"trace": summary, "spans": spans[:limit], "truncated": truncated})


async def _api_span(request: Request) -> Response:
    store: Store = request.app.state.store
    span = await _in_thread(
        store.get_span,
        request.path_params["trace_id"].lower(),
        request.path_params["span_id"].lower(),
    )
    if span is None:
        return _api_error(404, "no such span")
    return JSONResponse({"span": span})


async def _api_experiments(request: Request) -> Response:
    store: Store = request.app.state.store
    limit = _int_param(request, "limit", 50, 1, 1000)
    offset = _int_param(request, "offset", 0, 0, 10**9)
    experiments = await _in_thread(store.list_experiments, limit, offset)
    return JSONResponse({"experiments": experiments, "limit": limit, "offset": offset})


async def _api_experiment(request: Request) -> Response:
    store: Store = request.app.state.store
    experiment_id = request.path_params["experiment_id"]
    preview = _int_param(request, "preview", 200, 0, 10**8)
    experiment = await _in_thread(store.get_experiment, experiment_id, preview)
    if experiment is None:
        return _api_error(404, f"no experiment {experiment_id}")
    return JSONResponse(experiment)


async def _api_lag(request: Request) -> Response:
    store: Store = request.app.state.store
    limit = _int_param(request, "limit", 100, 1, 10_000)
    worst = _int_param(request, "worst", 20, 0, 1000)
    since = _int_param(request, "since_ns", 0, 0, 2**63 - 1)
    return JSONResponse(await _in_thread(store.lag_summaries, limit, since or None, worst))


async def _api_stats(request: Request) -> Response:
    store: Store = request.app.state.store
    return JSONResponse(await _in_thread(store.stats))


def _api(
    handler: Callable[[Request], Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except _BadRequest as exc:
            return _api_error(400, str(exc))
        except (sqlite3.OperationalError, StoreError) as exc:
            return _api_error(503, f"store unavailable: {exc}")

    return wrapped


def api_routes() -> list[BaseRoute]:
    """``/v1/traces`` and the ``/api`` routes (what ``create_app`` mounts before extra routes)."""
    return [
        Route("/v1/traces", _receive_traces, methods=["POST"]),
        Route("/api/traces", _api(_api_traces), methods=["GET"]),
        Route("/api/traces/{trace_id}", _api(_api_trace), methods=["GET"]),
        Route("/api/traces/{trace_id}/spans/{span_id}", _api(_api_span), methods=["GET"]),
        Route("/api/services", _api(_api_services), methods=["GET"]),
        Route("/api/experiments", _api(_api_experiments), methods=["GET"]),
        Route("/api/experiments/{experiment_id}", _api(_api_experiment), methods=["GET"]),
        Route("/api/lag", _api(_api_lag), methods=["GET"]),
        Route("/api/stats", _api(_api_stats), methods=["GET"]),
    ]


# --------------------------------------------------------------------------------------------
# the token gate


class _TokenGate:
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


# --------------------------------------------------------------------------------------------
# app and server


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
) -> Any:
    """The collector as an ASGI app.

    ``store_path`` defaults to the configured store (``LOOPTRACE_STORE``), with its retention
    settings; pass ``store`` to share an open Store. ``extra_routes`` come after ``/v1/traces``
    and ``/api/...`` (the viewer's pages). With ``token``, every request must carry it.
    """
    if store is None:
        from .._config import Config

        cfg = Config.from_env()
        if store_path is not None:
            cfg = cfg.replace(store_path=Path(store_path))
        store = Store.from_config(cfg)
    owned_store = store

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # Open (and migrate) the store before the first request, off the loop.
        await anyio.to_thread.run_sync(owned_store.stats)
        try:
            yield
        finally:
            await anyio.to_thread.run_sync(owned_store.close)

    app = Starlette(routes=[*api_routes(), *extra_routes], lifespan=lifespan)
    app.state.store = store
    app.state.limits = _Limits(
        max_body_bytes, max_decompressed_bytes, max_pending_bytes, max_spans_per_request
    )
    app.state.max_trace_spans = max_trace_spans
    if token:
        app.add_middleware(_TokenGate, token=token)
    return app


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
) -> None:
    """Run the collector with uvicorn until interrupted. Refuses a non-loopback ``host``
    without a ``token`` (ValueError)."""
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
    )
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        # The access log would print query strings (a viewer link may carry ?token=); headers
        # are never logged by anything here.
        access_log=False,
        server_header=False,
        lifespan="on",
        http=header_timeout_protocol(header_timeout),
    )
    uvicorn.Server(config).run()
