"""The OTLP/HTTP receiver: ``POST /v1/traces``, decoded and written to the store.

Every request that reaches the store is answered only after its spans are committed (the store
writes with ``synchronous=FULL``). Bodies are limited twice: as they stream in (never read
unbounded) and after decompression (a small gzip/zstd body that expands to gigabytes is refused).
A malformed body changes nothing: decoding happens before the write, and a write is one
transaction. Answers follow OTLP/HTTP: an empty ``ExportTraceServiceResponse`` or a
``google.rpc.Status`` in the request's encoding, 429 and 503 with ``Retry-After``.
"""

from __future__ import annotations

import os
import sqlite3
import threading

import anyio
import anyio.to_thread
import orjson
from starlette.requests import Request
from starlette.responses import Response

from ._internals import JSON_CONTENT_TYPE, PROTOBUF_CONTENT_TYPE, Store, StoreError
from .bodies import BodyTooLarge
from .decode import DecodeError, TooManySpans, decode_request

_MEDIA_TYPES = {
    PROTOBUF_CONTENT_TYPE: "protobuf",
    "application/protobuf": "protobuf",
    JSON_CONTENT_TYPE: "json",
}


def _otlp_response(encoding: str, status: int, message: str = "") -> Response:
    """An OTLP/HTTP answer in the request's encoding: an empty ExportTraceServiceResponse on
    success, a google.rpc.Status with ``message`` on failure (what OTLP exporters log)."""
    if encoding == "json":
        body = (
            b"{}"
            if status == 200
            else orjson.dumps({"code": _rpc_code(status), "message": message})
        )
        return Response(body, status_code=status, media_type=JSON_CONTENT_TYPE)
    if status == 200:
        return Response(b"", status_code=200, media_type=PROTOBUF_CONTENT_TYPE)
    text = message.encode()
    body = b"\x08" + _varint(_rpc_code(status)) + b"\x12" + _varint(len(text)) + text
    return Response(body, status_code=status, media_type=PROTOBUF_CONTENT_TYPE)


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


class Limits:
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


async def receive_traces(request: Request) -> Response:
    limits: Limits = request.app.state.limits
    taken = [0]
    try:
        return await _receive(request, limits, taken)
    finally:
        limits.pending.give(taken[0])


async def _receive(request: Request, limits: Limits, taken: list[int]) -> Response:
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
        except DecodeError as exc:
            too_big = isinstance(exc, (TooManySpans, BodyTooLarge))
            return _otlp_response(encoding, 413 if too_big else 400, str(exc))
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
