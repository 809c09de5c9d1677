"""The pipeline when the backend misbehaves: 5xx storms, 429 with and without Retry-After,
connection resets, 413, 4xx, a server that never recovers, a flood that overruns the buffer,
and backpressure. Every test runs against the real OTLP test server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import looptrace
from looptrace._transport import RetryPolicy
from otlp_server import OtlpTestServer
from pipeline_support import checked_server, install_pipeline, make_spans
from store_support import free_port

FAST_RETRY = RetryPolicy(base_delay=0.02, max_delay=0.2, budget=20.0)
use = functools.partial(install_pipeline, retry=FAST_RETRY)


@pytest.fixture
def server() -> Iterator[OtlpTestServer]:
    """A fresh OTLP server (every request it answered must have decoded)."""
    with checked_server() as srv:
        yield srv


async def produce_during(seconds: float) -> int:
    """End 25 spans every 50 ms for ``seconds``; how many were made."""
    until = time.monotonic() + seconds
    produced = 0
    while time.monotonic() < until:
        make_spans(25, prefix=f"b{produced}-")
        produced += 25
        await asyncio.sleep(0.05)
    return produced


async def test_a_503_storm_loses_nothing(server: OtlpTestServer) -> None:
    """Every request fails with 503 for 1.5 s while spans keep coming; once the server recovers
    all of them arrive, none is dropped, and the retries are counted."""
    use(server, max_batch_spans=50)
    server.fail_for(1.5, status=503)
    produced = await produce_during(1.5)
    result = await looptrace.flush(10)
    assert result.ok, result
    stats = looptrace.statistics()
    assert server.accepted_span_count == produced
    assert stats.spans_sent == produced
    assert stats.dropped_total == 0
    assert stats.retries > 0
    assert stats.requests_failed > 0
    assert 503 in server.statuses()


def _most_at_once(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


async def test_a_failing_backend_gets_one_probe_at_a_time_and_everything_once_back(
    server: OtlpTestServer,
) -> None:
    """While the backend answers 503, once the first failure is known, requests go one at a
    time (a probe); when it answers again, what queued up goes out at once, as many requests
    in parallel as the in-flight limit allows; every span arrives, and none twice."""
    use(server, max_batch_spans=50, max_concurrent_requests=4)
    server.latency = 0.1  # slow answers: requests sent together are seen together
    server.fail_for(1.5, status=503)
    produced = await produce_during(1.5)
    assert (await looptrace.flush(10)).ok
    failed = [(start, end) for start, end, status in server.intervals if status == 503]
    first_known = min(end for _, end in failed)
    probes = [(start, end) for start, end in failed if start >= first_known]
    assert len(probes) >= 2
    assert _most_at_once(probes) == 1
    recovered = [(start, end) for start, end, status in server.intervals if status == 200]
    assert _most_at_once(recovered) > 1
    assert server.accepted_span_count == produced
    assert server.accepted_record_count == produced  # none twice


async def test_429_with_retry_after_waits_that_long(server: OtlpTestServer) -> None:
    """A 429 carrying Retry-After: 1 delays the retry by at least a second (jitter alone would
    retry within 0.2 s), then the batch goes through."""
    use(server)
    server.fail_next(429, retry_after="1")
    make_spans(5)
    assert (await looptrace.flush(10)).ok
    assert server.statuses() == [429, 200]
    assert server.times[1] - server.times[0] >= 0.95
    assert server.accepted_span_count == 5


async def test_a_retry_goes_when_retry_after_says_and_the_backlog_right_after_it(
    server: OtlpTestServer,
) -> None:
    """A retry goes when the server's Retry-After allows, not at the next flush interval, and
    the first success sends what queued meanwhile at once. With a 10 s flush interval and
    Retry-After: 1, spans that end during the wait (a wake-up for the flusher, which used to
    leave it asleep for a whole interval past the Retry-After) change nothing: the retry comes
    after the second, never before it, and the backlog follows the retry's answer rather than
    the interval."""
    use(server, flush_interval=10.0)
    server.fail_next(429, retry_after="1")
    make_spans(5, prefix="first")
    flushing = asyncio.ensure_future(looptrace.flush(30))
    assert await asyncio.to_thread(server.wait_for_requests, 1, 10)
    make_spans(5, prefix="meanwhile")
    assert (await flushing).ok
    assert await asyncio.to_thread(server.wait_for_spans, 10, 8)
    assert server.statuses()[:2] == [429, 200]
    retry_wait = server.times[1] - server.times[0]
    assert 0.95 <= retry_wait < 5.0  # the Retry-After, far from the 10 s interval
    assert server.times[-1] - server.times[1] < 5.0  # the backlog: woken by the success
    assert sorted(server.span_names()) == sorted(
        [f"first{i}" for i in range(5)] + [f"meanwhile{i}" for i in range(5)]
    )


async def test_429_without_retry_after_is_retried(server: OtlpTestServer) -> None:
    """A bare 429 (and 408, 500, 502, 504) is retried with jittered backoff."""
    use(server)
    server.fail_next(429, 408, 500, 502, 504)
    make_spans(5)
    assert (await looptrace.flush(10)).ok
    assert server.statuses() == [429, 408, 500, 502, 504, 200]
    assert looptrace.statistics().retries == 5
    assert server.accepted_span_count == 5


async def test_connection_resets_are_retried(server: OtlpTestServer) -> None:
    """Connections reset without an answer are retried; nothing is lost. The failures are
    counted, and ``last_error`` is cleared by the success that followed them (it says what is
    wrong now)."""
    use(server)
    server.reset_next(2)
    make_spans(10)
    assert (await looptrace.flush(10)).ok
    assert server.accepted_span_count == 10
    stats = looptrace.statistics()
    assert stats.retries >= 2 and stats.requests_failed >= 2
    assert stats.last_error is None


async def test_413_splits_the_batch_in_halves(server: OtlpTestServer) -> None:
    """A 413 splits the batch into two halves, each sent on its own; order is kept within
    each half (the halves go out at once, so which one arrives first is up to the network)."""
    use(server)
    server.fail_next(413)
    make_spans(8)
    assert (await looptrace.flush(10)).ok
    assert server.statuses() == [413, 200, 200]
    assert [len(r.spans) for r in server.requests] == [8, 4, 4]
    halves = sorted([s.name for s in r.spans] for r in server.requests[1:])
    assert halves == [[f"s{i}" for i in range(4)], [f"s{i}" for i in range(4, 8)]]
    assert looptrace.statistics().dropped_total == 0


async def test_413_on_a_single_span_drops_it_as_rejected(server: OtlpTestServer) -> None:
    """A span too large for the server even alone cannot be split: it is dropped, counted."""
    use(server)
    server.fail_next(413)
    make_spans(1)
    result = await looptrace.flush(10)
    assert result.dropped["rejected"] == 1
    assert not result.ok


async def test_other_4xx_drop_the_batch_and_log_once_per_status(
    server: OtlpTestServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A 400 drops its batch (counted as rejected, not retried); the status is logged once."""
    caplog.set_level(logging.WARNING, logger="looptrace")
    use(server)
    server.fail_next(400, 400)
    make_spans(3, "a")
    await looptrace.flush(10)
    make_spans(4, "b")
    result = await looptrace.flush(10)
    assert result.dropped["rejected"] == 4
    stats = looptrace.statistics()
    assert stats.dropped["rejected"] == 7
    assert stats.retries == 0
    assert stats.last_error is not None
    assert "400" in stats.last_error
    assert sum("rejected a batch with HTTP 400" in r.getMessage() for r in caplog.records) == 1


