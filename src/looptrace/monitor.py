"""The event-loop lag monitor: how late the loop runs, what blocked it, and which spans it hurt.

    async with looptrace.LagMonitor(culprits=True) as monitor:
        await serve()
    print(monitor.snapshot())          # LagSnapshot(count=..., p99_ms=..., max_ms=...)
    for c in monitor.culprits:         # the callbacks and task steps that held the loop
        print(c.duration_ms, c.qualname, f"{c.filename}:{c.lineno}")

Three parts, each paying only for what it measures:

* A ticker: one ``loop.call_at`` callback every ``interval`` seconds that records how late the
  loop woke it into a constant-memory log-linear histogram. ~100 callbacks a second by default.
* Span lag: while a monitor runs, every span that ends on its loop gets the worst lag observed
  while it was open (``looptrace.loop.lag_max_ms``), from one end hook: a bisect of the span's
  start time over a monotonic max-stack of tick lags, with no clock reading.
* Culprits (opt-in): ``asyncio.events.Handle._run`` is wrapped, only while some monitor asks for
  culprits, so each callback bumps a counter; a watchdog thread dates callbacks from that counter
  and samples the loop thread's stack (``sys._current_frames``) once one has run for half the
  threshold, which names the exact line that is blocking (a ``time.sleep`` included). When the step ends above the threshold
  it becomes a :class:`Culprit`, and a ``looptrace.loop.stall`` event on the span that was active
  in the blocked code (or a warning on the ``looptrace.monitor`` logger when there was none).
  Stopping the last such monitor puts the original ``Handle._run`` back.

asyncio only: loops that do not run ``asyncio.events.Handle`` objects (uvloop) get the ticker and
span lag but no culprits. See ``docs/lag-monitor.md``.
"""

from __future__ import annotations

import asyncio
import asyncio.events
import bisect
import collections
import contextvars
import dataclasses
import inspect
import logging
import math
import os
import sys
import sysconfig
import threading
import time
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any

# The pipeline, for its wiring too: the summary spans need its sink even in a program that
# traces nothing else.
from . import _clock, _export, _state
from ._context import CURRENT
from ._errors import internal_error
from ._semconv import LOOP_LAG_MAX_MS

if TYPE_CHECKING:
    from ._config import Config
    from ._span import Span

__all__ = [
    "Culprit",
    "LagMonitor",
    "LagSnapshot",
    "active_monitor",
    "blocked_ns",
    "ensure_from_config",
    "finish_windows",
]

logger = logging.getLogger("looptrace.monitor")

STALL_EVENT = "looptrace.loop.stall"
SUMMARY_SPAN = "looptrace.loop.lag"
SUMMARY_PREFIX = "looptrace.loop.lag."

_get_running_loop = asyncio.events._get_running_loop
_perf = time.perf_counter
_bisect_left = bisect.bisect_left
_CORO_FLAGS = inspect.CO_COROUTINE | inspect.CO_ITERABLE_COROUTINE | inspect.CO_ASYNC_GENERATOR
_MAX_CULPRITS = 100
_MAX_SAMPLES = 64
_MAX_STACK = 40


# --------------------------------------------------------------------------------------------
# The histogram


_MAX_US = 60_000_000  # lags above 60 s are counted as 60 s in the percentiles (max stays exact)
_N_BUCKETS = ((_MAX_US.bit_length() - 7) << 6) + 128


def _bucket(us: int) -> int:
    """Log-linear bucket of a lag in microseconds: exact below 128 us, then 64 sub-buckets per
    power of two, so any value is within 1/64 (1.6%) of its bucket's bounds."""
    if us < 128:
        return us if us > 0 else 0
    if us > _MAX_US:
        us = _MAX_US
    shift = us.bit_length() - 7
    return (shift << 6) + (us >> shift)


def _bucket_bounds(index: int) -> tuple[int, int]:
    """[low, high) in microseconds of a bucket."""
    shift = (index >> 6) - 1
    if shift <= 0:
        return index, index + 1
    low = (index - (shift << 6)) << shift
    return low, low + (1 << shift)


