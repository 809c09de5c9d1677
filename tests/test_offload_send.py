"""Large spans sent by the worker itself, against a real OTLP server on 127.0.0.1: the bytes on
the wire, what each answer means to the pipeline, and every way the worker can fail."""

from __future__ import annotations

import asyncio
import gc
import gzip
import os
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest

import looptrace
from looptrace import _export, _otlp, _serialize
from looptrace._capture.spans import Span
from looptrace._config import Config
from looptrace._offload.parent import Destination, Offloader, SendHere, Unsent
from looptrace._transport import Response, RetryPolicy
from looptrace._transport.settings import HttpSettings
from otlp_server import OtlpTestServer
from pipeline_support import checked_server, install_pipeline

CFG = Config()
IMAGE = "QUJD" * 100_000  # 400 KB of base64: sent raw, after the pickle
RAW = bytes(range(256)) * 400  # 100 KB of bytes: the same


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


def expected_body(span: Span, encoding: str) -> bytes:
    chunk = _otlp.encode_span(_serialize.to_wire(span, CFG), encoding)
    return _otlp.encode_request([chunk], _otlp.default_resource(CFG), encoding)


def destination(
    server: OtlpTestServer, encoding: str = "protobuf", compression: str = "gzip", **headers: str
) -> Destination:
    http = HttpSettings(server.endpoint, tuple(headers.items()), 5.0)
    return Destination(http, encoding, compression, _otlp.default_resource(CFG))


def kill(pid: int) -> None:
    """End a process at once, on any platform (SIGKILL on POSIX, TerminateProcess on Windows)."""
    import signal

    os.kill(pid, getattr(signal, "SIGKILL", signal.SIGTERM))


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
async def test_worker_sends_the_bytes_the_parent_would_have_sent(
    offloader: Offloader, server: OtlpTestServer, encoding: str
) -> None:
    """The request a worker sends is, once decompressed, byte for byte the request the parent
    would have built for that span alone: strings and bytes that crossed without a pickle,
    inside dicts, tuples and lists, come out the same, and the secret is redacted."""
    span = big_span()
    job = offloader.job(span, CFG, encoding, 0)
    outcome = await offloader.deliver(job, destination(server, encoding, authorization="k"))
    assert isinstance(outcome, Response) and outcome.status == 200
    (received,) = server.requests
    assert received.headers["content-encoding"] == "gzip"
    assert received.headers["authorization"] == "k"
    assert gzip.decompress(received.body) == expected_body(span, encoding)
    assert b"sk-123" not in gzip.decompress(received.body)


async def test_values_sent_raw_outlive_a_caller_that_gave_up(
    offloader: Offloader, server: OtlpTestServer
) -> None:
    """A call waits in the worker's queue while the worker is busy, and the task that awaited
    it is cancelled (as at shutdown) and the span freed. Its large values were handed over
    with the call, so the request still carries them whole, not memory reused since."""
    pool = offloader._pool
    assert pool is not None
    server.hold()
    first = asyncio.ensure_future(
        offloader.deliver(offloader.job(big_span(), CFG, "protobuf", 0), destination(server))
    )
    assert await asyncio.to_thread(server.wait_for_active, 1)  # the worker is busy with it
    span = Span("big", 1, 3, 0, 1_000)
    span.end_ns = 2_000
    span.inputs = {"image": "".join(["QUJE"] * 100_000), "raw": bytes(RAW[::-1])}
    want = expected_body(span, "protobuf")
    second = asyncio.ensure_future(
        offloader.deliver(offloader.job(span, CFG, "protobuf", 0), destination(server))
    )
    while sum(ch.queued for ch in pool._channels) < 2:  # handed over: queued behind the first
        await asyncio.sleep(0.001)
    second.cancel()
    del span
    gc.collect()
    churn = ["Z" * 400_000 for _ in range(20)]  # reuses memory freed too early, if any was
    server.release()
    assert isinstance(await first, Response)
    assert await asyncio.to_thread(server.wait_for_requests, 2)
    assert gzip.decompress(server.requests[1].body) == want
    assert len(churn) == 20


