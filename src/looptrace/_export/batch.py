"""A :class:`Batch`: spans that travel together in one request, and come back together when the
request fails; :func:`halves` and :func:`part` cut encoded batches."""

from __future__ import annotations

from collections.abc import Sized
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .._capture.spans import Span

__all__ = ["Batch", "halves", "part"]


class Batch:
    """Encoded spans that travel together in one request (and come back together on failure)."""

    __slots__ = (
        "attempts",
        "chunks",
        "file",
        "first_failure",
        "hi",
        "lo",
        "lost",
        "nbytes",
        "records",
        "spans",
    )

    def __init__(self, lo: int, hi: int, spans: list[Span], nbytes: int) -> None:
        self.lo = lo  # sequence numbers [lo, hi) of the real spans in this batch
        self.hi = hi
        self.spans: list[Span] | None = spans  # until encoded
        self.chunks: list[Sized] = []  # what the exporter made of the spans, once encoded
        self.nbytes = nbytes  # estimated until encoded, then exact
        self.records = 0  # extra records (in-progress) that are not counted as spans
        self.lost = 0  # spans in [lo, hi) that failed to encode (already counted as dropped)
        self.first_failure: float | None = None
        self.attempts = 0
        self.file: str | None = None  # its spool file while it is in flight (durable spool)

    @property
    def span_count(self) -> int:
        return self.hi - self.lo - self.lost

    def __repr__(self) -> str:
        return f"<Batch [{self.lo},{self.hi}) {self.nbytes}B attempts={self.attempts}>"


def halves(batch: Batch) -> list[Batch]:
    """Split a batch the destination found too large into two, keeping span order."""
    mid = len(batch.chunks) // 2
    if batch.span_count:
        # Spans that failed to encode (``lost``) stay with the first half's range.
        cut = batch.lo + batch.lost + mid
        return [
            part(batch.lo, cut, batch.chunks[:mid], batch.lost),
            part(cut, batch.hi, batch.chunks[mid:], 0),
        ]
    parts = []  # in-progress records only
    for chunks in (batch.chunks[:mid], batch.chunks[mid:]):
        piece = part(batch.lo, batch.lo, chunks, 0)
        piece.records = len(chunks)
        parts.append(piece)
    return parts


def part(lo: int, hi: int, chunks: list[Sized], lost: int) -> Batch:
    """A batch of already encoded chunks for the spans [lo, hi), ``lost`` of which failed."""
    piece = Batch(lo, hi, [], sum(len(c) for c in chunks))
    piece.spans = None
    piece.chunks = chunks
    piece.lost = lost
    return piece
