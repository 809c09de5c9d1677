"""The client's bounds against misbehaving backends on 127.0.0.1: a huge or endless answer, an
answer that trickles in, a backend that stays down, exit with a span still open, SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import looptrace
from loop_matrix import loop_kind  # noqa: F401
from otlp_server import OtlpTestServer
from raw_http import read_request

LARGE = "QUJD" * 200_000  # a worker serializes and sends a span carrying this


class Misbehaving:
    """A backend that reads each request whole, then answers as ``mode`` says:

    ``huge``: 200 with a 1 GiB body, streamed; ``endless``: 200 with a chunked body that never
    ends; ``drip``: 200, headers at once, then one body byte every 0.2 s."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.requests = 0
        self._lock = threading.Lock()
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._stop = threading.Event()
        self.endpoint = f"http://127.0.0.1:{self._sock.getsockname()[1]}/v1/traces"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        self._sock.settimeout(0.1)
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                while not self._stop.is_set():
                    if not read_request(conn):
                        return
                    with self._lock:
                        self.requests += 1
                    self._answer(conn)
            except OSError:
                return

    def _answer(self, conn: socket.socket) -> None:
        zeros = b"\0" * 65536
        if self.mode == "huge":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1073741824\r\n\r\n")
            for _ in range(1 << 14):
                conn.sendall(zeros)
        elif self.mode == "endless":
            conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            chunk = b"10000\r\n" + zeros + b"\r\n"
            while not self._stop.is_set():
                conn.sendall(chunk)
        else:  # drip
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
            while not self._stop.is_set():
                conn.sendall(b"x")
                time.sleep(0.2)

    def close(self) -> None:
        self._stop.set()
        self._sock.close()


@pytest.fixture
def run_app(tmp_path: Path) -> Any:
    """Run a traced script in a fresh process; returns (exit code, stdout, stderr)."""

    def run(body: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        script = tmp_path / "app.py"
        script.write_text(textwrap.dedent(body))
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("LOOPTRACE_", "OTEL_"))}
        clean["LOOPTRACE_STORE"] = str(tmp_path / "store.db")
        return subprocess.run(
            [sys.executable, str(script), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=clean,
        )

    return run


PEAK_RSS = """
import resource, sys
def peak_mb():
    usage = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return usage / (1 << 20) if sys.platform == "darwin" else usage / 1024
"""


APP = (
    PEAK_RSS
    + """
import asyncio, sys, looptrace
looptrace.configure(endpoint=sys.argv[1], flush_interval=0.05)

@looptrace.traced
def handle(request):
    return len(request)

async def main():
    for i in range(5):
        handle(f"small {i}")
        await looptrace.flush(timeout=30)
    handle("QUJD" * 200_000)
    result = await looptrace.flush(timeout=30)
    print(result.ok, looptrace.statistics().spans_sent, round(peak_mb()))

asyncio.run(main())
"""
)


@pytest.mark.skipif(sys.platform == "win32", reason="peak RSS through the resource module")
@pytest.mark.parametrize("mode", ["huge", "endless"])
def test_a_huge_or_endless_answer_does_not_grow_the_application(run_app: Any, mode: str) -> None:
    """A backend answering 200 with a 1 GiB body, or a body that never ends, costs the traced
    application no more than the answer cap: its peak RSS stays within a few megabytes of the
    same program's against a well-behaved backend (it reached 2.3 GB and 20 GB when the
    client read whole answers), for spans the application sends and large spans a worker
    sends alike, and the spans count as sent."""
    with OtlpTestServer() as good:
        baseline = run_app(APP, good.endpoint)
    assert baseline.returncode == 0, baseline.stderr
    server = Misbehaving(mode)
    try:
        done = run_app(APP, server.endpoint)
    finally:
        server.close()
    assert done.returncode == 0, done.stderr
    ok, sent, peak = done.stdout.split()
    assert ok == "True" and sent == "6"
    assert server.requests == 6
    normal = int(baseline.stdout.split()[2])
    assert int(peak) < normal + 30, f"peak RSS {peak} MB against {normal} MB"


@pytest.mark.usefixtures("loop_kind")
async def test_an_answer_that_trickles_in_is_a_failure_within_the_timeout() -> None:
    """A backend that sends its headers and then a byte every 0.2 s holds no request past
    ``export_timeout``, on the application's path and a worker's alike: each request fails,
    is retried within the retry budget, and the spans are then dropped and counted."""
    server = Misbehaving("drip")
    try:
        looptrace.configure(
            endpoint=server.endpoint,
            export_timeout=0.5,
            retry_budget=1.0,
            flush_interval=0.05,
            spool=False,  # given up, not spooled
        )

        @looptrace.traced
        def handle(request: object) -> int:
            return 1

        handle("small")
        handle(LARGE)
        started = time.monotonic()
        result = await looptrace.flush(timeout=30)
        took = time.monotonic() - started
    finally:
        server.close()
    stats = looptrace.statistics()
    assert not result.ok
    assert stats.dropped["retries_exhausted"] == 2
    assert stats.requests_failed >= 2 and "timeout" in (stats.last_error or "").lower()
    assert took < 10
    assert stats.in_flight_spans == 0


@pytest.mark.usefixtures("loop_kind")
async def test_failed_sends_come_back_within_the_byte_budget() -> None:
    """Batches in flight when the backend fails come back while the pending spans already
    fill ``max_buffer_bytes``: the budget still holds (the oldest are dropped and counted as
    ``buffer_full``), and every span is accounted for."""
    with OtlpTestServer() as server:
        budget = 400_000
        looptrace.configure(
            endpoint=server.endpoint,
            max_buffer_bytes=budget,
            max_batch_bytes=100_000,
            max_concurrent_requests=4,
            flush_interval=0.02,
            retry_budget=30,
            spool=False,  # the buffer's own bound, not the spool's spill
        )
        server.hold()  # the first batches stay in flight
        payload = "p" * 1_000
        for i in range(1_000):
            with looptrace.span(f"s{i}") as s:
                s.set_attribute("payload", payload)
            if i == 100:
                deadline = time.monotonic() + 10
                while looptrace.statistics().in_flight_spans == 0:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.01)
        assert looptrace.statistics().queued_bytes <= budget
        server.fail_for(30, 503)
        server.release()  # the batches in flight fail and come back
        deadline = time.monotonic() + 10
        while looptrace.statistics().requests_failed < 4:
            assert time.monotonic() < deadline
            assert looptrace.statistics().queued_bytes <= budget
            await asyncio.sleep(0.005)
        stats = looptrace.statistics()
        assert stats.queued_bytes <= budget
        assert stats.dropped["buffer_full"] > 0
        accounted = stats.queued_spans + stats.in_flight_spans + stats.spans_sent
        assert accounted + sum(stats.dropped.values()) == 1_000


