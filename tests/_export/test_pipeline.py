"""The export pipeline against a real OTLP server on 127.0.0.1: what reaches the wire, batching,
concurrency, flush results, statistics, and the pieces (transport, retry policy, buffer)."""

from __future__ import annotations

import asyncio
import dataclasses
import email.utils
import functools
import importlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import looptrace
from looptrace import _export, _otlp, _state
from looptrace._capture.spans import Span
from looptrace._export.buffer import PENDING_OVERHEAD_BYTES, Buffer
from looptrace._otlp.span_encoder import SpanEncoder
from looptrace._transport import (
    HttpTransport,
    InMemoryTransport,
    Response,
    RetryPolicy,
    parse_retry_after,
)
from otlp_server import OtlpTestServer
from pipeline_support import FAST_RETRY, checked_server, install_pipeline, make_spans
from steps_support import LoopTurns

use = functools.partial(install_pipeline, retry=FAST_RETRY)


@pytest.fixture
def server() -> Iterator[OtlpTestServer]:
    """A fresh OTLP server; afterwards, every request it got must have decoded cleanly."""
    with checked_server() as srv:
        yield srv


# ---------------------------------------------------------------------------------------------
# What reaches the wire
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("encoding", "compression", "content_type", "content_encoding"),
    [
        ("protobuf", "gzip", "application/x-protobuf", "gzip"),
        ("json", "gzip", "application/json", "gzip"),
        ("protobuf", "zstd", "application/x-protobuf", "zstd"),
        ("json", "none", "application/json", None),
        # The default: nothing to gain from compressing for a receiver on this machine.
        ("protobuf", "auto", "application/x-protobuf", None),
    ],
)
async def test_spans_arrive_decodable_in_every_encoding(
    server: OtlpTestServer,
    encoding: str,
    compression: str,
    content_type: str,
    content_encoding: str | None,
) -> None:
    """Every encoding/compression pair yields requests that opentelemetry-proto decodes, with
    the right headers, ids, parent links and resource."""
    use(server, encoding=encoding, compression=compression, service_name="svc")
    with looptrace.span("root") as root, looptrace.span("child") as child:
        child.set_attribute("n", 3)
    result = await looptrace.flush(5)
    assert result.ok
    assert result.sent == 2
    spans = {s.name: s for s in server.accepted_spans()}
    assert set(spans) == {"root", "child"}
    assert spans["child"].parent_span_id == root.span_id.to_bytes(8, "big")
    assert spans["child"].trace_id == root.trace_id.to_bytes(16, "big")
    assert spans["root"].span_id == root.span_id.to_bytes(8, "big")
    assert spans["child"].span_id == child.span_id.to_bytes(8, "big")
    attrs = {kv.key: kv.value.int_value for kv in spans["child"].attributes if kv.key == "n"}
    assert attrs == {"n": 3}
    request = server.requests[0]
    assert request.headers["content-type"] == content_type
    assert request.headers.get("content-encoding") == content_encoding
    assert request.path == "/v1/traces"
    assert request.request is not None
    resource = {
        kv.key: kv.value.string_value
        for kv in request.request.resource_spans[0].resource.attributes
    }
    assert resource["service.name"] == "svc"
    assert resource["telemetry.sdk.name"] == "looptrace"


async def test_large_incompressible_bodies_go_out_uncompressed(server: OtlpTestServer) -> None:
    """A megabyte of base64 (an image in a prompt) is sent without gzip, which would spend tens
    of milliseconds to save a quarter of it; a megabyte of text is still gzipped. Both arrive."""
    import base64
    import random

    use(server, compression="gzip", offload=False)
    image = base64.b64encode(random.Random(7).randbytes(900_000)).decode()
    with looptrace.span("image") as s:
        s.set_inputs({"image": image})
    assert (await looptrace.flush(10)).ok
    with looptrace.span("text") as s:
        s.set_inputs({"text": "the quick brown fox jumps over the lazy dog " * 30_000})
    assert (await looptrace.flush(10)).ok
    first, second = server.requests
    assert first.headers.get("content-encoding") is None
    assert second.headers.get("content-encoding") == "gzip"
    assert len(second.body) < 100_000
    assert {s.name for s in server.accepted_spans()} == {"image", "text"}


