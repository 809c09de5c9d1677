"""The event-loop lag monitor: histogram, ticker, culprits, span lag, summaries, lifecycle."""

# These tests block the loop with time.sleep on purpose: that is what the monitor must catch.
# ruff: noqa: ASYNC251

from __future__ import annotations

import asyncio
import asyncio.events
import dataclasses
import gc
import logging
import pathlib
import threading
import time
import warnings
from collections.abc import Callable

import pytest

import looptrace
from looptrace import _state, monitor
from looptrace._config import Config
from looptrace._semconv import LOOP_LAG_MAX_MS
from looptrace.monitor import LagMonitor, LagSnapshot, _frames, _hook, _registry, active_monitor
from looptrace.monitor._culprits import STALL_EVENT
from looptrace.monitor._histogram import _Histogram
from looptrace.monitor._summary import SUMMARY_SPAN
from looptrace.testing import capture_spans

ORIGINAL_RUN = asyncio.events.Handle.__dict__["_run"]


def line_of(fn: Callable[..., object], marker: str) -> int:
    """The line number, in this file, of the line of ``fn`` that contains ``marker``."""
    import inspect

    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if marker in line)


async def blocking_coroutine(seconds: float) -> None:
    time.sleep(seconds)  # <- the stall


@looptrace.traced
async def traced_blocker(seconds: float) -> None:
    time.sleep(seconds)  # <- traced stall


