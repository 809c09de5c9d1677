"""The event-loop stall limit of async tests: a lag monitor around the test, failing it when the
test's code held the loop longer than the limit, and naming the culprit or the cause.

Time the process was not scheduled (a loaded machine, a stopped process) and looptrace's own work
are not the test's: they are reported, not counted, unless ``count_unscheduled`` asks for the
raw worst lag.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import pytest

from ._spans import _RECORD, _TestRecord


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    record = item.stash.get(_RECORD, None)
    if record is None or not isinstance(item, pytest.Function):
        return (yield)
    fn = item.obj
    if not inspect.iscoroutinefunction(fn):
        return (yield)
    # Async plugins may run the coroutine in a context captured before this test (anyio keeps
    # one runner task per loop), so the test function itself makes its span active.
    gate = _Gate(count_unscheduled=_count_unscheduled(item))
    item.obj = _wrap_async_test(fn, record, gate)
    try:
        result = yield
    finally:
        item.obj = fn
    if gate.unscheduled_ms:
        _report_pause(item, record, gate)
    if record.lag_message:
        pytest.fail(record.lag_message, pytrace=False)
    return result


# The name a test's report carries the time its process was not scheduled under (ms): read by
# the terminal summary, and by xdist controllers, which see only reports.
UNSCHEDULED_PROPERTY = "looptrace_unscheduled_ms"
UNSCHEDULED_ATTRIBUTE = "looptrace.loop.unscheduled_ms"


@dataclass
class _Gate:
    """One test's limit settings and what the monitor found beyond the test's code."""

    count_unscheduled: bool = False
    unscheduled_ms: float = 0.0


def _count_unscheduled(item: pytest.Item) -> bool:
    """Whether the limit applies to the raw worst lag: the marker's ``count_unscheduled``, else
    ``--looptrace-count-unscheduled`` or the ini's ``looptrace_count_unscheduled``."""
    marker = item.get_closest_marker("looptrace")
    if marker is not None and "count_unscheduled" in marker.kwargs:
        return bool(marker.kwargs["count_unscheduled"])
    config = item.config
    return bool(
        config.getoption("looptrace_count_unscheduled", False)
        or config.getini("looptrace_count_unscheduled")
    )


def _report_pause(item: pytest.Item, record: _TestRecord, gate: _Gate) -> None:
    """Say how long the process was not scheduled during the test: on its span, in its report
    (a "looptrace" section), and for the terminal summary."""
    pause = gate.unscheduled_ms
    record.span.set_attribute(UNSCHEDULED_ATTRIBUTE, pause)
    item.user_properties.append((UNSCHEDULED_PROPERTY, pause))
    counted = gate.count_unscheduled
    item.add_report_section(
        "call",
        "looptrace",
        f"event loop paused {pause:.0f} ms: the process was not scheduled (the machine was "
        f"busy or the process was stopped); {'counted' if counted else 'not counted'} "
        f"against the {record.lag_limit_ms:g} ms limit",
    )


def _wrap_async_test(
    fn: Callable[..., Any], record: _TestRecord, gate: _Gate | None = None
) -> Callable[..., Any]:
    gate = gate if gate is not None else _Gate()

    @functools.wraps(fn)
    async def traced_test(*args: Any, **kwargs: Any) -> Any:
        from ._internals import CURRENT

        token = CURRENT.set(record.span) if record.parent_code else None
        monitor = _start_monitor(record) if record.lag_limit_ms is not None else None
        try:
            if monitor is not None:
                # The monitor names culprits from the task steps that start after it: begin a
                # fresh step so a stall in the test's very first step is attributed too.
                import asyncio

                await asyncio.sleep(0)
            return await fn(*args, **kwargs)
        finally:
            if monitor is not None:
                await _stop_monitor(monitor, record, gate)
            if token is not None:
                CURRENT.reset(token)

    return traced_test


def _start_monitor(record: _TestRecord) -> Any:
    """A lag monitor on the running asyncio loop, or None (trio, or no loop)."""
    import asyncio

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return None
    from looptrace.monitor import LagMonitor

    assert record.lag_limit_ms is not None
    limit_s = record.lag_limit_ms / 1000.0
    monitor = LagMonitor(interval=min(0.01, limit_s / 2), culprits=True, culprit_threshold=limit_s)
    monitor.start()
    return monitor


