"""OTLP POSTs over HTTP/1.1 on asyncio's own transports: how the application's loop talks to
a backend it reaches directly (no proxy between them).

An exporter's request is a POST of bytes it already has, and the answer it needs is a status,
a few headers and at most a short message. httpx, over httpcore and anyio, runs about 1,500
Python calls to send one and read its answer: 1-2 ms of CPU on the application's loop per
request on the benchmark machine, in steps long enough to make a 1 ms timer late. This client
writes the request head itself, hands head and body to the transport, and reads the
answer's head, then a body framed by Content-Length, by chunks or by the connection's end,
never more than ``MAX_RESPONSE_BYTES`` of it. Proxies (tunnels, proxy credentials, NO_PROXY
rules) stay with httpx: :class:`~looptrace._transport.HttpTransport` takes this client only
where no proxy applies.

    pool = Http1Pool(settings)               # one per event loop
    response = await pool.post(body, headers)  # OSError when nothing was answered
    await pool.aclose()

A connection is reused when the answer said nothing against it and was read to its end. One
the server closed while it sat idle is noticed before it is used. A kept-alive connection that
ends before any byte of an answer was most likely closed by the server as the request went
out: the request goes again on a new connection, once. On a new connection the same failure
is the caller's to retry (the pipeline's backoff).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import socket
import ssl
import urllib.parse
from collections.abc import Mapping
from typing import NamedTuple

from ._config import check_header
from ._net import LOOPBACK_SNDBUF, HttpSettings

__all__ = ["MAX_RESPONSE_BYTES", "Http1Pool", "ProtocolError", "Response"]

# A backend's answer is a status and, at most, a short message: no more of its body than this
# is read, and the connection that carried a longer one is dropped, so a misbehaving backend,
# proxy or load balancer cannot grow the application's memory.
MAX_RESPONSE_BYTES = 64 * 1024
# The answer's status line and headers; a longer head is an error, not a buffer that grows.
MAX_HEAD_BYTES = 64 * 1024
# What is read ahead of the answer's parser before the connection stops reading.
_READ_BUFFER_BYTES = 2 * MAX_HEAD_BYTES


class ProtocolError(ConnectionError):
    """The server's answer was not HTTP/1.1 this client can read (an OSError, as every
    failure to get an answer is)."""


class _Unanswered(ConnectionError):
    """The connection ended before the first byte of an answer."""


class Response(NamedTuple):
    """What a backend answered: the status, its headers and at most ``MAX_RESPONSE_BYTES``
    of its body."""

    status: int
    headers: Mapping[str, str]
    body: bytes


class _Ended(Exception):
    """The connection ended (closed or reset) before what was read for was complete."""

    def __init__(self, partial: bool, error: BaseException | None) -> None:
        super().__init__(str(error) if error is not None else "closed")
        self.partial = partial
        self.error = error


class _Connection(asyncio.Protocol):
    """One connection, read from a buffer of our own: what the server sent stays readable
    after the connection ends, even by a reset. A backend with a body limit answers 413 as
    soon as it has the head and closes with the body unread, which resets the connection under
    the request still being written; asyncio's StreamReader raises that reset before the
    answer it already holds (Python 3.10), and the 413, which splits a batch, would have been
    a failed connection, retried with the same body until the budget ran out."""

    def __init__(self, send_buffer: int = 0) -> None:
        self._send_buffer = send_buffer  # SO_SNDBUF to set; 0 keeps the kernel's sizing
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.ended = False
        self.error: BaseException | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._wakeup: asyncio.Future[None] | None = None
        self._writable: asyncio.Future[None] | None = None  # set while writing is paused
        self._reading_paused = False

    # -- asyncio.Protocol --
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        sock = transport.get_extra_info("socket") if self._send_buffer else None
        if sock is not None:
            # A write's first send runs in the exporter's step, the rest in the transport's
            # callbacks: each copies at most what the send buffer holds (_net.LOOPBACK_SNDBUF).
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._send_buffer)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if len(self.buffer) > _READ_BUFFER_BYTES and not self._reading_paused:
            # Bounded: the server may send faster than an answer is read.
            assert self.transport is not None
            self.transport.pause_reading()
            self._reading_paused = True
        self._wake()

    def eof_received(self) -> bool:
        self.ended = True
        self._wake()
        return False  # close: nothing more will come, and a request cannot be answered now

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended = True
        self.error = exc
        self._wake()
        self._resume_writing()
        if not self.closed.done():
            self.closed.set_result(None)

    def pause_writing(self) -> None:
        if self._writable is None:
            self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        self._resume_writing()

    # -- the pool's side --
    def idle_and_open(self) -> bool:
        # A server that closes an idle connection has its end-of-stream read by the loop
        # while the connection waits in the pool; one that sent something unasked is no
        # longer in step with its requests.
        return not self.ended and not self.buffer

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    async def exchange(self, head: bytes, body: bytes) -> tuple[Response, bool]:
        """Send one request, read its answer; also whether the connection can carry another."""
        assert self.transport is not None
        self.transport.write(head)
        self.transport.write(body)
        # Until the transport holds what is left, or the connection ended: an answer that came
        # before the body went out whole is still the answer.
        while self._writable is not None and not self.ended:
            await self._writable
        try:
            status, headers, reusable = await self._read_head()
        except _Ended as exc:
            if exc.partial:
                raise ProtocolError("the connection closed in the middle of an answer") from exc
            if exc.error is not None:
                raise _Unanswered(f"the connection failed before an answer: {exc.error}") from exc
            raise _Unanswered("the connection closed before an answer") from exc
        try:
            data, whole = await self._read_body(status, headers)
        except _Ended as exc:
            raise ProtocolError("the connection closed in the middle of an answer") from exc
        return Response(status, headers, data), reusable and whole and not self.ended

    # -- reading --
    def _wake(self) -> None:
        waiter = self._wakeup
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _resume_writing(self) -> None:
        waiter, self._writable = self._writable, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _more(self) -> None:
        """Wait for more bytes; :class:`_Ended` when none will come."""
        if self.ended:
            raise _Ended(bool(self.buffer), self.error)
        if self._reading_paused and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()
        self._wakeup = asyncio.get_running_loop().create_future()
        try:
            await self._wakeup
        finally:
            self._wakeup = None

    def _take(self, n: int) -> bytes:
        data = bytes(self.buffer[:n])
        del self.buffer[:n]
        return data

    async def _read_until(self, separator: bytes, what: str) -> bytes:
        start = 0
        while True:
            i = self.buffer.find(separator, start)
            if 0 <= i <= MAX_HEAD_BYTES:
                return self._take(i + len(separator))
            if i > MAX_HEAD_BYTES or len(self.buffer) > MAX_HEAD_BYTES:
                raise ProtocolError(f"{what} longer than {MAX_HEAD_BYTES} bytes")
            start = max(0, len(self.buffer) - len(separator) + 1)
            await self._more()

    async def _read_exactly(self, n: int) -> bytes:
        while len(self.buffer) < n:
            await self._more()
        return self._take(n)

    async def _read_head(self) -> tuple[int, dict[str, str], bool]:
        while True:
            raw = await self._read_until(b"\r\n\r\n", "an answer's head")
            lines = raw[:-4].split(b"\r\n")
            version, _, rest = lines[0].partition(b" ")
            code = rest[:3]
            if not version.startswith(b"HTTP/1.") or len(code) != 3 or not code.isdigit():
                raise ProtocolError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
            status = int(code)
            if 100 <= status < 200 and status != 101:
                continue  # an interim answer (103 Early Hints...): the real one follows
            headers: dict[str, str] = {}
            for line in lines[1:]:
                name, sep, value = line.partition(b":")
                if not sep or not name or name != name.strip():
                    raise ProtocolError(f"a malformed header line: {line[:80]!r}")
                key = name.decode("latin-1").lower()
                text = value.strip().decode("latin-1")
                headers[key] = f"{headers[key]}, {text}" if key in headers else text
            if status == 101:
                raise ProtocolError("the server switched protocols")
            connection = headers.get("connection", "").lower()
            if version == b"HTTP/1.0":
                reusable = "keep-alive" in connection
            else:
                reusable = "close" not in connection
            return status, headers, reusable

    async def _read_body(self, status: int, headers: dict[str, str]) -> tuple[bytes, bool]:
        """At most MAX_RESPONSE_BYTES of the body; whether it was read to its end."""
        if status in (204, 304):
            return b"", True
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return await self._read_chunks()
        length = headers.get("content-length")
        if length is not None:
            try:
                n = int(length.split(",")[0])
            except ValueError:
                raise ProtocolError(f"Content-Length is not a number: {length[:40]!r}") from None
            if n < 0:
                raise ProtocolError("a negative Content-Length")
            if n > MAX_RESPONSE_BYTES:
                return await self._read_exactly(MAX_RESPONSE_BYTES), False
            return await self._read_exactly(n), True
        # Neither: the body is whatever comes until the server closes the connection.
        while len(self.buffer) < MAX_RESPONSE_BYTES:
            try:
                await self._more()
            except _Ended:
                break
        return self._take(MAX_RESPONSE_BYTES), False

    async def _read_chunks(self) -> tuple[bytes, bool]:
        data = bytearray()
        while True:
            line = await self._read_until(b"\r\n", "a chunk size line")
            try:
                size = int(line.split(b";")[0].strip(), 16)
            except ValueError:
                raise ProtocolError(f"a malformed chunk size: {line[:40]!r}") from None
            if size == 0:
                # Trailers, if any, up to the empty line that ends the answer.
                while await self._read_until(b"\r\n", "a trailer") != b"\r\n":
                    pass
                return bytes(data), True
            room = MAX_RESPONSE_BYTES - len(data)
            if size > room:
                data += await self._read_exactly(room)
                return bytes(data), False
            data += await self._read_exactly(size)
            if await self._read_exactly(2) != b"\r\n":
                raise ProtocolError("a chunk longer than its size")


class Http1Pool:
    """Keep-alive connections to one endpoint, on one event loop (asyncio's transports belong
    to the loop that opened them). At most ``settings.max_connections`` are kept idle; the
    pipeline bounds how many requests are in flight."""

    def __init__(self, settings: HttpSettings) -> None:
        """Builds the TLS context for an https endpoint (a CA bundle to load: call it off
        the loop)."""
        url = urllib.parse.urlsplit(settings.url)
        if url.scheme not in ("http", "https") or url.hostname is None:
            raise ValueError(f"not an http(s) URL: {settings.url!r}")
        self.host = url.hostname
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.tls: ssl.SSLContext | None = None
        if url.scheme == "https":
            self.tls = settings.ssl_context()
            self.tls.set_alpn_protocols(["http/1.1"])
        self.max_idle = settings.max_connections
        self._send_buffer = LOOPBACK_SNDBUF if settings.loopback else 0
        self._idle: list[_Connection] = []
        self._closed = False
        target = url.path or "/"
        if url.query:
            target += "?" + url.query
        host = url.netloc.rpartition("@")[2]
        fixed = {"host": host, "user-agent": _user_agent(), "accept-encoding": "identity"}
        if url.username is not None:
            credentials = f"{url.username}:{url.password or ''}"
            fixed["authorization"] = "Basic " + base64.b64encode(credentials.encode()).decode()
        for name, value in settings.headers:
            check_header(name, value)
            fixed[name.lower()] = value
        self._target = target
        self._fixed = fixed

    def head(self, length: int, headers: Mapping[str, str]) -> bytes:
        """The request head for a body of ``length`` bytes; ``headers`` (the exporter's
        content type and encoding) over the configured ones."""
        fields = dict(self._fixed)
        for name, value in headers.items():
            fields[name.lower()] = value
        fields["content-length"] = str(length)
        lines = [f"POST {self._target} HTTP/1.1"]
        lines.extend(f"{name}: {value}" for name, value in fields.items())
        lines.append("\r\n")
        return "\r\n".join(lines).encode("latin-1")

    async def post(self, body: bytes, headers: Mapping[str, str]) -> Response:
        """POST ``body``; raise an ``OSError`` when no answer came (``TimeoutError`` is the
        caller's: cancelled mid-request, the connection is closed, never reused)."""
        head = self.head(len(body), headers)
        for attempt in (1, 2):
            conn, reused = await self._connection()
            try:
                answer, reusable = await conn.exchange(head, body)
            except _Unanswered:
                conn.close()
                if reused and attempt == 1:
                    continue  # the server closed it as the request went out: never processed
                raise
            except BaseException:
                conn.close()
                raise
            if reusable and not self._closed and len(self._idle) < self.max_idle:
                self._idle.append(conn)
            else:
                conn.close()
            return answer
        raise AssertionError("unreachable")  # pragma: no cover

    async def _connection(self) -> tuple[_Connection, bool]:
        while self._idle:
            conn = self._idle.pop()
            if conn.idle_and_open():
                return conn, True
            conn.close()
        if self._closed:
            raise ConnectionError("the connection pool is closed")
        _, conn = await asyncio.get_running_loop().create_connection(
            functools.partial(_Connection, self._send_buffer),
            self.host,
            self.port,
            ssl=self.tls,
            server_hostname=self.host if self.tls is not None else None,
        )
        return conn, False

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
        if idle:
            closed = asyncio.gather(*(c.closed for c in idle), return_exceptions=True)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(closed, 1.0)


def _user_agent() -> str:
    from . import __version__

    return f"looptrace/{__version__}"