async def wait_for(condition: Callable[[], bool], timeout: float = 2.0) -> None:
    """Yield to the loop until ``condition()`` holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met before the deadline"
        await asyncio.sleep(0.005)


# -- the histogram ---------------------------------------------------------------------------


def test_histogram_percentiles_on_synthetic_lags() -> None:
    """Percentiles from the buckets are within 2% of the exact ones; mean, max, total exact."""
    hist = _Histogram()
    values = [i / 1000 for i in range(1, 1001)]  # 1 ms .. 1000 ms
    for i, v in enumerate(reversed(values)):
        hist.record(v, at_ns=i)
    snap = hist.snapshot()
    assert snap.count == 1000
    assert snap.p50_ms == pytest.approx(500, rel=0.02)
    assert snap.p90_ms == pytest.approx(900, rel=0.02)
    assert snap.p99_ms == pytest.approx(990, rel=0.02)
    assert snap.max_ms == pytest.approx(1000)
    assert snap.mean_ms == pytest.approx(500.5)
    assert snap.total_stall_ms == pytest.approx(500_500)
    assert snap.worst_at_ns == 0  # the 1000 ms value was recorded first, at_ns=0


def test_histogram_skewed_distribution_and_tiny_values() -> None:
    """A mostly-quiet loop with rare big stalls: p50 stays at the quiet level, p99 and max find
    the stalls; sub-millisecond lags keep microsecond resolution."""
    hist = _Histogram()
    for _ in range(980):
        hist.record(0.000_050)  # 50 us
    for _ in range(20):
        hist.record(0.250)  # 250 ms
    snap = hist.snapshot()
    assert snap.p50_ms == pytest.approx(0.05, rel=0.02)
    assert snap.p90_ms == pytest.approx(0.05, rel=0.02)
    assert snap.p99_ms == pytest.approx(250, rel=0.02)
    assert snap.max_ms == pytest.approx(250)


def test_histogram_memory_is_constant() -> None:
    """However many and however large the values, the bucket array keeps its size."""
    hist = _Histogram()
    size = len(hist.buckets)
    for i in range(20_000):
        hist.record((i % 997) * 0.0137 + i * 1e-7)
    hist.record(3600.0)  # an hour-long stall lands in the last bucket; max stays exact
    assert len(hist.buckets) == size
    assert hist.snapshot().max_ms == pytest.approx(3_600_000)
    assert hist.snapshot().p99_ms <= 3_600_000


def test_empty_snapshot_is_all_zero() -> None:
    """No tick measured yet: every figure is zero, not an error."""
    assert _Histogram().snapshot() == LagSnapshot(0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0)


# -- the ticker --------------------------------------------------------------------------------


async def test_real_stall_shows_in_snapshot_and_reset_starts_a_new_window() -> None:
    """A 150 ms time.sleep shows as a ~150 ms max lag at the time it happened; reset() clears."""
    before_ns = time.time_ns()
    async with LagMonitor(interval=0.005) as m:
        await wait_for(lambda: m.snapshot().count >= 2)
        time.sleep(0.15)
        await wait_for(lambda: m.snapshot().max_ms > 100)
        snap = m.snapshot()
        assert 100 < snap.max_ms < 400
        assert snap.p99_ms == pytest.approx(snap.max_ms, rel=0.02)
        assert snap.total_stall_ms >= snap.max_ms
        assert before_ns < snap.worst_at_ns < time.time_ns()
        m.reset()
        assert m.snapshot().count == 0
        await wait_for(lambda: m.snapshot().count >= 3)
        assert m.snapshot().max_ms < 100


async def test_start_twice_and_active_monitor() -> None:
    """start() on a started monitor does nothing; active_monitor() names the first one running on
    this loop and forgets it on stop; a second monitor on the same loop works alongside."""
    assert active_monitor() is None
    m = LagMonitor(interval=0.002)
    m.start()
    m.start()
    other = LagMonitor(interval=0.002).start()
    try:
        assert active_monitor() is m
        await wait_for(lambda: m.snapshot().count >= 3 and other.snapshot().count >= 3)
        # one ticker, not two: ticks arrive at most once per interval
        m.reset()
        t0 = time.monotonic()
        await wait_for(lambda: m.snapshot().count >= 5)
        assert m.snapshot().count <= (time.monotonic() - t0) / 0.002 + 1
        m.stop()
        assert active_monitor() is other
    finally:
        m.stop()
        other.stop()
    assert active_monitor() is None
    assert not m.running


def test_monitor_across_several_asyncio_runs() -> None:
    """Start and stop on a fresh loop in several asyncio.run calls (debug mode, warnings as
    errors): each measures, nothing leaks, and a monitor left running when its loop closes is
    forgotten instead of breaking the next run."""

    async def once(stop: bool) -> LagSnapshot:
        m = LagMonitor(interval=0.002, culprits=True).start()
        await wait_for(lambda: m.snapshot().count >= 3)
        snap = m.snapshot()
        if stop:
            m.stop()
        return snap

    hooks_before = (_state.start_hooks, _state.end_hooks)
    # Garbage other tests left (an SDK client's unclosed socket) must not be collected, and
    # warn, inside the block that makes this test's own warnings errors.
    gc.collect()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for stop in (True, True, False, True):
            assert asyncio.run(once(stop), debug=True).count >= 3
    assert (_state.start_hooks, _state.end_hooks) == hooks_before
    assert asyncio.events.Handle.__dict__["_run"] is ORIGINAL_RUN
    assert not _registry._running
    assert not _hook._watches
    assert not [t for t in threading.enumerate() if t.name == "looptrace-lag-watchdog"]


def test_start_needs_a_loop_or_takes_one() -> None:
    """start() without a running loop raises; start(loop=...) before the loop runs works."""
    with pytest.raises(RuntimeError):
        LagMonitor().start()
    loop = asyncio.new_event_loop()
    try:
        m = LagMonitor(interval=0.002).start(loop=loop)

        async def measure() -> int:
            await wait_for(lambda: m.snapshot().count >= 3)
            assert active_monitor() is m
            return m.snapshot().count

        assert loop.run_until_complete(measure()) >= 3
        m.stop()
    finally:
        loop.close()


def test_invalid_settings_are_rejected() -> None:
    """Non-positive intervals and thresholds are refused at construction."""
    for kwargs in ({"interval": 0}, {"culprit_threshold": -1}, {"summary_interval": 0}):
        with pytest.raises(ValueError):
            LagMonitor(**kwargs)  # type: ignore[arg-type]


# -- culprits ----------------------------------------------------------------------------------


async def test_time_sleep_in_a_coroutine_is_named() -> None:
    """A time.sleep(0.2) inside a coroutine is reported with its task, function, file and line,
    and the stall event lands on the span active in the blocked task."""
    async with LagMonitor(culprits=True, culprit_threshold=0.1) as m:
        with capture_spans() as spans:
            async with looptrace.span("request"):
                await asyncio.create_task(blocking_coroutine(0.2), name="blocker-task")
        assert len(m.culprits) == 1
    c = m.culprits[0]
    assert c.task_name == "blocker-task"
    assert c.qualname == "blocking_coroutine"
    assert c.filename == __file__
    assert c.lineno == line_of(blocking_coroutine, "<- the stall")
    assert 170 <= c.duration_ms < 1000  # dated by the watchdog: within threshold/8
    assert c.stack[-1] == f"blocking_coroutine ({__file__}:{c.lineno})"

    request = spans.by_name("request")
    assert request.events is not None
    (event,) = [e for e in request.events if e.name == STALL_EVENT]
    assert event.attributes is not None
    assert event.attributes["code.function"] == "blocking_coroutine"
    assert event.attributes["code.lineno"] == c.lineno
    assert event.attributes["looptrace.task.name"] == "blocker-task"
    assert request.attributes is not None
    assert request.attributes[LOOP_LAG_MAX_MS] >= 150


async def test_stall_event_on_a_span_that_ends_inside_the_stalled_step() -> None:
    """A traced coroutine that blocks without ever awaiting ends its span inside the stalled
    step; it still gets the stall event, with its own line."""
    async with LagMonitor(culprits=True, culprit_threshold=0.05):
        await asyncio.sleep(0)  # the step that started the monitor was not timed
        with capture_spans() as spans:
            await traced_blocker(0.12)
    span = spans.by_name("traced_blocker")
    assert span.events is not None
    (event,) = [e for e in span.events if e.name == STALL_EVENT]
    assert event.attributes is not None
    assert event.attributes["code.lineno"] == line_of(traced_blocker, "<- traced stall")
    assert event.attributes["looptrace.loop.stall.duration_ms"] >= 50
    assert span.attributes is not None
    assert span.attributes[LOOP_LAG_MAX_MS] >= 100


def crunch(seconds: float) -> None:
    time.sleep(seconds)  # <- sync helper stall


async def calls_a_blocking_helper(seconds: float) -> None:
    await asyncio.sleep(0)
    crunch(seconds)  # <- helper call


async def test_blocking_sync_helper_names_the_coroutine_and_keeps_the_stack() -> None:
    """When the blocking call is in a sync helper, the culprit names the coroutine at the line
    that called it, and the stack goes down to the helper's blocking line."""
    async with LagMonitor(culprits=True, culprit_threshold=0.05) as m:
        await asyncio.create_task(calls_a_blocking_helper(0.12))
    (c,) = m.culprits
    assert (c.qualname, c.lineno) == (
        "calls_a_blocking_helper",
        line_of(calls_a_blocking_helper, "<- helper call"),
    )
    assert c.stack[-1] == f"crunch ({__file__}:{line_of(crunch, '<- sync helper stall')})"