@dataclasses.dataclass(frozen=True)
class LagSnapshot:
    """Loop lag over one window: how late the loop ran the monitor's ticker.

    ``count`` is the number of ticks measured; every ``*_ms`` figure is in milliseconds.
    Percentiles come from log-linear buckets (within ~1% of the true value); ``mean_ms``,
    ``max_ms`` and ``total_stall_ms`` (the sum of all lags) are exact. ``worst_at_ns`` is the
    wall-clock time (ns since the epoch) the worst-delayed tick was due, 0 when nothing was
    measured.
    """

    count: int
    mean_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    total_stall_ms: float
    worst_at_ns: int


class _Histogram:
    """Counts of lags in fixed log-linear buckets: constant memory however long it runs."""

    __slots__ = ("buckets", "count", "max", "total", "worst_at_ns")

    def __init__(self) -> None:
        self.buckets = [0] * _N_BUCKETS
        self.count = 0
        self.total = 0.0
        self.max = 0.0
        self.worst_at_ns = 0

    def record(self, lag: float, at_ns: int = 0) -> None:
        """Add one lag (seconds); ``at_ns`` is when it happened, kept for the worst one."""
        if lag < 0.0:
            lag = 0.0
        self.buckets[_bucket(int(lag * 1e6))] += 1
        self.count += 1
        self.total += lag
        if lag > self.max or self.count == 1:
            self.max = lag
            self.worst_at_ns = at_ns

    def percentile(self, p: float) -> float:
        """The ``p`` quantile (0..1) in seconds, from the buckets (bucket midpoint, clamped to
        the exact maximum)."""
        if not self.count:
            return 0.0
        rank = max(1, math.ceil(p * self.count))
        seen = 0
        for index, n in enumerate(self.buckets):
            if n:
                seen += n
                if seen >= rank:
                    low, high = _bucket_bounds(index)
                    return min((low + high) / 2e6, self.max)
        return self.max

    def snapshot(self) -> LagSnapshot:
        n = self.count
        return LagSnapshot(
            count=n,
            mean_ms=round(self.total / n * 1e3, 3) if n else 0.0,
            p50_ms=round(self.percentile(0.5) * 1e3, 3),
            p90_ms=round(self.percentile(0.9) * 1e3, 3),
            p99_ms=round(self.percentile(0.99) * 1e3, 3),
            max_ms=round(self.max * 1e3, 3),
            total_stall_ms=round(self.total * 1e3, 3),
            worst_at_ns=self.worst_at_ns,
        )


# --------------------------------------------------------------------------------------------
# Culprits


@dataclasses.dataclass(frozen=True)
class Culprit:
    """A callback or task step that held the event loop longer than the threshold.

    ``qualname``/``filename``/``lineno`` name the innermost coroutine (or, for a plain callback,
    the innermost function) at the line where it was blocking, as sampled while it ran;
    ``stack`` is the whole sampled stack, outermost first, as ``"qualname (file:line)"``.
    ``task_name`` is None for a callback that is not a task step.
    """

    task_name: str | None
    qualname: str
    filename: str
    lineno: int
    duration_ms: float
    stack: tuple[str, ...]


# A sampled frame: (filename, qualname, lineno, is_coroutine, is_library).
_Frame = tuple[str, str, int, bool, bool]

# Frames from the standard library (asyncio's to_thread, gather...) and from looptrace itself are
# shown in the stack but not named as the culprit when the user's own coroutine is on the stack.
_STDLIB_DIR = os.path.join(sysconfig.get_paths()["stdlib"], "")
_LOOPTRACE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "")
# `looptrace demo` plays the user's program: its blocking step is what the culprit must name.
_DEMO_FILE = os.path.join(_LOOPTRACE_DIR, "_demo.py")


def _is_library(filename: str) -> bool:
    if filename.startswith(_LOOPTRACE_DIR):  # wherever looptrace is installed
        return filename != _DEMO_FILE
    # The standard library, but not the third-party packages installed under it.
    return filename.startswith(_STDLIB_DIR) and "-packages" not in filename


