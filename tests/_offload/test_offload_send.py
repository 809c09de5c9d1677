"""Large spans a worker encodes, on their way to a real OTLP server on 127.0.0.1: the request
is the one the parent would have built, the values handed to a worker outlive their caller, and
the pipeline sends, retries and drops them like any other span, over its own transport."""

from __future__ import annotations

import asyncio
import gc
import gzip
import os
import signal
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest

import looptrace
from looptrace import _export, _otlp, _serialize
from looptrace._capture.spans import Span
from looptrace._config import Config
from looptrace._export.exporter import SENT
from looptrace._offload import pool as _pool
from looptrace._offload.parent import Offloader, _Lifter
from looptrace._transport import RetryPolicy
from looptrace._transport.settings import HttpSettings
from otlp_server import OtlpTestServer
from pipeline_support import checked_server, install_pipeline
from steps_support import LoopTurns

CFG = Config()
IMAGE = "QUJD" * 100_000  # 400 KB of base64: sent raw, after the pickle
RAW = bytes(range(256)) * 400  # 100 KB of bytes: the same
# A worker held still (SIGSTOP) keeps a call waiting, without a timer; Windows has no such signal.
needs_sigstop = pytest.mark.skipif(
    not hasattr(signal, "SIGSTOP"), reason="a worker is held with SIGSTOP"
)


def big_span(span_id: int = 2) -> Span:
    span = Span("big", 1, span_id, 0, 1_000)
    span.end_ns = 2_000
    span.inputs = {
        "image": IMAGE,
        "pair": ("small", IMAGE[:70_000]),
        "raw": RAW,
        "api_key": "sk-123",
    }
    span.output = ["ok", bytearray(RAW)]
    return span


def inline(span: Span, encoding: str = "protobuf") -> bytes:
    return _otlp.encode_span(_serialize.to_wire(span, CFG), encoding)


def handoff(span: Span) -> tuple[tuple[Any, ...], list[str | bytes]]:
    """The call ``Offloader`` makes for ``span``: its arguments, and the values sent raw."""
    wire, inputs, output, pol, cap = _serialize.prepare(span, CFG)
    lifter = _Lifter()
    inputs = (inputs[0], lifter.lift(inputs[1]))
    output = (output[0], lifter.lift(output[1]))
    return (wire, inputs, output, pol, cap, "protobuf"), lifter.values


@pytest.fixture(scope="module")
def offloader() -> Iterator[Offloader]:
    off = Offloader(workers=1)
    asyncio.run(off.ready())
    yield off
    off.shutdown(wait=True)


@pytest.fixture
def server() -> Iterator[OtlpTestServer]:
    with checked_server() as srv:
        yield srv


@pytest.mark.parametrize("encoding", ["protobuf", "json"])
async def test_a_large_span_goes_out_as_the_parent_would_have_sent_it(
    server: OtlpTestServer, encoding: str
) -> None:
    """A span a worker encodes goes out, once decompressed, byte for byte as the request the
    parent would have built for it: strings and bytes that crossed without a pickle, inside
    dicts, tuples and lists, come out the same, the secret is redacted, and the configured
    headers and compression apply as to any request."""
    from looptrace._export.otlp_http import OtlpHttpExporter

    cfg = looptrace.Config.from_env(
        endpoint=server.endpoint,
        encoding=encoding,
        compression="gzip",
        headers={"authorization": "k"},
    )
    exporter = OtlpHttpExporter(cfg)
    exporter.load()
    session = exporter.session()
    try:
        span = big_span()
        chunks = await exporter.encode([span])
        assert exporter.offload_statistics().offloaded == 1
        assert await session.export(chunks) == SENT  # type: ignore[arg-type]
    finally:
        await session.aclose()
        exporter.shutdown()
    (received,) = server.requests
    assert received.headers["content-encoding"] == "gzip"
    assert received.headers["authorization"] == "k"
    body = gzip.decompress(received.body)
    assert body == _otlp.encode_request([inline(span, encoding)], exporter.resource, encoding)
    assert b"sk-123" not in body


