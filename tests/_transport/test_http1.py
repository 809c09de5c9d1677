"""The application's HTTP/1.1 client against real servers on 127.0.0.1: well-behaved ones that
keep connections alive or close them, and ones that answer in every framing HTTP/1.1 allows,
badly, or not at all; under asyncio, asyncio's debug mode and uvloop (``loop_matrix``)."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable, Iterator

import pytest

import looptrace
from loop_matrix import loop_kind  # noqa: F401
from looptrace._transport.http11 import (
    MAX_RESPONSE_BYTES,
    WRITE_PIECE_BYTES,
    Http11Pool,
    ProtocolError,
)
from looptrace._transport.settings import LOOPBACK_SNDBUF, HttpSettings
from otlp_server import OtlpTestServer

pytestmark = pytest.mark.usefixtures("loop_kind")

Answer = Callable[[int, int, bytes], bytes | None]
"""(connection number, request number on it, request head) -> the bytes to answer, or None to
close the connection without answering."""


class Scripted:
    """A server that reads each request whole and answers what ``answer`` says; it closes the
    connection after an HTTP/1.0 answer or one that says ``Connection: close``."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.heads: list[bytes] = []
        self.connections = 0
        self._lock = threading.Lock()
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}/v1/traces?tenant=a"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
                number = self.connections
            threading.Thread(target=self._serve, args=(conn, number), daemon=True).start()

    def _serve(self, conn: socket.socket, number: int) -> None:
        with conn:
            data = b""
            for request in range(1, 1000):
                while b"\r\n\r\n" not in data:
                    part = conn.recv(65536)
                    if not part:
                        return
                    data += part
                head, _, data = data.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.lower() == b"content-length":
                        length = int(value)
                while len(data) < length:
                    data += conn.recv(65536)
                data = data[length:]
                with self._lock:
                    self.heads.append(head)
                reply = self.answer(number, request, head)
                if reply is None:
                    return
                conn.sendall(reply)
                if reply.startswith(b"HTTP/1.0") or b"Connection: close" in reply:
                    return  # as such a server does after its answer

    def close(self) -> None:
        self._sock.close()


@pytest.fixture
def scripted() -> Iterator[Callable[[Answer], Scripted]]:
    servers: list[Scripted] = []

    def make(answer: Answer) -> Scripted:
        servers.append(Scripted(answer))
        return servers[-1]

    yield make
    for server in servers:
        server.close()


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"


def post_all(url: str, count: int, headers: tuple[tuple[str, str], ...] = ()) -> list[object]:
    """``count`` POSTs one after another on one pool; each answer or the error it raised."""

    async def run() -> list[object]:
        pool = Http11Pool(HttpSettings(url, headers))
        results: list[object] = []
        try:
            for i in range(count):
                try:
                    post = pool.post(b"body %d" % i, {"content-type": "x/y"})
                    results.append(await asyncio.wait_for(post, 10))
                except OSError as exc:
                    results.append(exc)
        finally:
            await pool.aclose()
        return results

    return asyncio.run(run())


def test_requests_reuse_one_kept_alive_connection() -> None:
    with OtlpTestServer() as server:
        looptrace.configure(endpoint=server.endpoint, flush_interval=0.05)

        async def work() -> None:
            for i in range(5):
                with looptrace.span(f"s{i}"):
                    pass
                assert (await looptrace.flush(5)).ok

        asyncio.run(work())
        assert server.accepted_span_count == 5
        assert server.connections_opened == 1


def test_the_request_head_carries_the_target_host_length_and_configured_headers(
    scripted: Callable[[Answer], Scripted],
) -> None:
    server = scripted(lambda c, r, head: OK)
    [answer] = post_all(server.url, 1, (("Authorization", "Bearer k"),))
    assert getattr(answer, "status", None) == 200
    lines = server.heads[0].decode().split("\r\n")
    assert lines[0] == "POST /v1/traces?tenant=a HTTP/1.1"
    fields = dict(line.split(": ", 1) for line in lines[1:])
    port = server.url.split(":")[2].split("/")[0]
    assert fields["host"] == f"127.0.0.1:{port}"
    assert fields["content-length"] == "6"
    assert fields["content-type"] == "x/y"
    assert fields["authorization"] == "Bearer k"
    assert fields["user-agent"] == f"looptrace/{looptrace.__version__}"


def test_a_connection_the_server_closed_while_idle_is_not_used() -> None:
    with OtlpTestServer(idle_timeout=0.1) as server:

        async def run() -> list[int]:
            pool = Http11Pool(HttpSettings(server.endpoint))
            statuses = [(await pool.post(b"", {})).status]
            assert await asyncio.to_thread(server.wait_for_closed, 1)
            statuses.append((await pool.post(b"", {})).status)
            await pool.aclose()
            return statuses

        assert asyncio.run(run()) == [200, 200]
        assert server.connections_opened == 2


