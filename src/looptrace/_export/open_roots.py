"""Roots still open, for ``sends_in_progress``: a root that has run longer than
``in_progress_after`` is sent as an in-progress record, so a long run shows up in the viewer
before it ends. A root that ends first is skipped: its one final record says it all."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from .. import _clock
from .._errors import report_internal
from .batch import Batch

if TYPE_CHECKING:
    from .._capture.spans import Span
    from .buffer import Buffer
    from .exporter import Exporter

__all__ = ["OpenRoots"]


class OpenRoots:
    """Started roots in start order; ``add`` is the sink's ``on_start`` (any thread, O(1))."""

    def __init__(self, after: float, interval: float) -> None:
        self._after = after
        self._interval = interval
        self._roots: deque[Span] = deque()
        self.add = self._roots.append

    def __bool__(self) -> bool:
        return bool(self._roots)

    def due_in(self) -> float:
        """Seconds until the oldest open root is due a record."""
        roots = self._roots
        if not roots:
            return self._interval
        age = (_clock.now_ns() - roots[0].start_ns) / 1e9
        return max(0.01, self._after - age)

    def take_due(self) -> list[Span]:
        """The open roots older than ``in_progress_after`` (each is sent once); ended roots are
        forgotten."""
        roots = self._roots
        cutoff = _clock.now_ns() - int(self._after * 1e9)
        keep: list[Span] = []
        due: list[Span] = []
        for _ in range(len(roots)):
            span = roots.popleft()
            if span.end_ns:
                continue
            (due if span.start_ns <= cutoff else keep).append(span)
        roots.extendleft(reversed(keep))
        return due

    def batch(self, exporter: Exporter, buffer: Buffer) -> Batch | None:
        """The records of the roots now due, as a batch the buffer tracks in flight (they count
        as records, not spans: each root's final record is a span like any other)."""
        chunks = []
        for span in self.take_due():
            try:
                chunks.append(exporter.encode_open(span))
            except Exception as exc:
                report_internal("pipeline.in_progress", exc)
        if not chunks:
            return None
        lo = buffer.flush_target()
        batch = Batch(lo, lo, [], sum(len(c) for c in chunks))
        batch.spans = None
        batch.chunks = chunks
        batch.records = len(chunks)
        buffer.track(batch)
        return batch
