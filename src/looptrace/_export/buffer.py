"""The buffer between capture and the flusher: pending spans and in-flight batches, apart.

    producers (any thread)                 flusher (one loop, or two during a hand-off)
    push(span) --append--> raw deque --take()--> Batch (in flight) --sent()--> gone
                                    ^                   |
                 retry list (Batch) +---- returned() ---+  (failed sends, original order)

Every span gets a sequence number implicitly: its position in the raw deque since the buffer was
created (``_out_count`` is the sequence number of the deque's head). Batches carry the contiguous
range of sequence numbers they hold, so ``flush`` can wait for "every span before mine" without
touching spans one by one.

Counts and byte totals are plain integers, so every figure is an O(1) read. The producer path
(``push``) takes no lock: ``deque.append`` is atomic and its two ``+=`` on integer attributes
cannot be interleaved by another thread under the GIL (there is no eval-breaker check between the
load and the store). Everything the consumer does, and the rare producer path (buffer full, or a
threshold crossed), runs under ``_lock``, held only for pointer moves.

On a free-threaded build (``sys._is_gil_enabled()`` false) two producers can interleave those
``+=``, so there the producer path takes a lock of its own (``_push_lock``) around the append
and the count; the consumer reads the count under ``_lock`` as before.
"""

from __future__ import annotations

import collections
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from .batch import Batch

if TYPE_CHECKING:
    from .._capture.spans import Span

# invalid_config: spans ended while the settings in the environment could not be used, so no
# pipeline could start (see ``_export.Misconfigured``).
DROP_REASONS = ("buffer_full", "rejected", "retries_exhausted", "shutdown", "invalid_config")

# Until ``_serialize.estimate_size`` is loaded (off the caller's path), a span is assumed to
# weigh this much.
FALLBACK_SPAN_BYTES = 512
# What a pending span costs in memory beyond its estimated encoded size: the Span object's own
# slots and its deque slot. Counted so that the byte budget bounds memory, not just the bytes
# the spans will have on the wire.
PENDING_OVERHEAD_BYTES = 160


def gil_enabled() -> bool:
    """Whether this interpreter runs with a GIL (every build before 3.13's free-threaded one)."""
    check = getattr(sys, "_is_gil_enabled", None)
    return True if check is None else bool(check())


