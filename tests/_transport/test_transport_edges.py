"""The application's HTTP client against backends that misbehave on purpose, on 127.0.0.1, under
every event loop of the matrix (asyncio, asyncio debug mode, uvloop): one that accepts and
never reads, one that sends trailers or interim answers without end, ones whose answers HTTP
forbids. What each may cost is bounded: sockets, memory, and the loop's time."""

from __future__ import annotations

import asyncio
import gc
import os
import socket
import stat
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest

import looptrace
from loop_matrix import loop_kind  # noqa: F401
from looptrace._transport import HttpTransport, RequestHeadersError, Response
from looptrace._transport.http11 import (
    EVENTS_PER_STEP,
    MAX_HEAD_BYTES,
    MAX_INTERIM,
    MAX_RESPONSE_BYTES,
    Http11Pool,
    ProtocolError,
)
from looptrace._transport.settings import HttpSettings
from otlp_server import OtlpTestServer
from raw_http import read_request

pytestmark = pytest.mark.usefixtures("loop_kind")

T = TypeVar("T")

# The most of the loop thread's CPU that may go by between two wake-ups of a 1 ms ticker while
# the client reads what a hostile backend sends: the client parses a few dozen events per loop
# step, each a few microseconds; the rest of the bound is room for asyncio's debug mode on a
# slow, shared machine (one run in a few hundred went past 50 ms there). Without the per-step
# budget the hold was 275-513 ms. Measured in the thread's CPU time, so that another process
# taking the core (two shared cores here) is not counted as the loop's own stall.
MAX_STEP_LAG = 0.100


class Backend:
    """A server on 127.0.0.1 that reads each request's head and body, then calls ``answer``
    with the connection (which may send anything, for as long as it likes)."""

    def __init__(self, answer: Callable[[socket.socket], None]) -> None:
        self.answer = answer
        self.requests = 0
        self.connections = 0
        self.keep_alive = False  # serve further requests on a connection after an answer
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._stop = threading.Event()
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}/v1/traces"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                while True:
                    if not read_request(conn):
                        return
                    self.requests += 1
                    self.answer(conn)
                    if not self.keep_alive:
                        return
            except OSError:
                return

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def close(self) -> None:
        self._stop.set()
        self._sock.close()


@pytest.fixture
def backend() -> Iterator[Callable[[Callable[[socket.socket], None]], Backend]]:
    made: list[Backend] = []

    def make(answer: Callable[[socket.socket], None]) -> Backend:
        made.append(Backend(answer))
        return made[-1]

    yield make
    for server in made:
        server.close()


async def with_ticker(work: Awaitable[T]) -> tuple[T | BaseException, float]:
    """``work``'s result (or the exception it raised) and the most of the loop thread's CPU
    time that went by between two wake-ups of a 1 ms ticker on the same loop while it ran: a
    step that holds the loop shows there whatever else the machine runs."""
    held: list[float] = []
    done = False

    async def tick() -> None:
        while not done:
            before = time.thread_time()
            await asyncio.sleep(0.001)
            held.append(time.thread_time() - before)

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0)
    result: T | BaseException
    try:
        result = await work
    except Exception as exc:
        result = exc
    done = True
    await ticker
    return result, max(held, default=0.0)


async def post_once(url: str, timeout: float = 10.0) -> Response:
    transport = HttpTransport(HttpSettings(url, timeout=timeout))
    try:
        return await transport.send(b"{}", {"content-type": "application/json"})
    finally:
        await transport.aclose()


# -- the loop's time -------------------------------------------------------------------------