def test_a_kept_alive_connection_closed_as_the_request_goes_out_is_retried_once(
    scripted: Callable[[Answer], Scripted],
) -> None:
    """The server closes a kept-alive connection at its second request without a word: the
    request goes again on a new connection, and the caller sees only the answer."""
    server = scripted(lambda c, r, head: None if (c, r) == (1, 2) else OK)
    results = post_all(server.url, 3)
    assert [getattr(r, "status", r) for r in results] == [200, 200, 200]
    assert server.connections == 2
    assert len(server.heads) == 4  # the request that met the closing connection, and again


def test_a_new_connection_closed_before_an_answer_is_an_error_not_a_retry(
    scripted: Callable[[Answer], Scripted],
) -> None:
    server = scripted(lambda c, r, head: None)
    [result] = post_all(server.url, 1)
    assert isinstance(result, ConnectionError)
    assert len(server.heads) == 1  # the pipeline's retry policy decides when to try again


def test_chunked_answers_with_trailers_are_read_whole_and_the_connection_kept(
    scripted: Callable[[Answer], Scripted],
) -> None:
    chunked = (
        b"HTTP/1.1 400 Bad Request\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;ext=1\r\nbad r\r\n7\r\nequest.\r\n0\r\nX-Trailer: t\r\n\r\n"
    )
    server = scripted(lambda c, r, head: chunked)
    results = post_all(server.url, 3)
    assert [(getattr(r, "status", r), getattr(r, "body", r)) for r in results] == [
        (400, b"bad request.")
    ] * 3
    assert server.connections == 1


def test_interim_answers_are_skipped(scripted: Callable[[Answer], Scripted]) -> None:
    early = b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" + OK
    server = scripted(lambda c, r, head: early)
    results = post_all(server.url, 2)
    assert [getattr(r, "status", r) for r in results] == [200, 200]
    assert server.connections == 1


def test_an_answer_ended_by_closing_the_connection(scripted: Callable[[Answer], Scripted]) -> None:
    """HTTP/1.0 style: no length, the body ends with the connection, which is not reused."""
    server = scripted(lambda c, r, head: b"HTTP/1.0 429 Slow\r\n\r\nlater")
    results = post_all(server.url, 2)
    assert [(getattr(r, "status", r), getattr(r, "body", r)) for r in results] == [
        (429, b"later")
    ] * 2
    assert server.connections == 2


def test_connection_close_is_honoured(scripted: Callable[[Answer], Scripted]) -> None:
    closing = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"
    server = scripted(lambda c, r, head: closing)
    results = post_all(server.url, 3)
    assert [getattr(r, "status", r) for r in results] == [200] * 3
    assert server.connections == 3


@pytest.mark.parametrize(
    "reply",
    [
        b"SSH-2.0-OpenSSH_9.6\r\n\r\n",
        b"HTTP/1.1 2x0 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: many\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * (MAX_RESPONSE_BYTES + 10) + b"\r\n\r\n",
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n",
    ],
    ids=["not-http", "bad-status", "bad-header", "bad-length", "bad-chunk", "head-too-long", "101"],
)
def test_answers_that_are_not_http_are_connection_errors(
    scripted: Callable[[Answer], Scripted], reply: bytes
) -> None:
    """What the pipeline treats as no answer at all (retried under its policy), never an
    exception of another kind and never a buffer that grows with what the server sends."""
    server = scripted(lambda c, r, head: reply)
    [result] = post_all(server.url, 1)
    assert isinstance(result, ProtocolError) and isinstance(result, OSError)


def test_a_body_longer_than_the_bound_is_cut_and_its_connection_dropped(
    scripted: Callable[[Answer], Scripted],
) -> None:
    long = b"x" * (MAX_RESPONSE_BYTES + 1000)
    reply = b"HTTP/1.1 413 Too Large\r\nContent-Length: %d\r\n\r\n%s" % (len(long), long)
    server = scripted(lambda c, r, head: reply)
    results = post_all(server.url, 2)
    assert [len(getattr(r, "body", b"")) for r in results] == [MAX_RESPONSE_BYTES] * 2
    assert server.connections == 2


