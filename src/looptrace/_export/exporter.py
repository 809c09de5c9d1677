"""The flusher's one view of where spans go: an :class:`Exporter`, after OpenTelemetry's split
of a batch processor over a span exporter.

    exporter.load()                           once, before the first batch (imports, codec)
    chunks = await exporter.encode(spans)     on the flusher's loop, in short slices
    session = exporter.session()              one per flusher (an HTTP client is per loop)
    outcome = await session.export(chunks)    one request, or one transaction
    exporter.shutdown()

The flusher batches by count and bytes, bounds what is in flight, retries and counts drops; it
knows nothing of OTLP, HTTP, SQLite or worker processes. An exporter turns each span into a
chunk whose ``len()`` is what it weighs in a batch (exact bytes on the wire for OTLP), and says
what became of a batch of chunks as an :class:`Outcome`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import time
from collections.abc import Callable, Generator, Sequence, Sized
from typing import TYPE_CHECKING, Protocol, TypeVar

from .._errors import report_internal
from .._wire import WireSpan

if TYPE_CHECKING:
    from .._capture.spans import Span
    from .stats import OffloadStatistics

_T = TypeVar("_T")

__all__ = ["SLICE_SECONDS", "Exporter", "Outcome", "Session", "Slices", "Verdict", "encode_each"]

# An exporter's CPU work on the flusher's loop runs in slices of about this long between yields.
# A timer that falls due in a slice runs after it (and three turns of the loop): with slices
# of a millisecond, a 1 ms ticker on the application's loop was late by more than 1 ms at every
# slice it fell due in.
SLICE_SECONDS = 0.0005


class Verdict(enum.Enum):
    """What the destination did with a batch, in the terms the flusher acts on."""

    SENT = "sent"
    """Kept: the batch is done."""
    RETRY = "retry"
    """Nothing kept and no answer, or a transient refusal: send it again after a backoff."""
    TOO_LARGE = "too_large"
    """Refused for its size: split it in halves and send each at once."""
    REJECTED = "rejected"
    """Refused for good (a malformed request, a bad token): drop it and count it."""


@dataclasses.dataclass(frozen=True)
class Outcome:
    """A :class:`Verdict` with what the flusher reports and honours alongside it."""

    verdict: Verdict
    error: str = ""
    """What went wrong, short (``HTTP 503``, ``ConnectionRefusedError``): rejections are
    logged once per distinct ``error``. Never a header value."""
    detail: str = ""
    """The destination's own words, if any (the start of an HTTP error body)."""
    retry_after: float | None = None
    """The destination's own wait before the next attempt (HTTP ``Retry-After``), seconds."""

    def describe(self) -> str:
        """``error: detail``, for ``statistics().last_error``."""
        return f"{self.error}: {self.detail}" if self.detail else self.error


SENT = Outcome(Verdict.SENT)


class Session(Protocol):
    """An exporter's resources on one flusher's loop (an HTTP connection pool belongs to one
    loop). Called concurrently, up to ``max_concurrent_requests`` at once."""

    async def export(self, chunks: Sequence[Sized]) -> Outcome:
        """Deliver ``chunks`` (from :meth:`Exporter.encode`) as one unit. Never raises for a
        failure of the destination: that is an :class:`Outcome`."""
        ...

    async def aclose(self) -> None:
        """Release what the session holds; called once, on its loop."""
        ...


class Exporter(Protocol):
    """Where spans go and in what form."""

    def load(self) -> None:
        """The slow start-up (imports, building the codec). Called once, off the loop unless
        :meth:`loaded_cheaply` says it is quick."""
        ...

    def loaded_cheaply(self) -> bool:
        """Whether :meth:`load` would take well under a millisecond now (its imports done)."""
        ...

    def estimate(self, span: Span) -> int:
        """What ``span`` will weigh once encoded, cheaply, for the buffer's byte budget."""
        ...

    async def encode(self, spans: Sequence[Span]) -> list[Sized | None]:
        """One chunk per span (None: that span could not be encoded, and was reported).
        Runs on the flusher's loop and yields to it at least every millisecond."""
        ...

    def encode_open(self, span: Span) -> Sized:
        """The chunk for a span still open (an in-progress record of a long root)."""
        ...

    def session(self) -> Session:
        """A new session for the calling flusher's loop."""
        ...

    def offload_statistics(self) -> OffloadStatistics:
        """What worker processes did for this exporter (all zero when it uses none)."""
        ...

    def shutdown(self) -> None:
        """Stop background resources (worker processes). Sessions are closed separately."""
        ...


class Slices:
    """Cuts a loop over spans into slices of at most about :data:`SLICE_SECONDS`:
    ``if slices.due(): await slices.pause()`` after each span, one clock reading.

    A slice ends before the next span would take it past the limit, judged by the span just
    done: with spans of 0.6 ms, checking only whether the limit has passed would make every
    slice two spans long. ``pause`` yields three times, the steps a task asleep on a timer
    that fell due during the slice needs before it runs: the loop queues the timer's callback
    behind the flusher's next step; that callback only resolves the sleep's future, whose
    task is queued one step later again. With two yields every such tick waited for a second
    slice: ticks late by more than 1 ms under 165 KB spans came to 50-70 ms, against 20.
    """

    __slots__ = ("_last", "_started")

    def __init__(self) -> None:
        self._started = self._last = time.perf_counter()

    def due(self) -> bool:
        now = time.perf_counter()
        step, self._last = now - self._last, now
        return now - self._started + step > SLICE_SECONDS

    def restart(self) -> None:
        self._started = self._last = time.perf_counter()

    async def pause(self) -> None:
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        self._started = self._last = time.perf_counter()

    async def run(self, steps: Generator[None, None, _T]) -> _T:
        """The result of a computation that yields between its steps, run step by step
        inside the slices: a pause falls between two steps when the next would end the slice
        (the caller judges the slice before the first step and after the last, as for any
        span)."""
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            if self.due():
                await self.pause()


async def encode_each(
    spans: Sequence[Span],
    wire: Callable[[Span], WireSpan | Generator[None, None, WireSpan]],
    chunk: Callable[[WireSpan], Sized],
) -> list[Sized | None]:
    """Each span's chunk: ``chunk`` of the WireSpan that ``wire`` makes of it (at once, or
    for a span with long JSON as a generator that yields between its steps), in
    :class:`Slices`; None (reported) for a span it could not encode. The loop of an exporter
    whose every span takes the general route."""
    chunks: list[Sized | None] = [None] * len(spans)
    slices = Slices()
    for i, span in enumerate(spans):
        try:
            made = wire(span)
            chunks[i] = chunk(made if isinstance(made, WireSpan) else await slices.run(made))
        except Exception as exc:
            report_internal("pipeline.encode", exc)
        if slices.due():
            await slices.pause()
    return chunks
