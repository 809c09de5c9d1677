"""The exporter interface: the local store's exporter writes what a receiver would have
decoded from OTLP, with no encoding in between; the flusher acts on each outcome the same way
whatever the exporter (tested here with the in-memory one)."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

import looptrace
from looptrace import _export, _otlp
from looptrace._capture.spans import Event, Span
from looptrace._export.exporter import Outcome, Verdict
from looptrace._export.memory import InMemoryExporter
from looptrace._export.otlp_http import OtlpHttpExporter
from looptrace._export.store import Row, StoreExporter, decoded
from looptrace._store import Store
from looptrace._transport import RetryPolicy
from looptrace._wire import WireEvent, WireLink, WireSpan
from looptrace.collector.decode import decode_request
from steps_support import LoopTurns

FAST_RETRY = RetryPolicy(base_delay=0.01, max_delay=0.05, budget=10.0)
NOW = 1_700_000_000_000_000_000


def _wires() -> list[WireSpan]:
    """Spans with every shape the store keeps: arrays, bytes, events, links, a foreign scope,
    a remote parent, an error status, an in-progress record."""
    return [
        WireSpan(1, 1, 0, "root", 1, NOW, NOW + 50, [("k", "v"), ("n", 3)], [], [], 0, ""),
        WireSpan(
            1,
            2,
            1,
            "child",
            3,
            NOW + 5,
            NOW + 9,
            [
                ("tags", ("a", "b")),
                ("nums", (1, 2, 3)),
                ("flag", True),
                ("ratio", 0.5),
                ("blob", b"\x00\x01\xff"),
                ("input.value", '{"q": "hi"}'),
                ("output.value", '"done"'),
            ],
            [WireEvent("exception", NOW + 7, [("exception.type", "ValueError")])],
            [WireLink(9, 8, "vendor=x", [("why", "follows")], is_remote=True)],
            2,
            "boom",
            trace_state="a=b",
            parent_is_remote=True,
            scope=("opentelemetry.instrumentation.httpx", "0.50b0"),
        ),
        WireSpan(2, 3, 0, "long run", 1, NOW, 0, [("looptrace.in_progress", True)], [], [], 0, ""),
    ]


@pytest.mark.parametrize("encoding", ["protobuf", "json"])
def test_the_store_exporter_keeps_what_a_receiver_decodes(encoding: str) -> None:
    """For every shape of span, the row the store exporter builds equals what the collector
    decodes from the OTLP request the client would have sent."""
    cfg = looptrace.Config.from_env(service_name="svc", encoding=encoding)
    resource = _otlp.default_resource(cfg)
    wires = _wires()
    body = _otlp.encode_request([_otlp.encode_span(w, encoding) for w in wires], resource, encoding)
    from_wire = decode_request(body, _otlp.content_type(encoding))
    direct = [
        decoded(w, dict(resource.attributes), (resource.scope_name, resource.scope_version))
        for w in wires
    ]
    assert sorted(direct, key=lambda s: s.span_id) == sorted(from_wire, key=lambda s: s.span_id)


async def test_traced_calls_reach_the_store_through_its_exporter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no endpoint, traced calls land in the local store, payloads in their columns, and
    the write happens in a worker thread, committed before the flush returns."""
    path = tmp_path / "t.db"
    looptrace.configure(store_path=str(path), flush_interval=0.05, service_name="svc")
    threads: list[int] = []
    real_write = Store.write

    def spy(self: Store, spans: Any) -> None:
        threads.append(threading.get_ident())
        real_write(self, spans)

    @looptrace.traced
    async def answer(question: str) -> dict[str, Any]:
        with looptrace.span("lookup") as s:
            s.set_attribute("hits", [1, 2])
        return {"text": question.upper()}

    monkeypatch.setattr(Store, "write", spy)
    await answer("hi")
    assert (await looptrace.flush(10)).ok
    assert threads and threading.get_ident() not in threads
    pipeline = _export.current()
    assert isinstance(pipeline.exporter, StoreExporter)
    with Store(path) as store:
        (trace,) = store.list_traces()
        assert trace["span_count"] == 2
        tree = store.get_trace(trace["trace_id"])
    assert tree is not None
    spans = {s["name"].rsplit(".", 1)[-1]: s for s in tree}
    assert spans["answer"]["input"] == '{"question":"hi"}'
    assert spans["answer"]["output"] == '{"text":"HI"}'
    assert spans["lookup"]["attributes"]["hits"] == [1, 2]
    assert spans["lookup"]["parent_span_id"] == spans["answer"]["span_id"]


