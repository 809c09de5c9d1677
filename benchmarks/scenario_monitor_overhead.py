"""What the lag monitor costs a callback-heavy program, side by side in one run.

Workload: 100,000 short tasks (``create_task`` of a tiny coroutine, gathered in chunks of 1,000),
run with no monitor, with the ticker at its default settings (10 ms, and the watchdog thread
whose looks tell a pause of the process from a stall), and with the ticker plus
culprit detection (Handle._run wrapped, watchdog thread, 100 ms threshold). A second workload
opens a ``looptrace.span`` in every task (sink that drops), so the span-lag hooks are paid too.
Rounds alternate the modes; the table shows the median CPU time of the process (``process_time``,
which counts the watchdog thread too and is not inflated when a shared machine deschedules us),
the median wall time, and the median of the per-round CPU ratios against no monitor.

    .venv/bin/python benchmarks/scenario_monitor_overhead.py [rounds]
"""

from __future__ import annotations

import asyncio
import gc
import logging
import statistics
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any

import looptrace
from looptrace import _state
from looptrace.monitor import LagMonitor

TASKS = 100_000
CHUNK = 1_000
MODES: dict[str, dict[str, Any] | None] = {
    "no monitor": None,
    "ticker (10 ms)": {},
    "ticker + culprits": {"culprits": True},
}


async def tiny(i: int) -> int:
    return i + 1


async def tiny_span(i: int) -> int:
    with looptrace.span("tiny"):
        return i + 1


async def workload(fn: Callable[[int], Coroutine[Any, Any, int]]) -> None:
    for start in range(0, TASKS, CHUNK):
        await asyncio.gather(*(asyncio.create_task(fn(i)) for i in range(start, start + CHUNK)))


def run_once(
    fn: Callable[[int], Coroutine[Any, Any, int]], settings: dict[str, Any] | None
) -> tuple[float, float]:
    async def main() -> tuple[float, float]:
        monitor = LagMonitor(**settings).start() if settings is not None else None
        await asyncio.sleep(0)
        c0, t0 = time.process_time(), time.perf_counter()
        await workload(fn)
        cpu, wall = time.process_time() - c0, time.perf_counter() - t0
        if monitor is not None:
            monitor.stop()
        return cpu, wall

    gc.collect()
    return asyncio.run(main(), debug=False)


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    looptrace.configure(sample_rate=1.0)
    _state.sink = _state.NullSink()  # measure capture and hooks, not the exporter
    print(f"{TASKS:,} short tasks, {rounds} rounds, Python {sys.version.split()[0]}")
    # Preemption by other processes shows up as stalls; keep their log lines out of the table.
    logging.getLogger("looptrace.monitor").setLevel(logging.ERROR)
    print(f"{'workload':<14}{'mode':<20}{'cpu s':>8}{'wall s':>8}{'cpu ratio':>11}{'overhead':>10}")
    for label, fn in (("plain tasks", tiny), ("task + span", tiny_span)):
        cpu: dict[str, list[float]] = {mode: [] for mode in MODES}
        wall: dict[str, list[float]] = {mode: [] for mode in MODES}
        run_once(fn, None)  # warm up
        for r in range(rounds):
            order = list(MODES) if r % 2 == 0 else list(reversed(MODES))
            for mode in order:
                c, w = run_once(fn, MODES[mode])
                cpu[mode].append(c)
                wall[mode].append(w)
        base = cpu["no monitor"]
        for mode in MODES:
            ratio = statistics.median(t / b for t, b in zip(cpu[mode], base, strict=True))
            print(
                f"{label:<14}{mode:<20}{statistics.median(cpu[mode]):>8.3f}"
                f"{statistics.median(wall[mode]):>8.3f}{ratio:>11.3f}{(ratio - 1) * 100:>9.1f}%"
            )


if __name__ == "__main__":
    main()
