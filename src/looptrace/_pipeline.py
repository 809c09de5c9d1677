"""The export pipeline: ended spans -> buffer -> flusher -> OTLP requests, several in flight.

    span.end() -> Pipeline.on_end = Buffer.push      (any thread; O(1), no lock, no I/O)
        | a batch's worth pending, or the first span after idle: kick the flusher (once)
        v
    flusher task (a "home": the app's running asyncio loop, else a private loop in a daemon
    thread) -- every flush_interval or on a kick, drains everything pending:
        take <= max_batch_spans / max_batch_bytes -> to_wire + encode_span in ~1 ms slices
        (large spans through the Offloader) -> encode_request -> compress -> Transport.send,
        up to max_concurrent_requests at once; the next batch is taken while others fly.
    a failed send returns its batch to the buffer (ahead of newer spans) and backs off;
    413 splits it; other 4xx drop it; the retry budget bounds it all.

The module-level functions (``flush``, ``shutdown``, ``statistics``...) act on the one pipeline
installed as ``_state.sink``; it is created on the first span after ``configure()``.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import contextvars
import dataclasses
import logging
import os
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import httpx

from . import _clock, _errors, _state
from ._batcher import DROP_REASONS, Batch, Buffer
from ._config import Config
from ._context import suppress_tracing
from ._net import HttpSettings
from ._transport import (
    HttpTransport,
    Response,
    RetryPolicy,
    Transport,
    in_background,
    off_loop,
    parse_retry_after,
)

if TYPE_CHECKING:
    from ._offload import Job
    from ._otlp import Resource
    from ._span import Span

logger = logging.getLogger("looptrace")

# The flusher's CPU work runs in slices of about this long, then yields to the loop.
SLICE_SECONDS = 0.001
# Request bodies above this are compressed in a worker thread (zlib and zstd release the GIL).
COMPRESS_IN_THREAD_BYTES = 64 * 1024
# Drops are logged at most this often (per reason), with the count since the last line.
DROP_LOG_INTERVAL = 10.0


@dataclasses.dataclass(frozen=True)
class OffloadStatistics:
    """What the worker processes did (``looptrace.statistics().offload``).

    ``offloaded`` counts spans a worker serialized (and sent, over OTLP/HTTP); ``fallbacks``
    counts, by reason, large spans serialized in the application's process instead:
    ``unpicklable``, ``worker_error``, ``broken_pool``, ``pool_retired``, ``unavailable``,
    ``shutdown``. ``workers_alive`` is how many worker processes are running now."""

    offloaded: int = 0
    fallbacks: Mapping[str, int] = dataclasses.field(default_factory=dict)
    workers_alive: int = 0


@dataclasses.dataclass(frozen=True)
class Statistics:
    """A snapshot of the pipeline's counters (``looptrace.statistics()``)."""

    queued_spans: int = 0
    queued_bytes: int = 0
    in_flight_spans: int = 0
    in_flight_bytes: int = 0
    requests_sent: int = 0
    requests_failed: int = 0
    retries: int = 0
    spans_sent: int = 0
    dropped: Mapping[str, int] = dataclasses.field(
        default_factory=lambda: dict.fromkeys(DROP_REASONS, 0)
    )
    last_error: str | None = None
    internal_errors: Mapping[str, int] = dataclasses.field(default_factory=dict)
    offload: OffloadStatistics = dataclasses.field(default_factory=OffloadStatistics)

    @property
    def dropped_total(self) -> int:
        return sum(self.dropped.values())


@dataclasses.dataclass(frozen=True)
class FlushResult:
    """What a flush achieved for the spans that had ended before it was called.

    ``sent`` and ``dropped`` count what happened while the call waited (spans of other batches
    included); ``pending`` is how many of the awaited spans were still unsent at return.
    """

    sent: int
    dropped: Mapping[str, int]
    pending: int

    @property
    def ok(self) -> bool:
        """True when every awaited span was sent and nothing was dropped meanwhile."""
        return self.pending == 0 and not any(self.dropped.values())


class _Waiter:
    """Someone waiting in flush() / backpressure(): a future on some loop, or a thread."""

    __slots__ = ("event", "future", "loop", "target")

    def __init__(
        self,
        target: int,
        loop: asyncio.AbstractEventLoop | None = None,
        future: asyncio.Future[None] | None = None,
    ) -> None:
        self.target = target  # flush: a sequence number; backpressure: -1
        self.loop = loop
        self.future = future
        self.event = threading.Event() if future is None else None

    def fire(self) -> None:
        if self.event is not None:
            self.event.set()
            return
        assert self.loop is not None
        assert self.future is not None
        try:
            self.loop.call_soon_threadsafe(_resolve, self.future)
        except RuntimeError:  # that loop is closed: nobody is waiting any more
            pass


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class _Home:
    """One flusher: a task on an asyncio loop (the application's, or a private one in a thread)."""

    def __init__(self, private: bool) -> None:
        self.private = private
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread_id = 0
        self.task: asyncio.Task[None] | None = None
        self.event: asyncio.Event | None = None
        self.slots: asyncio.Semaphore | None = None
        self.senders: set[asyncio.Task[None]] = set()
        self.sending: set[Batch] = set()  # encoded batches its senders hold
        self.transport: Transport | None = None
        self.urgent = False  # drain now: a flush or shutdown is waiting
        self.stopping = False  # cancelled on purpose: do not hand work to another home
        self.done = threading.Event()

    def alive(self) -> bool:
        loop = self.loop
        if self.done.is_set():
            return False
        return loop is None or not loop.is_closed()

    def kick(self, urgent: bool = False) -> None:
        if urgent:
            self.urgent = True
        loop = self.loop
        if loop is None:  # still starting: it drains as soon as it runs
            return
        if threading.get_ident() == self.thread_id:
            if self.event is not None:
                self.event.set()
            return
        try:
            loop.call_soon_threadsafe(self._set)
        except RuntimeError:  # closed meanwhile; the pipeline notices on the next kick
            pass

    def _set(self) -> None:
        if self.event is not None:
            self.event.set()

    def cancel(self) -> None:
        """Stop this flusher on purpose (shutdown): its in-flight batches go back to pending."""
        self.stopping = True
        loop, task = self.loop, self.task
        if loop is None or task is None:
            return
        try:
            if threading.get_ident() == self.thread_id:
                task.cancel()
            else:
                loop.call_soon_threadsafe(task.cancel)
        except RuntimeError:  # its loop was closed with the task still pending
            pass


