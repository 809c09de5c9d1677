"""The event-loop stall limit of async tests: a lag monitor around the test, failing it when the
loop stalled longer than the limit, and naming the culprit.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable, Generator
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
    item.obj = _wrap_async_test(fn, record)
    try:
        result = yield
    finally:
        item.obj = fn
    if record.lag_message:
        pytest.fail(record.lag_message, pytrace=False)
    return result


def _wrap_async_test(fn: Callable[..., Any], record: _TestRecord) -> Callable[..., Any]:
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
                await _stop_monitor(monitor, record)
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


async def _stop_monitor(monitor: Any, record: _TestRecord) -> None:
    import asyncio

    # A stall right before the test returned is only measured once the monitor's ticker runs
    # again: give the loop two turns.
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    monitor.stop()
    snap = monitor.snapshot()
    limit = record.lag_limit_ms
    assert limit is not None
    record.lag_max_ms = float(snap.max_ms)
    worst = max(monitor.culprits, key=lambda c: c.duration_ms, default=None)
    if worst is not None:
        record.lag_culprit = _describe_culprit(worst)
    stalled = max(record.lag_max_ms, worst.duration_ms if worst is not None else 0.0)
    if stalled > limit:
        record.lag_max_ms = stalled
        where = record.lag_culprit or "culprit unknown"
        record.lag_message = f"event loop stalled {stalled:.0f} ms > {limit:g} ms limit: {where}"


def _describe_culprit(culprit: Any) -> str:
    """``file:line in coroutine``, plus the innermost frame when the blocking line is in a plain
    function the coroutine called (``time.sleep`` inside a helper, say)."""
    text = f"{_short_path(culprit.filename)}:{culprit.lineno} in {culprit.qualname}"
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