@needs_sigstop
async def test_values_sent_raw_outlive_a_caller_that_gave_up(offloader: Offloader) -> None:
    """A call waits in the worker's queue while the worker is busy, and its caller lets go of
    the span and of everything it handed over (as at shutdown). Its large values went with the
    call, so the worker still encodes them whole, not memory reused since."""
    pool = offloader._pool
    assert pool is not None
    (worker,) = [ch.process.pid for ch in pool._channels if not ch.helper]
    os.kill(worker, signal.SIGSTOP)
    try:
        first = pool.submit("work", *handoff(big_span()))
        span = Span("big", 1, 3, 0, 1_000)
        span.end_ns = 2_000
        span.inputs = {"image": "".join(["QUJE"] * 100_000), "raw": bytes(RAW[::-1])}
        want = inline(span)
        args, values = handoff(span)
        second = pool.submit("work", args, values)
        assert pool.queued == 2  # the second waits behind the first
        del span, args, values
        gc.collect()
        churn = ["Z" * 400_000 for _ in range(20)]  # reuses memory freed too early, if any was
    finally:
        os.kill(worker, signal.SIGCONT)
    assert type(await asyncio.wrap_future(first)) is _pool.Raw
    answer = await asyncio.wrap_future(second)
    assert type(answer) is _pool.Raw and answer.values[0] == want
    assert len(churn) == 20


@needs_sigstop
async def test_shutdown_from_another_thread_gives_the_span_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Shutting the offloader down from another thread while a worker holds a span: the
    waiting task gets the span encoded here (reason ``shutdown``), without hanging, and the
    worker is gone."""
    monkeypatch.setattr(_pool, "START_HELP_SECONDS", 600.0)  # one worker, however busy
    monkeypatch.setattr(_pool, "BEHIND_SECONDS", 600.0)
    off = Offloader(workers=1)
    try:
        await off.ready()
        assert off._pool is not None
        process = off._pool._channels[0].process
        os.kill(process.pid, signal.SIGSTOP)  # busy: it will not answer before the shutdown
        span = big_span()
        task = asyncio.ensure_future(off.encode(span, CFG, "protobuf"))
        while not off._pool.queued:
            await asyncio.sleep(0)
        await asyncio.to_thread(off.shutdown, True)
        assert await asyncio.wait_for(task, 30) == inline(span)
        assert off.stats["shutdown"] == 1
        assert off.worker_pids() == [] and off.workers_alive() == 0
        assert process.poll() is not None  # exited, and reaped
    finally:
        off.shutdown(wait=True)


async def test_worker_loads_nothing_of_the_application(offloader: Offloader) -> None:
    """A worker is a fresh interpreter: after encoding a span it has loaded neither the
    application's __main__ (nor multiprocessing's stand-in for it) nor looptrace's capture
    and pipeline, nor an event loop, nor an HTTP client."""
    assert await offloader.encode(big_span(), CFG, "protobuf") == inline(big_span())
    pool = offloader._pool
    assert pool is not None
    modules = await asyncio.wrap_future(pool.submit("modules", ()))
    assert "looptrace._offload.child" in modules
    assert not set(modules) & {
        "__mp_main__",
        "multiprocessing",
        "asyncio",
        "looptrace._export",
        "looptrace._capture.decorators",
        "looptrace._capture.start",
        "looptrace._transport",
        "httpx",
        "h11",
        "pytest",
    }


@pytest.mark.parametrize(
    ("url", "loopback"),
    [
        ("http://127.0.0.1:4318/v1/traces", True),
        ("http://127.9.9.9:4318/v1/traces", True),
        ("http://localhost:4318/v1/traces", True),
        ("http://[::1]:4318/v1/traces", True),
        ("https://otlp.example.com/v1/traces", False),
        ("http://10.0.0.5:4318/v1/traces", False),
        ("http://[2001:db8::1]:4318/v1/traces", False),
    ],
)
def test_only_a_loopback_backend_gets_the_small_send_buffer(url: str, loopback: bool) -> None:
    """A backend on this machine shares its CPUs, so the application's client sends to it in
    bounded steps (and never through a proxy); a remote one keeps the kernel's buffer sizing,
    which a long round trip needs for speed."""
    from looptrace._transport.settings import is_loopback

    assert is_loopback(urllib.parse.urlsplit(url).hostname or "") is loopback
    assert HttpSettings(url).loopback is loopback


@pytest.mark.parametrize(
    ("choice", "url", "sent"),
    [
        ("auto", "http://127.0.0.1:4318/v1/traces", "none"),
        ("auto", "http://localhost:4318/v1/traces", "none"),
        ("auto", "http://[::1]:4318/v1/traces", "none"),
        ("auto", "https://otlp.example.com/v1/traces", "gzip"),
        ("auto", "http://10.0.0.5:4318/v1/traces", "gzip"),
        ("gzip", "http://127.0.0.1:4318/v1/traces", "gzip"),
        ("zstd", "http://127.0.0.1:4318/v1/traces", "zstd"),
        ("none", "https://otlp.example.com/v1/traces", "none"),
    ],
)
def test_compression_is_left_out_only_on_loopback_unless_asked_for(
    choice: str, url: str, sent: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``compression="auto"`` (the default) compresses with gzip for a backend on another
    machine and not for one on this machine, where deflating costs CPU on both ends and saves
    nothing; a compression asked for by name (the setting or the standard variable, for a
    loopback address that forwards to another machine) is used wherever the backend is."""
    from looptrace._export.otlp_http import OtlpHttpExporter
    from looptrace._transport.settings import wire_compression

    assert wire_compression(choice, HttpSettings(url).loopback) == sent
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", choice)
    cfg = looptrace.Config.from_env(endpoint=url)
    assert cfg.compression == choice
    exporter = OtlpHttpExporter(cfg)
    exporter.load()
    try:
        assert exporter.compression == sent
    finally:
        exporter.shutdown()