def test_a_generator_left_open_at_exit_is_counted_without_a_traceback(run_app: Any) -> None:
    """A traced generator still suspended when the interpreter exits ends its span during the
    teardown, after the final flush: no traceback, and one line says the span was not sent."""
    with OtlpTestServer() as server:
        done = run_app(
            f"""
import looptrace
looptrace.configure(endpoint={server.endpoint!r})

@looptrace.traced
def numbers():
    yield 1
    yield 2

@looptrace.traced
def done():
    return 0

left_open = numbers()
next(left_open)
done()
"""
        )
        assert done.returncode == 0
        assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr
        assert "span 'numbers' ended after the final flush at exit and was not sent" in (
            done.stderr
        )
        assert server.wait_for_spans(1) and server.accepted_span_count == 1


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="POSIX signals")
@pytest.mark.parametrize("backend_up", [True, False])
def test_sigterm_flushes_and_reports_with_shutdown_on_signal(
    tmp_path: Path, backend_up: bool
) -> None:
    """With ``looptrace.shutdown_on_signal()``, SIGTERM sends what is pending within the
    shutdown deadline (or says how many spans could not be sent) and the process still ends
    by SIGTERM. Without it, Python's default: the process ends at once."""
    with OtlpTestServer() as server:
        endpoint = server.endpoint if backend_up else "http://127.0.0.1:9/v1/traces"
        script = tmp_path / "app.py"
        script.write_text(
            textwrap.dedent(
                f"""
                import sys, time, looptrace
                looptrace.configure(
                    endpoint={endpoint!r}, flush_interval=3600, shutdown_timeout=1.0,
                    max_batch_spans=100_000,
                )
                looptrace.shutdown_on_signal()
                for i in range(50):
                    with looptrace.span(f"s{{i}}"):
                        pass
                print("ready", flush=True)
                # Short sleeps: Python runs a handler when the main thread next runs Python
                # code, and a signal landing just before one long sleep begins would wait
                # for that sleep to end.
                for _ in range(1200):
                    time.sleep(0.05)
                """
            )
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LOOPTRACE_", "OTEL_"))}
        app = subprocess.Popen(
            [sys.executable, str(script)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert app.stdout is not None
        assert app.stdout.readline().strip() == "ready"
        app.send_signal(signal.SIGTERM)
        _, err = app.communicate(timeout=30)
        assert app.returncode == -signal.SIGTERM
        if backend_up:
            assert server.wait_for_spans(50) and server.accepted_span_count == 50
            assert "could not be sent" not in err
        else:
            assert f"50 span(s) could not be sent to {endpoint} before exit" in err
