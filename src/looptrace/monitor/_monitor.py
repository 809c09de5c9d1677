"""``LagMonitor``: its lifecycle on one loop, and the ticker that measures the loop's lag.

A ticker is one ``loop.call_at`` callback every ``interval`` seconds that records how late the
loop woke it into the histogram (``_histogram``) and the max-stack span lag reads
(``_span_lag``). ``start()`` registers the monitor (``_registry``), installs the span end hook
and, with ``culprits=True``, joins the loop's watch (``_culprits``); ``stop()`` undoes each.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import math
import threading
import time
from types import TracebackType
from typing import TYPE_CHECKING

from ._causes import GC_LOG, describe_gc
from ._culprits import CAUSE_LOOPTRACE, Culprit, _join_watch, _leave_watch, _Watch
from ._histogram import LagSnapshot, _bucket, _Histogram

# The pipeline, for its wiring too: the summary spans need its sink even in a program that
# traces nothing else.
from ._internals import _clock, _export, _state, internal_error
from ._registry import (
    _active,
    _active_get,
    _by_thread,
    _get_ident,
    _get_running_loop,
    _lock,
    _prune_closed,
    _running,
)
from ._span_lag import _push_tick, _span_end
from ._summary import _emit_summary, _finish_window

if TYPE_CHECKING:
    from ._internals import Config

_MAX_CULPRITS = 100
_perf = time.perf_counter
# Lags shorter than this are taken as they are: asking what caused them costs a clock reading
# and a CPU-time system call, for nothing a reader would act on.
_EXPLAIN_S = 0.002


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
        # The loop's watch, which every monitor joins for its heartbeat (the time the process
        # did not run); _culprit_watch: whether this monitor names culprits through it.
        self._watch: _Watch | None = None
        self._culprit_watch = False
        # looptrace's own work the watch saw since the last tick (s): not the program's stall.
        self._own_pending = 0.0
        # The longest step of the program's the watch measured since the last tick: that tick's
        # lag is this stall, seen late and to the ticker's phase; the step's own measure is the
        # one every monitor on the loop shares.
        self._stall_pending: tuple[float, str] | None = None
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
        return not self._want_culprits or self._culprit_watch or self._loop is None

    def snapshot(self) -> LagSnapshot:
        """The figures for the current window."""
        return self._hist.snapshot((_clock.now_ns() - self._window_start_ns) / 1e6)

    def _note_culprit(self, culprit: Culprit) -> None:
        """A step on this loop held it past a culprit threshold (called on the loop thread, for
        every monitor on the loop): the program's stall counts at its full measured length;
        looptrace's own work is taken out of the next tick's lag."""
        if culprit.cause == CAUSE_LOOPTRACE:
            self._own_pending += culprit.stall_ms / 1e3
        elif culprit.charged:
            cause = culprit.describe_cause()
            where = f"{culprit.qualname} ({culprit.filename}:{culprit.lineno})"
            stall = (culprit.stall_ms / 1e3, f"{cause} during {where}" if cause else where)
            self._hist.note_stall(*stall)
            if self._stall_pending is None or stall[0] > self._stall_pending[0]:
                self._stall_pending = stall

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
        _join_watch(self, loop)
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
            thread = _leave_watch(self, loop)
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
            stall = self._record(lag, due_ns)
            _push_tick(self, due_ns, ran_ns, int(stall * 1e9), _bucket(int(stall * 1e6)))
            self._ticks += 1
            self._lag_sum_ns += lag_ns
            if not self._thread_id:  # started before the loop ran
                self._bind_thread()
                if self._watch is not None:
                    self._watch.thread_id = self._thread_id
            if now >= self._next_summary:
                self._next_summary = now + (self._summary_interval or math.inf)
                _emit_summary(self)
        except Exception as exc:
            internal_error("monitor.tick", exc)
            now = loop.time()
        self._due = now + self._interval
        self._due_ns = _clock.now_ns() + self._interval_ns
        self._handle = loop.call_at(self._due, self._tick, context=self._ctx)

    def _record(self, lag: float, due_ns: int) -> float:
        """Put one tick's lag in the histogram, with the part of it the program caused (the
        stall, returned): the time the process did not run and looptrace's own work are taken
        out and counted apart."""
        own, self._own_pending = self._own_pending, 0.0
        measured, self._stall_pending = self._stall_pending, None
        watch = self._watch
        # With culprits named on this loop, a stall is a step past their threshold: measured on
        # the step itself, the same figure for every monitor here; a late tick counts as one
        # only when as long (a collection, a step the watchdog could not sample). Shorter lags
        # are lag, which a tick measures to its own phase.
        floor = watch.threshold if watch is not None and watch.hooked else 0.0
        unscheduled = 0.0
        if lag >= _EXPLAIN_S and watch is not None:
            ran = _perf()
            if watch.beats.may_have_paused(ran - lag, ran):
                unscheduled = watch.beats.unscheduled(ran - lag, ran)
            own = min(own, lag - unscheduled)
        else:
            ran, own = 0.0, min(own, lag)
        stall = lag - unscheduled - own
        cause = ""
        if measured is not None:
            stall, cause = min(lag, measured[0]), measured[1]
            counted = stall
        else:
            counted = stall if stall >= floor else 0.0
            if counted > self._hist.stall and ran:
                gc_s, generation, where = GC_LOG.during(ran - lag, ran)
                if gc_s >= counted / 2:
                    cause = describe_gc(gc_s, generation, where)
            if floor and counted and watch is not None:
                # A stall no step measured, seen by this ticker: every monitor on the loop
                # counts it (theirs may tick at another phase and see less of it).
                for other in watch.monitors:
                    if other is not self:
                        other._hist.note_stall(counted, cause)
        self._hist.record(lag, due_ns, counted, unscheduled, own, cause)
        return stall

    def finish_window(self) -> None:
        """Export the summary of the current, partial window now (with ``summary_interval``):
        the last window of a loop that is ending would otherwise never be exported."""
        _finish_window(self)


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