async def test_worker_reports_what_the_server_answered(
    offloader: Offloader, server: OtlpTestServer
) -> None:
    """Status and Retry-After reach the parent, which decides; a retry sends the span again."""
    job = offloader.job(big_span(), CFG, "protobuf", 0)
    server.fail_next(429, retry_after="7")
    outcome = await offloader.deliver(job, destination(server))
    assert isinstance(outcome, Response)
    assert (outcome.status, outcome.headers.get("retry-after")) == (429, "7")
    outcome = await offloader.deliver(job, destination(server))
    assert isinstance(outcome, Response) and outcome.status == 200
    assert server.statuses() == [429, 200]
    assert server.accepted_span_count == 1


async def test_no_answer_is_an_error_string(offloader: Offloader) -> None:
    """A refused connection comes back as a description (the pipeline retries it)."""
    with OtlpTestServer() as srv:
        dest = destination(srv)
    outcome = await offloader.deliver(offloader.job(big_span(), CFG, "protobuf", 0), dest)
    assert isinstance(outcome, Unsent) and "Connect" in outcome.error


def test_destination_repr_hides_headers(server: OtlpTestServer) -> None:
    dest = destination(server, authorization="Bearer sk-secret")
    assert "sk-secret" not in repr(dest) and "redacted" in repr(dest)
    assert "sk-secret" not in repr(dest.http)


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
    """A backend on this machine shares its CPUs, so the worker sends to it in bounded steps
    (and never through a proxy); a remote one keeps the kernel's buffer sizing, which a long
    round trip needs for speed."""
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
    loopback address that forwards to another machine) is used wherever the backend is. The
    pipeline's requests and the workers' use the same."""
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
        assert exporter._destination is not None
        assert exporter._destination.compression == sent
    finally:
        exporter.shutdown()


def test_compression_setting_refuses_an_unknown_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """A compression the exporters do not know is a clear configuration error, naming the
    ones they do; the default is ``auto``."""
    assert looptrace.Config().compression == "auto"
    monkeypatch.setenv("LOOPTRACE_COMPRESSION", "brotli")
    with pytest.raises(looptrace.ConfigurationError, match="auto, gzip, zstd or none"):
        looptrace.Config.from_env()


async def test_worker_keeps_one_connection_for_many_spans(offloader: Offloader) -> None:
    """Spans sent one after another reuse the worker's connection: no handshake per span."""
    with checked_server() as server:
        dest = destination(server)
        for span_id in range(2, 5):
            outcome = await offloader.deliver(
                offloader.job(big_span(span_id), CFG, "protobuf", 0), dest
            )
            assert isinstance(outcome, Response) and outcome.status == 200
        assert server.accepted_span_count == 3
        assert server.connections_opened == 1


async def test_worker_reconnects_when_the_server_closed_an_idle_connection(
    offloader: Offloader,
) -> None:
    """A server that closes kept-alive connections after a pause (as most do) costs a new
    connection, never a failed send."""
    with checked_server(idle_timeout=0.2) as server:
        dest = destination(server)
        first = await offloader.deliver(offloader.job(big_span(2), CFG, "protobuf", 0), dest)
        assert isinstance(first, Response) and first.status == 200
        assert await asyncio.to_thread(server.wait_for_closed, 1)
        second = await offloader.deliver(offloader.job(big_span(3), CFG, "protobuf", 0), dest)
        assert isinstance(second, Response) and second.status == 200
        assert server.connections_opened == 2 and server.accepted_span_count == 2


async def test_a_reset_connection_is_reported_and_the_next_span_still_goes(
    offloader: Offloader, server: OtlpTestServer
) -> None:
    """A connection reset mid-request is an error string (the pipeline retries it), and the
    worker sends the next span on a new connection."""
    server.reset_next(1)
    job = offloader.job(big_span(), CFG, "protobuf", 0)
    outcome = await offloader.deliver(job, destination(server))
    assert isinstance(outcome, Unsent) and "Connection" in outcome.error
    outcome = await offloader.deliver(job, destination(server))
    assert isinstance(outcome, Response) and outcome.status == 200
    assert server.statuses() == [0, 200]