def test_culprit_prefers_user_coroutines_over_library_ones() -> None:
    """A stall inside a standard-library coroutine (to_thread, gather...) is pinned on the user
    coroutine that awaited it; library frames stay in the stack."""
    stdlib_file = asyncio.__file__
    frames = [
        (__file__, "handler", 10, True, False),
        (stdlib_file, "to_thread", 25, True, True),
        (stdlib_file, "Thread.start", 969, False, True),
    ]
    assert _frames._pick(frames)[1] == "handler"
    assert _frames._pick(frames[1:])[1] == "to_thread"
    assert _frames._pick([(__file__, "callback", 3, False, False)])[1] == "callback"
    assert _frames._is_library(stdlib_file)
    assert _frames._is_library(monitor.__file__)
    assert not _frames._is_library(__file__)


async def test_stall_outside_any_span_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    """With no active span the culprit goes to the looptrace.monitor logger, naming the line."""
    caplog.set_level(logging.WARNING, logger="looptrace.monitor")
    async with LagMonitor(culprits=True, culprit_threshold=0.05) as m:
        await asyncio.create_task(blocking_coroutine(0.12), name="lonely")
    assert len(m.culprits) == 1
    records = [r for r in caplog.records if r.name == "looptrace.monitor"]
    assert len(records) == 1
    message = records[0].getMessage()
    assert "task 'lonely'" in message
    assert (
        f"blocking_coroutine ({__file__}:{line_of(blocking_coroutine, '<- the stall')})" in message
    )