class _Watch:
    """Per-loop state shared by the wrapped ``Handle._run`` (loop thread) and the watchdog.

    The loop thread bumps ``seq`` when a callback starts and sets ``done`` when it ends, and does
    nothing else on the common path: no clock reading, which would cost as much again. The
    watchdog reads them without a lock (each read and write is atomic under the GIL), dates a
    callback's start to the middle of the two looks around it (``t0``, within half a period),
    and re-checks ``seq``/``done`` after sampling, so a sample is only kept for the callback it
    saw.
    """

    __slots__ = (
        "delivered",
        "done",
        "flagged",
        "handle",
        "last_look",
        "loop",
        "monitors",
        "samples",
        "seen",
        "seq",
        "stop",
        "t0",
        "thread",
        "thread_id",
        "threshold",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop, thread_id: int) -> None:
        self.loop = loop
        self.thread_id = thread_id
        self.monitors: list[LagMonitor] = []
        self.threshold = 0.1
        self.seq = 0
        self.done = 0
        self.seen = 0
        self.t0 = 0.0
        self.last_look = _perf()
        self.handle: asyncio.Handle | None = None
        self.flagged = -1
        self.samples: list[tuple[list[_Frame], Span | None]] = []
        self.delivered: list[Span] = []
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    def refresh(self) -> None:
        self.threshold = min((m._threshold for m in self.monitors), default=0.1)

    # -- watchdog thread ---------------------------------------------------------------------

    def run_watchdog(self) -> None:
        try:
            while True:
                # A quarter of the threshold between looks: a step is first sampled between
                # half and three quarters of the threshold, before it crosses it. Bounded so a
                # huge threshold still notices a closed loop.
                period = min(max(self.threshold / 4, 0.002), 0.25)
                if self.stop.wait(period):
                    return
                if self.loop.is_closed():
                    _forget_loop(self.loop)
                    return
                self.look()
        except Exception as exc:  # never let the watchdog die silently under our tests
            internal_error("monitor.watchdog", exc)

    def look(self) -> None:
        now = _perf()
        previous, self.last_look = self.last_look, now
        s = self.seq
        if self.done == s:
            return
        if self.seen != s:
            # First time we see this callback: it started since the previous look.
            self.seen = s
            self.t0 = (previous + now) / 2
            return
        handle = self.handle
        if handle is None or now - self.t0 < self.threshold / 2:
            return
        frame = sys._current_frames().get(self.thread_id)
        if frame is None:
            return
        frames = _walk(frame)
        context = getattr(handle, "_context", None)
        span = context.get(CURRENT) if context is not None else None
        if self.seq != s or self.done == s:
            return  # the callback ended while we looked: the sample may be someone else's
        if self.flagged != s:
            self.samples = []
            self.delivered = []
        if len(self.samples) < _MAX_SAMPLES:
            self.samples.append((frames, span))
        self.flagged = s

    # -- loop thread -------------------------------------------------------------------------

    def finish(self, handle: asyncio.Handle) -> None:
        """A sampled callback just returned: if it ran past the threshold, report it."""
        elapsed = _perf() - self.t0
        samples, delivered = self.samples, self.delivered
        self.samples, self.delivered = [], []
        if elapsed < self.threshold:
            return
        culprit = _make_culprit(handle, samples, elapsed)
        for monitor in self.monitors:
            if elapsed >= monitor._threshold:
                monitor._culprits.append(culprit)
        emitted = bool(delivered)
        for _, span in reversed(samples):
            if span is not None and span.is_recording and not span.end_ns:
                span.add_event(
                    STALL_EVENT, _event_attributes(culprit), _stall_start_ns(elapsed, span)
                )
                emitted = True
                break
        if not emitted:
            logger.warning(
                "event loop blocked for %.1f ms by %s%s (%s:%d)\n%s",
                culprit.duration_ms,
                f"task {culprit.task_name!r} in " if culprit.task_name else "",
                culprit.qualname,
                culprit.filename,
                culprit.lineno,
                "\n".join(f"  {line}" for line in culprit.stack),
            )

    def on_span_end(self, span: Span) -> None:
        """A span ends inside a step the watchdog has sampled: give it its stall event now,
        since it will be gone when the step returns."""
        s = self.seq
        if self.flagged != s or self.done == s:
            return
        if not any(sampled is span for _, sampled in self.samples):
            return
        elapsed = _perf() - self.t0
        if elapsed < self.threshold or any(d is span for d in self.delivered):
            return
        culprit = _make_culprit(self.handle, self.samples, elapsed)
        # End hooks run after end_ns is set, so add_event would refuse: append directly.
        _append_event(span, culprit, elapsed)
        self.delivered.append(span)