class Pipeline:
    """One buffer, its flusher(s), and a transport per flusher. Installed as ``_state.sink``."""

    def __init__(
        self,
        cfg: Config,
        transport_factory: Callable[[], Transport] | None = None,
        retry_policy: RetryPolicy | None = None,
    ) -> None:
        self.cfg = cfg
        self._transport_factory = transport_factory or self._default_transport
        self.retry = retry_policy or RetryPolicy(budget=cfg.retry_budget)
        self._lock = threading.Lock()
        self._homes: list[_Home] = []
        self._home: _Home | None = None  # the one producers kick
        self._dead_loops: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()
        self._waiters: list[_Waiter] = []
        self._closing: float | None = None  # monotonic deadline once shutdown began
        self._closed = threading.Event()
        self._retry_at = 0.0  # monotonic: no request before this (backoff after a failure)
        self._consecutive_failures = 0
        # While the backend fails, one request at a time probes it; set at the first failure.
        self._failing_since: float | None = None
        self.requests_sent = 0
        self.requests_failed = 0
        self.retries = 0
        self.last_error: str | None = None
        self._rejected_statuses: set[int] = set()
        self._drop_log: dict[str, tuple[float, int]] = {}
        self._codec_loaded = False
        self._offloader: Any = None
        self._destination: Any = None  # an _offload.Destination: workers send large spans
        self._resource: Resource | None = None

        # Until the codec is loaded (in a worker thread, by the first drain: importing it on the
        # caller's first span would stall it) spans are estimated at a fixed size.
        self.buffer = Buffer(
            cfg.max_buffer_spans,
            cfg.max_buffer_bytes,
            cfg.max_batch_spans,
            cfg.max_batch_bytes,
            None,
            self._on_crossing,
        )
        self.buffer._on_drop = self._on_drop  # type: ignore[method-assign]
        # The sink protocol, bound straight to the buffer: span.end() costs one call.
        self.on_end: Callable[[Span], None] = self.buffer.push
        self._roots: deque[Span] = deque()
        self.on_start: Callable[[Span], None] = (
            self._roots.append if cfg.sends_in_progress else _ignore
        )

    def __repr__(self) -> str:
        where = self.cfg.endpoint or f"store:{self.cfg.store_path}"
        return f"<looptrace Pipeline -> {where} queued={self.buffer.queued_spans}>"

    # ------------------------------------------------------------------ transports and codec
    def _default_transport(self) -> Transport:
        cfg = self.cfg
        if cfg.endpoint is None:
            from ._store import StoreTransport

            return StoreTransport(cfg.store_path)
        return HttpTransport(HttpSettings.from_config(cfg))

    async def _ensure_codec(self) -> None:
        if self._codec_loaded:
            return
        if _serialize_ready(self.cfg):
            # configure() did the slow part (imports, the redaction patterns): the rest takes
            # a fraction of a millisecond, less than starting a thread to do it in, and a
            # thread doing Python work holds the GIL against this loop for up to 5 ms at a time.
            self._load_codec()
        else:
            # Imports and the patterns take tens of milliseconds: off the loop, while the
            # first batch gathers.
            await off_loop(self._load_codec)

    def _load_codec(self) -> None:
        from . import _otlp

        cfg = self.cfg
        self._resource = _otlp.default_resource(self.cfg)
        self._content_type = _otlp.content_type(self.cfg.encoding)
        self._encode_request = _otlp.encode_request
        self._compress = _otlp.compress
        from . import _serialize
        from ._encode import SpanEncoder

        self._span_encoder = SpanEncoder(cfg)
        if cfg.offload:
            # Started at the first large span; at interpreter exit, when no thread can start
            # it, large spans are serialized inline.
            from ._offload import Offloader

            self._offloader = Offloader()
            if cfg.endpoint is not None and self._transport_factory == self._default_transport:
                # Plain OTLP/HTTP: a worker can send a large span itself, so that its bytes
                # never come back to this process (other transports get the encoded span
                # back from the worker instead).
                from ._offload import Destination

                self._destination = Destination(
                    HttpSettings.from_config(cfg), cfg.encoding, cfg.compression, self._resource
                )
        self.buffer._estimate = _serialize.estimate_size
        self._codec_loaded = True

    # ------------------------------------------------------------------ homes
    def _on_crossing(self) -> None:
        """A producer crossed a threshold (or there was no flusher): wake or start one."""
        home = self._home
        if home is not None and home.alive():
            home.kick()
            return
        # A new flusher starts by letting a batch gather for one interval: no kick.
        self._ensure_home()

    def _ensure_home(self, prefer_thread: bool = False) -> _Home:
        with self._lock:
            home = self._home
            if home is not None and home.alive():
                return home
            if home is not None:
                self._forget(home)
            loop = None if prefer_thread else _running_asyncio_loop()
            if loop is not None and loop in self._dead_loops:
                loop = None
            home = self._start_on_loop(loop) if loop is not None else self._start_thread()
            self._home = home
            return home

    def _thread_home(self) -> _Home:
        """A live private-thread flusher (started if needed), without changing the primary."""
        with self._lock:
            for home in self._homes:
                if home.private and home.alive():
                    return home
            home = self._start_thread()
            if self._home is None or not self._home.alive():
                self._home = home
            return home

    def _forget(self, home: _Home) -> None:
        if home in self._homes:
            self._homes.remove(home)
        if self._home is home:
            self._home = None

    def _start_on_loop(self, loop: asyncio.AbstractEventLoop) -> _Home:
        home = _Home(private=False)
        home.loop = loop
        home.thread_id = threading.get_ident()
        home.event = asyncio.Event()
        home.slots = asyncio.Semaphore(self.cfg.max_concurrent_requests)
        coro = self._run_home(home)
        if sys.version_info >= (3, 11):
            # An empty context: the flusher must not inherit the span that happened to end first.
            home.task = loop.create_task(
                coro, name="looptrace-flusher", context=contextvars.Context()
            )
        else:  # pragma: no cover
            home.task = loop.create_task(coro, name="looptrace-flusher")
        self._homes.append(home)
        if self.cfg.lag_monitor:
            # LOOPTRACE_LAG_MONITOR: every loop that traces gets a monitor, started where the
            # flusher starts, because that is the first moment looptrace runs on that loop.
            try:
                from .monitor import ensure_from_config

                ensure_from_config(self.cfg)
            except Exception as exc:
                _report_internal("pipeline.lag_monitor", exc)
        return home

    def _start_thread(self) -> _Home:
        home = _Home(private=True)
        self._homes.append(home)
        thread = threading.Thread(
            target=self._thread_main, args=(home,), name="looptrace-flusher", daemon=True
        )
        try:
            thread.start()
        except RuntimeError:
            # "can't create new thread at interpreter shutdown": the caller drains inline.
            home.done.set()
            self._homes.remove(home)
        return home

    def _thread_main(self, home: _Home) -> None:
        loop = asyncio.new_event_loop()
        try:
            home.loop = loop
            home.thread_id = threading.get_ident()

            async def main() -> None:
                home.event = asyncio.Event()
                home.slots = asyncio.Semaphore(self.cfg.max_concurrent_requests)
                home.task = asyncio.current_task()
                await self._run_home(home)

            contextvars.Context().run(loop.run_until_complete, main())
        except BaseException as exc:  # pragma: no cover - the thread must never die noisily
            if not isinstance(exc, asyncio.CancelledError):
                _report_internal("pipeline.thread", exc)
        finally:
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
                # Starts a thread to join the executor's: refused at interpreter exit.
                with contextlib.suppress(RuntimeError):
                    loop.run_until_complete(loop.shutdown_default_executor())
            finally:
                loop.close()
                home.done.set()

    async def _run_home(self, home: _Home) -> None:
        with suppress_tracing():
            try:
                await self._ensure_codec()
                await self._flusher_loop(home)
            except asyncio.CancelledError:
                if not home.stopping and home.loop is not None:
                    # The application's loop is going away (asyncio.run ending): never start a
                    # flusher on it again; what it held goes to the private thread.
                    try:
                        self._dead_loops.add(home.loop)
                    except TypeError:  # pragma: no cover - a loop without weakref support
                        pass
                    if self.cfg.lag_monitor:
                        # Its monitor's last summary window, which the private thread sends.
                        monitor = sys.modules.get("looptrace.monitor")
                        if monitor is not None:
                            monitor.finish_windows(home.loop)
                raise
            finally:
                await self._wind_down(home)

    async def _wind_down(self, home: _Home) -> None:
        for task in list(home.senders):
            task.cancel()
        if home.senders:
            await asyncio.gather(*home.senders, return_exceptions=True)
        transport, home.transport = home.transport, None
        if transport is not None:
            try:
                await asyncio.wait_for(transport.aclose(), 1.0)
            except (Exception, asyncio.CancelledError):
                pass
        with self._lock:
            self._forget(home)
            others = [h for h in self._homes if h.alive()]
        home.done.set()
        if self._closing is not None:
            if not others:
                self._finish_close()
        elif not home.stopping and not self.buffer.idle():
            self._ensure_home(prefer_thread=True).kick(urgent=home.urgent)
        elif not others:
            # Nobody flushes now: the next span starts a flusher wherever it ends.
            self.buffer.force_slow_path()
        self._notify()

    # ------------------------------------------------------------------ the flusher
    async def _flusher_loop(self, home: _Home) -> None:
        assert home.event is not None
        event = home.event
        interval = self.cfg.flush_interval
        tracking = self.cfg.sends_in_progress
        while True:
            closing = self._closing is not None
            if closing:
                if self.buffer.idle():
                    return  # _wind_down collects the sender tasks that are finishing
                home.urgent = True
            idle = not self.buffer.has_pending() and not (tracking and self._roots)
            pending = self.buffer.arm(first_span=idle)
            if home.urgent and pending:
                pass  # a flush or shutdown is waiting: drain now
            elif idle and not pending:
                # Nothing to send: sleep without a timer until a span (or an answer) arrives.
                if closing:
                    await _wait(event, interval)
                else:
                    await event.wait()
                event.clear()
                if not home.urgent:
                    await _wait(event, interval)  # let a batch gather
            else:
                timeout = interval
                if tracking and self._roots:
                    timeout = min(timeout, self._next_root_due())
                await _wait(event, timeout)
            event.clear()
            now = time.monotonic()
            if self._retry_at > now:
                await _wait(event, self._retry_at - now)
                event.clear()
            home.urgent = False
            await self._drain(home)

    async def _drain(self, home: _Home) -> None:
        """Send everything pending now, as slots free up; never wait for a request otherwise."""
        assert home.slots is not None
        slots = home.slots
        cfg = self.cfg
        if self._roots and cfg.sends_in_progress:
            records = self._in_progress_batch()
            if records is not None:
                await slots.acquire()
                self._spawn(home, records)
        while self._retry_at <= time.monotonic():
            if self._failing_since is not None and self.buffer.in_flight_batches:
                # The backend is failing: one request probes it at a time. Its answer wakes
                # this flusher; a success sends everything queued at once.
                return
            await slots.acquire()
            batch = self.buffer.take_retry()
            if batch is not None:
                self._spawn(home, batch)
                continue
            batch = self.buffer.take(cfg.max_batch_spans, cfg.max_batch_bytes)
            if batch is None:
                slots.release()
                return
            try:
                parts = await self._encode(batch)
            except BaseException:
                slots.release()
                self.buffer.returned(batch)
                raise
            for i, part in enumerate(parts):
                if i:
                    await slots.acquire()
                self._spawn(home, part)

    def _spawn(self, home: _Home, batch: Batch) -> None:
        assert home.loop is not None
        home.sending.add(batch)
        task = home.loop.create_task(self._send(home, batch))
        home.senders.add(task)
        task.add_done_callback(home.senders.discard)

    async def _encode(self, batch: Batch) -> list[Batch]:
        """Encode each span (or hand it to a worker), in ~1 ms slices; split by exact bytes."""
        spans = batch.spans or []
        batch.spans = None
        cfg = self.cfg
        encoding = cfg.encoding
        from ._encode import OFFLOAD
        from ._offload import STARTABLE
        from ._serialize import estimate_size

        plan, encode = self._span_encoder.plan, self._span_encoder.encode
        offloader = self._offloader
        remote = self._destination is not None
        # Per span: its encoded bytes, the Job a worker will send, or None when it was lost.
        chunks: list[bytes | Job | None] = [None] * len(spans)
        offloaded: list[tuple[int, Any]] = []
        clock = time.perf_counter
        started = clock()
        for i, span in enumerate(spans):
            try:
                flags = plan(span)
                if flags & OFFLOAD and offloader is not None:
                    if remote:
                        # Travels alone, encoded and sent by a worker; the hooks run now.
                        chunks[i] = offloader.job(span, cfg, encoding, estimate_size(span))
                        continue
                    if offloader.state in STARTABLE:
                        # Start the pool before the first handoff, so that every handoff of
                        # this drain happens inside a time slice, not all at once after it.
                        await offloader.ready()
                        started = clock()
                    # The handoff (hooks, pickling) runs here, inside the time slice, so a drain
                    # of many large spans yields between them; only the results are awaited.
                    offloaded.append((i, offloader.submit(span, cfg, encoding)))
                else:
                    chunks[i] = encode(span, flags)
            except Exception as exc:
                _report_internal("pipeline.encode", exc)
            if clock() - started > SLICE_SECONDS:
                await asyncio.sleep(0)
                started = clock()
        if offloaded:
            results = await asyncio.gather(*(aw for _, aw in offloaded), return_exceptions=True)
            for (i, _), result in zip(offloaded, results, strict=True):
                if isinstance(result, bytes):
                    chunks[i] = result
                elif isinstance(result, BaseException):
                    _report_internal("pipeline.offload", result)
        lost = sum(1 for c in chunks if c is None)
        if lost:
            self.buffer.count_drop("rejected", lost)
        return self._split(batch, chunks)

    def _split(self, batch: Batch, chunks: list[bytes | Job | None]) -> list[Batch]:
        """One batch per max_batch_bytes of encoded spans (estimates can be off); a span that
        a worker sends (a Job among the chunks) is a batch of its own."""
        limit = self.cfg.max_batch_bytes
        bounds: list[tuple[int, int]] = []
        jobs = False
        start = size = 0
        for i, chunk in enumerate(chunks):
            if chunk is None or isinstance(chunk, bytes):
                n = len(chunk) if chunk is not None else 0
                if size and size + n > limit:
                    bounds.append((start, i))
                    start, size = i, 0
                size += n
                continue
            jobs = True
            if i > start:
                bounds.append((start, i))
            bounds.append((i, i + 1))
            start, size = i + 1, 0
        if start < len(chunks) or not bounds:
            bounds.append((start, len(chunks)))
        if len(bounds) == 1 and not jobs:
            # No Job among them (``jobs`` is False): every chunk kept is bytes.
            batch.chunks = [c for c in chunks if isinstance(c, bytes)]
            batch.lost = len(chunks) - len(batch.chunks)
            self.buffer.resize(batch, size)
            return [batch]
        parts = []
        for start, end in bounds:
            piece = chunks[start:end]
            if end - start == 1 and piece[0] is not None and not isinstance(piece[0], bytes):
                parts.append(_job_part(batch.lo + start, piece[0]))
                continue
            # A Job is always a part of its own (above): the rest are bytes or lost.
            kept = [c for c in piece if isinstance(c, bytes)]
            parts.append(_part(batch.lo + start, batch.lo + end, kept, end - start - len(kept)))
        self.buffer.replace(batch, parts)
        return parts

    # ------------------------------------------------------------------ in-progress records
    def _next_root_due(self) -> float:
        roots = self._roots
        if not roots:
            return self.cfg.flush_interval
        age = (_clock.now_ns() - roots[0].start_ns) / 1e9
        return max(0.01, self.cfg.in_progress_after - age)

    def _in_progress_batch(self) -> Batch | None:
        """Records for long-running roots still open; a root that already ended is skipped
        (its start and end coalesce into the one final record)."""
        roots = self._roots
        cutoff = _clock.now_ns() - int(self.cfg.in_progress_after * 1e9)
        keep: list[Span] = []
        due: list[Span] = []
        for _ in range(len(roots)):
            span = roots.popleft()
            if span.end_ns:
                continue
            (due if span.start_ns <= cutoff else keep).append(span)
        roots.extendleft(reversed(keep))
        if not due:
            return None
        chunks = []
        for span in due:
            try:
                chunks.append(self._span_encoder.encode(span, 0))
            except Exception as exc:
                _report_internal("pipeline.in_progress", exc)
        if not chunks:
            return None
        lo = self.buffer.flush_target()
        batch = Batch(lo, lo, [], sum(len(c) for c in chunks))
        batch.spans = None
        batch.chunks = chunks
        batch.records = len(chunks)
        self.buffer.track(batch)
        return batch

    # ------------------------------------------------------------------ sending
    async def _send(self, home: _Home, batch: Batch) -> None:
        assert home.slots is not None
        try:
            await self._send_once(home, batch)
        except asyncio.CancelledError:
            self.buffer.returned(batch)
            raise
        except Exception as exc:
            self.buffer.returned(batch)
            _report_internal("pipeline.send", exc)
        finally:
            home.sending.discard(batch)
            home.slots.release()
            if home.event is not None:
                home.event.set()  # a slot is free, and a shutdown waits for the last answer
            self._notify()

    async def _send_once(self, home: _Home, batch: Batch) -> None:
        assert self._resource is not None
        if batch.job is not None:
            offloader = self._offloader
            if offloader is None:  # the pipeline shut down under this send
                self._failed(batch, "shut down", None)
                return
            from ._offload import Unsent

            outcome = await offloader.deliver(batch.job, self._destination)
            if isinstance(outcome, Unsent):
                self._failed(batch, str(outcome), None)
                return
            if isinstance(outcome, Response):
                self._answered(batch, outcome)
                return
            # No worker could take it: this process sends the span it encoded instead.
            batch.job = None
            batch.chunks = [outcome]
            self.buffer.resize(batch, len(outcome))
        body = self._encode_request(batch.chunks, self._resource, self.cfg.encoding)
        compression = self.cfg.compression
        if compression != "none":
            if len(body) > COMPRESS_IN_THREAD_BYTES:
                body, content_encoding = await in_background(self._compress, body, compression)
            else:
                body, content_encoding = self._compress(body, compression)
        else:
            content_encoding = None
        headers = {"Content-Type": self._content_type}
        if content_encoding:
            headers["Content-Encoding"] = content_encoding
        if home.transport is None:
            home.transport = self._transport_factory()
        try:
            response = await home.transport.send(body, headers)
        except (OSError, httpx.TransportError, asyncio.TimeoutError) as exc:
            self._failed(
                batch, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__, None
            )
            return
        self._answered(batch, response)

    def _answered(self, batch: Batch, response: Response) -> None:
        """Apply the retry rules to what the backend answered for ``batch``."""
        verdict = self.retry.classify(response.status)
        if verdict == "ok":
            with self._lock:
                self.requests_sent += 1
                self._consecutive_failures = 0
                self.last_error = None  # it says what is wrong now, not what once was
                if self._failing_since is not None:
                    self._failing_since = None
                    self._retry_at = 0.0  # back: the in-flight limit paces what is queued
            self.buffer.sent(batch)
        elif verdict == "retry":
            self._failed(
                batch,
                f"HTTP {response.status}",
                parse_retry_after(_header(response.headers, "retry-after")),
            )
        elif verdict == "split" and len(batch.chunks) > 1:
            with self._lock:
                self.requests_failed += 1
                self.last_error = f"HTTP {response.status}: request too large, split in halves"
            parts = _halves(batch)
            self.buffer.replace(batch, parts)
            # Back to pending (ahead of newer spans, no backoff): the drain sends them at once.
            for part in parts:
                self.buffer.returned(part)
        else:
            self._rejected(batch, response)

    def _failed(self, batch: Batch, error: str, retry_after: float | None) -> None:
        now = time.monotonic()
        if batch.first_failure is None:
            batch.first_failure = now
        with self._lock:
            self.requests_failed += 1
            self.last_error = error
            if self._failing_since is None:
                self._failing_since = now
            delay = self.retry.delay(
                self._consecutive_failures, retry_after, now - self._failing_since
            )
            exhausted = now + delay - batch.first_failure > self.retry.budget
            if not exhausted:
                self._consecutive_failures += 1
                self.retries += 1
                self._retry_at = max(self._retry_at, now + delay)
        if exhausted:
            self.buffer.drop(batch, "retries_exhausted")
        else:
            batch.attempts += 1
            self.buffer.returned(batch)

    def _rejected(self, batch: Batch, response: Any) -> None:
        status = response.status
        detail = bytes(response.body[:200]).decode("utf-8", "replace")
        with self._lock:
            self.requests_failed += 1
            self.last_error = f"HTTP {status}" + (f": {detail}" if detail else "")
            first = status not in self._rejected_statuses
            self._rejected_statuses.add(status)
        if first:
            logger.warning(
                "looptrace: the backend rejected a batch with HTTP %s (%s); such batches are "
                "dropped (logged once per status)",
                status,
                detail or "no detail",
            )
        self.buffer.drop(batch, "rejected")

    # ------------------------------------------------------------------ waiting and notifying
    def _notify(self) -> None:
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
        now = time.monotonic()
        with self._lock:
            last, unreported = self._drop_log.get(reason, (0.0, 0))
            unreported += count
            if now - last >= DROP_LOG_INTERVAL:
                self._drop_log[reason] = (now, 0)
                report = unreported
            else:
                self._drop_log[reason] = (last, unreported)
                report = 0
        if report:
            logger.warning(
                "looptrace dropped %d span(s): %s (see looptrace.statistics(); logged at most "
                "every %gs)",
                report,
                reason.replace("_", " "),
                DROP_LOG_INTERVAL,
            )
        self._notify()

    def _kick(self, urgent: bool) -> _Home:
        home = self._home
        if home is None or not home.alive():
            home = self._ensure_home()
        home.kick(urgent)
        return home

    def _counters(self) -> tuple[int, dict[str, int]]:
        return self.buffer.spans_sent, dict(self.buffer.dropped)

    def _result(self, before: tuple[int, dict[str, int]], target: int) -> FlushResult:
        sent, dropped = self._counters()
        return FlushResult(
            sent=sent - before[0],
            dropped={k: v - before[1].get(k, 0) for k, v in dropped.items()},
            pending=self.buffer.unresolved_before(target),
        )

    async def flush(self, timeout: float | None = None) -> FlushResult:
        """Wait (without blocking the loop) until every span ended before the call is resolved."""
        loop = _running_asyncio_loop()
        if loop is None:
            import anyio.to_thread

            return await anyio.to_thread.run_sync(self.flush_sync, timeout, abandon_on_cancel=True)
        before = self._counters()
        target = self.buffer.flush_target()
        if self.buffer.watermark() < target:
            waiter = _Waiter(target, loop, loop.create_future())
            self._add_waiter(waiter)
            home = self._kick(urgent=True)
            if home.loop is not loop and home.loop is not None and not home.loop.is_running():
                self._thread_home().kick(urgent=True)
            assert waiter.future is not None
            try:
                await _until(waiter.future, timeout)
            finally:
                self._remove_waiter(waiter)
        return self._result(before, target)

    def flush_sync(self, timeout: float | None = None) -> FlushResult:
        """Block this thread until the spans ended before the call are resolved.

        Called on the thread whose loop hosts the flusher, that flusher cannot run while we
        block: the pending spans are handed to the private thread instead, and batches that
        loop already had in flight are reported as pending.
        """
        before = self._counters()
        target = self.buffer.flush_target()
        if self.buffer.watermark() >= target:
            return self._result(before, target)
        waiter = _Waiter(target)
        self._add_waiter(waiter)
        try:
            home = self._home
            if (
                home is None
                or not home.alive()
                or home.thread_id == threading.get_ident()
                or (home.loop is not None and not home.loop.is_running() and not home.private)
            ):
                if home is not None and home.alive():
                    # That loop cannot run while we wait: its requests will not complete.
                    # Send them again from the private thread (a duplicate at worst).
                    for batch in list(home.sending):
                        self.buffer.returned(batch)
                home = self._thread_home()
            if home.done.is_set():  # no thread could be started (interpreter shutdown)
                self._drain_inline(waiter, timeout)
            else:
                home.kick(urgent=True)
                assert waiter.event is not None
                waiter.event.wait(timeout)
        finally:
            self._remove_waiter(waiter)
        return self._result(before, target)

    def _drain_inline(self, waiter: _Waiter, timeout: float | None) -> None:
        """Flush on a temporary loop in this thread (when no thread can be started)."""
        if _running_asyncio_loop() is not None:
            return

        async def main() -> None:
            home = _Home(private=True)
            home.loop = asyncio.get_running_loop()
            home.thread_id = threading.get_ident()
            home.event = asyncio.Event()
            home.slots = asyncio.Semaphore(self.cfg.max_concurrent_requests)
            home.task = asyncio.current_task()
            home.urgent = True
            home.stopping = True
            with self._lock:
                self._homes.append(home)
            assert waiter.event is not None
            runner = asyncio.ensure_future(self._run_home(home))
            try:
                while not waiter.event.is_set() and not runner.done():
                    await asyncio.sleep(0.005)
            finally:
                runner.cancel()
                await asyncio.gather(runner, return_exceptions=True)

        try:
            asyncio.run(asyncio.wait_for(main(), timeout))
        except (asyncio.TimeoutError, RuntimeError):
            pass

    def _add_waiter(self, waiter: _Waiter) -> None:
        with self._lock:
            self._waiters.append(waiter)
        self._notify()

    def _remove_waiter(self, waiter: _Waiter) -> None:
        with self._lock:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    async def backpressure(self) -> None:
        """Wait while the bytes pending plus in flight exceed ``cfg.backpressure_bytes``."""
        limit = self.cfg.backpressure_bytes
        if self.buffer.outstanding_bytes <= limit:
            return
        loop = _running_asyncio_loop()
        if loop is None:
            import anyio

            while self.buffer.outstanding_bytes > limit:
                self._kick(urgent=True)
                await anyio.sleep(self.cfg.flush_interval / 4)
            return
        while self.buffer.outstanding_bytes > limit:
            waiter = _Waiter(-1, loop, loop.create_future())
            self._add_waiter(waiter)
            self._kick(urgent=True)
            assert waiter.future is not None
            try:
                # The timeout only guards against a lost wake-up; the waiter normally fires.
                await _until(waiter.future, self.cfg.flush_interval)
            finally:
                self._remove_waiter(waiter)

    # ------------------------------------------------------------------ shutdown
    def _begin_close(self, deadline: float) -> list[_Home]:
        with self._lock:
            if self._closing is None or deadline < self._closing:
                self._closing = deadline
            homes = [h for h in self._homes if h.alive()]
        if not homes:
            if self.buffer.idle():
                self._finish_close()
                return []
            homes = [self._thread_home()]
        for home in homes:
            home.kick(urgent=True)
        return homes

    def _stop_homes(self) -> None:
        with self._lock:
            homes = list(self._homes)
        for home in homes:
            home.cancel()

    def _finish_close(self) -> None:
        """Everything still held is dropped now; say so once."""
        if self._closed.is_set():
            return
        pending = self.buffer.drop_pending("shutdown")
        in_flight = self.buffer.drop_in_flight("shutdown")
        self._closed.set()
        with self._lock:
            unreported = {r: n for r, (_, n) in self._drop_log.items() if n}
            self._drop_log.clear()
        for reason, count in unreported.items():
            logger.warning(
                "looptrace dropped %d more span(s): %s (since the last report)",
                count,
                reason.replace("_", " "),
            )
        offloader, self._offloader = self._offloader, None
        if offloader is not None:
            offloader.shutdown(wait=False)
        self.on_end = _ignore
        self.on_start = _ignore
        if pending or in_flight:
            logger.warning(
                "looptrace: shutdown deadline passed with %d span(s) unsent (%d queued, %d in "
                "flight); last error: %s",
                pending + in_flight,
                pending,
                in_flight,
                self.last_error or "none",
            )
        self._notify()

    def shutdown_sync(self, timeout: float | None = None) -> FlushResult:
        """Send what is held, within ``timeout`` (default cfg.shutdown_timeout), then stop."""
        timeout = self.cfg.shutdown_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        before = self._counters()
        target = self.buffer.flush_target()
        result_wait = self.flush_sync(timeout)
        del result_wait
        homes = self._begin_close(deadline)
        self._stop_homes()
        for home in homes:
            if home.thread_id != threading.get_ident():
                home.done.wait(max(0.0, deadline - time.monotonic()) + 0.5)
        self._finish_close()
        return self._result(before, target)

    async def shutdown(self, timeout: float | None = None) -> FlushResult:
        """Async twin of :meth:`shutdown_sync`; never blocks the loop."""
        timeout = self.cfg.shutdown_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        before = self._counters()
        target = self.buffer.flush_target()
        await self.flush(timeout)
        homes = self._begin_close(deadline)
        self._stop_homes()
        loop = _running_asyncio_loop()
        for home in homes:
            left = max(0.0, deadline - time.monotonic()) + 0.5
            if home.task is not None and home.loop is loop:
                await asyncio.wait([home.task], timeout=left)
            elif loop is not None:
                await asyncio.to_thread(home.done.wait, left)
        self._finish_close()
        return self._result(before, target)

    def close_soon(self) -> None:
        """Stop in the background (``configure`` replacing this pipeline): drain what is held
        within cfg.shutdown_timeout, without making the caller wait."""
        deadline = time.monotonic() + self.cfg.shutdown_timeout
        homes = self._begin_close(deadline)
        for home in homes:
            loop = home.loop
            if loop is None:
                continue
            delay = max(0.0, deadline - time.monotonic())
            try:
                loop.call_soon_threadsafe(loop.call_later, delay, home.cancel)
            except RuntimeError:
                pass

    # ------------------------------------------------------------------ reading
    def statistics(self) -> Statistics:
        b = self.buffer
        return Statistics(
            queued_spans=b.queued_spans,
            queued_bytes=b.queued_bytes,
            in_flight_spans=b.in_flight_spans,
            in_flight_bytes=b.in_flight_bytes,
            requests_sent=self.requests_sent,
            requests_failed=self.requests_failed,
            retries=self.retries,
            spans_sent=b.spans_sent,
            dropped=dict(b.dropped),
            last_error=self.last_error,
            internal_errors=dict(_errors.counts),
            offload=self._offload_statistics(),
        )

    def _offload_statistics(self) -> OffloadStatistics:
        offloader = self._offloader
        if offloader is None:
            return OffloadStatistics()
        from ._offload import FALLBACKS

        stats = offloader.stats
        return OffloadStatistics(
            offloaded=stats["offloaded"],
            fallbacks={reason: stats[reason] for reason in FALLBACKS},
            workers_alive=offloader.workers_alive(),
        )