class Buffer:
    """Pending spans (raw, FIFO), batches waiting for a retry, and batches in flight."""

    def __init__(
        self,
        max_spans: int,
        max_bytes: int,
        batch_spans: int,
        batch_bytes: int,
        estimate: Callable[[Span], int] | None,
        on_crossing: Callable[[], None],
        on_drop: Callable[[str, int], None] | None = None,
    ) -> None:
        """``on_crossing``: a producer crossed a threshold (wake or start a flusher);
        ``on_drop(reason, count)``: spans were dropped, already counted (said, and waiters
        woken, by whoever owns the buffer). Both are called outside the lock."""
        self.max_spans = max_spans
        self.max_bytes = max_bytes
        self.batch_spans = batch_spans
        self.batch_bytes = batch_bytes
        self._estimate = estimate
        self._on_crossing = on_crossing
        self._on_drop: Callable[[str, int], None] = on_drop or _no_drop_hook
        self._closed = False  # closed: a span pushed now is dropped (``shutdown``) at once
        self._lock = threading.Lock()
        self._q: collections.deque[Span] = collections.deque()
        # Written by producers only (lock-free, see the module docstring).
        self._in_bytes = 0
        # Written under the lock only.
        self._out_count = 0  # raw spans that left the deque (taken or dropped)
        self._out_bytes = 0
        self._retry: list[Batch] = []  # sorted by lo: the oldest spans first
        self._retry_spans = 0
        self._retry_bytes = 0
        self._in_flight: dict[int, Batch] = {}
        self._in_flight_spans = 0
        self._in_flight_bytes = 0
        self.dropped: dict[str, int] = dict.fromkeys(DROP_REASONS, 0)
        self.spans_sent = 0
        self.records_sent = 0
        self.spooled_spans = 0  # written to the spool instead of being dropped
        # When the producer leaves the fast path: count or bytes past these.
        self._armed = True  # the next crossing calls on_crossing (cleared when it does)
        self._idle_wake = 1  # the flusher is idle: the first span is a crossing
        self._slow_count = 0  # 0: the very next push takes the slow path (starts the flusher)
        self._slow_bytes = 0
        self._push_lock = threading.Lock()
        if not gil_enabled():
            self.push = self._push_locked  # type: ignore[method-assign]

    # -- producer side --
    def push(self, span: Span) -> None:
        """Take ownership of an ended span. O(1), no lock on the common path."""
        est = self._estimate
        size = (est(span) if est is not None else FALLBACK_SPAN_BYTES) + PENDING_OVERHEAD_BYTES
        span.pending_bytes = size
        q = self._q
        q.append(span)
        self._in_bytes += size
        if len(q) >= self._slow_count or self._in_bytes >= self._slow_bytes:
            self._slow_path()

    def _push_locked(self, span: Span) -> None:
        """:meth:`push` where no GIL makes the append and the count one step."""
        est = self._estimate
        size = (est(span) if est is not None else FALLBACK_SPAN_BYTES) + PENDING_OVERHEAD_BYTES
        span.pending_bytes = size
        q = self._q
        with self._push_lock:
            q.append(span)
            self._in_bytes += size
            slow = len(q) >= self._slow_count or self._in_bytes >= self._slow_bytes
        if slow:
            self._slow_path()

    def _slow_path(self) -> None:
        with self._lock:
            q = self._q
            if self._closed:
                # The pipeline has stopped: a span that ends now (a thread that read the sink
                # just before it was replaced) is counted, not kept where nobody sends it.
                late = len(q)
                self._out_count += late
                self._out_bytes = self._in_bytes
                q.clear()
                self.dropped["shutdown"] += late
                self._slow_count = 0
                crossing = False
                dropped = 0
            else:
                late = 0
                dropped = self._shed()
                crossing = self._armed and (
                    len(q) >= (1 if self._idle_wake else self.batch_spans)
                    or self._in_bytes - self._out_bytes >= self.batch_bytes
                )
                if crossing:
                    self._armed = False
                self._rearm_thresholds()
        if crossing:
            self._on_crossing()
        if dropped:
            self._on_drop("buffer_full", dropped)
        if late:
            self._on_drop("shutdown", late)

    def _shed(self) -> int:
        """Under the lock: drop the oldest pending spans (batches waiting for a retry first,
        then raw spans) until the pending count and bytes are within their budgets; returns
        how many were dropped, already counted as ``buffer_full``."""
        dropped = 0
        q = self._q
        while len(q) + self._retry_spans > self.max_spans or (
            self._in_bytes - self._out_bytes + self._retry_bytes > self.max_bytes
        ):
            if self._retry and (len(self._retry) > 1 or q):
                batch = self._retry.pop(0)
                self._retry_spans -= batch.span_count
                self._retry_bytes -= batch.nbytes
                dropped += batch.span_count
            elif len(q) > 1:
                self._out_count += 1
                self._out_bytes += q.popleft().pending_bytes
                dropped += 1
            else:
                break  # one span or batch over the byte budget still goes out
        if dropped:
            self.dropped["buffer_full"] += dropped
        return dropped

    def _rearm_thresholds(self) -> None:
        # Under the lock. While armed, wake at a batch's worth; once the flusher has been told,
        # only the hard limits matter until it drains.
        if self._closed:
            self._slow_count = 0
            return
        room_spans = self.max_spans - self._retry_spans
        room_bytes = self._out_bytes + self.max_bytes - self._retry_bytes
        if self._armed:
            self._slow_count = min(self._idle_wake or self.batch_spans, room_spans + 1)
            self._slow_bytes = min(self._out_bytes + self.batch_bytes, room_bytes + 1)
        else:
            self._slow_count = room_spans + 1
            self._slow_bytes = room_bytes + 1

    def use_estimate(self, estimate: Callable[[Span], int]) -> None:
        """Weigh spans with the exporter's estimate from now on (loaded off the caller's path:
        until then, :data:`FALLBACK_SPAN_BYTES`)."""
        self._estimate = estimate

    def close(self) -> None:
        """Take no span any more: each one pushed from now on is dropped and counted as
        ``shutdown`` (what is still held is for the owner to drop or spool)."""
        with self._lock:
            self._closed = True
            self._slow_count = 0

    def arm(self, first_span: bool = False) -> bool:
        """The flusher drained: tell it about the next crossing again.

        With ``first_span`` the very next push counts as a crossing (the flusher goes idle and
        sleeps without a timer). Returns True when spans are already pending.
        """
        with self._lock:
            self._armed = True
            self._idle_wake = 1 if first_span else 0
            self._rearm_thresholds()
            return bool(self._q) or bool(self._retry)

    def batch_pending(self) -> bool:
        """Whether a batch's worth (by count or by estimated bytes) is pending now."""
        return (
            len(self._q) >= self.batch_spans or self._in_bytes - self._out_bytes >= self.batch_bytes
        )

    def force_slow_path(self) -> None:
        """Make the next push take the slow path (no flusher is running)."""
        with self._lock:
            self._armed = True
            self._idle_wake = 1
            self._slow_count = 0

    # -- consumer side --
    def take_retry(self) -> Batch | None:
        """The oldest batch waiting for a retry, now in flight."""
        with self._lock:
            if not self._retry:
                return None
            batch = self._retry.pop(0)
            self._retry_spans -= batch.span_count
            self._retry_bytes -= batch.nbytes
            self._add_in_flight(batch)
            return batch

    def take(self, max_spans: int, max_bytes: int, end: int | None = None) -> Batch | None:
        """Up to ``max_spans`` raw spans / ``max_bytes`` estimated bytes, oldest first, now in
        flight (at least one span when any is pending); with ``end``, only spans whose sequence
        number is below it."""
        with self._lock:
            q = self._q
            lo = self._out_count
            if end is not None:
                max_spans = min(max_spans, end - lo)
            if not q or max_spans <= 0:
                return None
            spans: list[Span] = []
            nbytes = 0
            popleft = q.popleft
            while q and len(spans) < max_spans:
                if spans and nbytes + q[0].pending_bytes > max_bytes:
                    break
                span = popleft()
                spans.append(span)
                nbytes += span.pending_bytes
            self._out_count += len(spans)
            self._out_bytes += nbytes
            batch = Batch(lo, lo + len(spans), spans, nbytes)
            self._add_in_flight(batch)
            self._rearm_thresholds()
            return batch

    def track(self, batch: Batch) -> None:
        """Count a batch made by the flusher itself (in-progress records) as in flight."""
        with self._lock:
            self._add_in_flight(batch)

    def _add_in_flight(self, batch: Batch) -> None:
        self._in_flight[id(batch)] = batch
        self._in_flight_spans += batch.span_count
        self._in_flight_bytes += batch.nbytes

    def _remove_in_flight(self, batch: Batch) -> bool:
        if self._in_flight.pop(id(batch), None) is None:
            return False
        self._in_flight_spans -= batch.span_count
        self._in_flight_bytes -= batch.nbytes
        return True

    def resize(self, batch: Batch, nbytes: int) -> None:
        """The batch is encoded: its in-flight bytes become exact."""
        with self._lock:
            if id(batch) in self._in_flight:
                self._in_flight_bytes += nbytes - batch.nbytes
            batch.nbytes = nbytes

    def replace(self, batch: Batch, parts: list[Batch]) -> None:
        """Swap an in-flight batch for the parts it was split into. A batch no longer in
        flight (handed to another thread meanwhile) puts none of its parts there."""
        with self._lock:
            if self._remove_in_flight(batch):
                for part in parts:
                    self._add_in_flight(part)

    def sent(self, batch: Batch) -> None:
        with self._lock:
            if self._remove_in_flight(batch):
                self.spans_sent += batch.span_count
                self.records_sent += len(batch.chunks)

    def returned(self, batch: Batch) -> None:
        """A send failed: the batch goes back to pending, ahead of newer spans, in order. Once
        the buffer is closed nobody sends it any more: it is dropped (``shutdown``)."""
        late = dropped = 0
        with self._lock:
            if not self._remove_in_flight(batch):
                return
            if batch.span_count == 0 and batch.records == 0:
                return
            if self._closed:
                # A flusher still winding down after the pipeline closed (the deadline passed
                # while it encoded) hands back what it held: counted, not kept.
                late = batch.span_count
                self.dropped["shutdown"] += late
            else:
                i = len(self._retry)
                while i > 0 and self._retry[i - 1].lo > batch.lo:
                    i -= 1
                self._retry.insert(i, batch)
                self._retry_spans += batch.span_count
                self._retry_bytes += batch.nbytes
                # Failed sends come back as encoded batches while new spans keep arriving: the
                # budget holds here too, not only at the next push.
                dropped = self._shed()
                self._rearm_thresholds()
        if dropped:
            self._on_drop("buffer_full", dropped)
        if late:
            self._on_drop("shutdown", late)

    def drop(self, batch: Batch, reason: str) -> int:
        """Give up on an in-flight batch; returns how many spans were dropped."""
        with self._lock:
            if not self._remove_in_flight(batch):
                return 0
            self.dropped[reason] = self.dropped.get(reason, 0) + batch.span_count
        if batch.span_count:
            self._on_drop(reason, batch.span_count)
        return batch.span_count

    def spooled(self, batch: Batch) -> int:
        """An in-flight batch is in the spool now: resolved, neither sent nor dropped."""
        with self._lock:
            if not self._remove_in_flight(batch):
                return 0
            self.spooled_spans += batch.span_count
        return batch.span_count

    def take_everything(self) -> tuple[list[Span], list[Batch]]:
        """Everything still held, oldest first, out of the buffer (to go to the spool): the
        raw spans pending, and the batches waiting for a retry or in flight (still counted as
        in flight until :meth:`spooled` or :meth:`drop`)."""
        with self._lock, self._push_lock:
            spans = list(self._q)
            self._out_count += len(self._q)
            self._out_bytes = self._in_bytes
            self._q.clear()
            for batch in self._retry:
                self._add_in_flight(batch)
            self._retry.clear()
            self._retry_spans = self._retry_bytes = 0
            self._rearm_thresholds()
            batches = sorted(self._in_flight.values(), key=lambda b: b.lo)
        return spans, batches

    def count_drop(self, reason: str, count: int) -> None:
        """Spans lost outside any batch (they failed to encode)."""
        with self._lock:
            self.dropped[reason] = self.dropped.get(reason, 0) + count
        self._on_drop(reason, count)

    def drop_pending(self, reason: str) -> int:
        """Drop everything pending (shutdown deadline passed)."""
        with self._lock, self._push_lock:
            count = len(self._q) + self._retry_spans
            self._out_count += len(self._q)
            self._out_bytes = self._in_bytes
            self._q.clear()
            self._retry.clear()
            self._retry_spans = self._retry_bytes = 0
            self.dropped[reason] = self.dropped.get(reason, 0) + count
            self._rearm_thresholds()
        if count:
            self._on_drop(reason, count)
        return count

    def drop_in_flight(self, reason: str) -> int:
        """Drop every in-flight batch (their senders are gone: shutdown deadline passed)."""
        with self._lock:
            count = self._in_flight_spans
            self._in_flight.clear()
            self._in_flight_spans = self._in_flight_bytes = 0
            self.dropped[reason] = self.dropped.get(reason, 0) + count
        if count:
            self._on_drop(reason, count)
        return count

    # -- reading --
    def flush_target(self) -> int:
        """The sequence number after the last span pushed so far."""
        return self._out_count + len(self._q)

    def watermark(self) -> int:
        """Every span with a sequence number below this is resolved (sent or dropped)."""
        with self._lock:
            low = self._out_count
            for batch in self._retry:
                if batch.span_count and batch.lo < low:
                    low = batch.lo
            for batch in self._in_flight.values():
                if batch.span_count and batch.lo < low:
                    low = batch.lo
            return low

    def unresolved_before(self, target: int) -> int:
        """How many spans below ``target`` are still pending or in flight."""
        with self._lock:
            count = max(0, target - self._out_count)
            for batch in (*self._retry, *self._in_flight.values()):
                if batch.lo < target:
                    count += min(batch.hi, target) - batch.lo
            return count

    @property
    def queued_spans(self) -> int:
        return len(self._q) + self._retry_spans

    @property
    def queued_bytes(self) -> int:
        return self._in_bytes - self._out_bytes + self._retry_bytes

    @property
    def in_flight_batches(self) -> int:
        return len(self._in_flight)

    @property
    def in_flight_spans(self) -> int:
        return self._in_flight_spans

    @property
    def in_flight_bytes(self) -> int:
        return self._in_flight_bytes

    @property
    def outstanding_bytes(self) -> int:
        """What backpressure counts: bytes pending plus bytes in flight, never bytes acknowledged."""
        return self._in_bytes - self._out_bytes + self._retry_bytes + self._in_flight_bytes

    def idle(self) -> bool:
        """Nothing pending and nothing in flight."""
        return not self._q and not self._retry and not self._in_flight

    def has_pending(self) -> bool:
        return bool(self._q) or bool(self._retry)


def _no_drop_hook(reason: str, count: int) -> None:
    pass
