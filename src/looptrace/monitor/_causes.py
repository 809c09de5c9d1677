"""Causes of a stall beyond the user's frames: garbage collection, and time the process did not run.

**Garbage collection.** While any monitor runs, a ``gc.callbacks`` entry times every collection
(``perf_counter`` at start and stop) and keeps the last few in a ring: when, how long, which
generation and, for a long one, where the collection was triggered. A stall is explained by
collection when the collections inside it add up to most of it.

**Not scheduled.** A loop held by its code keeps the rest of the process running; a process the OS
stopped (SIGSTOP, a suspended container) or did not give a CPU (a loaded machine) runs nothing
at all. The monitor's watchdog thread looks every few milliseconds; each look notes the time
and the process's CPU time (``time.process_time``). A gap between two looks that is longer than
the watchdog asked for, during which the process used less CPU than the extra time, is time the
process did not run. (A ``time.sleep`` on the loop leaves the watchdog on time; a C call or a
collection holding the GIL makes it late, but the process burns CPU all along.) On a busy machine
every wake-up comes a little late, the loop's own included: the watchdog's usual lateness (the
median of its recent looks) is that noise, and only a gap well past it is a pause, less the
noise. Portable: only ``perf_counter``, ``process_time`` and a thread.
"""

from __future__ import annotations

import collections
import gc
import sys
import threading
import time
from typing import Any

from ._frames import _Frame, _pick, _walk

_perf = time.perf_counter
_cpu = time.process_time

# Shorter pauses and collections are noise for every question the monitor answers.
_MIN_PAUSE = 0.003
_MIN_GC_NOTED = 0.0005
# A collection this long records where it was triggered (one stack walk, rare).
_GC_WHERE = 0.005
_RING = 128
# The watchdog's usual lateness is the median of this many recent looks; a gap counts as a pause
# only past this many times it.
_NOISE_LOOKS = 32
_NOISE_FACTOR = 3.0


class _GcLog:
    """Every collection of note: ``(start, end, generation, where)`` on ``perf_counter``."""

    def __init__(self) -> None:
        self.ring: collections.deque[tuple[float, float, int, _Frame | None]] = collections.deque(
            maxlen=_RING
        )
        self.users = 0
        self._started = 0.0
        self._lock = threading.Lock()

    def callback(self, phase: str, info: dict[str, Any]) -> None:
        # Runs inside the collector, on whichever thread triggered it: record and return.
        now = _perf()
        if phase == "start":
            self._started = now
            return
        started = self._started
        if not started or now - started < _MIN_GC_NOTED:
            return
        where: _Frame | None = None
        if now - started >= _GC_WHERE:
            try:
                frames = _walk(sys._getframe(1))
                where = _pick(frames) if frames else None
            except Exception:  # a best-effort label, never an error inside the collector
                where = None
        self.ring.append((started, now, int(info.get("generation", -1)), where))

    def acquire(self) -> None:
        with self._lock:
            self.users += 1
            if self.users == 1 and self.callback not in gc.callbacks:
                gc.callbacks.append(self.callback)

    def release(self) -> None:
        with self._lock:
            self.users = max(0, self.users - 1)
            if not self.users:
                while self.callback in gc.callbacks:
                    gc.callbacks.remove(self.callback)

    def during(self, start: float, end: float) -> tuple[float, int, _Frame | None]:
        """Collection time inside ``[start, end]`` (s), the highest generation collected, and
        where the longest one was triggered."""
        total = 0.0
        generation = -1
        where: _Frame | None = None
        longest = 0.0
        for a, b, gen, at in list(self.ring):
            if b <= start or a >= end:
                continue
            part = min(b, end) - max(a, start)
            total += part
            generation = max(generation, gen)
            if part > longest:
                longest, where = part, at
        return total, generation, where


GC_LOG = _GcLog()


class _Beats:
    """The watchdog's looks, and the pauses they found: where the process did not run."""

    __slots__ = ("floor", "last", "noise", "pauses", "period", "recent")

    def __init__(self) -> None:
        # (perf_counter, process_time) of the last look: one tuple, so a reader on another
        # thread never sees one without the other.
        self.last = (_perf(), _cpu())
        self.period = 0.025
        self.pauses: collections.deque[tuple[float, float]] = collections.deque(maxlen=_RING)
        # How late the recent looks came (s), and their median: the machine's wake-up noise.
        self.recent: collections.deque[float] = collections.deque(maxlen=_NOISE_LOOKS)
        self.noise = 0.0
        # The shortest gap worth calling a pause: half the shortest stall a monitor on this loop
        # names (its culprit threshold); a shorter one changes no answer and is mostly noise.
        self.floor = _MIN_PAUSE

    def beat(self, period: float) -> None:
        """A look by the watchdog, which asked to sleep ``period`` seconds since the last one."""
        now, cpu = _perf(), _cpu()
        (then, then_cpu), self.last = self.last, (now, cpu)
        gap = now - then
        off = _off_time(gap, period, cpu - then_cpu, self.noise, self.floor)
        if off > 0.0:
            self.pauses.append((now - off, now))
        else:
            # A pause is not noise: only ordinary looks tell how late a wake-up usually is.
            self.recent.append(max(0.0, gap - period))
            if len(self.recent) >= 8:
                self.noise = sorted(self.recent)[len(self.recent) // 2]
        self.period = period

    def may_have_paused(self, start: float, end: float) -> bool:
        """Whether ``[start, end]`` (``end`` being now) can hold a pause at all: a recorded one
        ends inside it, or the watchdog is overdue now. No system call: the span hook asks
        this on its hot path."""
        pauses = self.pauses
        if pauses and pauses[-1][1] > start:
            return True
        return end - self.last[0] > self.period + self.floor

    def unscheduled(self, start: float, end: float) -> float:
        """Time inside ``[start, end]`` (perf_counter, ``end`` being now) the process did not
        run: the pauses the watchdog found, and the one it has not yet woken up to see."""
        total = 0.0
        for a, b in list(self.pauses):
            if b > start and a < end:
                total += min(b, end) - max(a, start)
        then, then_cpu = self.last
        off = _off_time(end - then, self.period, _cpu() - then_cpu, self.noise, self.floor)
        if off > 0.0:
            a = end - off
            if a < end and end > start:
                total += end - max(a, start)
        return min(total, max(0.0, end - start))


def _off_time(
    gap: float, period: float, cpu: float, noise: float = 0.0, floor: float = _MIN_PAUSE
) -> float:
    """Of a ``gap`` between two looks (the watchdog asked for ``period``), how long the process
    did not run: the extra time past the usual ``noise``, less the CPU the process used
    meanwhile; nothing unless that is well past the noise, and at least ``floor``."""
    late = gap - period
    if late < max(floor, _NOISE_FACTOR * noise):
        return 0.0
    off = late - noise - max(cpu, 0.0)
    return off if off >= _MIN_PAUSE else 0.0


def describe_gc(seconds: float, generation: int, where: _Frame | None) -> str:
    """``garbage collection (generation 2, 78 ms) during fn (file:line)``: where the collection
    was triggered, when known."""
    gen = f"generation {generation}, " if generation >= 0 else ""
    text = f"garbage collection ({gen}{seconds * 1e3:.0f} ms)"
    if where is not None:
        text += f" during {where[1]} ({where[0]}:{where[2]})"
    return text


def describe_pause(seconds: float) -> str:
    return (
        f"process not scheduled for {seconds * 1e3:.0f} ms "
        "(the machine was busy or the process was stopped)"
    )