async def test_a_locked_store_is_retried_not_lost(tmp_path: Path) -> None:
    """A store held locked past its busy timeout answers RETRY (not an exception); once the
    lock goes, the same spans are written, once."""
    path = tmp_path / "locked.db"
    Store(path).close()
    cfg = looptrace.Config.from_env(store_path=str(path), store_max_age_days=None)
    exporter = StoreExporter(cfg)
    exporter.load()
    session = exporter.session()
    session._store = Store(path, busy_timeout=0.05)
    row = _wires()[0]
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        outcome = await session.export([Row(row, 100)])
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert outcome.verdict is Verdict.RETRY
    assert "local store unavailable" in outcome.describe()
    assert (await session.export([Row(row, 100)])).verdict is Verdict.SENT
    assert session.store.list_traces()[0]["span_count"] == 1
    await session.aclose()


def test_the_store_exporter_takes_retention_from_config(tmp_path: Path) -> None:
    """The store it opens keeps the configured retention."""
    cfg = looptrace.Config.from_env(
        store_path=str(tmp_path / "c.db"), store_max_age_days=3, store_max_bytes=123456
    )
    session = StoreExporter(cfg).session()
    assert (session.store.max_age_days, session.store.max_bytes) == (3.0, 123456)
    asyncio.run(session.aclose())