def _halves(batch: Batch) -> list[Batch]:
    """Split a batch a server found too large (413) into two, keeping span order."""
    mid = len(batch.chunks) // 2
    parts = []
    if batch.span_count:
        # Spans that failed to encode (``lost``) stay with the first half's range.
        cut = batch.lo + batch.lost + mid
        parts.append(_part(batch.lo, cut, batch.chunks[:mid], batch.lost))
        parts.append(_part(cut, batch.hi, batch.chunks[mid:], 0))
    else:  # in-progress records only
        for chunks in (batch.chunks[:mid], batch.chunks[mid:]):
            part = _part(batch.lo, batch.lo, chunks, 0)
            part.records = len(chunks)
            parts.append(part)
    return parts


def _job_part(lo: int, job: Any) -> Batch:
    part = Batch(lo, lo + 1, [], job.nbytes)
    part.spans = None
    part.job = job
    return part


def _part(lo: int, hi: int, chunks: list[bytes], lost: int) -> Batch:
    part = Batch(lo, hi, [], sum(len(c) for c in chunks))
    part.spans = None
    part.chunks = chunks
    part.lost = lost
    return part


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is None:
        for key, v in headers.items():
            if key.lower() == name:
                return v
    return value


async def _wait(event: asyncio.Event, timeout: float) -> None:
    if event.is_set():
        return
    waiter = asyncio.ensure_future(event.wait())
    try:
        await _until(waiter, max(0.0, timeout))
    finally:
        waiter.cancel()