def _append_event(span: Span, culprit: Culprit, elapsed: float) -> None:
    from ._span import Event

    event = Event(STALL_EVENT, _stall_start_ns(elapsed, span), _event_attributes(culprit))
    if span.events is None:
        span.events = [event]
    else:
        span.events.append(event)


def _stall_start_ns(elapsed: float, span: Span) -> int:
    """When the stall began, as seen by ``span``: a span that started inside the blocking step
    (after the stall began) dates it at its own start, never before it."""
    return max(_clock.now_ns() - int(elapsed * 1e9), span.start_ns)


def _event_attributes(culprit: Culprit) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "looptrace.loop.stall.duration_ms": culprit.duration_ms,
        "code.function": culprit.qualname,
        "code.filepath": culprit.filename,
        "code.lineno": culprit.lineno,
        "looptrace.loop.stall.stack": "\n".join(culprit.stack),
    }
    if culprit.task_name is not None:
        attributes["looptrace.task.name"] = culprit.task_name
    return attributes


def _walk(frame: FrameType | None) -> list[_Frame]:
    """The loop thread's frames inside the running callback, outermost first."""
    out: list[_Frame] = []
    stop = _wrapped_run.__code__
    skip = getattr(_original_run, "__code__", None)
    while frame is not None and len(out) < _MAX_STACK:
        code = frame.f_code
        if code is stop:
            break
        if code is not skip:
            qualname = getattr(code, "co_qualname", code.co_name)
            filename = code.co_filename
            out.append(
                (
                    filename,
                    qualname,
                    frame.f_lineno,
                    bool(code.co_flags & _CORO_FLAGS),
                    _is_library(filename),
                )
            )
        frame = frame.f_back
    out.reverse()
    return out


def _make_culprit(
    handle: asyncio.Handle | None,
    samples: list[tuple[list[_Frame], Span | None]],
    elapsed: float,
) -> Culprit:
    callback = getattr(handle, "_callback", None)
    owner = getattr(callback, "__self__", None)
    task_name = owner.get_name() if isinstance(owner, asyncio.Task) else None
    frames: list[_Frame] = []
    if samples:
        # The line seen most often is where the step spent its time (ties: the first seen).
        counts = collections.Counter(_pick(f) for f, _ in samples if f)
        if counts:
            best = counts.most_common(1)[0][0]
            frames = next(f for f, _ in samples if f and _pick(f) == best)
    if frames:
        filename, qualname, lineno, _, _ = _pick(frames)
    elif isinstance(owner, asyncio.Task):
        # Not sampled in time (a step just past the threshold): name the coroutine instead,
        # at the line it is suspended on now.
        coro = owner.get_coro()
        code = getattr(coro, "cr_code", None) or getattr(coro, "gi_code", None)
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        qualname = getattr(code, "co_qualname", getattr(code, "co_name", repr(coro)))
        filename = getattr(code, "co_filename", "?")
        lineno = frame.f_lineno if frame is not None else getattr(code, "co_firstlineno", 0)
    else:
        code = getattr(callback, "__code__", None)
        qualname = getattr(callback, "__qualname__", None) or repr(callback)
        filename = getattr(code, "co_filename", "?")
        lineno = getattr(code, "co_firstlineno", 0)
    stack = tuple(f"{q} ({fn}:{ln})" for fn, q, ln, _, _ in frames)
    return Culprit(task_name, qualname, filename, lineno, round(elapsed * 1e3, 3), stack)


def _pick(frames: list[_Frame]) -> _Frame:
    """The frame to name: the innermost coroutine outside the standard library and looptrace,
    else the innermost coroutine, else the innermost frame."""
    for frame in reversed(frames):
        if frame[3] and not frame[4]:
            return frame
    for frame in reversed(frames):
        if frame[3]:
            return frame
    return frames[-1]