async def test_fast_steps_are_not_culprits() -> None:
    """Steps below the threshold are not reported, however many there are."""
    async with LagMonitor(culprits=True, culprit_threshold=0.05) as m:
        await asyncio.gather(*(asyncio.sleep(0) for _ in range(200)))
        time.sleep(0.01)
        await asyncio.sleep(0)
    assert m.culprits == []


async def test_culprits_restore_the_loop_exactly() -> None:
    """Handle._run is wrapped only while a culprit monitor runs, and the loop's attributes are
    the same after stop as before start; culprits=False never touches Handle._run."""
    loop = asyncio.get_running_loop()
    attrs_before = {k: v for k, v in vars(loop).items() if not isinstance(v, (list, set, dict))}
    hooks_before = (_state.start_hooks, _state.end_hooks)
    async with LagMonitor():
        assert asyncio.events.Handle.__dict__["_run"] is ORIGINAL_RUN
    async with LagMonitor(culprits=True):
        assert asyncio.events.Handle.__dict__["_run"] is not ORIGINAL_RUN
        await asyncio.sleep(0)
    assert asyncio.events.Handle.__dict__["_run"] is ORIGINAL_RUN
    attrs_after = {k: v for k, v in vars(loop).items() if not isinstance(v, (list, set, dict))}
    assert attrs_after.keys() == attrs_before.keys()
    for key in ("slow_callback_duration", "_debug", "_clock_resolution", "_task_factory"):
        assert attrs_after.get(key) == attrs_before.get(key), key
    assert (_state.start_hooks, _state.end_hooks) == hooks_before
    assert not [t for t in threading.enumerate() if t.name == "looptrace-lag-watchdog"]


async def test_overlapping_culprit_monitors_restore_handle_run_after_the_last() -> None:
    """Culprit monitors that overlap, on one loop and on two loops in two threads, share one
    hook: Handle._run stays wrapped (and culprits keep coming) while any of them runs, whichever
    stops first, and the original object is back once the last one stops."""
    a = LagMonitor(culprits=True, culprit_threshold=0.05).start()
    b = LagMonitor(culprits=True, culprit_threshold=0.05).start()
    a.stop()
    assert asyncio.events.Handle.__dict__["_run"] is not ORIGINAL_RUN
    await asyncio.create_task(blocking_coroutine(0.12))
    assert [c.qualname for c in b.culprits] == ["blocking_coroutine"]
    assert a.culprits == []
    b.stop()
    assert asyncio.events.Handle.__dict__["_run"] is ORIGINAL_RUN

    # Another loop in another thread starts watching first and stops first.
    other = asyncio.new_event_loop()
    thread = threading.Thread(target=other.run_forever, name="other-loop")
    try:
        c = LagMonitor(culprits=True).start(loop=other)
        thread.start()
        d = LagMonitor(culprits=True).start()
        assert asyncio.events.Handle.__dict__["_run"] is not ORIGINAL_RUN
        c.stop()
        assert asyncio.events.Handle.__dict__["_run"] is not ORIGINAL_RUN
        d.stop()
    finally:
        other.call_soon_threadsafe(other.stop)
        thread.join(timeout=5)
        other.close()
    assert asyncio.events.Handle.__dict__["_run"] is ORIGINAL_RUN
    assert _hook._original_run is ORIGINAL_RUN
    assert not _hook._watches
    assert not [t for t in threading.enumerate() if t.name == "looptrace-lag-watchdog"]