async def _until(future: asyncio.Future[Any], timeout: float | None) -> None:
    """Wait for ``future`` for at most ``timeout`` seconds; on timeout leave it pending.

    Not ``asyncio.wait_for``: before Python 3.12 it swallows a cancellation that arrives as
    the awaited thing completes. A span that ended just before ``asyncio.run`` returned set the
    flusher's event in the same turn in which ``asyncio.run`` cancelled the flusher; the flusher
    went back to waiting on its event, forever, and ``asyncio.run`` never returned."""
    await asyncio.wait((future,), timeout=timeout)


def _running_asyncio_loop() -> asyncio.AbstractEventLoop | None:
    return asyncio._get_running_loop()


def _ignore(span: Span) -> None:
    pass


def _report_internal(where: str, exc: BaseException) -> None:
    try:
        _errors.internal_error(where, exc)
    except Exception:
        # Under looptrace's own tests internal errors re-raise; inside the flusher that would only
        # kill the task, so it is logged (once) and counted instead.
        pass


# ---------------------------------------------------------------------------------------------
# The process-wide pipeline
# ---------------------------------------------------------------------------------------------

_lock = threading.RLock()
_pipeline: Pipeline | None = None
_atexit_registered = False


class StartsPipeline:
    """The sink until a pipeline runs: the first span starts one from the configuration in
    force, which then replaces this as the sink."""

    def on_start(self, span: Span) -> None:
        _get_or_create().on_start(span)

    def on_end(self, span: Span) -> None:
        _get_or_create().on_end(span)


