"""OTLP POSTs over HTTP/1.1 on the event loop's own transports, h11 doing all of HTTP/1.1:
how the application's loop talks to a backend it reaches directly (no proxy between them).

An exporter's request is a POST of bytes it already has, and the answer it needs is a status,
a few headers and at most a short message. httpx, over httpcore and anyio, runs about 1,500
Python calls to send one and read its answer: 1-2 ms of CPU on the application's loop per
request on the benchmark machine, in steps long enough to make a 1 ms timer late. This client
is an ``asyncio.Protocol`` driven by h11 (the state machine httpx itself uses): h11 writes the
request head and frames the body, and parses every byte of the answer (status line, headers,
Content-Length, chunks, trailers, interim answers), refusing what HTTP/1.1 forbids. The
connection owns only I/O, bounds and its lifecycle. It runs on any loop that implements
asyncio's transports (asyncio's own, uvloop), and asks nothing of a transport's type.

    pool = Http11Pool(settings)               # one per event loop
    response = await pool.post(body, headers)  # OSError when nothing was answered
    await pool.aclose()

Bounds on what a backend, a proxy or a load balancer in between can make the loop hold or do:

- the answer's head (status line and headers) and its trailers: ``MAX_HEAD_BYTES`` each (what
  h11 buffers of an incomplete event) and ``MAX_FIELDS`` fields;
- interim answers (``100 Continue``, ``103 Early Hints``): ``MAX_INTERIM`` per request;
- the answer's body: ``MAX_RESPONSE_BYTES`` read, and the connection that carried a longer one
  dropped;
- the loop's time: at most ``EVENTS_PER_STEP`` parsed events per callback; the rest waits for
  the loop's next turn with reading paused, so a flood of tiny chunks or interim answers
  cannot hold the loop in one long step; the whole request is bounded by the transport's
  timeout.

Every failure (an answer h11 refuses, a bound passed, a timeout or a cancellation) aborts the
connection: the socket is closed at once and the unsent rest of the request dropped, never left
to drain to a backend that stopped reading. Refusals are :class:`ProtocolError`, an OSError,
which the pipeline counts as a failed request.

A connection is reused when the answer said nothing against it, was read to its end, and the
request went out whole. One the server closed while it sat idle is noticed before it is used.
A kept-alive connection that ends before any byte of an answer was most likely closed by the
server as the request went out: the request goes again on a new connection, once. On a new
connection the same failure is the caller's to retry (the pipeline's backoff).
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import functools
import socket
import ssl
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any, cast

import h11

from .._config import check_header
from .._errors import ProtocolError as ProtocolError
from .._errors import Unanswered as _Unanswered
from . import MAX_RESPONSE_BYTES, Response
from .settings import LOOPBACK_SNDBUF, HttpSettings

__all__ = [
    "EVENTS_PER_STEP",
    "MAX_FIELDS",
    "MAX_HEAD_BYTES",
    "MAX_INTERIM",
    "MAX_RESPONSE_BYTES",
    "WRITE_PIECE_BYTES",
    "Http11Pool",
    "ProtocolError",
    "Response",
]

# The answer's status line and headers, and its trailers: what h11 buffers while an event is
# incomplete. Past it h11 refuses the answer rather than grow a buffer.
MAX_HEAD_BYTES = 64 * 1024
# Header fields in the answer's head, and in its trailers.
MAX_FIELDS = 100
# Interim answers (1xx) before the final one.
MAX_INTERIM = 10
# Parsed events (a head, a piece of body, an interim answer) per loop callback: one event costs
# a few microseconds, so a step stays well under a millisecond whatever arrived at once.
EVENTS_PER_STEP = 32
# Requests up to this size go to the transport as one piece (head and body joined).
_ONE_WRITE_BYTES = 64 * 1024
# A longer body goes to the transport this much at a time: the next piece only once the
# transport has passed the last to the socket (flow control: pause_writing, resume_writing),
# and one piece per step of the loop. Written at once, a body the socket could not take whole
# was kept by the transport: before Python 3.12 asyncio copies the unsent rest into a
# bytearray, and moves what is left after every partial send, megabytes of copying on the
# loop's thread per megabyte sent. A piece at a time, each byte is copied at most once.
WRITE_PIECE_BYTES = 256 * 1024


class _Connection(asyncio.Protocol):
    """One connection: h11's state machine, fed from ``data_received`` as bytes arrive, so
    what the server sent stays readable after the connection ends, even by a reset. A backend
    with a body limit answers 413 as soon as it has the head and closes with the body unread,
    which resets the connection under the request still being written; the 413 (which splits a
    batch) is still the answer, not a failed connection retried with the same body."""

    def __init__(self, send_buffer: int = 0) -> None:
        self._send_buffer = send_buffer  # SO_SNDBUF to set; 0 keeps the kernel's sizing
        self._loop = asyncio.get_running_loop()
        # asyncio's and uvloop's transports alike: typed as asyncio's, never checked.
        self.transport: asyncio.Transport | None = None
        self._h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD_BYTES)
        self.ended = False
        self.closed: asyncio.Future[None] = self._loop.create_future()
        self._reading_paused = False
        self._later: asyncio.Handle | None = None
        # The exchange in progress: set while a request waits for its answer.
        self._answer: asyncio.Future[None] | None = None
        self._failure: BaseException | None = None
        self._heard = False  # a byte of the answer arrived
        self._status = 0
        self._headers: dict[str, str] = {}
        self._body = bytearray()
        self._whole = False
        self._interim = 0
        self._input_ended = False
        self._lost: BaseException | None = None
        # Flow control of what is written: set while the transport holds unsent bytes.
        self._writing_paused = False
        # The rest of a long request, written a piece at a time (see _pump).
        self._pieces: collections.deque[memoryview] = collections.deque()
        self._pump_later: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol --
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket") if self._send_buffer else None
        if sock is not None:
            # A write's first send runs in the exporter's step, the rest in the transport's
            # callbacks: each copies at most what the send buffer holds (LOOPBACK_SNDBUF).
            with contextlib.suppress(OSError, AttributeError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._send_buffer)
        # Paused once the transport holds bytes it could not send, resumed once it holds
        # none: a long body is written a piece at a time (see WRITE_PIECE_BYTES). Not a
        # high-water mark of 0: TLS transports pause at a size >= the mark, so at 0 they
        # would pause with nothing held, and never resume.
        with contextlib.suppress(NotImplementedError, AttributeError):
            self.transport.set_write_buffer_limits(high=1, low=0)

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        if self._pieces and self._pump_later is None:
            # In the transport's own write callback, which runs after its read callback in
            # the same turn of the loop: an answer that came while the body was being
            # written is read before the next piece can meet the closed connection behind it.
            self._pump()

    def data_received(self, data: bytes) -> None:
        if not self._waiting():
            # Bytes nobody asked for: the connection is out of step with its requests.
            self.abort()
            return
        self._heard = True
        self._h11.receive_data(data)
        if self._later is None:  # else a step is already due, on the loop's next turn
            self._step()

    def eof_received(self) -> bool:
        self._end_of_input()
        return False  # close: nothing more will come, and a request cannot be answered now

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended = True
        self._lost = exc
        self._end_of_input()  # what h11 already holds may still be the whole answer
        if self._waiting() and self._later is None:
            self._fail(self._ended_error())
        self._stop_writing()
        if not self.closed.done():
            self.closed.set_result(None)

    # -- the pool's side --
    def idle_and_open(self) -> bool:
        # A server that closes an idle connection has its end-of-stream read by the loop
        # while the connection waits in the pool.
        return not self.ended

    def abort(self) -> None:
        """Drop the connection now: the socket closes and the transport's buffer (the unsent
        rest of a request) is freed, whatever the peer does."""
        if self._later is not None:
            self._later.cancel()
            self._later = None
        self._stop_writing()
        if self.transport is not None:
            self.transport.abort()

    def close(self) -> None:
        """End an idle connection politely (nothing is left to send on it)."""
        if self.transport is not None:
            self.transport.close()

    async def exchange(self, request: h11.Request, body: bytes) -> tuple[Response, bool]:
        """Send one request, read its answer; also whether the connection can carry another.
        The caller aborts the connection on any exception."""
        transport = self.transport
        assert transport is not None
        self._failure = None
        self._heard = False
        self._status = 0
        self._headers = {}
        self._body = bytearray()
        self._whole = False
        self._interim = 0
        answer = self._answer = self._loop.create_future()
        try:
            try:
                pieces = [self._h11.send(request) or b""]
                if body:
                    # h11 frames the body and passes it through uncopied.
                    pieces += self._h11.send_with_data_passthrough(h11.Data(data=body)) or ()
                pieces.append(self._h11.send(h11.EndOfMessage()) or b"")
            except h11.LocalProtocolError as exc:
                raise ProtocolError(f"the request could not be framed: {exc}") from None
            if len(body) <= _ONE_WRITE_BYTES:
                # One send for a small request: a system call costs more than the copy.
                transport.write(b"".join(pieces))
            else:
                transport.write(pieces[0])  # the head
                self._pieces.extend(_cut(pieces[1:]))
                self._pump()
            if self.ended:  # lost before the request went out
                self._end_of_input()
                if self._waiting():
                    self._fail(self._ended_error())
            await answer
        finally:
            self._answer = None
        failure, self._failure = self._failure, None
        if failure is not None:
            raise failure
        response = Response(self._status, self._headers, bytes(self._body))
        # Not empty: the answer came before the whole request went out.
        written = not self._pieces
        self._stop_writing()
        reusable = (
            written
            and self._whole
            and not self.ended
            and self._h11.our_state is h11.DONE
            and self._h11.their_state is h11.DONE
            and not self._h11.trailing_data[0]
            and transport.get_write_buffer_size() == 0
        )
        if reusable:
            self._h11.start_next_cycle()
        return response, reusable

    def _pump(self) -> None:
        """Write the next piece of the request: one per step of the loop, and none while the
        transport holds unsent bytes (its resume_writing calls this again). Once
        the answer is in (a server may answer 413 before it reads the body, and close) or the
        connection ended, the rest is not written."""
        self._pump_later = None
        transport = self.transport
        answer = self._answer
        if not self._pieces or self._writing_paused:
            return
        if transport is None or transport.is_closing() or answer is None or answer.done():
            return
        transport.write(self._pieces.popleft())
        if self._pieces and not self._writing_paused:
            # The socket took it whole: the next piece on the loop's next turn, once it has
            # polled for input (a timer, not call_soon, which would run before the poll): a
            # piece written right after another would meet the reset of a server that
            # answered meanwhile, and the answer sitting unread in front of it would be lost.
            self._pump_later = self._loop.call_later(0, self._pump)

    def _stop_writing(self) -> None:
        self._pieces.clear()
        if self._pump_later is not None:
            self._pump_later.cancel()
            self._pump_later = None

    # -- reading --
    def _waiting(self) -> bool:
        return self._answer is not None and not self._answer.done()

    def _end_of_input(self) -> None:
        if self._input_ended:
            return
        self._input_ended = True
        if self._waiting():
            self._h11.receive_data(b"")
            self._step()

    def _ended_error(self) -> ConnectionError:
        if self._heard:
            return ProtocolError("the connection closed in the middle of an answer")
        if self._lost is not None:
            return _Unanswered(f"the connection failed before an answer: {self._lost}")
        return _Unanswered("the connection closed before an answer")

    def _fail(self, error: BaseException) -> None:
        self._failure = error
        self._finish()

    def _finish(self) -> None:
        answer = self._answer
        if answer is not None and not answer.done():
            answer.set_result(None)
        if self._reading_paused and not self.ended and self.transport is not None:
            # Held for a step that found the end: the next request's answer must be read.
            self._reading_paused = False
            self.transport.resume_reading()

    def _step(self) -> None:
        """Take at most EVENTS_PER_STEP events from h11; the rest on the loop's next turn."""
        self._later = None
        if not self._waiting():
            return
        h = self._h11
        for _ in range(EVENTS_PER_STEP):
            try:
                event = h.next_event()
            except h11.RemoteProtocolError as exc:
                if self._input_ended and not self._heard:
                    self._fail(self._ended_error())
                else:
                    self._fail(ProtocolError(f"an answer HTTP/1.1 refuses: {exc}"))
                return
            kind = type(event)
            if kind is h11.Data:
                data = cast(h11.Data, event).data
                room = MAX_RESPONSE_BYTES - len(self._body)
                if len(data) > room:
                    self._body += data[:room]
                    self._finish()  # cut: the connection is not reused
                    return
                self._body += data
            elif kind is h11.Response:
                response = cast(h11.Response, event)
                refused = _over_bounds(response.headers, "header", len(response.reason))
                if refused is not None:
                    self._fail(refused)
                    return
                self._status = response.status_code
                self._headers = _fields(response.headers)
            elif kind is h11.EndOfMessage:
                refused = _over_bounds(cast(h11.EndOfMessage, event).headers, "trailer", 0)
                if refused is not None:
                    self._fail(refused)
                    return
                self._whole = True
                self._finish()
                return
            elif kind is h11.InformationalResponse:
                self._interim += 1
                if self._interim > MAX_INTERIM:
                    self._fail(ProtocolError(f"over {MAX_INTERIM} interim (1xx) answers"))
                    return
            elif event is h11.NEED_DATA:
                if self._reading_paused and not self.ended and self.transport is not None:
                    self._reading_paused = False
                    self.transport.resume_reading()
                return
            else:  # ConnectionClosed, PAUSED: no answer will complete
                self._fail(self._ended_error())
                return
        # More may be parsed from what arrived: on the loop's next turn, reading held until then.
        if not self.ended and self.transport is not None and not self._reading_paused:
            self._reading_paused = True
            self.transport.pause_reading()
        self._later = self._loop.call_soon(self._step)