async def test_user_headers_reach_the_server(offloader: Offloader, server: OtlpTestServer) -> None:
    dest = destination(server, authorization="Bearer sk-secret", **{"x-team": "evals"})
    outcome = await offloader.deliver(offloader.job(big_span(), CFG, "protobuf", 0), dest)
    assert isinstance(outcome, Response) and outcome.status == 200
    headers = server.requests[-1].headers
    assert headers["authorization"] == "Bearer sk-secret" and headers["x-team"] == "evals"
    assert headers["content-type"] == "application/x-protobuf"
    assert headers["content-encoding"] == "gzip"


async def test_worker_loads_nothing_of_the_application(
    offloader: Offloader, server: OtlpTestServer
) -> None:
    """A worker is a fresh interpreter: after sending a span it has loaded neither the
    application's __main__ (nor multiprocessing's stand-in for it) nor looptrace's capture
    and pipeline, nor an event loop."""
    outcome = await offloader.deliver(
        offloader.job(big_span(), CFG, "protobuf", 0), destination(server)
    )
    assert isinstance(outcome, Response) and outcome.status == 200
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
        "pytest",
    }


async def test_worker_killed_mid_send_gives_the_span_back_to_the_parent(
    server: OtlpTestServer,
) -> None:
    """The worker dies while its request is held: the parent gets the encoded span back to
    send itself, the reason is counted, and the next pool sends again."""
    off = Offloader(workers=1)
    try:
        await off.ready()
        server.hold()
        span = big_span()
        task = asyncio.ensure_future(
            off.deliver(off.job(span, CFG, "protobuf", 0), destination(server))
        )
        assert await asyncio.to_thread(server.wait_for_active, 1)
        kill(off.worker_pids()[0])
        outcome = await task
        server.release()
        assert outcome == SendHere(_otlp.encode_span(_serialize.to_wire(span, CFG), "protobuf"))
        assert off.stats["broken_pool"] == 1
        outcome = await off.deliver(off.job(big_span(3), CFG, "protobuf", 0), destination(server))
        assert isinstance(outcome, Response) and outcome.status == 200
    finally:
        server.release()
        off.shutdown(wait=True)


async def test_shutdown_from_another_thread_gives_the_span_back(server: OtlpTestServer) -> None:
    """Shutting the offloader down from another thread while a worker holds a span: the
    waiting task gets the encoded span to send itself (reason ``shutdown``), without hanging,
    and the worker is gone."""
    off = Offloader(workers=1)
    try:
        await off.ready()
        assert off._pool is not None
        process = off._pool._channels[0].process
        server.hold()
        span = big_span()
        task = asyncio.ensure_future(
            off.deliver(off.job(span, CFG, "protobuf", 0), destination(server))
        )
        assert await asyncio.to_thread(server.wait_for_active, 1)
        await asyncio.to_thread(off.shutdown, True)
        outcome = await asyncio.wait_for(task, 30)
        assert outcome == SendHere(_otlp.encode_span(_serialize.to_wire(span, CFG), "protobuf"))
        assert off.stats["shutdown"] == 1
        assert off.worker_pids() == [] and off.workers_alive() == 0
        assert process.poll() is not None  # exited, and reaped
    finally:
        server.release()
        off.shutdown(wait=True)


async def test_many_medium_strings_reach_the_server_whole(
    offloader: Offloader, server: OtlpTestServer
) -> None:
    """Strings each below the size sent raw, 3 MB together, travel in the call's pickle, a
    frame larger than the pipe: the request is still the parent's, byte for byte."""
    span = big_span()
    span.inputs = {"parts": [f"{i:04d}" + "z" * 60_000 for i in range(50)]}
    outcome = await offloader.deliver(offloader.job(span, CFG, "protobuf", 0), destination(server))
    assert isinstance(outcome, Response) and outcome.status == 200
    assert gzip.decompress(server.requests[0].body) == expected_body(span, "protobuf")


