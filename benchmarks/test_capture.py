"""Caller-side cost of a traced call: the same function plain, traced, and traced while
looptrace is disabled. Spans go to an in-memory list so only capture is measured here; the
scenario script ``scenario_capture.py`` measures capture with the real exporter running."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import looptrace
from looptrace import _state

CALLS = 1000


class _ListSink:
    """The cheapest possible sink, so the figure is capture alone."""

    def __init__(self) -> None:
        self.spans: list[Any] = []

    def on_start(self, span: Any) -> None:
        pass

    def on_end(self, span: Any) -> None:
        self.spans.append(span)


@pytest.fixture
def sink() -> Iterator[_ListSink]:
    saved = _state.sink
    s = _ListSink()
    _state.sink = s
    yield s
    _state.sink = saved


def work(a: int, b: str) -> int:
    return a + len(b)


async def awork(a: int, b: str) -> int:
    return a + len(b)


traced_work = looptrace.traced(work)
traced_awork = looptrace.traced(awork)


def _sync_loop(fn: Callable[[int, str], int]) -> Callable[[], None]:
    def run() -> None:
        for i in range(CALLS):
            fn(i, "payload")

    return run


def _async_loop(fn: Callable[[int, str], Any]) -> Callable[[], None]:
    loop = asyncio.new_event_loop()

    async def many() -> None:
        for i in range(CALLS):
            await fn(i, "payload")

    def run() -> None:
        loop.run_until_complete(many())

    return run


@pytest.mark.benchmark(group="sync call x1000")
def test_sync_plain(benchmark: Any) -> None:
    benchmark(_sync_loop(work))


@pytest.mark.benchmark(group="sync call x1000")
def test_sync_traced(benchmark: Any, sink: _ListSink) -> None:
    benchmark(_sync_loop(traced_work))
    assert sink.spans


@pytest.mark.benchmark(group="sync call x1000")
def test_sync_traced_disabled(benchmark: Any, sink: _ListSink, monkeypatch: Any) -> None:
    monkeypatch.setattr(_state, "disabled", True)
    benchmark(_sync_loop(traced_work))
    assert not sink.spans


@pytest.mark.benchmark(group="async call x1000")
def test_async_plain(benchmark: Any) -> None:
    benchmark(_async_loop(awork))


@pytest.mark.benchmark(group="async call x1000")
def test_async_traced(benchmark: Any, sink: _ListSink) -> None:
    benchmark(_async_loop(traced_awork))
    assert sink.spans


def _block(i: int, b: str) -> int:
    with looptrace.span("work") as s:
        s.set_inputs({"a": i, "b": b})
        out = work(i, b)
        s.set_output(out)
        return out


def _nested_block(i: int, b: str) -> int:
    with looptrace.span("outer"):
        return _block(i, b)


@pytest.mark.benchmark(group="span block x1000")
def test_span_block(benchmark: Any, sink: _ListSink) -> None:
    benchmark(_sync_loop(_block))
    assert sink.spans


@pytest.mark.benchmark(group="span block x1000")
def test_span_block_nested(benchmark: Any, sink: _ListSink) -> None:
    benchmark(_sync_loop(_nested_block))
    assert len({s.trace_id for s in sink.spans[:2]}) == 1


def items(n: int) -> Iterator[int]:
    yield from range(n)


traced_items = looptrace.traced(items)


@pytest.mark.benchmark(group="generator x1000 items")
def test_generator_plain(benchmark: Any) -> None:
    benchmark(lambda: sum(items(CALLS)))


@pytest.mark.benchmark(group="generator x1000 items")
def test_generator_traced(benchmark: Any, sink: _ListSink) -> None:
    benchmark(lambda: sum(traced_items(CALLS)))
    assert sink.spans[0].attributes == {"looptrace.generator.items": CALLS}