# What Handle._run was before we wrapped it (read when the wrapper goes in, put back when the
# last culprit monitor stops).
_original_run: Callable[[asyncio.Handle], None] = asyncio.events.Handle._run
_watches: dict[asyncio.AbstractEventLoop, _Watch] = {}
_watch_get = _watches.get


def _wrapped_run(self: asyncio.Handle) -> None:
    watch = _watch_get(self._loop)  # type: ignore[attr-defined]
    if watch is None:
        _original_run(self)
        return
    watch.handle = self
    s = watch.seq = watch.seq + 1
    try:
        _original_run(self)
    finally:
        watch.done = s
        watch.handle = None
        if watch.flagged == s:
            try:
                watch.finish(self)
            except Exception as exc:
                internal_error("monitor.culprit", exc)


def _patch(on: bool) -> None:
    global _original_run
    handle_cls = asyncio.events.Handle
    current = handle_cls.__dict__["_run"]
    if on:
        if current is not _wrapped_run:
            _original_run = current
            setattr(handle_cls, "_run", _wrapped_run)  # noqa: B010
    elif current is _wrapped_run:
        setattr(handle_cls, "_run", _original_run)  # noqa: B010


# --------------------------------------------------------------------------------------------
# The monitor

_lock = threading.RLock()
# Every running monitor per loop, oldest first; the first one feeds span lag.
_running: dict[asyncio.AbstractEventLoop, list[LagMonitor]] = {}
_active: dict[asyncio.AbstractEventLoop, LagMonitor] = {}
_active_get = _active.get
# The same monitors by the id of the thread their loop runs in, for the span hooks: on Linux
# asyncio's _get_running_loop() makes a getpid() system call, threading.get_ident() does not.
_by_thread: dict[int, LagMonitor] = {}
_by_thread_get = _by_thread.get
_get_ident = threading.get_ident