def test_the_store_exporter_reopens_after_fork(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a forked child (another pid) the session opens its own connections instead of using
    the parent's, and writes still land."""
    cfg = looptrace.Config.from_env(store_path=str(tmp_path / "f.db"), store_max_age_days=None)
    exporter = StoreExporter(cfg)
    exporter.load()
    session = exporter.session()
    parent_store = session.store
    from looptrace._export import store as store_module

    monkeypatch.setattr(store_module.os, "getpid", lambda: -1)
    child_store = session.store
    assert child_store is not parent_store
    child_store.write([decoded(_wires()[0], {}, ("looptrace", "0"))])
    assert parent_store.list_traces()[0]["trace_id"] == f"{1:032x}"
    child_store.close()
    parent_store.close()


def test_the_local_store_path_loads_no_otlp_codec(tmp_path: Path) -> None:
    """Writing to the local store decodes nothing: no decoder, and nothing of the collector,
    is imported by a program that traces into it."""
    script = textwrap.dedent(
        f"""
        import sys, looptrace
        looptrace.configure(store_path={str(tmp_path / "s.db")!r}, flush_interval=0.05)

        @looptrace.traced
        def f(x):
            return x * 2

        f(21)
        assert looptrace.flush_sync(10).ok
        loaded = sorted(m for m in sys.modules if m.startswith(("looptrace._otlp.", "looptrace.collector")))
        print("LOADED", loaded)
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if x.startswith("LOADED"))
    for module in ("pbread", "jsonread", "decode"):
        assert f"looptrace._otlp.{module}'" not in line
    assert "looptrace.collector" not in line


# ------------------------------------------------------------------ the flusher's rules


def _install(script: list[Outcome], **overrides: Any) -> InMemoryExporter:
    cfg = looptrace.Config.from_env(flush_interval=0.05, **overrides)
    exporter = InMemoryExporter(cfg, script)
    _export.install(_export.Pipeline(cfg, retry_policy=FAST_RETRY, exporter=exporter))
    return exporter


def _spans(count: int) -> None:
    for i in range(count):
        with looptrace.span(f"s{i}"):
            pass


async def test_retry_then_sent_delivers_each_span_once() -> None:
    """RETRY returns the batch to the buffer and backs off; the next attempt delivers every
    span once, and the retries are counted."""
    exporter = _install([Outcome(Verdict.RETRY, "HTTP 503"), Outcome(Verdict.RETRY, "HTTP 503")])
    _spans(5)
    assert (await looptrace.flush(10)).ok
    assert sorted(s.name for s in exporter.spans) == [f"s{i}" for i in range(5)]
    assert exporter.attempts == 3
    stats = looptrace.statistics()
    assert (stats.retries, stats.requests_failed, stats.spans_sent) == (2, 2, 5)
    assert stats.last_error is None  # it says what is wrong now


async def test_too_large_splits_and_rejected_drops() -> None:
    """TOO_LARGE splits the batch in halves and sends both at once; REJECTED drops a batch and
    counts its spans, with the destination's words in ``last_error``."""
    exporter = _install([Outcome(Verdict.TOO_LARGE, "HTTP 413")])
    _spans(4)
    assert (await looptrace.flush(10)).ok
    assert sorted(len(batch) for batch in exporter.exported) == [2, 2]

    exporter = _install([Outcome(Verdict.REJECTED, "HTTP 400", "bad request")])
    _spans(3)
    result = await looptrace.flush(10)
    assert result.dropped["rejected"] == 3
    assert exporter.spans == []
    assert looptrace.statistics().last_error == "HTTP 400: bad request"


async def test_a_retry_past_the_budget_is_dropped_and_counted() -> None:
    """A batch whose next attempt would fall past the retry budget is dropped as
    ``retries_exhausted``."""
    cfg = looptrace.Config.from_env(flush_interval=0.05)
    exporter = InMemoryExporter(cfg, [Outcome(Verdict.RETRY, "HTTP 503", retry_after=5.0)])
    retry = RetryPolicy(base_delay=0.01, max_delay=0.05, budget=1.0)
    _export.install(_export.Pipeline(cfg, retry_policy=retry, exporter=exporter))
    _spans(2)
    result = await looptrace.flush(10)
    assert result.dropped["retries_exhausted"] == 2
    assert exporter.attempts == 1


class _Held(InMemoryExporter):
    """Holds the first encode, or the first export, until the test lets it go on."""

    def __init__(self, cfg: looptrace.Config, hold: str) -> None:
        super().__init__(cfg)
        self.hold = hold
        self.reached = asyncio.Event()
        self.go_on = asyncio.Event()

    async def _held(self, step: str) -> None:
        if self.hold == step and not self.go_on.is_set():
            self.reached.set()
            await self.go_on.wait()

    async def encode(self, spans: Any) -> Any:
        await self._held("encode")
        return await super().encode(spans)

    async def export(self, chunks: Any) -> Outcome:
        await self._held("export")
        return await super().export(chunks)


@pytest.mark.parametrize("hold", ["encode", "export"])
async def test_spans_that_end_during_a_drain_gather_into_the_next_batch(hold: str) -> None:
    """A span that ends while a batch is being encoded, or while its request waits for an
    answer, waits for the next batch to gather: it is not sent alone straight after, and a
    healthy answer does not start a drain (each answer starting one would send spans one or
    two to a request)."""
    cfg = looptrace.Config.from_env(flush_interval=5.0)
    exporter = _Held(cfg, hold)
    _export.install(_export.Pipeline(cfg, retry_policy=FAST_RETRY, exporter=exporter))
    _spans(1)
    first = asyncio.ensure_future(looptrace.flush(10))
    await asyncio.wait_for(exporter.reached.wait(), 10)
    with looptrace.span("during"):
        pass
    exporter.go_on.set()
    assert (await first).ok
    for _ in range(20):  # the loop handles the answer, and anything it would start
        await asyncio.sleep(0)
    with looptrace.span("after"):
        pass
    assert (await looptrace.flush(10)).ok
    assert [[s.name for s in batch] for batch in exporter.exported] == [
        ["s0"],
        ["during", "after"],
    ]


def _large_span(**fields: Any) -> Span:
    span = Span("load", 0x77, 0x5, 0, NOW)
    span.end_ns = NOW + 10
    span.inputs = {
        "rows": [{"id": i, "name": f"item-{i}", "meta": {"r": i % 7}} for i in range(8_000)]
    }
    for name, value in fields.items():
        setattr(span, name, value)
    return span


async def test_large_spans_handed_to_workers_are_prepared_in_time_slices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Spans large enough that a worker encodes them are prepared on the loop (the
    user's hooks run there, once) inside the time slices like any other span's encoding: a
    drain of many of them yields between them instead of preparing them all in one step."""
    monkeypatch.setattr(_export.exporter, "SLICE_SECONDS", 0.0)
    cfg = looptrace.Config.from_env(
        endpoint="http://127.0.0.1:9/v1/traces", offload_threshold_bytes=1024
    )
    spans = []
    for i in range(20):
        span = Span("upload", 0x77, 0x10 + i, 0, NOW)
        span.end_ns = NOW + 10
        span.inputs = {"blob": "x" * 4096}
        spans.append(span)
    exporter = OtlpHttpExporter(cfg)
    exporter.load()
    try:
        async with LoopTurns() as turns:
            chunks = await exporter.encode(spans)
        assert exporter.offload_statistics().offloaded == 20  # each encoded by a worker
    finally:
        exporter.shutdown()
    assert all(isinstance(c, bytes) for c in chunks)
    # A pause of three turns of the loop after each span but the last, at least.
    assert turns.count >= 19 * 3


@pytest.mark.parametrize("offload", [True, False])
async def test_an_image_no_worker_takes_is_written_in_steps(
    offload: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chat request carrying a 2.5 MB image, under the size from which a worker takes it (or
    with offload off), is written on the loop in steps, the application's other tasks run in
    between: orjson's pass, the scan for secret keys, the masking and the message each held the
    loop for about a millisecond, where in one step they held it for two to four. The bytes
    are those written in one go, with the credential masked."""
    monkeypatch.setattr(_export.exporter, "SLICE_SECONDS", 0.0)
    cfg = looptrace.Config.from_env(endpoint="http://127.0.0.1:9/v1/traces", offload=offload)
    span = Span("describe", 0x77, 0x6, 0, NOW)
    span.end_ns = NOW + 10
    span.inputs = {
        "messages": [
            {"role": "user", "content": [{"image_url": {"url": "QUJD" * 625_000}}]},
        ],
        "headers": {"Authorization": "Bearer sk-live-0123"},
    }
    exporter = OtlpHttpExporter(cfg)
    exporter.load()
    try:
        async with LoopTurns() as turns:
            (chunk,) = await exporter.encode([span])
        assert exporter.offload_statistics().offloaded == 0
    finally:
        exporter.shutdown()
    # The JSON, the scan, the masking, the message: three pauses of three turns between them.
    assert turns.count >= 3 * 3
    assert isinstance(chunk, bytes)
    assert chunk == exporter.span_encoder.encode(span, exporter.span_encoder.plan(span))
    assert b"sk-live-0123" not in chunk and b"QUJDQUJD" in chunk


@pytest.mark.parametrize(
    "kind", ["otlp-protobuf", "otlp-json", "otlp-hooked", "otlp-events", "store", "memory"]
)
async def test_every_exporter_writes_a_large_structure_in_steps(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever the exporter and the route a span takes, one carrying a structure of many
    small values is written in steps with the application's other tasks run in between
    (orjson's pass, then the scan for secret keys 64 KiB at a time), and the chunk is the one
    the exporter writes in one go."""
    monkeypatch.setattr(_export.exporter, "SLICE_SECONDS", 0.0)
    # A policy that has learned no keys: one whose 64 learned keys were filled by earlier,
    # unrelated payloads scans by words, in one step (docs/serialization.md).
    import importlib

    policy_module = importlib.import_module("looptrace._serialize.policy")
    monkeypatch.setattr(policy_module, "_policies", {})
    monkeypatch.setattr(policy_module, "_last", None)
    cfg = looptrace.Config.from_env(
        endpoint="http://127.0.0.1:9/v1/traces",
        store_path=str(tmp_path / "s.db"),
        offload=False,
        encoding="json" if kind == "otlp-json" else "protobuf",
        process_inputs=(lambda v: {"kept": v}) if kind == "otlp-hooked" else None,
    )
    span = _large_span(events=[Event("e", NOW + 5)] if kind == "otlp-events" else [])
    exporter: Any
    if kind == "store":
        exporter = StoreExporter(cfg)
    elif kind == "memory":
        exporter = InMemoryExporter(cfg)
    else:
        exporter = OtlpHttpExporter(cfg)
    exporter.load()
    async with LoopTurns() as turns:
        (chunk,) = await exporter.encode([span])
    # Orjson's pass and four steps of the scan at least, each followed by three turns.
    assert turns.count >= 5 * 3
    if kind.startswith("otlp"):
        whole = exporter.span_encoder.encode(span, exporter.span_encoder.plan(span))
    else:
        whole = exporter.encode_open(span)
    if kind in ("store", "memory"):
        assert _otlp.encode_span(chunk.wire, "protobuf") == _otlp.encode_span(
            whole.wire, "protobuf"
        )
    else:
        assert bytes(chunk) == bytes(whole)
    assert len(chunk) == len(whole)