async def test_configured_headers_are_sent_but_never_shown(
    server: OtlpTestServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Headers from the configuration reach the server; the API key is in no repr or log."""
    caplog.set_level(logging.DEBUG)
    secret = "sk-very-secret-123"
    pipeline = use(server, headers={"x-api-key": secret})
    make_spans(3)
    assert (await looptrace.flush(5)).ok
    assert server.requests[0].headers["x-api-key"] == secret
    transport = HttpTransport(server.endpoint, {"x-api-key": secret})
    for text in (repr(pipeline.cfg), repr(transport), repr(pipeline), caplog.text):
        assert secret not in text


async def test_batches_split_by_count_and_fly_concurrently(server: OtlpTestServer) -> None:
    """A drain cuts max_batch_spans-sized requests and keeps up to max_concurrent_requests of
    them in flight at once (the server sees them overlap), instead of one after another."""
    use(server, max_batch_spans=50, max_concurrent_requests=4)
    server.hold()
    make_spans(400)
    flushing = asyncio.ensure_future(looptrace.flush(10))
    assert await asyncio.to_thread(server.wait_for_active, 4)
    assert looptrace.statistics().in_flight_spans == 200  # 4 requests x 50 spans, held
    server.release()
    result = await flushing
    assert result.ok
    assert result.sent == 400
    assert server.max_concurrency == 4
    sizes = [len(r.spans) for r in server.requests]
    assert sum(sizes) == 400
    assert max(sizes) == 50
    assert server.accepted_span_count == 400


async def test_batches_split_by_bytes(server: OtlpTestServer) -> None:
    """No request carries more than max_batch_bytes of encoded spans (when spans fit)."""
    use(server, max_batch_bytes=8_000, compression="none")
    make_spans(60, payload="x" * 1000)
    assert (await looptrace.flush(5)).ok
    assert server.accepted_span_count == 60
    assert len(server.requests) >= 8
    for r in server.requests:
        assert len(r.body) < 8_000 + 1_000


async def test_large_payloads_inside_a_request_go_out_as_they_come(
    server: OtlpTestServer,
) -> None:
    """A traced call's image sits inside its request dict, where the buffer's quick estimate
    (top-level values only) cannot see it. Once one such span has been encoded, the next ones
    of the same function weigh what it weighed: a batch's worth of them wakes the flusher, and
    they are sent long before the flush interval, not an interval's worth at a time."""
    use(server, flush_interval=60.0, max_batch_bytes=2 * 1024 * 1024, compression="none")
    image = "data:image/png;base64," + "QUJD" * 375_000  # 1.5 MB

    @looptrace.traced
    def describe(request: dict[str, Any]) -> str:
        return "a red bicycle"

    def call() -> None:
        describe({"messages": [{"role": "user", "content": [{"image_url": {"url": image}}]}]})

    call()
    assert (await looptrace.flush(10)).ok  # the first one is weighed as it is encoded
    for _ in range(4):
        call()
    deadline = asyncio.get_running_loop().time() + 20
    while server.accepted_span_count < 5:
        assert asyncio.get_running_loop().time() < deadline, "held for the flush interval"
        await asyncio.sleep(0.01)
    assert looptrace.statistics().queued_spans == 0
    assert all(len(r.spans) == 1 for r in server.requests)  # 1.5 MB each, 2 MiB a request


async def test_flush_waits_only_for_spans_ended_before_it(server: OtlpTestServer) -> None:
    """flush() resolves once the spans ended before the call are sent, even if newer spans are
    stuck behind a held server; its pending count covers only the awaited spans."""
    use(server, max_concurrent_requests=1)
    make_spans(5, "early")
    assert (await looptrace.flush(5)).ok
    server.hold()
    make_spans(5, "late")
    result = await looptrace.flush(0.2)  # the late spans are held: not resolved in time
    assert result.pending == 5
    assert not result.ok
    server.release()
    result = await looptrace.flush(5)
    assert result.ok
    assert result.pending == 0
    assert server.accepted_span_count == 10


def test_flush_sync_from_plain_code(server: OtlpTestServer) -> None:
    """Without any event loop, spans go through the private flusher thread; flush_sync waits."""
    use(server)
    make_spans(20)
    result = looptrace.flush_sync(5)
    assert result.ok
    assert result.sent == 20
    assert server.accepted_span_count == 20


async def test_flush_sync_on_the_flusher_loop_does_not_deadlock(server: OtlpTestServer) -> None:
    """flush_sync called on the very loop that hosts the flusher hands the spans to the private
    thread and returns instead of waiting forever."""
    use(server, flush_interval=5.0)  # the loop's flusher lingers: it holds nothing yet
    make_spans(10)
    await asyncio.sleep(0)  # the flusher task now lives on this loop
    pipeline = _export.current()
    assert pipeline is not None
    assert pipeline.flusher.homes.primary is not None
    assert not pipeline.flusher.homes.primary.private
    result = looptrace.flush_sync(5)  # blocks this loop on purpose
    assert result.ok
    assert server.accepted_span_count == 10


async def test_flush_sync_on_the_flusher_loop_takes_over_the_batch_it_was_encoding(
    server: OtlpTestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop's flusher encodes a batch in slices and yields between them. flush_sync
    called on that loop between two slices (a test calling it from async code, on a busy
    machine) blocks the loop: the batch half encoded there is sent by the private thread,
    so flush_sync still delivers every span. Before, it waited out its timeout."""
    from looptrace._export.exporter import Slices

    between = asyncio.Event()
    pause = Slices.pause

    async def paused(self: Slices) -> None:
        between.set()
        await pause(self)

    monkeypatch.setattr(Slices, "due", lambda self: True)  # a pause after every span
    monkeypatch.setattr(Slices, "pause", paused)
    use(server, flush_interval=5.0)
    make_spans(10)
    flushing = asyncio.ensure_future(looptrace.flush(5))
    await asyncio.wait_for(between.wait(), 5)  # the drain is between two slices of the batch
    pipeline = _export.current()
    assert pipeline is not None
    home = pipeline.flusher.homes.primary
    assert home is not None and not home.private and home.encoding
    result = looptrace.flush_sync(5)  # blocks this loop on purpose
    assert result.ok
    assert server.accepted_span_count >= 10
    assert set(server.span_names()) == {f"s{i}" for i in range(10)}
    assert (await flushing).ok  # the loop then finishes its own copy (a duplicate at worst)


async def test_statistics_snapshot(server: OtlpTestServer) -> None:
    """statistics() is a frozen snapshot: queued and in-flight counts and bytes, requests, spans
    sent; bytes in flight are the exact encoded sizes."""
    use(server, max_concurrent_requests=1, compression="none")
    server.hold()
    make_spans(10)
    flushing = asyncio.ensure_future(looptrace.flush(5))
    assert await asyncio.to_thread(server.wait_for_active, 1)
    stats = looptrace.statistics()
    assert isinstance(stats, looptrace.Statistics)
    assert stats.in_flight_spans == 10
    assert stats.queued_spans == 0
    request_body = server.requests[0].body if server.requests else None
    assert request_body is None  # still held: nothing recorded yet
    assert 0 < stats.in_flight_bytes < len(b"x") * 10_000
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.queued_spans = 3  # type: ignore[misc]
    server.release()
    assert (await flushing).ok
    stats = looptrace.statistics()
    assert (
        stats.in_flight_spans,
        stats.in_flight_bytes,
        stats.queued_spans,
        stats.queued_bytes,
    ) == (
        0,
        0,
        0,
        0,
    )
    assert stats.spans_sent == 10
    assert stats.requests_sent == 1
    assert stats.dropped == {
        "buffer_full": 0,
        "rejected": 0,
        "retries_exhausted": 0,
        "shutdown": 0,
        "invalid_config": 0,
    }
    # In-flight bytes were the encoded spans: the request carried all of them plus a small head.
    assert len(server.requests[0].body) > 10 * 30


@pytest.mark.parametrize("compression", ["gzip", "none"])
async def test_large_request_bodies_are_put_together_off_the_loop(
    server: OtlpTestServer, monkeypatch: pytest.MonkeyPatch, compression: str
) -> None:
    """A request body of more than 64 KiB is joined (and compressed, when it is) in a worker
    thread, compressed or not: copying a batch of a few megabytes holds a loop for
    milliseconds. The body arrives whole."""
    threads: list[int] = []
    real = _otlp.compress_body

    def spy(pieces: list[bytes], compression: str) -> tuple[bytes, str | None]:
        threads.append(threading.get_ident())
        return real(pieces, compression)

    monkeypatch.setattr(_otlp, "compress_body", spy)  # what the exporter loads
    use(server, compression=compression)
    make_spans(40, payload="p" * 4096)
    assert (await looptrace.flush(10)).ok
    assert server.accepted_span_count == 40
    assert threads and threading.get_ident() not in threads


async def test_flusher_runs_on_the_running_loop_in_short_slices(
    server: OtlpTestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a running asyncio loop the flusher is a task on it (no thread), and it encodes in
    time-budgeted slices that yield to the loop: with a zero budget it yields after every span,
    so another task gets a turn at least once per span encoded."""
    monkeypatch.setattr(_export.exporter, "SLICE_SECONDS", 0.0)
    use(server, max_batch_spans=500)
    make_spans(500, payload="p" * 100)
    async with LoopTurns() as turns:
        assert (await looptrace.flush(10)).ok
    pipeline = _export.current()
    assert pipeline is not None
    assert pipeline.flusher.homes.primary is not None
    assert not pipeline.flusher.homes.primary.private
    assert pipeline.flusher.homes.primary.thread_id == threading.get_ident()
    assert server.accepted_span_count == 500
    assert turns.count >= 500


async def test_a_large_structure_is_written_in_steps_that_yield_to_the_loop(
    server: OtlpTestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One span carrying a structure of many small values (rows, messages) is not one long
    step on the application's loop: orjson's pass and each part of the scan for secret keys
    after it are steps of their own, with the loop's other tasks run in between. The span
    arrives whole."""
    monkeypatch.setattr(_export.exporter, "SLICE_SECONDS", 0.0)
    # A policy that has learned none of these keys: one shared with earlier tests that wrote
    # the same keys would skip them in C and need fewer steps (docs/serialization.md).
    policy_module = importlib.import_module("looptrace._serialize.policy")
    monkeypatch.setattr(policy_module, "_policies", {})
    monkeypatch.setattr(policy_module, "_last", None)
    use(server)
    rows = [{"id": i, "name": f"item-{i}", "meta": {"rank": i % 7}} for i in range(8_000)]
    turns = LoopTurns()
    # The loop's turns when the flusher began the span (planned it) and when it put the
    # encoded span together.
    seen: list[int] = []
    plan, encode = SpanEncoder.plan, SpanEncoder.encode

    def planned(self: SpanEncoder, span: Span) -> int:
        seen.append(turns.count)
        return plan(self, span)

    def encoded(self: SpanEncoder, span: Span, flags: int, bodies: Any = None) -> bytes:
        seen.append(turns.count)
        return encode(self, span, flags, bodies)

    monkeypatch.setattr(SpanEncoder, "plan", planned)
    monkeypatch.setattr(SpanEncoder, "encode", encoded)

    @looptrace.traced
    async def load(rows: list[dict[str, Any]]) -> int:
        return len(rows)

    await load(rows)
    async with turns:
        assert (await looptrace.flush(10)).ok
    (span,) = server.accepted_spans()
    values = {kv.key: kv.value.string_value for kv in span.attributes}
    assert len(values["input.value"]) > 4 * 64 * 1024
    # Orjson's pass and four steps of the scan at least, each followed by a pause of three
    # turns of the loop.
    began, ended = seen
    assert ended - began >= 5 * 3


async def test_exporter_does_not_trace_itself() -> None:
    """Spans that code inside the transport tries to create are never recorded: the flusher and
    its senders run with tracing suppressed."""

    class TracingTransport(InMemoryTransport):
        async def send(self, body: bytes, headers: Any) -> Response:
            with looptrace.span("inside-exporter") as s:
                assert not s.is_recording
            return await super().send(body, headers)

    transport = TracingTransport()
    cfg = looptrace.Config.from_env(endpoint="http://127.0.0.1:9/v1/traces", flush_interval=0.05)
    pipeline = _export.install(_export.Pipeline(cfg, transport_factory=lambda: transport))
    make_spans(3)
    assert (await looptrace.flush(5)).ok
    assert pipeline.statistics().spans_sent == 3
    assert len(transport.requests) == 1


def test_estimated_bytes_accounting_is_exact_on_the_buffer() -> None:
    """Pending counts and bytes are O(1) integers that match what was pushed and taken (each
    pending span weighs its estimate plus the fixed in-memory overhead)."""
    size = 100 + PENDING_OVERHEAD_BYTES
    buf = Buffer(100, 100_000, 10, 1_000_000, lambda s: 100, lambda: None)
    spans = [Span(f"s{i}", 1, i + 1, 0, 0) for i in range(7)]
    for s in spans:
        buf.push(s)
    assert (buf.queued_spans, buf.queued_bytes) == (7, 7 * size)
    batch = buf.take(3, 100_000)
    assert batch is not None
    assert (batch.lo, batch.hi) == (0, 3)
    assert (buf.queued_spans, buf.queued_bytes, buf.in_flight_spans, buf.in_flight_bytes) == (
        4,
        4 * size,
        3,
        3 * size,
    )
    buf.resize(batch, 123)  # encoded: in-flight bytes become exact
    assert buf.in_flight_bytes == 123
    assert buf.outstanding_bytes == 4 * size + 123
    buf.returned(batch)
    assert (buf.queued_spans, buf.in_flight_spans) == (7, 0)
    assert buf.watermark() == 0
    again = buf.take_retry()
    assert again is batch
    buf.sent(batch)
    assert buf.spans_sent == 3
    assert buf.watermark() == 3
    assert buf.unresolved_before(7) == 4
    assert buf.outstanding_bytes == 4 * size  # acknowledged bytes no longer count


def test_failed_batches_return_in_their_original_order() -> None:
    """Batches returned out of order go back to pending sorted by age, ahead of newer spans."""
    buf = Buffer(100, 10_000, 10, 1_000_000, lambda s: 10, lambda: None)
    for i in range(6):
        buf.push(Span(f"s{i}", 1, i + 1, 0, 0))
    first = buf.take(2, 10_000)
    second = buf.take(2, 10_000)
    assert first is not None
    assert second is not None
    buf.returned(second)
    buf.returned(first)
    assert buf.take_retry() is first
    assert buf.take_retry() is second
    rest = buf.take(10, 10_000)
    assert rest is not None
    assert (rest.lo, rest.hi) == (4, 6)


def test_buffer_drops_the_oldest_when_full() -> None:
    """Past max_spans / max_bytes the oldest pending spans go, each counted as buffer_full."""
    buf = Buffer(5, 10_000, 100, 1_000_000, lambda s: 10, lambda: None)
    spans = [Span(f"s{i}", 1, i + 1, 0, 0) for i in range(12)]
    for s in spans:
        buf.push(s)
    assert buf.queued_spans == 5
    assert buf.dropped["buffer_full"] == 7
    batch = buf.take(100, 1_000_000)
    assert batch is not None
    assert [s.name for s in batch.spans or []] == ["s7", "s8", "s9", "s10", "s11"]
    size = 10 + PENDING_OVERHEAD_BYTES
    by_bytes = Buffer(1000, 3 * size + 5, 100, 1_000_000, lambda s: 10, lambda: None)
    for s in spans:
        by_bytes.push(s)
    assert by_bytes.queued_bytes <= 3 * size + 5
    assert by_bytes.dropped["buffer_full"] == 12 - 3


def test_retry_policy_classifies_statuses() -> None:
    """2xx ok; 408/429/5xx retried; 413 split; other 4xx rejected."""
    c = RetryPolicy.classify
    assert [c(s) for s in (200, 202, 408, 429, 500, 503, 599, 413, 400, 401, 404)] == [
        "ok",
        "ok",
        "retry",
        "retry",
        "retry",
        "retry",
        "retry",
        "split",
        "reject",
        "reject",
        "reject",
    ]


def test_retry_delays_are_jittered_capped_and_honour_retry_after() -> None:
    """Full jitter stays within [0, min(max, base*2^n)]; Retry-After is a floor."""
    policy = RetryPolicy(base_delay=0.1, max_delay=1.0)
    for attempt in range(10):
        for _ in range(50):
            d = policy.delay(attempt)
            assert 0.0 <= d <= min(1.0, 0.1 * 2**attempt)
    assert policy.delay(0, retry_after=3.0) >= 3.0
    delays = {round(policy.delay(5), 6) for _ in range(20)}
    assert len(delays) > 1  # jittered, not fixed


def test_parse_retry_after() -> None:
    """Retry-After as delta-seconds or an HTTP date; garbage is ignored."""
    assert parse_retry_after("2") == 2.0
    assert parse_retry_after(" 0.5 ") == 0.5
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    now = 1_700_000_000.0
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert parse_retry_after(date, now=now) == pytest.approx(30, abs=1)
    assert parse_retry_after(email.utils.formatdate(now - 30, usegmt=True), now=now) == 0.0


async def test_in_memory_transport_scripts_answers() -> None:
    """InMemoryTransport records requests and replays a script of answers."""
    t = InMemoryTransport([503, Response(200, {}, b"ok"), ConnectionResetError("boom")])
    assert (await t.send(b"a", {})).status == 503
    assert (await t.send(b"b", {})).body == b"ok"
    with pytest.raises(ConnectionResetError):
        await t.send(b"c", {})
    assert (await t.send(b"d", {})).status == 200
    assert [body for body, _ in t.requests] == [b"a", b"b", b"c", b"d"]


def test_sink_is_the_pipeline_after_first_span(server: OtlpTestServer) -> None:
    """configure() installs a lazy sink; the first span creates the pipeline from the config."""
    looptrace.configure(endpoint=server.endpoint, flush_interval=0.05)
    assert _export.current() is None
    make_spans(1)
    pipeline = _export.current()
    assert pipeline is not None
    assert _state.sink is pipeline
    assert pipeline.cfg.endpoint == server.endpoint
    assert looptrace.flush_sync(5).ok
    assert server.accepted_span_count == 1


def test_configure_replaces_the_pipeline_and_sends_what_it_had(server: OtlpTestServer) -> None:
    """A second configure() stops the old pipeline after it sends what it held."""
    use(server, flush_interval=5.0)  # long interval: the spans wait in the old pipeline
    make_spans(7)
    old = _export.current()
    assert old is not None
    looptrace.configure(endpoint=server.endpoint, flush_interval=0.05)
    assert old.lifecycle.wait_closed(5)
    assert server.accepted_span_count == 7
    assert old.statistics().spans_sent == 7