# -- span lag ----------------------------------------------------------------------------------


async def test_span_lag_counts_stalls_inside_not_outside() -> None:
    """A span's lag_max_ms reflects a stall that happened while it was open, not one just before
    it started (even in the same step), and not one after it ended."""
    async with LagMonitor(interval=0.005) as m:
        await wait_for(lambda: m.snapshot().count >= 2)
        with capture_spans() as spans:
            time.sleep(0.12)  # stall before the span, in the same step
            async with looptrace.span("after-stall"):
                await asyncio.sleep(0.02)
            async with looptrace.span("with-stall"):
                await asyncio.sleep(0.01)
                time.sleep(0.12)
                await asyncio.sleep(0.01)
            async with looptrace.span("quiet"):
                await asyncio.sleep(0.02)
            with looptrace.span("same-step"):
                time.sleep(0.12)  # ends before the ticker can run
            time.sleep(0.12)  # stall after "same-step" ended
            await asyncio.sleep(0.02)
    lag = {s.name: (s.attributes or {}).get(LOOP_LAG_MAX_MS) for s in spans}
    assert lag["with-stall"] >= 100
    assert lag["same-step"] >= 100
    assert lag["after-stall"] < 50
    assert lag["quiet"] < 50


async def test_span_lag_only_while_running_and_only_on_the_loop() -> None:
    """Spans get no lag attribute without a monitor, nor in a worker thread with no loop."""

    def in_thread() -> None:
        with looptrace.span("thread"):
            pass

    with capture_spans() as spans:
        with looptrace.span("unmonitored"):
            pass
        async with LagMonitor():
            await asyncio.to_thread(in_thread)
            with looptrace.span("monitored"):
                pass
    attrs = {s.name: s.attributes or {} for s in spans}
    assert LOOP_LAG_MAX_MS not in attrs["unmonitored"]
    assert LOOP_LAG_MAX_MS not in attrs["thread"]
    assert LOOP_LAG_MAX_MS in attrs["monitored"]


# -- summaries and configuration -------------------------------------------------------------


async def test_periodic_summary_spans() -> None:
    """With summary_interval set, a root span named looptrace.loop.lag carries the window's
    figures through the normal sink, and the window restarts."""
    with capture_spans() as spans:
        async with looptrace.span("app"):
            m = LagMonitor(interval=0.002, summary_interval=0.03).start()
            try:
                await wait_for(lambda: m._hist.count >= 1 and m._window_start_ns > 0)
                time.sleep(0.05)
                await wait_for(lambda: m._ticks >= 40)
            finally:
                m.stop()
    summaries = [s for s in spans if s.name == SUMMARY_SPAN]
    assert summaries
    for s in summaries:
        assert s.parent_span_id == 0
        assert s.attributes is not None
        assert s.attributes["looptrace.loop.lag.count"] >= 1
        assert s.start_ns < s.end_ns
    worst = max(s.attributes["looptrace.loop.lag.max_ms"] for s in summaries if s.attributes)
    assert worst >= 40
    assert (
        sum(s.attributes["looptrace.loop.lag.count"] for s in summaries if s.attributes) <= m._ticks
    )


async def test_ensure_from_config() -> None:
    """The program-wide monitor starts only when configured, with the configured settings, once
    per loop."""
    assert monitor.ensure_from_config(Config(lag_monitor=False)) is None
    cfg = Config(lag_monitor=True, lag_interval=0.004, lag_culprits=True, lag_culprit_threshold=0.2)
    m = monitor.ensure_from_config(cfg)
    try:
        assert m is not None
        assert active_monitor() is m
        assert (m._interval, m._want_culprits, m._threshold) == (0.004, True, 0.2)
        assert m._summary_interval == cfg.lag_summary_interval
        assert monitor.ensure_from_config(cfg) is m
    finally:
        assert m is not None
        m.stop()