STARTS_PIPELINE = StartsPipeline()


def _wire_lag_monitor(cfg: Config) -> None:
    """With ``lag_monitor`` on, the monitor starts on a loop when the first span starts there."""
    if cfg.lag_monitor and not cfg.disabled:
        _state.add_hooks(start=_start_lag_monitor)
    else:
        _state.remove_hooks(start=_start_lag_monitor)


def _start_lag_monitor(span: Span) -> None:
    """Start the monitor on this loop at its first span, so a stall inside that very span is
    measured (once per loop: one lookup per span after)."""
    loop = asyncio._get_running_loop()
    if loop is None or loop in _monitored:
        return
    try:
        _monitored.add(loop)
    except TypeError:  # pragma: no cover - a loop without weakref support
        return
    from .monitor import ensure_from_config

    ensure_from_config(_state.config)


_monitored: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()


def _get_or_create() -> Pipeline:
    global _pipeline, _atexit_registered
    with _lock:
        pipeline = _pipeline
        if pipeline is None or pipeline._closed.is_set():
            pipeline = _pipeline = Pipeline(get_config())
            _state.sink = pipeline
            if not _atexit_registered:
                atexit.register(_at_exit)
                _atexit_registered = True
        return pipeline


def install(pipeline: Pipeline) -> Pipeline:
    """Make ``pipeline`` the process-wide one (tests use this to inject a transport)."""
    global _pipeline, _atexit_registered
    with _lock:
        old, _pipeline = _pipeline, pipeline
        _state.apply_config(pipeline.cfg)
        _state.sink = pipeline
        if not _atexit_registered:
            atexit.register(_at_exit)
            _atexit_registered = True
    if old is not None and old is not pipeline:
        old.close_soon()
    return pipeline


