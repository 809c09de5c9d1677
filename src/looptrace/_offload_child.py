"""What a worker process does for :mod:`looptrace._offload`: finish serializing a large span,
encode it, and (for :meth:`~looptrace._offload.Offloader.deliver`) send it.

Everything a worker unpickles lives here or in the modules this one imports: the calls it
answers, :class:`Destination`, the ring's slots. None of them imports asyncio or httpx, which
were half of a worker's start-up (about 120 ms of CPU, on cores the application wants).
"""

from __future__ import annotations

import http.client
import os
import pickle
import select
import socket
import sys
import urllib.parse
from typing import TYPE_CHECKING, Any

from . import _otlp, _ring, _serialize
from ._net import is_loopback, ssl_context

if TYPE_CHECKING:
    from ._otlp import Resource

__all__ = ["CALLS", "LIFT_BUDGET", "LOOPBACK_SNDBUF", "Destination", "initializer", "restore"]

# Values visited (per span) looking for large strings to put in the ring: the planning walk's
# budget, so a span's handoff stays as cheap as its plan. The parent's lift and the worker's
# restore walk the same values in the same order within it.
LIFT_BUDGET = 256

# On loopback the kernel runs the receiver's side of TCP inside the sender's system calls, and
# with the default buffers one ``send`` of a 2.5 MB body did all of it without a pause, on a
# kernel that may not preempt a system call. A quarter-megabyte buffer makes the worker wait
# for the receiver every few hundred kilobytes: the application's loop waited for a CPU about
# half as long (docs/performance.md). A remote backend keeps the kernel's own sizing, which
# a long round trip needs.
LOOPBACK_SNDBUF = 256 * 1024

# An answer's body is a status message; more than this is not read, and the connection that
# carried it is not reused.
_ANSWER_BYTES = 64 * 1024


class Destination:
    """Where and how a worker sends a large span: the pipeline's OTLP/HTTP endpoint and
    request settings. Carries the endpoint's headers (API keys): never shown in a repr."""

    __slots__ = ("compression", "encoding", "headers", "resource", "timeout", "url")

    def __init__(
        self,
        url: str,
        headers: dict[str, str],
        timeout: float,
        encoding: str,
        compression: str,
        resource: Resource,
    ) -> None:
        self.url = url
        self.headers = headers
        self.timeout = timeout
        self.encoding = encoding
        self.compression = compression
        self.resource = resource

    def __repr__(self) -> str:
        return f"Destination({self.url!r}, headers=<{len(self.headers)} redacted>)"


_reader: _ring.Reader | None = None


def initializer(parent: int | None = None) -> None:
    """Runs in each worker before any call: gets ready to read slots from the parent."""
    global _reader
    _reader = _ring.Reader(pid=parent)


def _read_back(slot: _ring.Slot) -> Any:
    """The value behind ``slot``, read here: the parent's test of direct reads."""
    assert _reader is not None, "no reader"
    return _reader.value(slot)


def _ping() -> int:
    return os.getpid()


def _work(
    wire: Any, inputs: Any, output: Any, pol: Any, max_span_bytes: int, encoding: str
) -> tuple[bytes | None, dict[str, int]]:
    """Finish serializing one prepared span, and encode it. (A value the worker cannot
    rebuild, such as a class from the user's ``__main__``, fails in the pool's unpickling,
    which answers with the error.)"""
    try:
        with _serialize.counted() as counts:
            wire = _serialize.finish(wire, inputs, output, pol, max_span_bytes)
        body = _otlp.encode_span(wire, encoding)
    except Exception as exc:
        return None, {"error": 1, type(exc).__name__: 1}
    return body, dict(counts)


def restore(v: Any, reader: _ring.Reader, left: list[int]) -> Any:
    """``v`` with every ring slot replaced by its value: the mirror of the parent's lift,
    walking the same values in the same order within the same budget. ``left`` is [slots
    still to find, values still to visit]."""
    cls = type(v)
    if cls is _ring.Slot:
        left[0] -= 1
        return reader.value(v)
    if cls is dict:
        for k, x in v.items():
            left[1] -= 1
            if left[0] <= 0 or left[1] < 0:
                break
            y = restore(x, reader, left)
            if y is not x:
                v[k] = y
        return v
    if cls is list or cls is tuple:
        out = v if cls is list else list(v)
        for i, x in enumerate(out):
            left[1] -= 1
            if left[0] <= 0 or left[1] < 0:
                break
            out[i] = restore(x, reader, left)
        return out if cls is list else tuple(out)
    return v