def test_snapshot_is_a_frozen_dataclass() -> None:
    """LagSnapshot and Culprit are immutable values, exported from looptrace."""
    assert looptrace.LagMonitor is LagMonitor
    assert dataclasses.is_dataclass(looptrace.LagSnapshot)
    with pytest.raises(dataclasses.FrozenInstanceError):
        LagSnapshot(0, 0, 0, 0, 0, 0, 0, 0).count = 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        looptrace.Culprit(None, "f", "x.py", 1, 1.0, ()).lineno = 2  # type: ignore[misc]


async def test_lag_monitor_switched_on_by_configuration(tmp_path: pathlib.Path) -> None:
    """With lag_monitor=True, the first traced span on a loop starts a monitor there, with no
    code change in the program."""
    import looptrace
    from looptrace import monitor

    looptrace.configure(lag_monitor=True, lag_interval=0.005, store_path=tmp_path / "s.db")
    assert monitor.active_monitor() is None

    @looptrace.traced
    async def step() -> None:
        await asyncio.sleep(0)

    await step()
    running = monitor.active_monitor()
    assert running is not None
    running.stop()


async def stall_then_span(seconds: float) -> None:
    time.sleep(seconds)  # the stall has begun before the span starts
    with looptrace.span("late"):
        time.sleep(seconds)


async def test_a_stall_event_is_never_dated_before_its_span() -> None:
    """A span that starts inside a step that was already stalling gets the stall event dated
    at its own start at the earliest, never before the span began."""
    async with LagMonitor(culprits=True, culprit_threshold=0.05):
        await asyncio.sleep(0)  # the step that started the monitor was not timed
        with capture_spans() as spans:
            await stall_then_span(0.1)
    span = spans.by_name("late")
    (event,) = [e for e in span.events or [] if e.name == STALL_EVENT]
    assert span.start_ns <= event.time_ns <= span.end_ns


def test_a_program_that_only_monitors_still_exports_its_summaries(tmp_path: pathlib.Path) -> None:
    """Importing looptrace.monitor alone (no traced code anywhere) wires the export pipeline:
    the monitor's summary spans reach the store."""
    import os
    import subprocess
    import sys

    from looptrace._store import Store

    code = (
        "import asyncio, time\n"
        "from looptrace.monitor import LagMonitor\n"
        "async def main():\n"
        "    async with LagMonitor(interval=0.002, summary_interval=0.05):\n"
        "        time.sleep(0.03)\n"
        "        await asyncio.sleep(0.12)\n"
        "asyncio.run(main())\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOOPTRACE_", "OTEL_"))}
    env["LOOPTRACE_STORE"] = str(tmp_path / "store.db")
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    with Store(tmp_path / "store.db") as store:
        summaries = store.lag_summaries()["summaries"]
    assert summaries and max(s["values"]["max_ms"] for s in summaries) >= 25


async def test_blocked_ns_adds_up_the_time_the_loop_was_held() -> None:
    """Two readings of ``blocked_ns`` differ by how long the loop was blocked between them (to
    the ticker's resolution), whether or not the ticker has run since; None without a monitor."""
    assert monitor.blocked_ns() is None
    async with LagMonitor(interval=0.001):
        await asyncio.sleep(0.005)
        before = monitor.blocked_ns()
        assert before is not None
        time.sleep(0.03)  # blocks the loop on purpose
        during = monitor.blocked_ns()  # the pending tick is late: counted already
        await asyncio.sleep(0.005)
        after = monitor.blocked_ns()
    assert during is not None and after is not None
    assert during - before >= 25_000_000
    assert after >= during
    assert monitor.blocked_ns() is None