class LagMonitor:
    """Measures event-loop lag on one asyncio loop; optionally names what blocked it.

    ``interval``: seconds between ticks (lag resolution; 0.001 for benchmarks).
    ``culprits``: report callbacks and task steps that run longer than ``culprit_threshold``.
    ``summary_interval``: every so many seconds, export a ``looptrace.loop.lag`` span with the
    window's figures and start a new window (None: never).

    ``start()`` (or ``async with``) attaches it to the running loop, ``stop()`` detaches it and
    undoes everything it changed. Starting a started monitor does nothing.
    """

    def __init__(
        self,
        interval: float = 0.01,
        culprits: bool = False,
        culprit_threshold: float = 0.1,
        summary_interval: float | None = None,
    ) -> None:
        if not interval > 0:
            raise ValueError("interval must be a positive number of seconds")
        if not culprit_threshold > 0:
            raise ValueError("culprit_threshold must be a positive number of seconds")
        if summary_interval is not None and not summary_interval > 0:
            raise ValueError("summary_interval must be a positive number of seconds or None")
        self._interval = float(interval)
        self._want_culprits = culprits
        self._threshold = float(culprit_threshold)
        self._summary_interval = summary_interval
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None
        # The ticker runs in a context of its own: no copy per tick, and a summary span is a
        # root rather than a child of whatever span was active when start() was called.
        self._ctx = contextvars.Context()
        self._hist = _Histogram()
        self._window_start_ns = _clock.now_ns()
        self._next_summary = math.inf
        self._due = 0.0  # when the pending tick is due, on the loop's clock (s)
        self._due_ns = 0  # the same, on the span clock (ns), for the span hook
        self._interval_ns = int(self._interval * 1e9)
        self._ticks = 0
        # Every tick's lag added up (ns), never reset: the difference between two readings is
        # how long the loop was held between them (see blocked_ns).
        self._lag_sum_ns = 0
        # Monotonic max-stack over ticks, for span lag: when each tick was due and when it ran
        # (span clock, ns: the clock span.start_ns/end_ns come from), its lag, and its bucket.
        # Due times ascend; lags strictly decrease by bucket, so it never holds more than
        # _N_BUCKETS entries.
        self._stack_due: list[int] = []
        self._stack_ran: list[int] = []
        self._stack_lag: list[int] = []  # ns
        self._stack_bucket: list[int] = []
        self._culprits: collections.deque[Culprit] = collections.deque(maxlen=_MAX_CULPRITS)
        self._watch: _Watch | None = None
        self._thread_id = 0

    def __repr__(self) -> str:
        state = "running" if self._loop is not None else "stopped"
        return f"<LagMonitor {state} interval={self._interval} culprits={self._want_culprits}>"

    @property
    def running(self) -> bool:
        return self._loop is not None

    @property
    def culprits(self) -> list[Culprit]:
        """The last 100 culprits, oldest first (empty unless ``culprits=True``)."""
        return list(self._culprits)

    @property
    def culprits_supported(self) -> bool:
        """False when culprits were asked for but this loop's callbacks cannot be observed."""
        return not self._want_culprits or self._watch is not None or self._loop is None

    def snapshot(self) -> LagSnapshot:
        """The figures for the current window."""
        return self._hist.snapshot()

    def reset(self) -> None:
        """Start a new window (span lag and culprits are not affected)."""
        self._hist = _Histogram()
        self._window_start_ns = _clock.now_ns()

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> LagMonitor:
        """Attach to ``loop`` (default: the running loop) and start ticking."""
        if self._loop is not None:
            return self
        if loop is None:
            loop = asyncio.get_running_loop()
        if loop.is_closed():
            raise RuntimeError("cannot monitor a closed event loop")
        running_here = _get_running_loop() is loop
        with _lock:
            _prune_closed()
            self._loop = loop
            self._due = loop.time() + self._interval
            self._due_ns = _clock.now_ns() + self._interval_ns
            monitors = _running.setdefault(loop, [])
            monitors.append(self)
            if loop not in _active:
                _active[loop] = self
            _state.add_hooks(end=_span_end)
        if self._summary_interval is not None:
            self._next_summary = loop.time() + self._summary_interval
        self._window_start_ns = _clock.now_ns()
        if running_here:
            self._bind_thread()
        if running_here or not loop.is_running():
            self._begin()
        else:
            loop.call_soon_threadsafe(self._begin)
        return self

    def _bind_thread(self) -> None:
        """Called on the loop's thread once it runs: from now on spans there see this monitor."""
        with _lock:
            loop = self._loop
            if loop is None or self._thread_id:
                return
            self._thread_id = _get_ident()
            if _active.get(loop) is self:
                _by_thread[self._thread_id] = self

    def _begin(self) -> None:
        loop = self._loop
        if loop is None:
            return
        if loop.is_running():
            self._bind_thread()
        if self._want_culprits:
            if isinstance(loop, asyncio.BaseEventLoop):
                thread_id = threading.get_ident() if loop.is_running() else 0
                with _lock:
                    watch = _watches.get(loop)
                    if watch is None:
                        watch = _watches[loop] = _Watch(loop, thread_id)
                    watch.monitors.append(self)
                    watch.refresh()
                    self._watch = watch
                    _patch(True)
                    if watch.thread is None:
                        watch.thread = threading.Thread(
                            target=watch.run_watchdog, name="looptrace-lag-watchdog", daemon=True
                        )
                        watch.thread.start()
            else:
                logger.warning(
                    "looptrace: %s does not run asyncio Handles; lag is measured but culprits "
                    "cannot be named on this loop",
                    type(loop).__name__,
                )
        self._due = loop.time() + self._interval
        self._due_ns = _clock.now_ns() + self._interval_ns
        self._handle = loop.call_at(self._due, self._tick, context=self._ctx)

    def stop(self) -> None:
        """Detach from the loop, restoring everything start() changed, and export the summary
        of the window so far (with ``summary_interval``). Safe to call twice."""
        loop = self._loop
        if loop is None:
            return
        self.finish_window()
        handle, self._handle = self._handle, None
        if handle is not None and not loop.is_closed():
            if loop.is_running() and _get_running_loop() is not loop:
                loop.call_soon_threadsafe(handle.cancel)
            else:
                handle.cancel()
        thread = self._detach()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=1.0)

    def _detach(self) -> threading.Thread | None:
        loop = self._loop
        if loop is None:
            return None
        thread = None
        with _lock:
            self._loop = None
            monitors = _running.get(loop, [])
            if self in monitors:
                monitors.remove(self)
            if not monitors:
                _running.pop(loop, None)
                _active.pop(loop, None)
            elif _active.get(loop) is self:
                _active[loop] = monitors[0]
            if _by_thread.get(self._thread_id) is self:
                del _by_thread[self._thread_id]
                successor = _active.get(loop)
                if successor is not None and successor._thread_id:
                    _by_thread[successor._thread_id] = successor
            self._thread_id = 0
            watch, self._watch = self._watch, None
            if watch is not None:
                if self in watch.monitors:
                    watch.monitors.remove(self)
                watch.refresh()
                if not watch.monitors:
                    _watches.pop(loop, None)
                    watch.stop.set()
                    thread = watch.thread
                if not _watches:
                    _patch(False)
            if not _running:
                _state.remove_hooks(end=_span_end)
        return thread

    async def __aenter__(self) -> LagMonitor:
        return self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- the ticker --------------------------------------------------------------------------

    def _tick(self) -> None:
        loop = self._loop
        if loop is None:
            return
        try:
            now = loop.time()
            lag = now - self._due
            if lag < 0.0:
                lag = 0.0  # the loop may run a timer up to its clock resolution early
            ran_ns = _clock.now_ns()
            lag_ns = int(lag * 1e9)
            due_ns = ran_ns - lag_ns
            self._hist.record(lag, due_ns)
            bucket = _bucket(int(lag * 1e6))
            buckets = self._stack_bucket
            while buckets and buckets[-1] <= bucket:
                buckets.pop()
                self._stack_due.pop()
                self._stack_ran.pop()
                self._stack_lag.pop()
            buckets.append(bucket)
            self._stack_due.append(due_ns)
            self._stack_ran.append(ran_ns)
            self._stack_lag.append(lag_ns)
            self._ticks += 1
            self._lag_sum_ns += lag_ns
            if not self._thread_id:  # started before the loop ran
                self._bind_thread()
                if self._watch is not None:
                    self._watch.thread_id = self._thread_id
            if now >= self._next_summary:
                self._next_summary = now + (self._summary_interval or math.inf)
                self._emit_summary()
        except Exception as exc:
            internal_error("monitor.tick", exc)
            now = loop.time()
        self._due = now + self._interval
        self._due_ns = _clock.now_ns() + self._interval_ns
        self._handle = loop.call_at(self._due, self._tick, context=self._ctx)

    def finish_window(self) -> None:
        """Export the summary of the current, partial window now (with ``summary_interval``):
        the last window of a loop that is ending would otherwise never be exported."""
        if self._summary_interval is not None:
            try:
                # In a context of its own: the summary is a root span, whatever the caller's
                # context holds (a span, or the flusher's suppression of tracing).
                contextvars.Context().run(self._emit_summary)
            except Exception as exc:
                internal_error("monitor.summary", exc)

    def _emit_summary(self) -> None:
        snap = self.snapshot()
        start_ns = self._window_start_ns
        self.reset()
        if not snap.count or _state.disabled:
            return
        from ._capture import start_span

        attributes: dict[str, Any] = {
            SUMMARY_PREFIX + field.name: getattr(snap, field.name)
            for field in dataclasses.fields(snap)
        }
        attributes[SUMMARY_PREFIX + "interval_ms"] = self._interval * 1e3
        span = start_span(SUMMARY_SPAN, attributes)
        span.start_ns = start_ns
        span.end()