def _deliver(
    wire: Any,
    inputs: Any,
    output: Any,
    max_span_bytes: int,
    settings: bytes,
    slots: int,
    ring: tuple[str, int] | None = None,
) -> tuple[str, Any, dict[str, int]]:
    """Finish one large span, and send it as a request of its own. Answers ``("answered",
    (status, retry_after, detail), counts)``, ``("unsent", error, counts)`` when no answer
    came, or ``("error", name, {})`` when the span could not be encoded here (the parent then
    encodes it itself)."""
    try:
        # Unpickled here, inside the try: a failure is an answer, not a dead worker.
        dest, pol = _settings(settings)
        if slots:
            assert _reader is not None, "slots without a reader"
            if ring is not None:
                _reader.map(*ring)
            left = [slots, LIFT_BUDGET]
            inputs = (inputs[0], restore(inputs[1], _reader, left))
            output = (output[0], restore(output[1], _reader, left))
            if left[0]:
                raise LookupError(f"{left[0]} ring slot(s) not found")
        with _serialize.counted() as counts:
            if dest.encoding == "protobuf":
                # The payloads' JSON goes out as orjson wrote it: no str, no joined copy.
                payloads = _serialize.finish_payloads(wire, inputs, output, pol, max_span_bytes)
                body = _otlp.request_pieces(_otlp.span_pieces(wire, payloads), dest.resource)
            else:
                wire = _serialize.finish(wire, inputs, output, pol, max_span_bytes)
                chunk = _otlp.encode_span(wire, dest.encoding)
                body = [_otlp.encode_request([chunk], dest.resource, dest.encoding)]
        headers = {**dest.headers, "Content-Type": _otlp.content_type(dest.encoding)}
        body, content_encoding = _otlp.compress_pieces(body, dest.compression)
        if content_encoding:
            headers["Content-Encoding"] = content_encoding
    except Exception as exc:
        return "error", type(exc).__name__, {}
    try:
        answer = post(dest, body, headers)
    except (OSError, http.client.HTTPException) as exc:
        return "unsent", f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__, counts
    return "answered", answer, dict(counts)


# Per destination: its connection, and the request target (path and query) to POST to.
_connections: dict[tuple[str, float], tuple[http.client.HTTPConnection, str]] = {}


def post(
    dest: Destination, body: list[bytes], headers: dict[str, str]
) -> tuple[int, str | None, bytes]:
    """POST the pieces of ``body`` to ``dest`` over a kept-alive connection; ``(status,
    Retry-After, the start of the answer's body)``. Raises ``OSError`` or
    ``http.client.HTTPException`` when no answer came; the connection is then dropped.

    http.client, not httpx: a worker sends one request at a time and needs no pool, and
    http.client hands the body to the kernel in one ``sendall``, where httpcore's synchronous
    stream copies the unsent rest of the body after every partial send (through a 256 KiB
    send buffer, about 14 MB of copying per 2.5 MB body). httpx also took a third of a
    worker's start-up to import."""
    key = (dest.url, dest.timeout)
    entry = _connections.get(key)
    if entry is None:
        entry = _connections[key] = _connect(dest)
    conn, path = entry
    if conn.sock is not None and _closed_by_peer(conn.sock):
        conn.close()  # the server ended the kept-alive connection while it was idle
    try:
        if conn.sock is None:
            _open(conn)
        # With its length given, http.client sends the pieces one after another as they are.
        headers["Content-Length"] = str(sum(map(len, body)))
        conn.request("POST", path, body, headers)
        response = conn.getresponse()
        detail = response.read(_ANSWER_BYTES)
        if response.will_close or not response.isclosed():
            conn.close()  # the server said so, or the answer had more than we read
        return response.status, response.getheader("retry-after"), detail[:200]
    except BaseException:
        conn.close()
        raise


def _connect(dest: Destination) -> tuple[http.client.HTTPConnection, str]:
    url = urllib.parse.urlsplit(dest.url)
    host = url.hostname or ""
    path = (url.path or "/") + (f"?{url.query}" if url.query else "")
    # The port always given: without one, http.client reads an IPv6 address's last group
    # as a port.
    if url.scheme == "https":
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            host, url.port or 443, timeout=dest.timeout, context=ssl_context()
        )
    else:
        conn = http.client.HTTPConnection(host, url.port or 80, timeout=dest.timeout)
    return conn, path


def _open(conn: http.client.HTTPConnection) -> None:
    conn.connect()
    # A body goes out in a few sends (headers, then pieces): without this, Nagle's algorithm
    # may hold a short piece back until the previous one is acknowledged.
    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if is_loopback(conn.host):
        conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, LOOPBACK_SNDBUF)


def _closed_by_peer(sock: socket.socket) -> bool:
    # Between requests nothing is due from the server: a readable socket means it closed the
    # connection (an idle timeout) or broke protocol. Either way, not one to send on.
    try:
        return bool(select.select([sock], [], [], 0)[0])
    except (OSError, ValueError):
        return True


_last_settings: tuple[bytes, Any] | None = None


def _settings(raw: bytes) -> tuple[Destination, Any]:
    """The destination and serialization policy, unpickled once per change."""
    global _last_settings
    last = _last_settings
    if last is None or last[0] != raw:
        last = _last_settings = (raw, pickle.loads(raw))
    return last[1]  # type: ignore[no-any-return]


def _modules() -> list[str]:
    """The modules this worker has loaded (diagnostics: what its start-up costs)."""
    return sorted(sys.modules)


# What a worker answers to, by name.
CALLS: dict[str, Any] = {
    "ping": _ping,
    "modules": _modules,
    "read_back": _read_back,
    "work": _work,
    "deliver": _deliver,
}