@pytest.mark.parametrize("compression", ["gzip", "none"])
async def test_large_payloads_go_out_uncompressed_and_whole(
    offloader: Offloader, server: OtlpTestServer, compression: str
) -> None:
    """A body the compression probe turns down (base64 of noise), or with compression off,
    goes out as it is: the worker sends the payloads' JSON without joining it into one body,
    and the server still gets the parent's request byte for byte, with its length."""
    import base64
    import random

    rng = random.Random(5)
    span = big_span()
    span.inputs = {"image": base64.b64encode(rng.randbytes(1_200_000)).decode()}
    span.output = {"thumb": base64.b64encode(rng.randbytes(150_000)).decode(), "ok": True}
    dest = destination(server, compression=compression)
    outcome = await offloader.deliver(offloader.job(span, CFG, "protobuf", 0), dest)
    assert isinstance(outcome, Response) and outcome.status == 200
    (received,) = server.requests
    assert "content-encoding" not in received.headers
    assert received.body == expected_body(span, "protobuf")


async def test_value_the_worker_cannot_rebuild_comes_back_encoded(
    offloader: Offloader, server: OtlpTestServer
) -> None:
    from test_offload import OnlyInParent

    span = big_span()
    span.output = {"obj": OnlyInParent()}
    before = offloader.stats["worker_error"]
    outcome = await offloader.deliver(offloader.job(span, CFG, "protobuf", 0), destination(server))
    assert outcome == SendHere(_otlp.encode_span(_serialize.to_wire(span, CFG), "protobuf"))
    assert offloader.stats["worker_error"] == before + 1
    assert server.request_count == 0


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


async def test_pipeline_sends_each_large_span_alone(server: OtlpTestServer) -> None:
    """Small spans still share requests; each large span goes in a request of its own, sent by
    the worker, and flush() waits for all of them."""
    pipe = install_pipeline(server, retry=FAST_RETRY)
    traced_calls(small=5, large=3)
    assert await looptrace.flush(timeout=30)
    assert server.accepted_span_count == 8
    sizes = sorted(len(r.spans) for r in server.requests)
    assert sizes[:3] == [1, 1, 1] and sum(sizes) == 8
    assert pipe.statistics().offload.offloaded == 3
    assert looptrace.statistics().spans_sent == 8
    await looptrace.shutdown()


async def test_a_large_span_goes_as_soon_as_the_one_before_is_answered(
    server: OtlpTestServer,
) -> None:
    """A large span that ends while a worker sends another does not wait for the flush
    interval: the answer to the first starts the next drain, since the workers' requests cost
    the application's loop nothing (gathered, large spans reached the workers in bursts)."""
    install_pipeline(server, retry=FAST_RETRY, flush_interval=60.0)
    server.hold()
    traced_calls(small=0, large=1)
    first = asyncio.ensure_future(looptrace.flush(timeout=30))
    assert await asyncio.to_thread(server.wait_for_active, 1, 20)
    traced_calls(small=0, large=1)
    server.release()
    assert await first
    # Nobody flushes again, and the interval is a minute.
    assert await asyncio.to_thread(server.wait_for_spans, 2, 20)
    assert [len(r.spans) for r in server.requests] == [1, 1]
    await looptrace.shutdown()


async def test_pipeline_retries_what_the_worker_reports(server: OtlpTestServer) -> None:
    """503s and a 429 answered to the worker are retried by the pipeline's rules: nothing is
    lost, and the retries are counted."""
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
    """With a transport the worker cannot use (here a custom factory), large spans are encoded
    in the worker and sent by the pipeline, in shared requests."""
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
    assert pipe.exporter._destination is None  # type: ignore[attr-defined]
    assert pipe.statistics().offload.offloaded == 2
    await looptrace.shutdown()