async def test_retry_budget_bounds_an_outage(server: OtlpTestServer) -> None:
    """When the server never recovers, a batch is retried until the budget is spent, then
    dropped as retries_exhausted, with an exact count; flush reports it (without a spool:
    with one the batch goes there, tests/_export/test_spool.py)."""
    use(server, retry=RetryPolicy(base_delay=0.02, max_delay=0.05, budget=0.5), spool=False)
    server.fail_for(60, status=503)
    make_spans(12)
    result = await looptrace.flush(10)
    assert result.dropped["retries_exhausted"] == 12
    assert result.pending == 0
    stats = looptrace.statistics()
    assert stats.dropped["retries_exhausted"] == 12
    assert stats.spans_sent == 0
    assert stats.retries >= 2


def test_a_flood_overruns_the_buffer_with_exact_drop_counts(server: OtlpTestServer) -> None:
    """With the server stalled and no spool, a flood past max_buffer_spans drops the oldest
    pending spans; every span is either sent or counted as buffer_full, and the buffer never
    exceeds its bounds."""
    use(server, max_buffer_spans=1000, max_batch_spans=100, max_concurrent_requests=1, spool=False)
    server.hold()
    total = 20_000
    worst_queued = 0
    for i in range(total):
        with looptrace.span(f"f{i}"):
            pass
        if i % 500 == 0:
            worst_queued = max(worst_queued, looptrace.statistics().queued_spans)
    stats = looptrace.statistics()
    assert stats.queued_spans <= 1000
    assert worst_queued <= 1000
    server.release()
    result = looptrace.flush_sync(10)
    stats = looptrace.statistics()
    assert stats.queued_spans == 0
    assert stats.in_flight_spans == 0
    assert stats.spans_sent + stats.dropped["buffer_full"] == total
    assert stats.dropped["buffer_full"] >= total - 1000 - 100
    assert server.accepted_span_count == stats.spans_sent
    assert result.pending == 0
    # The newest spans survived: drops take the oldest first.
    assert f"f{total - 1}" in server.span_names()