def _cut(pieces: Sequence[bytes]) -> list[memoryview]:
    """``pieces`` as views of at most WRITE_PIECE_BYTES (no copy)."""
    cut: list[memoryview] = []
    for piece in pieces:
        view = memoryview(piece)
        cut += (view[i : i + WRITE_PIECE_BYTES] for i in range(0, len(view), WRITE_PIECE_BYTES))
    return cut


def _over_bounds(
    headers: Sequence[tuple[bytes, bytes]], what: str, extra: int
) -> ProtocolError | None:
    # h11 bounds an event only while it is incomplete: a whole head that arrived at once is
    # measured here.
    if len(headers) > MAX_FIELDS:
        return ProtocolError(f"an answer with over {MAX_FIELDS} {what} fields")
    size = extra + sum(len(name) + len(value) + 4 for name, value in headers)
    if size > MAX_HEAD_BYTES:
        return ProtocolError(f"an answer whose {what}s pass {MAX_HEAD_BYTES} bytes")
    return None


def _fields(headers: Sequence[tuple[bytes, bytes]]) -> dict[str, str]:
    fields: dict[str, str] = {}
    for name, value in headers:
        key = name.decode("latin-1")  # lower case, from h11
        text = value.decode("latin-1")
        fields[key] = f"{fields[key]}, {text}" if key in fields else text
    return fields