def current() -> Pipeline | None:
    """The installed pipeline, if one was created."""
    return _pipeline


def configure(**overrides: Any) -> Config:
    """Apply settings (environment first, then ``overrides``) and return them.

    A pipeline already running is replaced: it sends what it holds (within its shutdown
    timeout) in the background, and the next span starts the new one.
    """
    global _pipeline
    cfg = Config.from_env(**overrides)
    with _lock:
        _state.apply_config(cfg)
        old, _pipeline = _pipeline, None
        _state.sink = STARTS_PIPELINE
    if old is not None:
        old.close_soon()
    if not cfg.disabled:
        _prepare(cfg)
    return cfg


def _prepare(cfg: Config) -> None:
    # A start-up step: import the export modules here, once, rather than in a worker thread
    # during the first drain, where an import holds the GIL against the application's loop
    # for tens of milliseconds.
    from . import _encode, _otlp, _serialize  # noqa: F401

    _serialize.policy(cfg)  # compiles the redaction patterns, 3-4 ms
    if cfg.offload:
        from . import _offload  # noqa: F401


_prepared = False


def prepare_ahead() -> None:
    """Do the export path's start-up now (imports, the redaction patterns of the settings in
    the environment), without applying any settings: ``@traced`` calls it when it decorates,
    which is usually at import time, so that the first traced call, perhaps on a busy event
    loop, costs what every other call costs. Once per process; never raises."""
    global _prepared
    if _prepared or _state.config is not None:
        return
    _prepared = True
    try:
        cfg = Config.from_env()
    except Exception:
        return  # a bad setting is reported where the settings are applied, not here
    if not cfg.disabled:
        _prepare(cfg)