def test_the_buffer_is_bounded_in_bytes(server: OtlpTestServer) -> None:
    """max_buffer_bytes bounds the pending bytes; overflow is counted as buffer_full (no
    spool)."""
    use(
        server,
        max_buffer_bytes=200_000,
        max_concurrent_requests=1,
        max_batch_spans=10,
        spool=False,
    )
    server.hold()
    for i in range(2_000):
        with looptrace.span(f"b{i}") as s:
            s.set_attribute("payload", "x" * 1_000)
        assert looptrace.statistics().queued_bytes <= 200_000
    server.release()
    looptrace.flush_sync(10)
    stats = looptrace.statistics()
    assert stats.dropped["buffer_full"] > 0
    assert stats.spans_sent + stats.dropped["buffer_full"] == 2_000


async def test_a_backend_slower_than_the_spans_gets_what_the_budget_cannot_hold_via_the_spool(
    server: OtlpTestServer, tmp_path: Path
) -> None:
    """A backend that answers, but slower than spans come, takes every request slot; the
    pending spans over half the buffer's budget then go to the spool rather than being dropped,
    the buffer stays within its bound, and every span is sent, spooled or counted."""
    use(
        server,
        max_buffer_bytes=200_000,
        max_concurrent_requests=1,
        max_batch_spans=20,
        spool_dir=tmp_path,
        flush_interval=0.02,
    )
    server.hold()
    total = 0
    while looptrace.statistics().spooled == 0 and total < 20_000:
        for _ in range(20):
            with looptrace.span(f"s{total}") as s:
                s.set_attribute("payload", "x" * 1_000)
            total += 1
        assert looptrace.statistics().queued_bytes <= 200_000
        await asyncio.sleep(0.005)  # the flusher's turn, as an application's loop gives it
    assert looptrace.statistics().spooled > 0
    server.release()
    await looptrace.flush(10)
    stats = looptrace.statistics()
    assert stats.spans_sent + stats.spooled + stats.dropped_total == total


async def test_backpressure_waits_for_bytes_in_flight_not_bytes_sent(
    server: OtlpTestServer,
) -> None:
    """backpressure() blocks while pending + in-flight bytes exceed the threshold and returns
    once they are acknowledged; bytes already sent never count."""
    use(server, backpressure_bytes=5_000)
    make_spans(100, payload="y" * 200)
    assert (await looptrace.flush(10)).ok
    await asyncio.wait_for(looptrace.backpressure(), 1)  # all acknowledged: free to go
    server.hold()
    make_spans(100, payload="y" * 200)
    waiting = asyncio.ensure_future(looptrace.backpressure())
    assert await asyncio.to_thread(server.wait_for_active, 1)
    for _ in range(20):
        await asyncio.sleep(0)
    assert not waiting.done()
    assert looptrace.statistics().in_flight_bytes > 5_000
    server.release()
    await asyncio.wait_for(waiting, 5)
    stats = looptrace.statistics()
    assert stats.queued_bytes + stats.in_flight_bytes <= 5_000


def test_server_down_at_exit_reports_the_loss_within_the_deadline(tmp_path: Path) -> None:
    """A process whose backend is down exits within LOOPTRACE_SHUTDOWN_TIMEOUT (plus start-up)
    and says how many spans it could not send, where to, and the last error (never the
    headers)."""
    script = tmp_path / "app.py"
    script.write_text(
        textwrap.dedent(
            """
            import looptrace
            for i in range(50):
                with looptrace.span(f"s{i}"):
                    pass
            """
        )
    )
    env = {k: v for k, v in os.environ.items() if k != "LOOPTRACE_RAISE_INTERNAL_ERRORS"}
    endpoint = f"http://127.0.0.1:{free_port()}/v1/traces"
    env["LOOPTRACE_ENDPOINT"] = endpoint
    env["LOOPTRACE_HEADERS"] = "authorization=Bearer%20sk-secret-key"
    env["LOOPTRACE_SHUTDOWN_TIMEOUT"] = "1.0"
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=30
    )
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr
    assert f"50 span(s) could not be sent to {endpoint} before exit" in proc.stderr
    assert "last error: ConnectionRefusedError" in proc.stderr
    assert "sk-secret-key" not in proc.stderr
    assert elapsed < 1.0 + 4.0  # the deadline plus interpreter start-up on a busy machine