def test_endless_trailers_are_refused_without_holding_the_loop(
    backend: Callable[[Callable[[socket.socket], None]], Backend],
) -> None:
    """A backend that ends its chunked body and then sends trailer lines without end: the
    answer is refused once its trailers pass MAX_HEAD_BYTES (never read for the whole
    timeout), the connection is dropped, and the loop is never held for long."""

    def trailers(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n")
        line = b"X-Trailer: " + b"t" * 40 + b"\r\n"
        while True:  # until the client goes (the send fails)
            conn.sendall(line * 64)

    server = backend(trailers)

    async def run() -> tuple[object, float, float]:
        started = time.monotonic()
        result, lag = await with_ticker(post_once(server.url, timeout=30))
        return result, lag, time.monotonic() - started

    result, lag, took = asyncio.run(run())
    assert isinstance(result, ProtocolError) and isinstance(result, OSError)
    assert "HTTP/1.1" in str(result)
    assert took < 10  # refused on the bound, not the 30 s timeout
    assert lag < MAX_STEP_LAG, f"the loop was held {lag * 1e3:.1f} ms"


def test_a_flood_of_interim_answers_is_refused_without_holding_the_loop(
    backend: Callable[[Callable[[socket.socket], None]], Backend],
) -> None:
    """``100 Continue`` without end: refused after MAX_INTERIM interim answers."""

    def flood(conn: socket.socket) -> None:
        while True:
            conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n" * 512)

    server = backend(flood)
    result, lag = asyncio.run(with_ticker(post_once(server.url, timeout=30)))
    assert isinstance(result, ProtocolError)
    assert f"over {MAX_INTERIM} interim" in str(result)
    assert lag < MAX_STEP_LAG, f"the loop was held {lag * 1e3:.1f} ms"


def test_a_body_of_one_byte_chunks_is_read_in_short_steps(
    backend: Callable[[Callable[[socket.socket], None]], Backend],
) -> None:
    """Tens of thousands of one-byte chunks arrive in a few reads: they are parsed a few dozen
    per loop step, the body stops at MAX_RESPONSE_BYTES, and the loop keeps its timers."""

    def tiny_chunks(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 400 Bad Request\r\nTransfer-Encoding: chunked\r\n\r\n")
        while True:
            conn.sendall(b"1\r\nx\r\n" * 8192)

    server = backend(tiny_chunks)
    result, lag = asyncio.run(with_ticker(post_once(server.url, timeout=60)))
    assert isinstance(result, Response), result
    assert result.status == 400 and result.body == b"x" * MAX_RESPONSE_BYTES
    assert lag < MAX_STEP_LAG, f"the loop was held {lag * 1e3:.1f} ms"


def test_an_answer_read_over_several_steps_leaves_its_connection_reusable(
    backend: Callable[[Callable[[socket.socket], None]], Backend],
) -> None:
    """An answer of a few hundred small chunks takes several loop steps to parse; the kept-alive
    connection then carries the next request, whose answer is read as usual."""
    chunked = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"1\r\nx\r\n" * (EVENTS_PER_STEP * 5)
        + b"0\r\n\r\n"
    )

    def answer(conn: socket.socket) -> None:
        conn.sendall(chunked)

    server = backend(answer)
    server.keep_alive = True

    async def run() -> list[tuple[int, int]]:
        pool = Http11Pool(HttpSettings(server.url))
        try:
            got = []
            for _ in range(3):
                response = await asyncio.wait_for(pool.post(b"{}", {}), 10)
                got.append((response.status, len(response.body)))
            return got
        finally:
            await pool.aclose()

    assert asyncio.run(run()) == [(200, EVENTS_PER_STEP * 5)] * 3
    assert server.connections == 1


def test_a_head_too_large_is_refused(
    backend: Callable[[Callable[[socket.socket], None]], Backend],
) -> None:
    """A head that never ends, and one that ends past MAX_HEAD_BYTES, or with too many fields:
    refused, whatever the pace they arrive at."""

    def endless(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\n")
        while True:
            conn.sendall(b"X-A: " + b"a" * 1000 + b"\r\n")

    many = b"HTTP/1.1 200 OK\r\n" + b"X-A: 1\r\n" * 200 + b"Content-Length: 0\r\n\r\n"
    for answer in (endless, lambda conn: conn.sendall(many)):
        server = backend(answer)
        result, lag = asyncio.run(with_ticker(post_once(server.url, timeout=30)))
        assert isinstance(result, ProtocolError), result
        assert lag < MAX_STEP_LAG
    assert MAX_HEAD_BYTES >= 16 * 1024  # room for any real backend's head


# -- what HTTP forbids -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "reply",
    [
        b"HTTP/1.1 2000 OK\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x2\r\nok\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0_2\r\nok\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\nok\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\nContent-Length: 3, 5\r\n\r\nabcde",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: gzip\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\n Folded: header\r\nContent-Length: 0\r\n\r\n",
    ],
    ids=["status-2000", "chunk-0x2", "chunk-0_2", "chunk-minus-1", "length-plus", "length-list",
         "unknown-coding", "continuation-first"],
)  # fmt: skip
def test_answers_http_forbids_are_refused(
    backend: Callable[[Callable[[socket.socket], None]], Backend], reply: bytes
) -> None:
    """Each is a ProtocolError (an OSError: the pipeline counts a failed request and retries
    under its policy), never a status or a body read from it."""
    server = backend(lambda conn: conn.sendall(reply))

    async def run() -> object:
        try:
            return await post_once(server.url)
        except OSError as exc:
            return exc

    result = asyncio.run(run())
    assert isinstance(result, ProtocolError), result


# -- nothing a failed request held survives it ----------------------------------------------


NEVER_READS = """
import socket, sys, time
sock = socket.create_server(("127.0.0.1", 0))
print(sock.getsockname()[1], flush=True)
held = []
while True:
    conn, _ = sock.accept()
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    held.append(conn)  # accepted, never read
"""


def _open_sockets() -> int:
    """The process's open sockets (a loop's wake-up pipe or eventfd is not one)."""
    count = 0
    for name in os.listdir("/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"):
        try:
            count += stat.S_ISSOCK(os.fstat(int(name)).st_mode)
        except OSError:
            pass  # the directory listing's own descriptor, closed since
    return count


@pytest.mark.skipif(sys.platform == "win32", reason="counts the process's sockets by descriptor")
def test_timed_out_requests_to_a_backend_that_never_reads_leave_nothing() -> None:
    """A backend (another process) accepts and never reads. Each request times out with most
    of an 8 MiB body unsent; its connection is aborted, not closed (a close waits for the
    unsent bytes to drain, for ever here): after N timeouts the process has no more sockets
    than before, no connection is left in the pool, nothing refers to the body, and memory
    has not grown by the bodies' unsent rest."""
    server = subprocess.Popen(
        [sys.executable, "-c", NEVER_READS], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        url = f"http://127.0.0.1:{int(server.stdout.readline())}/v1/traces"
        body = os.urandom(8 << 20)

        async def run() -> tuple[int, int, int, int, list[object], int]:
            transport = HttpTransport(HttpSettings(url, timeout=0.3))
            await asyncio.to_thread(int)  # the loop's executor and its wake-up, made beforehand
            before = _open_sockets()
            refs = sys.getrefcount(body)
            gc.collect()
            tracemalloc.start()
            try:
                outcomes: list[object] = []
                for _ in range(5):
                    try:
                        outcomes.append(await transport.send(body, {}))
                    except (OSError, asyncio.TimeoutError) as exc:
                        outcomes.append(type(exc))
                pool = transport._client
                assert isinstance(pool, Http11Pool)
                # An aborted socket is released by the loop's next turns: bounded wait.
                deadline = time.monotonic() + 5
                while _open_sockets() > before and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
                gc.collect()
                grown = tracemalloc.get_traced_memory()[0]
                return (
                    before,
                    _open_sockets(),
                    pool.open_connections(),
                    sys.getrefcount(body) - refs,
                    outcomes,
                    grown,
                )
            finally:
                tracemalloc.stop()
                await transport.aclose()

        # Garbage an earlier test left (an SDK client whose __del__ schedules its own close on
        # whichever loop runs) collected before the loop starts: its tasks would run inside
        # the measured window and keep references of their own.
        gc.collect()
        before, after, pooled, extra_refs, outcomes, grown = asyncio.run(run())
    finally:
        server.kill()
        server.wait()
    assert outcomes == [asyncio.TimeoutError] * 5
    assert after <= before, f"{after - before} sockets left open"
    assert pooled == 0
    assert extra_refs == 0, "a transport still holds the body"
    assert grown < 4 << 20, f"{grown >> 20} MiB still held"


def test_a_cancelled_request_aborts_its_connection(
    backend: Callable[[Callable[[socket.socket], None]], Backend],
) -> None:
    """Cancelled while it waits for an answer that never comes, the request's connection is
    aborted at once: the server sees it end, and the pool holds nothing."""
    ended = threading.Event()

    def silent(conn: socket.socket) -> None:
        if conn.recv(1) == b"":
            ended.set()

    server = backend(silent)

    async def run() -> int:
        pool = Http11Pool(HttpSettings(server.url))
        task = asyncio.create_task(pool.post(b"x" * 100, {}))
        while server.requests == 0:
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        open_now = pool.open_connections()
        await pool.aclose()
        return open_now

    assert asyncio.run(run()) == 0
    assert ended.wait(5)


# -- the client under every loop, end to end ------------------------------------------------


def test_a_pipeline_flush_reaches_a_real_server(request: pytest.FixtureRequest) -> None:
    """Under uvloop as under asyncio: spans go out at flush, over the loop's own client, and
    the statistics count them sent."""
    kind = request.getfixturevalue("loop_kind")
    with OtlpTestServer() as server:
        looptrace.configure(endpoint=server.endpoint, flush_interval=0.05)

        async def main() -> tuple[bool, int, str]:
            for i in range(20):
                with looptrace.span(f"s{i}"):
                    pass
            result = await looptrace.flush(10)
            loop = type(asyncio.get_running_loop()).__module__
            return result.ok, looptrace.statistics().spans_sent, loop

        ok, sent, loop_module = asyncio.run(main())
        assert ok and sent == 20
        assert server.accepted_span_count == 20
        assert loop_module.startswith("uvloop") == (kind == "uvloop")


# -- headers the application brings ---------------------------------------------------------


def _recording(backend: Callable[[Callable[[socket.socket], None]], Backend]) -> Any:
    heads: list[bytes] = []

    def record(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")

    server = backend(record)
    original = server._serve

    def serve(conn: socket.socket) -> None:
        # Peek the head before the server reads it.
        head = conn.recv(65536, socket.MSG_PEEK)
        heads.append(head.partition(b"\r\n\r\n")[0])
        original(conn)

    server._serve = serve  # type: ignore[method-assign]
    return server, heads


def test_a_headers_provider_is_asked_before_each_request(
    backend: Callable[[Callable[[socket.socket], None]], Backend],
) -> None:
    """A token that refreshes: the provider (a plain function or a coroutine function) is
    called for every request, and what it returns goes over the configured headers."""
    server, heads = _recording(backend)
    tokens = iter(range(100))

    def sync_provider() -> dict[str, str]:
        return {"Authorization": f"Bearer t{next(tokens)}"}

    async def async_provider() -> dict[str, str]:
        await asyncio.sleep(0)
        return {"Authorization": f"Bearer t{next(tokens)}", "X-Signed": "yes"}

    async def run(provider: Any) -> list[int]:
        settings = HttpSettings(
            server.url, (("Authorization", "Bearer static"),), headers_provider=provider
        )
        transport = HttpTransport(settings)
        try:
            return [(await transport.send(b"{}", {})).status for _ in range(2)]
        finally:
            await transport.aclose()

    assert asyncio.run(run(sync_provider)) == [200, 200]
    assert asyncio.run(run(async_provider)) == [200, 200]
    auth = [
        line.split(b": ", 1)[1]
        for head in heads
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"authorization:")
    ]
    assert auth == [b"Bearer t0", b"Bearer t1", b"Bearer t2", b"Bearer t3"]
    assert all(b"x-signed: yes" in head.lower() for head in heads[2:])


@pytest.mark.parametrize("failure", ["raises", "bad-value"])
def test_a_failing_headers_provider_fails_the_request_without_showing_the_secret(
    backend: Callable[[Callable[[socket.socket], None]], Backend], failure: str
) -> None:
    """A provider that raises, or returns a value that would break the request head: the
    request is not made, and fails as an OSError (counted, retried) whose message names the
    problem but never the header's value."""
    server, heads = _recording(backend)

    def provider() -> dict[str, str]:
        if failure == "raises":
            raise RuntimeError("could not refresh secret-token-123")
        return {"Authorization": "secret-token-123\r\nX-Injected: 1"}

    async def run() -> BaseException:
        transport = HttpTransport(HttpSettings(server.url, headers_provider=provider))
        try:
            await transport.send(b"{}", {})
        except OSError as exc:
            return exc
        finally:
            await transport.aclose()
        raise AssertionError("sent")

    error = asyncio.run(run())
    assert isinstance(error, RequestHeadersError)
    assert "secret-token" not in str(error)
    assert heads == []