def _serialize_ready(cfg: Config) -> bool:
    """Whether the export modules are imported and ``cfg``'s serialization policy is built."""
    serialize = sys.modules.get("looptrace._serialize")
    if serialize is None or "looptrace._encode" not in sys.modules:
        return False
    if cfg.offload and "looptrace._offload" not in sys.modules:
        return False
    return serialize.has_policy(cfg)  # type: ignore[no-any-return]


def get_config() -> Config:
    """The settings in force (read from the environment on first use)."""
    if _state.config is None:
        return configure()
    return _state.config


async def flush(timeout: float | None = None) -> FlushResult:
    """Wait until every span ended before this call is sent (or dropped), at most ``timeout``
    seconds; never blocks the event loop. Returns what happened and what is still pending."""
    pipeline = _pipeline
    if pipeline is None:
        return FlushResult(0, dict.fromkeys(DROP_REASONS, 0), 0)
    return await pipeline.flush(timeout)


def flush_sync(timeout: float | None = None) -> FlushResult:
    """:func:`flush` for synchronous code (blocks the calling thread, never deadlocks)."""
    pipeline = _pipeline
    if pipeline is None:
        return FlushResult(0, dict.fromkeys(DROP_REASONS, 0), 0)
    return pipeline.flush_sync(timeout)