def test_proxies_apply_to_remote_endpoints_only(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("all_proxy", raising=False)
    remote = HttpSettings("https://otlp.example.com/v1/traces")
    assert not remote.proxied()
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    assert remote.proxied()
    assert not HttpSettings("http://otlp.example.com/v1/traces").proxied()
    assert not HttpSettings("https://127.0.0.1:4318/v1/traces").proxied()
    monkeypatch.setenv("ALL_PROXY", "http://proxy.internal:3128")
    assert HttpSettings("http://otlp.example.com/v1/traces").proxied()


@pytest.mark.parametrize(
    "headers",
    [{"x-key": "a\r\nInjected: 1"}, {"x key": "v"}, {"x-key": "v\n"}, {"x-key": " v"}],
)
def test_headers_that_would_break_the_request_head_are_refused_at_configure(
    headers: dict[str, str],
) -> None:
    with pytest.raises(looptrace.ConfigurationError) as caught:
        looptrace.configure(endpoint="http://127.0.0.1:4318/v1/traces", headers=headers)
    assert "Injected" not in str(caught.value) and "v\n" not in str(caught.value)


def test_a_directly_reached_endpoint_never_imports_httpx() -> None:
    """httpx, httpcore and anyio (100+ ms of imports at start-up) are loaded only for an
    endpoint behind a proxy."""
    import os
    import subprocess
    import sys

    code = (
        "import sys, asyncio, looptrace\n"
        "looptrace.configure(endpoint=sys.argv[1], flush_interval=0.05)\n"
        "async def main():\n"
        "    with looptrace.span('s'):\n"
        "        pass\n"
        "    assert (await looptrace.flush(10)).ok\n"
        "asyncio.run(main())\n"
        "print(sorted(m for m in ('httpx', 'httpcore', 'anyio') if m in sys.modules))\n"
    )
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    with OtlpTestServer() as server:
        out = subprocess.run(
            [sys.executable, "-c", code, server.endpoint],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "[]"
        assert server.accepted_span_count == 1


def test_a_loopback_connection_sends_a_large_body_a_bounded_piece_at_a_time(
    scripted: Callable[[Answer], Scripted],
) -> None:
    """To a backend on this machine the kernel's own sizing lets one send take a whole 8 MB
    body, copied (and received) on the loop's thread in one go. The connection's send buffer
    is capped instead, so each send, in the exporter's step or the transport's callbacks,
    copies at most twice LOOPBACK_SNDBUF (Linux doubles what it is given). The body still
    arrives whole."""
    server = scripted(lambda number, request, head: OK)
    body = bytes(range(256)) * (32 << 10)  # 8 MiB

    async def run() -> tuple[int, int]:
        pool = Http11Pool(HttpSettings(server.url))
        try:
            answer = await asyncio.wait_for(pool.post(body, {}), 30)
            sock = pool._idle[0].transport.get_extra_info("socket")  # type: ignore[union-attr]
            return answer.status, sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        finally:
            await pool.aclose()

    status, send_buffer = asyncio.run(run())
    assert status == 200
    assert server.heads[0].lower().endswith(b"content-length: %d" % len(body))
    assert send_buffer <= 2 * LOOPBACK_SNDBUF


def test_an_answer_sent_before_the_body_was_read_is_the_answer() -> None:
    """A backend with a body limit answers 413 as soon as it reads the head, then closes the
    connection with the body unread: the exporter must see the 413 (it splits the batch), not a
    failed connection (which it would retry with the same body until the budget ran out)."""
    sock = socket.create_server(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1/traces"

    def serve() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                conn.sendall(
                    b"HTTP/1.1 413 Payload Too Large\r\nConnection: close\r\n"
                    b"Content-Length: 9\r\n\r\ntoo large"
                )

    threading.Thread(target=serve, daemon=True).start()

    async def run() -> object:
        pool = Http11Pool(HttpSettings(url))
        try:
            return await asyncio.wait_for(pool.post(b"x" * (16 << 20), {}), 10)
        except OSError as exc:
            return exc
        finally:
            await pool.aclose()

    try:
        results = [asyncio.run(run()) for _ in range(3)]
    finally:
        sock.close()
    assert [(getattr(r, "status", r), getattr(r, "body", r)) for r in results] == [
        (413, b"too large")
    ] * 3


def test_a_large_body_reaches_a_slow_reader_whole_a_piece_at_a_time() -> None:
    """A backend that reads slowly gets an 8 MiB body whole, byte for byte, while the loop
    goes on: the server reads nothing until a task on the client's loop has run 50 more
    times with the request in flight, then reads in small bites. Meanwhile the transport
    never holds more than one piece of the body (the rest waits, uncopied, until the socket
    has taken the last one)."""
    body = bytes(range(256)) * (32 << 10)  # 8 MiB
    turns = threading.Event()
    received: list[bytes] = []
    sock = socket.create_server(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1/traces"

    def serve() -> None:
        conn, _ = sock.accept()
        with conn:
            assert turns.wait(30)
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(16384)
            _, _, rest = data.partition(b"\r\n\r\n")
            parts = [rest]
            got = len(rest)
            while got < len(body):
                part = conn.recv(16384)
                if not part:
                    break
                parts.append(part)
                got += len(part)
            received.append(b"".join(parts))
            conn.sendall(OK)

    threading.Thread(target=serve, daemon=True).start()

    async def run() -> tuple[int, int]:
        pool = Http11Pool(HttpSettings(url))
        post = asyncio.ensure_future(pool.post(body, {}))
        held = 0
        try:
            ran = 0
            while not post.done():
                await asyncio.sleep(0 if ran < 50 else 0.001)
                ran += 1
                if ran == 50:
                    turns.set()
                for conn in pool._busy:
                    if conn.transport is not None:
                        held = max(held, conn.transport.get_write_buffer_size())
            return (await asyncio.wait_for(post, 30)).status, held
        finally:
            post.cancel()
            await pool.aclose()

    try:
        status, held = asyncio.run(run())
    finally:
        sock.close()
    assert status == 200
    assert received == [body]
    assert held <= WRITE_PIECE_BYTES
