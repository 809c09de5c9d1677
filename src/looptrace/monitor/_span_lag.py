"""Span lag: the worst stall each span saw while it was open, from the ticks' max-stack.

Every tick pushes its stall (its lag, less the time the process did not run and looptrace's own
work) onto its monitor's monotonic max-stack (``_push_tick``). While any
monitor runs, one end hook (``_span_end``) gives each span that ends on a monitored loop's
thread ``looptrace.loop.lag_max_ms``: a bisect of the span's start over the stack, with no
clock reading (one, only when the loop is late at that very moment). ``blocked_ns`` reads the
same ticks' running total of lag.
"""

from __future__ import annotations

import bisect
import time
from typing import TYPE_CHECKING

from ._hook import _watch_get, _watches
from ._internals import LOOP_LAG_MAX_MS, _clock
from ._registry import _by_thread_get, _get_ident

if TYPE_CHECKING:
    from ._internals import Span
    from ._monitor import LagMonitor

_bisect_left = bisect.bisect_left
_perf = time.perf_counter
_EXPLAIN_NS = 2_000_000


def _push_tick(monitor: LagMonitor, due_ns: int, ran_ns: int, lag_ns: int, bucket: int) -> None:
    """Put a tick on ``monitor``'s max-stack: ticks it out-lags (by bucket) leave, so due times
    ascend and lags strictly decrease, and the stack never outgrows the histogram's buckets."""
    buckets = monitor._stack_bucket
    while buckets and buckets[-1] <= bucket:
        buckets.pop()
        monitor._stack_due.pop()
        monitor._stack_ran.pop()
        monitor._stack_lag.pop()
    buckets.append(bucket)
    monitor._stack_due.append(due_ns)
    monitor._stack_ran.append(ran_ns)
    monitor._stack_lag.append(lag_ns)


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
        # The tick due just before the start may have run after it: only the part of its
        # stall after the start is the span's.
        late = min(monitor._stack_ran[j - 1] - start, monitor._stack_lag[j - 1])
        if late > worst:
            worst = late
    # The pending tick may be late right now (a stall inside this span that ends before the
    # loop gets to run the ticker): count what it has built up, but never more than the span's
    # own duration. All in span-clock nanoseconds.
    end = span.end_ns
    pending = end - monitor._due_ns
    if pending > worst:
        watch = monitor._watch
        if pending > _EXPLAIN_NS and watch is not None:
            # The loop is late right now: leave out the time the process did not run, as the
            # tick will when it runs (a clock reading, and a CPU-time call only when the
            # watchdog saw or is missing a pause).
            now = _perf()
            since = now - pending / 1e9
            if watch.beats.may_have_paused(since, now):
                pending -= int(watch.beats.unscheduled(since, now) * 1e9)
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
