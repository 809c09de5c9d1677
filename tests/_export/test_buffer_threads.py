"""The span buffer's byte and span counts under many producer threads, with and without a GIL."""

from __future__ import annotations

import gc
import threading

import pytest

from looptrace._capture.spans import Span
from looptrace._export import buffer as _batcher
from looptrace._export.buffer import PENDING_OVERHEAD_BYTES, Buffer


def _fill(buf: Buffer, threads: int, per_thread: int) -> None:
    start = threading.Barrier(threads)

    def produce() -> None:
        start.wait()
        for _ in range(per_thread):
            buf.push(Span("s", 1, 2, 0, 1))

    workers = [threading.Thread(target=produce) for _ in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()


@pytest.mark.parametrize("gil", [True, False])
def test_counts_stay_exact_under_concurrent_producers(
    monkeypatch: pytest.MonkeyPatch, gil: bool
) -> None:
    """Eight threads pushing at once leave exactly the spans and bytes they pushed, and taking
    them all leaves zero: on a free-threaded build (forced here) the producer path takes a
    lock; with a GIL it stays lock-free."""
    monkeypatch.setattr(_batcher, "gil_enabled", lambda: gil)
    buf = Buffer(10**6, 10**9, 10**6, 10**9, lambda s: 100, lambda: None)
    assert ("push" in vars(buf)) is (not gil)  # the locked producer path, only without a GIL
    _fill(buf, threads=8, per_thread=5_000)
    assert buf.queued_spans == 40_000
    assert buf.queued_bytes == 40_000 * (100 + PENDING_OVERHEAD_BYTES)
    batch = buf.take(10**6, 10**12)
    assert batch is not None and batch.span_count == 40_000
    assert buf.queued_spans == 0 and buf.queued_bytes == 0


def test_the_byte_budget_holds_under_concurrent_producers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a GIL, producers racing past the byte budget still leave the buffer within it,
    with every span that did not fit counted as dropped."""
    monkeypatch.setattr(_batcher, "gil_enabled", lambda: False)
    size = 100 + PENDING_OVERHEAD_BYTES
    buf = Buffer(10**6, 1_000 * size, 10**6, 10**9, lambda s: 100, lambda: None)
    _fill(buf, threads=8, per_thread=2_000)
    assert buf.queued_bytes <= 1_000 * size
    assert buf.queued_spans + buf.dropped["buffer_full"] == 16_000


@pytest.mark.parametrize("gil", [True, False])
def test_a_pending_span_adds_no_object_for_the_garbage_collector(
    monkeypatch: pytest.MonkeyPatch, gil: bool
) -> None:
    """A backlog of spans waiting to be sent (a burst faster than the export) is walked by
    every full collection of the application's garbage collector: the buffer adds nothing
    of its own per span to that walk, and its byte accounting stays exact."""
    monkeypatch.setattr(_batcher, "gil_enabled", lambda: gil)
    buf = Buffer(10**6, 10**9, 10**6, 10**9, lambda s: 100, lambda: None)
    spans = [Span("s", 1, 2 + i, 0, 1) for i in range(20_000)]
    gc.collect()
    tracked = len(gc.get_objects())
    for span in spans:
        buf.push(span)
    assert len(gc.get_objects()) - tracked < 100  # an object per span would be 20,000
    assert buf.queued_bytes == 20_000 * (100 + PENDING_OVERHEAD_BYTES)
    first = buf.take(10**6, 5_000 * (100 + PENDING_OVERHEAD_BYTES))
    assert first is not None and first.spans == spans[:5_000]
    assert buf.queued_bytes == 15_000 * (100 + PENDING_OVERHEAD_BYTES)
