"""The lag histogram: constant-memory log-linear buckets, and the snapshot read from them."""

from __future__ import annotations

import dataclasses
import math

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
    """Loop lag over one window (``window_ms`` long): how late the loop ran the monitor's
    ticker, and the longest stall the program caused.

    ``count`` is the number of ticks measured; every ``*_ms`` figure is in milliseconds.
    **Lag** is everything that made a tick late: percentiles come from log-linear buckets
    (within ~1% of the true value); ``mean_ms``, ``max_ms`` (the worst lag) and
    ``total_stall_ms`` (the sum of all lags) are exact. ``worst_at_ns`` is the wall-clock time
    (ns since the epoch) the worst-delayed tick was due, 0 when nothing was measured.

    **Worst stall** (``worst_stall_ms``) is the longest time the program held the loop: a
    tick's lag, or a culprit's duration, less the time the process was not scheduled and
    looptrace's own work, which are counted apart (``unscheduled_ms``, ``looptrace_ms``, summed
    over the window). ``worst_stall_cause`` says what it was, when known: the code (``fn
    (file:line)``) or garbage collection.
    """

    count: int
    mean_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    total_stall_ms: float
    worst_at_ns: int
    worst_stall_ms: float = 0.0
    worst_stall_cause: str = ""
    unscheduled_ms: float = 0.0
    looptrace_ms: float = 0.0
    window_ms: float = 0.0


class _Histogram:
    """Counts of lags in fixed log-linear buckets: constant memory however long it runs."""

    __slots__ = (
        "buckets",
        "count",
        "looptrace",
        "max",
        "stall",
        "stall_cause",
        "total",
        "unscheduled",
        "worst_at_ns",
    )

    def __init__(self) -> None:
        self.buckets = [0] * _N_BUCKETS
        self.count = 0
        self.total = 0.0
        self.max = 0.0
        self.worst_at_ns = 0
        self.stall = 0.0
        self.stall_cause = ""
        self.unscheduled = 0.0
        self.looptrace = 0.0

    def record(
        self,
        lag: float,
        at_ns: int = 0,
        stall: float | None = None,
        unscheduled: float = 0.0,
        looptrace: float = 0.0,
        cause: str = "",
    ) -> None:
        """Add one lag (seconds); ``at_ns`` is when it happened, kept for the worst one.
        ``stall`` is the part of it the program caused (default: all of it); ``unscheduled``
        and ``looptrace`` the parts the process did not run and looptrace worked."""
        if lag < 0.0:
            lag = 0.0
        self.buckets[_bucket(int(lag * 1e6))] += 1
        self.count += 1
        self.total += lag
        if lag > self.max or self.count == 1:
            self.max = lag
            self.worst_at_ns = at_ns
        if stall is None:
            stall = lag
        elif unscheduled or looptrace:
            self.unscheduled += unscheduled
            self.looptrace += looptrace
        if stall > self.stall:
            self.stall = stall
            self.stall_cause = cause

    def note_stall(self, stall: float, cause: str) -> None:
        """A stall measured by its culprit (the step's own duration, seconds)."""
        if stall > self.stall:
            self.stall = stall
            self.stall_cause = cause

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

    def snapshot(self, window_ms: float = 0.0) -> LagSnapshot:
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
            worst_stall_ms=round(self.stall * 1e3, 3),
            worst_stall_cause=self.stall_cause,
            unscheduled_ms=round(self.unscheduled * 1e3, 3),
            looptrace_ms=round(self.looptrace * 1e3, 3),
            window_ms=round(window_ms, 3),
        )