# --------------------------------------------------------------------------------------------
# Span hooks (installed while any monitor runs)


def _span_end(span: Span) -> None:
    """Give a span ending on a monitored loop's thread the worst lag seen while it was open.

    No start hook: the span's own start and end times locate the ticks that ran while it was
    open, so a span costs one bisect over the max-stack and one clock reading, at its end.
    """
    tid = _get_ident()
    monitor = _by_thread_get(tid)
    if monitor is None:
        return
    loop = monitor._loop
    # Only while its loop runs in this thread (BaseEventLoop keeps _thread_id; other loops are
    # trusted): after asyncio.run returns, spans in plain sync code get nothing.
    if loop is None or getattr(loop, "_thread_id", tid) != tid:
        return
    start = span.start_ns
    dues = monitor._stack_due
    # Ticks due after the span started: the first one on the stack has the worst lag.
    j = _bisect_left(dues, start)
    worst = monitor._stack_lag[j] if j < len(dues) else 0
    if j:
        # The tick due just before the start may have run after it: only the part of its lag
        # after the start is the span's.
        late = monitor._stack_ran[j - 1] - start
        if late > worst:
            worst = late
    # The pending tick may be late right now (a stall inside this span that ends before the
    # loop gets to run the ticker): count what it has built up, but never more than the span's
    # own duration. All in span-clock nanoseconds: no clock reading here.
    end = span.end_ns
    pending = end - monitor._due_ns
    if pending > worst:
        duration = end - start
        worst = pending if pending < duration else max(duration, worst)
    value = worst // 1000 / 1e3 if worst > 0 else 0.0  # ms, to the microsecond
    # End hooks run after end_ns is set (set_attribute would refuse): write directly.
    if span.attributes is None:
        span.attributes = {LOOP_LAG_MAX_MS: value}
    else:
        span.attributes[LOOP_LAG_MAX_MS] = value
    if _watches:
        watch = _watch_get(loop)
        if watch is not None and watch.flagged == watch.seq:
            watch.on_span_end(span)