class Http11Pool:
    """Keep-alive connections to one endpoint, on one event loop (a loop's transports belong
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
        self._busy: set[_Connection] = set()
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
        self._target = target.encode("ascii")
        self._fixed = fixed

    def request(self, length: int, headers: Mapping[str, str]) -> h11.Request:
        """The request for a body of ``length`` bytes; ``headers`` (the exporter's content
        type and encoding, a headers provider's) over the configured ones."""
        fields = dict(self._fixed)
        for name, value in headers.items():
            fields[name.lower()] = value
        fields["content-length"] = str(length)
        return h11.Request(
            method=b"POST",
            target=self._target,
            headers=[(k.encode("latin-1"), v.encode("latin-1")) for k, v in fields.items()],
        )

    async def post(self, body: bytes, headers: Mapping[str, str]) -> Response:
        """POST ``body``; raise an ``OSError`` when no answer came. Cancelled (the caller's
        timeout), the connection is aborted, never reused."""
        try:
            request = self.request(len(body), headers)
        except (h11.LocalProtocolError, UnicodeEncodeError) as exc:
            raise ProtocolError(f"the request could not be framed: {exc}") from None
        for attempt in (1, 2):
            conn, reused = await self._connection()
            self._busy.add(conn)
            try:
                answer, reusable = await conn.exchange(request, body)
            except _Unanswered:
                conn.abort()
                if reused and attempt == 1:
                    continue  # the server closed it as the request went out: never processed
                raise
            except BaseException:
                conn.abort()
                raise
            finally:
                self._busy.discard(conn)
            if reusable and not self._closed and len(self._idle) < self.max_idle:
                self._idle.append(conn)
            else:
                conn.abort()  # not reusable: a body cut short, unsent bytes, a closing server
            return answer
        raise AssertionError("unreachable")  # pragma: no cover

    async def _connection(self) -> tuple[_Connection, bool]:
        while self._idle:
            conn = self._idle.pop()
            if conn.idle_and_open():
                return conn, True
            conn.abort()
        if self._closed:
            raise ConnectionError("the connection pool is closed")
        loop = asyncio.get_running_loop()
        factory = functools.partial(_Connection, self._send_buffer)
        server_hostname = self.host if self.tls is not None else None
        try:
            _, conn = await loop.create_connection(
                factory, self.host, self.port, ssl=self.tls, server_hostname=server_hostname
            )
        except RuntimeError:
            # asyncio looks host names up in the loop's executor, which refuses new work once
            # the interpreter is exiting ("cannot schedule new futures after interpreter
            # shutdown"): the exit's flush would lose every span to a backend named by host
            # name. At exit no application loop is left to hold up, so the name is looked up
            # here, and the connection made to the address found.
            addresses = _lookup(self.host, self.port)
            _, conn = await loop.create_connection(
                factory, sock=_connect(addresses), ssl=self.tls, server_hostname=server_hostname
            )
        return conn, False

    def open_connections(self) -> int:
        """Connections kept idle or carrying a request."""
        return len(self._idle) + len(self._busy)

    async def aclose(self) -> None:
        """Close the idle connections and abort any still carrying a request."""
        self._closed = True
        idle, self._idle = self._idle, []
        busy, self._busy = list(self._busy), set()
        for conn in idle:
            conn.close()
        for conn in busy:
            conn.abort()
        every = idle + busy
        if every:
            closed = asyncio.gather(*(c.closed for c in every), return_exceptions=True)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(closed, 1.0)


def _user_agent() -> str:
    from .. import __version__

    return f"looptrace/{__version__}"


_Address = tuple[int, int, int, str, tuple[Any, ...]]


def _lookup(host: str, port: int) -> Sequence[_Address]:
    try:
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise OSError(f"cannot resolve {host}: {exc}") from exc


def _connect(addresses: Sequence[_Address]) -> socket.socket:
    """A connected, non-blocking socket to the first address that answers (blocking: only at
    exit, see :meth:`Http11Pool._connection`)."""
    error: OSError = OSError("no address to connect to")
    for family, kind, proto, _, address in addresses:
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(5.0)
            sock.connect(address)
            sock.setblocking(False)
            return sock
        except OSError as exc:
            sock.close()
            error = exc
    raise error