def test_compression_setting_refuses_an_unknown_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """A compression the exporters do not know is a clear configuration error, naming the
    ones they do; the default is ``auto``."""
    assert looptrace.Config().compression == "auto"
    monkeypatch.setenv("LOOPTRACE_COMPRESSION", "brotli")
    with pytest.raises(looptrace.ConfigurationError, match="auto, gzip, zstd or none"):
        looptrace.Config.from_env()


async def test_a_large_span_queues_behind_a_bounded_share_of_the_workers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The bytes of large spans handed over and not answered yet count against a bound per
    worker: past it, has_room() says no until the workers answer. A worker with nothing
    queued always has room, whatever the span's size."""
    from looptrace._offload import parent

    monkeypatch.setattr(parent, "QUEUED_BYTES_PER_WORKER", 500_000)
    off = Offloader(workers=1)
    try:
        await off.ready()
        assert off.has_room()
        first = off.submit(big_span(span_id=40), CFG, "protobuf")  # 570 KB handed over
        assert not off.has_room()
        assert await first == inline(big_span(span_id=40))
        assert off.has_room()
    finally:
        off.shutdown()


async def test_a_large_span_no_worker_has_room_for_is_written_here_in_steps(
    server: OtlpTestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the workers hold their share, a large span is serialized in the application's
    process, in steps, rather than queued behind the others (whose delivery it would wait
    for): the same bytes, counted as ``workers_busy``."""
    from looptrace._export.otlp_http import OtlpHttpExporter

    monkeypatch.setattr(Offloader, "has_room", lambda self: False)
    monkeypatch.setattr(_export.exporter, "SLICE_SECONDS", 0.0)
    cfg = looptrace.Config.from_env(endpoint=server.endpoint)
    exporter = OtlpHttpExporter(cfg)
    exporter.load()
    try:
        async with LoopTurns() as turns:
            (chunk,) = await exporter.encode([big_span(span_id=41)])
        stats = exporter.offload_statistics()
    finally:
        exporter.shutdown()
    assert turns.count >= 3
    assert stats.offloaded == 0 and stats.fallbacks["workers_busy"] == 1
    assert chunk == inline(big_span(span_id=41))


# --------------------------------------------------------------------------- the pipeline


def traced_calls(small: int, large: int) -> None:
    @looptrace.traced
    def handle(request: Any) -> str:
        return "ok"

    for i in range(small):
        handle({"i": i})
    for i in range(large):
        handle({"i": i, "image": IMAGE})


FAST_RETRY = RetryPolicy(base_delay=0.01, max_delay=0.05, budget=10.0)


async def test_pipeline_sends_large_spans_with_the_others(server: OtlpTestServer) -> None:
    """Large spans, encoded by a worker, share a request with the small ones over the
    pipeline's own client, and flush() waits for all of them."""
    pipe = install_pipeline(server, retry=FAST_RETRY)
    traced_calls(small=5, large=3)
    assert await looptrace.flush(timeout=30)
    assert server.accepted_span_count == 8
    assert server.request_count == 1
    assert pipe.statistics().offload.offloaded == 3
    assert looptrace.statistics().spans_sent == 8
    await looptrace.shutdown()


async def test_pipeline_retries_a_large_span(server: OtlpTestServer) -> None:
    """503s and a 429 answered to a request carrying a large span are retried by the
    pipeline's rules, the span encoded once: nothing is lost, and the retries are counted."""
    pipe = install_pipeline(server, retry=FAST_RETRY)
    server.fail_next(503, 503, 429)
    traced_calls(small=0, large=1)
    assert await looptrace.flush(timeout=30)
    assert server.statuses() == [503, 503, 429, 200]
    assert pipe.retries == 3
    assert server.accepted_span_count == 1
    await looptrace.shutdown()


async def test_pipeline_drops_a_large_span_the_backend_rejects(server: OtlpTestServer) -> None:
    pipe = install_pipeline(server, retry=FAST_RETRY)
    server.fail_next(400)
    traced_calls(small=0, large=1)
    await looptrace.flush(timeout=30)
    assert pipe.buffer.dropped["rejected"] == 1
    assert "HTTP 400" in (pipe.last_error or "")
    await looptrace.shutdown()


async def test_other_transports_get_the_encoded_span_back(server: OtlpTestServer) -> None:
    """With a custom transport, large spans are encoded in the worker and sent by the pipeline
    over that transport, in shared requests."""
    from looptrace._transport import HttpTransport

    config = looptrace.Config.from_env(endpoint=server.endpoint, flush_interval=0.05)
    pipe = _export.install(
        _export.Pipeline(
            config,
            transport_factory=lambda: HttpTransport(server.endpoint),
            retry_policy=FAST_RETRY,
        )
    )
    traced_calls(small=2, large=2)
    assert await looptrace.flush(timeout=30)
    assert server.accepted_span_count == 4
    assert server.request_count == 1
    assert pipe.statistics().offload.offloaded == 2
    await looptrace.shutdown()


@needs_sigstop
async def test_a_stopped_worker_gets_a_helper_and_the_loop_keeps_turning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker that never gets a CPU (held still here, starved on a busy machine): the loop
    that awaits its spans keeps turning, and once a call has waited past the bound a helper
    worker takes the queue and a copy of the call the held worker has, so every span comes
    back encoded by a worker (not inline), the held worker's answer not awaited."""
    # No helper while the pool starts and answers its first call, however busy the machine:
    # the one worker is the one held still below.
    monkeypatch.setattr(_pool, "BEHIND_SECONDS", 600.0)
    monkeypatch.setattr(_pool, "START_HELP_SECONDS", 600.0)  # the worker's own start
    off = Offloader(workers=1)
    try:
        await off.ready()
        (worker,) = off.worker_pids()
        monkeypatch.setattr(_pool, "BEHIND_SECONDS", 0.05)
        os.kill(worker, signal.SIGSTOP)
        try:
            spans = [big_span(span_id=10 + i) for i in range(3)]
            tasks = [asyncio.ensure_future(off.encode(s, CFG, "protobuf")) for s in spans]
            turns = 0
            while not all(t.done() for t in tasks):
                await asyncio.sleep(0.001)
                turns += 1
                assert turns < 60_000, "no helper took the calls"
            # The loop turned while a helper started (an interpreter and its imports); a
            # handoff that waited for a worker would have held it until the spans came back.
            assert turns >= 3
            assert [t.result() for t in tasks] == [inline(s) for s in spans]
            assert len(off.worker_pids()) == 2
            assert off._pool is not None and off._pool.helpers_started == 1
            assert off.stats["offloaded"] == 3 and sum(off.stats.values()) == 3
        finally:
            os.kill(worker, signal.SIGCONT)
        # The held worker answers its copy later, to nobody; the pool goes on.
        assert await off.encode(big_span(span_id=20), CFG, "protobuf") == inline(
            big_span(span_id=20)
        )
        assert off.state == "running"
    finally:
        off.shutdown(wait=True)


async def test_a_helper_with_nothing_to_do_exits(monkeypatch: pytest.MonkeyPatch) -> None:
    """A helper started while the queue was behind leaves once it finds no call to take: a
    quiet machine keeps only its idle-priority workers."""
    monkeypatch.setattr(_pool, "HELPER_IDLE_SECONDS", 0.2)
    monkeypatch.setattr(_pool, "START_HELP_SECONDS", 600.0)  # the worker's own start
    off = Offloader(workers=1)
    try:
        await off.ready()
        pool = off._pool
        assert pool is not None
        (worker,) = off.worker_pids()
        with pool._cond:
            pool._helper = True
        await asyncio.to_thread(pool._start_helper)
        assert len(off.worker_pids()) == 2
        assert await off.encode(big_span(), CFG, "protobuf") == inline(big_span())
        for _ in range(600):
            if off.worker_pids() == [worker]:
                break
            await asyncio.sleep(0.05)
        assert off.worker_pids() == [worker]
        assert not pool._helper
        assert await off.encode(big_span(span_id=4), CFG, "protobuf") == inline(big_span(span_id=4))
    finally:
        off.shutdown(wait=True)


@needs_sigstop
async def test_a_pool_whose_worker_cannot_start_starts_with_a_helper(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An idle-priority worker that does not get to finish its start-up (held still here,
    starved on a busy machine): the pool starts with a helper instead, large spans are
    offloaded at once, and the held worker joins once it has started."""
    held: list[int] = []

    def hold(pid: int) -> None:
        held.append(pid)
        os.kill(pid, signal.SIGSTOP)

    monkeypatch.setattr(_pool, "yield_cpu", hold)
    monkeypatch.setattr(_pool, "START_HELP_SECONDS", 0.05)
    off = Offloader(workers=1)
    try:
        try:
            await asyncio.wait_for(off.ready(), 60)
            assert off.state == "running"
            assert off._pool is not None and off._pool.helpers_started == 1
            assert await off.encode(big_span(), CFG, "protobuf") == inline(big_span())
            assert off.stats["offloaded"] == 1
        finally:
            for pid in held:
                os.kill(pid, signal.SIGCONT)
        (worker,) = held
        pool = off._pool
        for _ in range(1200):
            if any(ch.ready for ch in pool._channels if ch.process.pid == worker):
                break
            await asyncio.sleep(0.05)
        assert any(ch.ready for ch in pool._channels if ch.process.pid == worker)
    finally:
        off.shutdown(wait=True)


def names(server: OtlpTestServer) -> list[str]:
    """The accepted spans' names, in the order they arrived, without their qualifiers."""
    return [name.rsplit(".", 1)[-1] for name in server.span_names()]


@needs_sigstop
async def test_spans_behind_a_large_one_go_out_while_its_worker_encodes(
    server: OtlpTestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large span in a batch of its own does not hold up the batches behind it: while its
    worker encodes it (held still here, as a starved worker is), the drain sends the small
    span that ended after it. Once the worker answers, the large span goes too, once."""
    monkeypatch.setattr(_pool, "BEHIND_SECONDS", 600.0)  # no helper takes the held call
    monkeypatch.setattr(_pool, "START_HELP_SECONDS", 600.0)
    pipe = install_pipeline(server, retry=FAST_RETRY, max_batch_spans=1)

    @looptrace.traced
    def large(request: Any) -> str:
        return "ok"

    @looptrace.traced
    def small(request: Any) -> str:
        return "ok"

    large({"image": IMAGE, "n": 0})  # starts the pool
    assert (await looptrace.flush(timeout=60)).ok
    offloader = pipe.flusher.exporter._offloader  # type: ignore[attr-defined]
    (worker,) = offloader.worker_pids()
    os.kill(worker, signal.SIGSTOP)
    try:
        large({"image": IMAGE, "n": 1})
        small({"n": 2})
        flushed = asyncio.ensure_future(looptrace.flush(timeout=60))
        for _ in range(60_000):
            if server.accepted_span_count >= 2:
                break
            await asyncio.sleep(0.001)
        assert names(server) == ["large", "small"]
        assert not flushed.done()
    finally:
        os.kill(worker, signal.SIGCONT)
    assert (await flushed).ok
    assert sorted(names(server)) == ["large", "large", "small"]
    assert offloader.stats["offloaded"] == 2
    await looptrace.shutdown()