# --------------------------------------------------------------------------------------------
# Module functions


def finish_windows(loop: asyncio.AbstractEventLoop) -> None:
    """Export the partial summary window of every monitor on ``loop`` (which is ending)."""
    with _lock:
        monitors = list(_running.get(loop, ()))
    for monitor in monitors:
        monitor.finish_window()


def blocked_ns() -> int | None:
    """How long the loop running in this thread has been held so far, in nanoseconds: the sum
    of every tick's lag plus what the pending tick has built up. Subtract two readings to get
    the time the loop was blocked between them (to the ticker's resolution). None when no
    monitor watches a loop in this thread."""
    monitor = _by_thread_get(_get_ident())
    if monitor is None or monitor._loop is None:
        return None
    pending = _clock.now_ns() - monitor._due_ns
    return monitor._lag_sum_ns + (pending if pending > 0 else 0)


def active_monitor() -> LagMonitor | None:
    """The monitor running on the current thread's event loop (the first started), if any."""
    loop = _get_running_loop()
    if loop is None:
        return None
    return _active_get(loop)


def ensure_from_config(cfg: Config | None = None) -> LagMonitor | None:
    """Start the program-wide monitor on the running loop when ``cfg.lag_monitor`` is set.

    Uses ``lag_interval``, ``lag_culprits``, ``lag_culprit_threshold`` and
    ``lag_summary_interval``. Returns the monitor already running on this loop if there is one,
    None when monitoring is off or no loop is running. Cheap enough to call on every
    ``configure()`` or at the start of every ``asyncio.run``.
    """
    if cfg is None:
        cfg = _export.get_config()
    loop = _get_running_loop()
    if loop is None:
        return None
    existing = _active_get(loop)
    if existing is not None or not cfg.lag_monitor:
        return existing
    monitor = LagMonitor(
        interval=cfg.lag_interval,
        culprits=cfg.lag_culprits,
        culprit_threshold=cfg.lag_culprit_threshold,
        summary_interval=cfg.lag_summary_interval,
    )
    return monitor.start(loop)


def _prune_closed() -> None:
    """Forget monitors whose loop closed without stop() (asyncio.run ending while one ran)."""
    for loop in [loop for loop in _running if loop.is_closed()]:
        thread = _forget_loop(loop)
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=1.0)  # it wakes at once: the stop event is set


def _forget_loop(loop: asyncio.AbstractEventLoop) -> threading.Thread | None:
    thread = None
    with _lock:
        for monitor in list(_running.get(loop, ())):
            monitor._handle = None
            thread = monitor._detach() or thread
        watch = _watches.pop(loop, None)
        if watch is not None:
            watch.stop.set()
            thread = watch.thread
            if not _watches:
                _patch(False)
    return thread
