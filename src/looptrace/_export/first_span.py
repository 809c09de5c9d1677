"""The sink of a process's first span on an event loop: the span waits here, and the pipeline is
built on the loop's next turn, outside the user's call.

Building the pipeline (the exporter, the flusher, its homes) inside the first span made a
process's first traced call cost about a hundred times the hundredth. The build now runs as a
callback of its own: on the loop still, but charged to looptrace (the lag monitor names a
callback made only of looptrace's frames as looptrace's own), not to the user's span.
``flush``, ``shutdown``, ``statistics`` and the exit handler build it at once if it has not
run yet, so no span waits past them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from .. import _state
from .._capture.spans import UNSET
from .._capture.start import sampled_out
from .._errors import internal_error

if TYPE_CHECKING:
    from .._capture.spans import Span

__all__ = ["Deferred"]

# Spans that wait, at most: past this (a burst before the loop turns) the pipeline is built in
# the call that brings one more, as it was before any waited.
MAX_WAITING = 4096


class Deferred:
    """Holds spans, in order, until :meth:`run` builds the pipeline (``start`` returns the sink
    that takes them), then passes every later span straight to that sink."""

    __slots__ = ("_ends", "_lock", "_sink", "_start", "_starts")

    def __init__(self, start: Callable[[], _state.Sink]) -> None:
        self._start = start
        self._lock = threading.Lock()
        self._starts: list[Span] = []
        self._ends: list[Span] = []
        self._sink: _state.Sink | None = None

    def on_start(self, span: Span) -> None:
        sink = self._wait(self._starts, span)
        if sink is not None:
            sink.on_start(span)

    def on_end(self, span: Span) -> None:
        sink = self._wait(self._ends, span)
        if sink is not None:
            sink.on_end(span)

    def _wait(self, waiting: list[Span], span: Span) -> _state.Sink | None:
        """None when ``span`` now waits; else the sink to hand it to."""
        with self._lock:
            if self._sink is None and len(self._starts) + len(self._ends) < MAX_WAITING:
                waiting.append(span)
                return None
        return self.run()

    def run(self) -> _state.Sink:
        """Build the pipeline (once) and hand it the spans that waited; the sink from now on.

        The spans are handed over under the lock, so a span that ends meanwhile on another
        thread goes after them."""
        with self._lock:
            sink = self._sink
            if sink is not None:
                return sink
            recorded_with = _switches()
            try:
                sink = self._start()
            except Exception as exc:
                internal_error("pipeline.start", exc)
                sink = _state.NullSink()
            self._sink = sink
            starts, ends = self._starts, self._ends
            self._starts, self._ends = [], []
            try:
                if _switches() != recorded_with:
                    resampled = _state.sample_threshold != recorded_with[1]
                    starts = [span for span in starts if _held_to_settings(span, resampled)]
                    ends = [span for span in ends if _held_to_settings(span, resampled)]
                for span in starts:
                    sink.on_start(span)
                for span in ends:
                    sink.on_end(span)
            except Exception as exc:
                internal_error("pipeline.start", exc)
            return sink


def _switches() -> tuple[bool, int, bool, bool]:
    return (
        _state.disabled,
        _state.sample_threshold,
        _state.capture_inputs,
        _state.capture_outputs,
    )


def _held_to_settings(span: Span, resampled: bool) -> bool:
    """Whether a span that waited stays, under the settings read when the pipeline was built:
    they may differ from those read as ``@traced`` decorated (a program that sets its variables
    after its imports). With a new sample rate, its trace sampled out drops it, as it would
    have been had the settings been read first (a remote parent's sampled flag is not known
    here: the local ratio decides); inputs and outputs the settings do not keep are forgotten."""
    if _state.disabled or (resampled and sampled_out(span.trace_id)):
        return False
    site = span.site
    if site is not None:
        keep = site.capture_inputs
        if not (keep if keep is not None else _state.capture_inputs):
            span.inputs = UNSET
        keep = site.capture_output
        if not (keep if keep is not None else _state.capture_outputs):
            span.output = UNSET
    return True