async def shutdown(timeout: float | None = None) -> FlushResult:
    """Flush, then stop the pipeline, all within ``timeout`` (default: LOOPTRACE_SHUTDOWN_TIMEOUT).
    Spans still unsent at the deadline are dropped and counted as ``shutdown``."""
    pipeline = _detach()
    if pipeline is None:
        return FlushResult(0, dict.fromkeys(DROP_REASONS, 0), 0)
    return await pipeline.shutdown(timeout)


def shutdown_sync(timeout: float | None = None) -> FlushResult:
    """:func:`shutdown` for synchronous code."""
    pipeline = _detach()
    if pipeline is None:
        return FlushResult(0, dict.fromkeys(DROP_REASONS, 0), 0)
    return pipeline.shutdown_sync(timeout)


def _detach() -> Pipeline | None:
    """Take the installed pipeline out of service (the next span starts a new one) and keep it
    as the source of ``statistics()`` until then."""
    global _pipeline
    with _lock:
        pipeline, _pipeline = _pipeline, None
        if pipeline is not None:
            _state.sink = STARTS_PIPELINE
    if pipeline is not None:
        _last_stats[0] = pipeline
    return pipeline


# After shutdown, statistics() still describes the pipeline that was stopped.
_last_stats: list[Pipeline | None] = [None]


async def backpressure() -> None:
    """Wait while the bytes queued plus in flight exceed LOOPTRACE_FLUSH_BACKPRESSURE_BYTES."""
    pipeline = _pipeline
    if pipeline is not None:
        await pipeline.backpressure()


def statistics() -> Statistics:
    """A typed snapshot of the pipeline: queued, in flight, sent, retried, dropped by reason."""
    pipeline = _pipeline or _last_stats[0]
    if pipeline is None:
        return Statistics(internal_errors=dict(_errors.counts))
    return pipeline.statistics()


class _AfterExit:
    """The sink once the exit flush has run: a span that ends later (a generator suspended
    until the interpreter tears it down) cannot be sent, so it is counted as dropped
    (``shutdown``) and said once on standard error."""

    def __init__(self, pipeline: Pipeline) -> None:
        self._pipeline = pipeline
        self._told = False

    def on_start(self, span: Span) -> None:
        pass

    def on_end(self, span: Span) -> None:
        dropped = self._pipeline.buffer.dropped
        dropped["shutdown"] = dropped.get("shutdown", 0) + 1
        if self._told:
            return
        self._told = True
        try:
            stream = sys.stderr
            if stream is not None:
                stream.write(
                    f"looptrace: span {span.name!r} ended after the final flush at exit and "
                    "was not sent (a generator left suspended?)\n"
                )
        except Exception:
            pass


def _at_exit() -> None:
    pipeline = _pipeline
    if pipeline is None:
        return
    _state.sink = _AfterExit(pipeline)
    if pipeline.buffer.idle():
        pipeline._finish_close()  # nothing to send; reports drops not yet logged
        return
    _report_lost(pipeline, pipeline.shutdown_sync(pipeline.cfg.shutdown_timeout))


def _report_lost(pipeline: Pipeline, result: FlushResult) -> None:
    lost = sum(result.dropped.values())
    if lost:
        # logging's last-resort handler prints this to stderr even when logging is not set up.
        # Where to and why, never the headers (they carry API keys).
        where = pipeline.cfg.endpoint or f"the local store {pipeline.cfg.store_path}"
        logger.warning(
            "looptrace: %d span(s) could not be sent to %s before exit (%s)%s",
            lost,
            where,
            ", ".join(f"{k}={v}" for k, v in result.dropped.items() if v),
            f"; last error: {pipeline.last_error}" if pipeline.last_error else "",
        )


def shutdown_on_signal(*signals: int) -> None:
    """Flush and report, within the shutdown deadline, when the process is told to stop.

    By default SIGTERM ends a Python process at once: no ``atexit`` handler runs, so spans not
    yet sent are lost without a word. After ``looptrace.shutdown_on_signal()`` (SIGTERM when
    no signal is named) the signal first runs the same final flush as a normal exit
    (``shutdown_timeout``), reporting on standard error what could not be sent, then does what
    it did before: calls the handler that was installed, or, for the default action, ends the
    process by the same signal (so its exit status still says which). Call it from the main
    thread, as Python requires of signal handlers."""
    import signal

    for signum in signals or (signal.SIGTERM,):
        previous = signal.getsignal(signum)

        def handler(received: int, frame: Any, previous: Any = previous) -> None:
            pipeline = _pipeline
            if pipeline is not None:
                # Detached: if the program goes on after all, its next span starts anew.
                _report_lost(pipeline, shutdown_sync(pipeline.cfg.shutdown_timeout))
            if callable(previous):
                previous(received, frame)
            elif previous != signal.SIG_IGN:
                signal.signal(received, signal.SIG_DFL)
                signal.raise_signal(received)

        signal.signal(signum, handler)


def _after_fork_in_child() -> None:
    # The child starts empty: the parent's spans are the parent's to send, and the parent's
    # flusher thread and locks do not exist (or are in an unknown state) here.
    global _pipeline, _lock
    _lock = threading.RLock()
    if _pipeline is not None:
        _pipeline = None
        _state.sink = STARTS_PIPELINE
    _last_stats[0] = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

__all__ = [
    "FlushResult",
    "OffloadStatistics",
    "Pipeline",
    "Statistics",
    "backpressure",
    "configure",
    "flush",
    "flush_sync",
    "get_config",
    "shutdown",
    "shutdown_on_signal",
    "shutdown_sync",
    "statistics",
]


# The wiring from capture up: capture never imports this module's stage, it is told.
if isinstance(_state.sink, _state.NullSink) and not (_state.config and _state.config.disabled):
    _state.sink = STARTS_PIPELINE
_state.config_listeners.append(_wire_lag_monitor)
_state.prepare_ahead = prepare_ahead
if _state.config is not None:
    _wire_lag_monitor(_state.config)
