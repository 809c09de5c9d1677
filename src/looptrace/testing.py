"""Test helpers for code that uses looptrace: capture spans in memory, with predictable ids and
times, and assert on them.

    from looptrace.testing import capture_spans

    def test_my_code():
        with capture_spans() as spans:
            my_traced_function(3)
        assert [s.name for s in spans] == ["my_traced_function"]

The same capture is available as the ``looptrace_spans`` pytest fixture, registered by the
looptrace pytest plugin (it works even when ``--looptrace`` is off).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Iterator
from typing import Any

from . import _clock, _export, _state
from ._capture.spans import Span

# Imported for its wiring: it registers how the lag monitor follows each configuration.
_ = _export

__all__ = ["InMemorySink", "SpanCapture", "capture_spans", "deterministic_ids"]


class InMemorySink:
    """A sink that keeps every ended span in a list, in the order they ended."""

    def __init__(self, spans: list[Span] | None = None) -> None:
        self.spans: list[Span] = [] if spans is None else spans
        self.started: list[Span] = []
        self._lock = threading.Lock()

    def on_start(self, span: Span) -> None:
        with self._lock:
            self.started.append(span)

    def on_end(self, span: Span) -> None:
        with self._lock:
            self.spans.append(span)

    def clear(self) -> None:
        with self._lock:
            self.spans.clear()
            self.started.clear()


class SpanCapture(list[Span]):
    """The spans ended inside a :func:`capture_spans` block, in the order they ended."""

    def by_name(self, name: str) -> Span:
        """The one span called ``name`` (AssertionError when there are none or several)."""
        found = [s for s in self if s.name == name]
        assert len(found) == 1, (
            f"expected one span named {name!r}, found {len(found)}: {self.names()}"
        )
        return found[0]

    def names(self) -> list[str]:
        return [s.name for s in self]

    def roots(self) -> list[Span]:
        return [s for s in self if s.parent_span_id == 0]

    def children(self, parent: Span) -> list[Span]:
        return [
            s for s in self if s.parent_span_id == parent.span_id and s.trace_id == parent.trace_id
        ]

    def tree(self) -> list[tuple[int, str]]:
        """(depth, name) pairs in start order, depth first: handy for one-line assertions."""
        out: list[tuple[int, str]] = []

        def walk(span: Span, depth: int) -> None:
            out.append((depth, span.name))
            for child in sorted(self.children(span), key=lambda s: (s.start_ns, s.span_id)):
                walk(child, depth + 1)

        for root in sorted(self.roots(), key=lambda s: (s.start_ns, s.span_id)):
            walk(root, 0)
        return out


@contextlib.contextmanager
def deterministic_ids(
    start_ns: int = 1_700_000_000_000_000_000, step_ns: int = 1_000
) -> Iterator[None]:
    """Inside the block trace ids count 1, 2, 3..., span ids likewise, and the clock advances
    ``step_ns`` on every reading, so spans compare equal across runs."""
    traces = itertools.count(1)
    spans = itertools.count(1)
    ticks = itertools.count(0)
    saved = (_clock.new_trace_id, _clock.new_span_id, _clock.now_ns)
    _clock.new_trace_id = lambda: next(traces)
    _clock.new_span_id = lambda: next(spans)
    _clock.now_ns = lambda: start_ns + next(ticks) * step_ns
    try:
        yield
    finally:
        _clock.new_trace_id, _clock.new_span_id, _clock.now_ns = saved


@contextlib.contextmanager
def capture_spans(*, deterministic: bool = False, **config: Any) -> Iterator[SpanCapture]:
    """Send every span ended in the block to a list instead of the pipeline.

    ``config`` overrides capture settings for the block (``sample_rate``, ``capture_inputs``...);
    ``deterministic=True`` also makes ids and times predictable (see :func:`deterministic_ids`).
    """
    from ._config import Config

    saved_sink, saved_config = _state.sink, _state.config
    capture = SpanCapture()
    # The capture is the sink's own list, so it fills live, as spans end inside the block.
    sink = InMemorySink(capture)
    base = saved_config if saved_config is not None else Config.from_env()
    _state.apply_config(base.replace(**{"disabled": False, **config}))
    _state.sink = sink
    ctx = deterministic_ids() if deterministic else contextlib.nullcontext()
    try:
        with ctx:
            yield capture
    finally:
        _state.sink = saved_sink
        if saved_config is not None:
            _state.apply_config(saved_config)
        else:
            _state.config = None
            _state.apply_config(base)
            _state.config = None