async def _stop_monitor(monitor: Any, record: _TestRecord, gate: _Gate) -> None:
    import asyncio

    # A stall right before the test returned is only measured once the monitor's ticker runs
    # again: give the loop two turns.
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    monitor.stop()
    snap = monitor.snapshot()
    limit = record.lag_limit_ms
    assert limit is not None
    count_unscheduled = gate.count_unscheduled
    culprits = monitor.culprits
    pause = max([snap.unscheduled_ms, *(c.unscheduled_ms for c in culprits)])
    if count_unscheduled:
        # Everything, as measured: the worst lag, and every culprit at its full duration.
        counted = culprits
        stalled = max([snap.max_ms, *(c.duration_ms for c in culprits)])
        worst = max(counted, key=lambda c: c.duration_ms, default=None)
        cause = ""
        if pause >= stalled / 2 and (worst is None or worst.duration_ms < stalled):
            worst = None
            cause = (
                f"process not scheduled for {pause:.0f} ms (the machine was busy or the "
                "process was stopped)"
            )
    else:
        # The test's own: the worst stall, and the culprits its code (or its garbage) caused.
        counted = [c for c in culprits if c.charged]
        stalled = max([snap.worst_stall_ms, *(c.stall_ms for c in counted)])
        worst = max(counted, key=lambda c: c.stall_ms, default=None)
        cause = _short_cause(snap.worst_stall_cause)
    record.lag_max_ms = float(stalled)
    # A few milliseconds of it are the ordinary noise of a shared machine: said only when it
    # is a real share of the limit.
    if pause >= max(5.0, limit / 10):
        gate.unscheduled_ms = round(pause, 1)
    if worst is not None:
        record.lag_culprit = _describe_culprit(worst)
    elif cause:
        record.lag_culprit = cause
    if stalled > limit:
        where = record.lag_culprit or "culprit unknown"
        message = f"event loop stalled {stalled:.0f} ms > {limit:g} ms limit: {where}"
        if gate.unscheduled_ms and not count_unscheduled:
            message += f" (not counted: the process was not scheduled for {pause:.0f} ms)"
        record.lag_message = message


def _short_cause(cause: str) -> str:
    """The monitor's ``fn (path:line)`` with the path made relative, as the culprits are."""
    match = re.fullmatch(r"(.*) \((.*):(\d+)\)", cause)
    if match is None:
        return cause
    head, filename, lineno = match.groups()
    if " during " in head:
        what, qualname = head.rsplit(" during ", 1)
        return f"{what} during {_short_path(filename)}:{lineno} in {qualname}"
    return f"{_short_path(filename)}:{lineno} in {head}"


def _describe_culprit(culprit: Any) -> str:
    """``file:line in coroutine``, plus the innermost frame when the blocking line is in a plain
    function the coroutine called (``time.sleep`` inside a helper, say); a cause other than the
    code itself (garbage collection, looptrace's start-up, a pause) comes first."""
    cause = culprit.describe_cause() if hasattr(culprit, "describe_cause") else ""
    if cause == culprit.qualname:  # looptrace's own work: named by the cause alone
        return f"{cause} at {_short_path(culprit.filename)}:{culprit.lineno}"
    text = f"{_short_path(culprit.filename)}:{culprit.lineno} in {culprit.qualname}"
    if cause:
        text = f"{cause} during {text}"
    if culprit.stack:
        match = re.fullmatch(r"(.*) \((.*):(\d+)\)", culprit.stack[-1])
        if match is not None:
            qualname, filename, lineno = match.groups()
            if (qualname, int(lineno)) != (culprit.qualname, culprit.lineno):
                text += f", blocked in {qualname} at {_short_path(filename)}:{lineno}"
    return text


def _short_path(filename: str) -> str:
    import os

    try:
        rel = os.path.relpath(filename)
    except ValueError:
        return filename
    return filename if rel.startswith("..") else rel
