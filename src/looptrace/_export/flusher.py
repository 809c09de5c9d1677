"""The flusher: ended spans -> buffer -> batches -> an :class:`~.exporter.Exporter`, several
batches in flight.

    span.end() -> Pipeline.on_end = Buffer.push     (any thread; O(1), no lock, no I/O)
        | a batch's worth pending, or the first span after idle: kick the flusher (once)
        v
    flusher task (a :class:`~.homes.Home`: the app's running asyncio loop, else a private loop
    in a daemon thread) -- every flush_interval or on a kick, drains everything pending:
        take <= max_batch_spans / max_batch_bytes -> Exporter.encode (in ~1 ms slices)
        -> split by exact size -> Session.export, up to max_concurrent_requests at once;
        the next batch is taken while others fly, and while a worker process encodes the
        large spans of one (the batch's own task waits for them, then sends it).
    RETRY returns a batch to the buffer (ahead of newer spans) and backs off, one probe at a
    time while the destination fails; TOO_LARGE splits it; REJECTED drops it; the retry
    budget bounds it all.

:class:`~.pipeline.Pipeline` makes a flusher and adds what callers use (flush, backpressure,
shutdown, statistics); the buffer is the flusher's, made with the flusher's hooks (a crossing
wakes a home, a drop is said and wakes waiters); the pipeline's :class:`~.lifecycle.Lifecycle`
says whether the flushers run, stop once nothing is held, or are closed.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Sequence, Sized
from typing import TYPE_CHECKING

from .._capture.context import suppress_tracing
from .._errors import report_internal
from .._transport import off_loop
from .batch import Batch, halves, part
from .buffer import Buffer
from .exporter import Exporter, Outcome, Verdict
from .homes import Home, Homes, Waiter, wait_event
from .lifecycle import Lifecycle
from .open_roots import OpenRoots
from .retry import Health
from .stats import DropLog

if TYPE_CHECKING:
    from .._capture.spans import Span
    from .._config import Config
    from .spool import Spool

# What an exporter's encode_begun gives: the chunks so far, and what fills in the rest.
_Begun = tuple[list[Sized | None], Callable[[], Awaitable[None]] | None]

logger = logging.getLogger("looptrace")

LoopHook = Callable[["Config", asyncio.AbstractEventLoop], None]
# Run when an application's loop goes away under its flusher; the wiring puts the lag
# monitor's last summary window here.
ON_LOOP_END: list[LoopHook] = []


def _unlearned(spans: Sequence[Span], chunks: Sequence[Sized | None]) -> None:
    """Until the codec is loaded there is no estimate to teach."""


class Flusher:
    """One buffer, the flushers (:class:`~.homes.Homes`) that drain it, and the exporter they
    hand batches to. Made by a :class:`~.pipeline.Pipeline`, which owns the lifecycle and
    offers what callers use (flush, backpressure, shutdown, statistics)."""

    def __init__(
        self,
        cfg: Config,
        exporter: Exporter,
        health: Health,
        lifecycle: Lifecycle,
        spool: Callable[[Flusher], Spool] | None = None,
    ) -> None:
        self.cfg = cfg
        self.exporter = exporter
        self.health = health
        self.lifecycle = lifecycle
        self._lock = threading.Lock()  # the waiters
        self._waiters: list[Waiter] = []
        self.drops = DropLog()
        self.quiet = False  # the exit reports what was lost in one line of its own
        self.codec_loaded = False
        self._learn_sizes: Callable[[Sequence[Span], Sequence[Sized | None]], None] = _unlearned
        # Until the codec is loaded (in a worker thread, by the first drain: importing it on the
        # caller's first span would stall it) spans are estimated at a fixed size.
        self.buffer = Buffer(
            cfg.max_buffer_spans,
            cfg.max_buffer_bytes,
            cfg.max_batch_spans,
            cfg.max_batch_bytes,
            None,
            self._on_crossing,
            self._on_drop,
        )
        self.homes = Homes(self._run_home, cfg.max_concurrent_requests)
        self.roots = OpenRoots(cfg.in_progress_after, cfg.flush_interval)
        # Where what cannot be sent goes (see .spool): made last, it reads the buffer.
        self.spool: Spool | None = spool(self) if spool is not None else None
        # The longest backoff wait: with a durable spool, pending spans are written at each
        # flush interval, so the flusher looks that often.
        self._longest_wait = (
            cfg.flush_interval if self.spool is not None and cfg.spool_durable else float("inf")
        )

    def __repr__(self) -> str:
        return f"<looptrace Flusher -> {self.exporter!r} queued={self.buffer.queued_spans}>"

    # ------------------------------------------------------------------ the exporter's codec
    async def ensure_codec(self) -> None:
        if self.codec_loaded:
            return
        if self.exporter.loaded_cheaply():
            # configure() did the slow part (imports, the redaction patterns): the rest takes
            # a fraction of a millisecond, less than starting a thread to do it in, and a
            # thread doing Python work holds the GIL against this loop for up to 5 ms at a time.
            self.exporter.load()
        else:
            # Imports and the patterns take tens of milliseconds: off the loop, while the
            # first batch gathers.
            await off_loop(self.exporter.load)
        self.buffer.use_estimate(self.exporter.estimate)
        # Loaded with the codec, never at import: the estimate's record of large spans.
        from .._serialize import learn_sizes

        self._learn_sizes = learn_sizes
        self.codec_loaded = True

    # ------------------------------------------------------------------ homes
    def _on_crossing(self) -> None:
        """A producer crossed a threshold (or there was no flusher): wake or start one."""
        home = self.homes.primary
        if home is not None and home.alive():
            home.kick()
            return
        # A new flusher starts by letting a batch gather for one interval: no kick.
        self.homes.ensure()

    async def _run_home(self, home: Home) -> None:
        with suppress_tracing():
            try:
                await self.ensure_codec()
                await self._flusher_loop(home)
            except asyncio.CancelledError:
                if not home.stopping and home.loop is not None:
                    # The application's loop is going away (asyncio.run ending): never start a
                    # flusher on it again; what it held goes to the private thread.
                    self.homes.loop_went_away(home.loop)
                    for hook in ON_LOOP_END:
                        hook(self.cfg, home.loop)
                raise
            finally:
                await self._wind_down(home)

    async def _wind_down(self, home: Home) -> None:
        for task in list(home.senders):
            task.cancel()
        if home.senders:
            await asyncio.gather(*home.senders, return_exceptions=True)
        # What this loop still holds: batches whose sender was cancelled before its first step
        # (asyncio.run cancels every task at once) or that never got a slot. None of them can
        # be sent from here now, so they go back to pending.
        for batch in list(home.sending):
            self.buffer.returned(batch)
        home.sending.clear()
        session, home.session = home.session, None
        if session is not None:
            try:
                await asyncio.wait_for(session.aclose(), 1.0)
            except (Exception, asyncio.CancelledError):
                pass
        others = self.homes.forget(home)
        home.done.set()
        if self.lifecycle.closing:
            if not others:
                self.close_down()
        elif not home.stopping and not self.buffer.idle():
            self.homes.ensure(prefer_thread=True).kick(urgent=home.urgent)
        elif not others:
            # Nobody flushes now: the next span starts a flusher wherever it ends.
            self.buffer.force_slow_path()
        self.notify()

    def close_down(self, wait: float | None = None) -> None:
        """The last flusher has stopped, or the deadline passed: what is still held goes to
        the spool or is dropped, counted and said once; the buffer takes no span any more.
        Another thread may be doing it already (a flusher that stopped): with ``wait``, wait
        that long for it to finish, so that what the caller reads next is the final count."""
        if not self.lifecycle.close():
            if wait is not None:
                self.lifecycle.wait_closed(wait)
            return
        if self.spool is not None:
            self.spool.close()  # what is still held goes to the spool
        self.buffer.close()
        pending = self.buffer.drop_pending("shutdown")
        in_flight = self.buffer.drop_in_flight("shutdown")
        self.drops.close()
        self.exporter.shutdown()
        if (pending or in_flight) and not self.quiet:
            logger.warning(
                "looptrace: shutdown deadline passed with %d span(s) unsent to %s (%d queued, "
                "%d in flight); last error: %s",
                pending + in_flight,
                self.health.where,
                pending,
                in_flight,
                self.health.last_error or "none",
            )
        self.lifecycle.closed_down()
        self.notify()

    # ------------------------------------------------------------------ the flusher
    async def _flusher_loop(self, home: Home) -> None:
        assert home.event is not None
        event = home.event
        interval = self.cfg.flush_interval
        tracking = self.cfg.sends_in_progress
        health = self.health
        while True:
            closing = self.lifecycle.closing
            if closing:
                if self.buffer.idle():
                    return  # _wind_down collects the sender tasks that are finishing
                home.urgent = True
            idle = not self.buffer.has_pending() and not (tracking and self.roots)
            pending = self.buffer.arm(first_span=idle)
            if home.urgent and pending:
                pass  # a flush or shutdown is waiting: drain now
            elif idle and not pending:
                # Nothing to send: sleep without a timer until a span (or an answer) arrives.
                if closing:
                    await wait_event(event, interval)
                else:
                    await event.wait()
                event.clear()
                if not home.urgent:
                    # Let a batch gather, for an interval or until a batch's worth (by count
                    # or by bytes) is pending, whichever comes first: large spans go out as
                    # they come, not an interval's worth at a time.
                    self.buffer.arm()
                    if not self.buffer.batch_pending():
                        await wait_event(event, self._until_retry(interval))
            else:
                timeout = interval
                if tracking and self.roots:
                    timeout = min(timeout, self.roots.due_in())
                await wait_event(event, self._until_retry(timeout))
            event.clear()
            backoff = health.retry_at - time.monotonic()
            if backoff > 0:
                await wait_event(event, min(backoff, self._longest_wait))
                event.clear()
            home.urgent = False
            await self._drain(home)

    def _until_retry(self, timeout: float) -> float:
        """``timeout``, cut short by a retry that falls due first: it goes at its time (a
        server's Retry-After to the millisecond), not when a batch would have gathered."""
        backoff = self.health.retry_at - time.monotonic()
        return min(timeout, backoff) if backoff > 0 else timeout

    async def _drain(self, home: Home) -> None:
        """Send everything pending now, as slots free up; never wait for a request otherwise."""
        assert home.slots is not None
        slots, cfg = home.slots, self.cfg
        if self.spool is not None:
            await self.spool.relieve()
        if self.roots and cfg.sends_in_progress:
            records = self.roots.batch(self.exporter, self.buffer)
            if records is not None:
                home.sending.add(records)
                await slots.acquire()
                self._spawn(home, records)
        health = self.health
        # The spans pending now: those that end while this drain encodes wait for the next
        # one, so that they gather into a batch rather than trail this one in a request or two.
        end = self.buffer.flush_target()
        while health.retry_at <= time.monotonic():
            if health.failing and self.buffer.in_flight_batches:
                # The backend is failing: one request probes it at a time. Its answer wakes
                # this flusher; a success sends everything queued at once.
                return
            await self._acquire_slot(home)
            batch = self.buffer.take_retry()
            if batch is None:
                batch = self.buffer.take(cfg.max_batch_spans, cfg.max_batch_bytes, end)
                if batch is None:
                    slots.release()
                    return
            elif batch.spans is None:
                self._spawn(home, batch)  # encoded: a send that failed, or one never begun
                continue
            home.encoding[batch] = batch.spans or []
            try:
                encoded = await self._encode_begun(batch)
            except BaseException:
                slots.release()
                self.buffer.returned(batch)
                raise
            finally:
                home.encoding.pop(batch, None)
            if callable(encoded):
                # Spans a worker encodes: a task of their own waits for them and sends the
                # batch, holding the slot, while this drain takes the next one.
                self._spawn_when_encoded(home, batch, encoded)
                continue
            parts = encoded
            # Held by this loop from now on, also while the later ones wait for a slot.
            home.sending.update(parts)
            for i, piece in enumerate(parts):
                if i:
                    await slots.acquire()
                self._spawn(home, piece)

    async def _acquire_slot(self, home: Home) -> None:
        """A request slot. While every slot is taken (the backend answers slower than spans
        come) and there is a spool, the flusher looks again at each flush interval, or as
        soon as a sender frees a slot, and what the buffer's budget cannot hold goes to the
        spool rather than to a drop."""
        assert home.slots is not None and home.event is not None
        slots, spool = home.slots, self.spool
        while spool is not None and slots.locked():
            await spool.relieve(saturated=True)
            if not slots.locked():
                break
            home.awaiting_slot = True
            try:
                await wait_event(home.event, self.cfg.flush_interval)
            finally:
                home.awaiting_slot = False
            home.event.clear()
        await slots.acquire()

    def _spawn(self, home: Home, batch: Batch) -> None:
        assert home.loop is not None
        home.sending.add(batch)
        task = home.loop.create_task(self._send(home, batch))
        home.senders.add(task)
        task.add_done_callback(home.senders.discard)

    async def encode(self, batch: Batch) -> list[Batch]:
        """The exporter encodes each span (in ~1 ms slices); split by exact size."""
        spans = batch.spans or []
        batch.spans = None
        try:
            chunks = await self.exporter.encode(spans)
        except BaseException:
            # Not encoded (the loop is ending, mid-slice): it goes back as spans, and a later
            # drain encodes it. Handed back with neither, it went out as a request of no spans
            # and counted as sent.
            batch.spans = spans
            raise
        return self._encoded(batch, spans, chunks)

    async def _encode_begun(
        self, batch: Batch
    ) -> list[Batch] | Callable[[], Awaitable[list[Batch]]]:
        """:meth:`encode`; or, when the exporter handed spans of the batch to a worker
        (:meth:`~.otlp_http.OtlpHttpExporter.encode_begun`), what finishes it once the
        worker's chunks are in. Until then the batch keeps its spans: one that goes back to
        the buffer before that (a cancelled task) is encoded again later."""
        begin: Callable[[Sequence[Span]], Awaitable[_Begun]] | None = getattr(
            self.exporter, "encode_begun", None
        )
        if begin is None:
            return await self.encode(batch)
        spans = batch.spans or []
        chunks, rest = await begin(spans)
        if rest is None:
            batch.spans = None
            return self._encoded(batch, spans, chunks)

        async def finish() -> list[Batch]:
            assert rest is not None
            await rest()
            batch.spans = None
            return self._encoded(batch, spans, chunks)

        return finish

    def _spawn_when_encoded(
        self, home: Home, batch: Batch, finish: Callable[[], Awaitable[list[Batch]]]
    ) -> None:
        assert home.loop is not None
        home.sending.add(batch)
        task = home.loop.create_task(self._send_when_encoded(home, batch, finish))
        home.senders.add(task)
        task.add_done_callback(home.senders.discard)

    async def _send_when_encoded(
        self, home: Home, batch: Batch, finish: Callable[[], Awaitable[list[Batch]]]
    ) -> None:
        """Wait for the worker's chunks, then send the batch with the slot the drain took for
        it; the parts of a batch split by size go one after another, each with a slot."""
        assert home.slots is not None
        try:
            parts = await finish()
        except BaseException as exc:
            home.sending.discard(batch)
            home.slots.release()
            self.buffer.returned(batch)
            if home.event is not None:
                home.event.set()
            self.notify()
            if not isinstance(exc, Exception):
                raise
            report_internal("pipeline.encode", exc)
            return
        home.sending.discard(batch)
        home.sending.update(parts)
        for i, piece in enumerate(parts):
            if i:
                await home.slots.acquire()
            await self._send(home, piece)

    def _encoded(
        self, batch: Batch, spans: Sequence[Span], chunks: list[Sized | None]
    ) -> list[Batch]:
        # What the spans weighed once encoded is the buffer's estimate for the next spans of
        # their names, where a top-level look at their values saw less.
        self._learn_sizes(spans, chunks)
        lost = sum(1 for c in chunks if c is None)
        if lost:
            self.buffer.count_drop("rejected", lost)
        return self._split(batch, chunks)

    def _split(self, batch: Batch, chunks: list[Sized | None]) -> list[Batch]:
        """One batch per max_batch_bytes of encoded spans (estimates can be off)."""
        limit = self.cfg.max_batch_bytes
        bounds: list[tuple[int, int]] = []
        start = size = 0
        for i, chunk in enumerate(chunks):
            n = len(chunk) if chunk is not None else 0
            if size and size + n > limit:
                bounds.append((start, i))
                start, size = i, 0
            size += n
        bounds.append((start, len(chunks)))
        if len(bounds) == 1:
            batch.chunks = [c for c in chunks if c is not None]
            batch.lost = len(chunks) - len(batch.chunks)
            self.buffer.resize(batch, size)
            return [batch]
        parts = []
        for start, end in bounds:
            kept = [c for c in chunks[start:end] if c is not None]
            parts.append(part(batch.lo + start, batch.lo + end, kept, end - start - len(kept)))
        self.buffer.replace(batch, parts)
        return parts

    # ------------------------------------------------------------------ sending
    async def _send(self, home: Home, batch: Batch) -> None:
        assert home.slots is not None
        wake = True
        try:
            wake = await self._send_once(home, batch)
        except asyncio.CancelledError:
            self.buffer.returned(batch)
            raise
        except Exception as exc:
            self.buffer.returned(batch)
            report_internal("pipeline.send", exc)
        finally:
            home.sending.discard(batch)
            home.slots.release()  # a drain waiting for a slot goes on by itself
            if home.event is not None and (wake or self.lifecycle.closing or home.awaiting_slot):
                # A batch came back, the backend's health changed, a worker sent the span, or
                # a shutdown waits for the last answer. The success of a batch this loop sent
                # wakes nobody: were it to start a drain, the spans that ended meanwhile would
                # go out one or two to a request, each answer starting the next drain, and
                # never gather into a batch.
                home.event.set()
            self.notify()

    async def _send_once(self, home: Home, batch: Batch) -> bool:
        if home.session is None:
            home.session = self.exporter.session()
        if self.spool is not None:
            await self.spool.before_send(batch)
        outcome = await home.session.export(batch.chunks)
        wake = self._answered(batch, outcome)
        if batch.file is not None and self.spool is not None:
            await self.spool.settled(batch, outcome)
        return wake

    def _answered(self, batch: Batch, outcome: Outcome) -> bool:
        """Apply the retry rules to what became of ``batch``; whether the flusher must look
        again now (anything but a success while the backend was healthy)."""
        verdict = outcome.verdict
        if verdict is Verdict.SENT:
            recovered = self.health.failing
            self.health.sent()
            self.buffer.sent(batch)
            return recovered
        if verdict is Verdict.RETRY:
            self._failed(batch, outcome.describe(), outcome.retry_after)
        elif verdict is Verdict.TOO_LARGE and len(batch.chunks) > 1:
            self.health.too_large(outcome)
            parts = halves(batch)
            self.buffer.replace(batch, parts)
            # Back to pending (ahead of newer spans, no backoff): the drain sends them at once.
            for part in parts:
                self.buffer.returned(part)
        else:
            self._rejected(batch, outcome)
        return True

    def _failed(self, batch: Batch, error: str, retry_after: float | None) -> None:
        if batch.first_failure is None:
            batch.first_failure = time.monotonic()
        given_up = self.health.failed(error, retry_after, batch.first_failure)
        if given_up is None:
            batch.attempts += 1
            self.buffer.returned(batch)
        elif self.spool is None or not self.spool.store(batch, given_up):
            self.buffer.drop(batch, given_up)
        if not self.lifecycle.running and self.spool is not None:
            # A first failure during shutdown: no backoff, and no wait for a batch to gather:
            # what is held goes to the spool now.
            self.health.closing()
            for home in self.homes.alive():
                home.kick(urgent=True)

    def _rejected(self, batch: Batch, outcome: Outcome) -> None:
        if self.health.rejected(outcome):
            logger.warning(
                "looptrace: %s rejected a batch with %s (%s); such batches are "
                "dropped (logged once per status)",
                self.health.where,
                outcome.error,
                outcome.detail or "no detail",
            )
        self.buffer.drop(batch, "rejected")

    # ------------------------------------------------------------------ waiting and notifying
    def add_waiter(self, waiter: Waiter) -> None:
        with self._lock:
            self._waiters.append(waiter)
        self.notify()

    def remove_waiter(self, waiter: Waiter) -> None:
        with self._lock:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def notify(self) -> None:
        """Wake the waiters whose spans are resolved, or whose backpressure has eased."""
        if not self._waiters:
            return
        mark = self.buffer.watermark()
        under = self.buffer.outstanding_bytes <= self.cfg.backpressure_bytes
        with self._lock:
            fire = [
                w
                for w in self._waiters
                if (w.target >= 0 and w.target <= mark) or (w.target < 0 and under)
            ]
            for w in fire:
                self._waiters.remove(w)
        for w in fire:
            w.fire()

    def _on_drop(self, reason: str, count: int) -> None:
        self.drops.dropped(reason, count)
        self.notify()
