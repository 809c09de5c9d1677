"""Summary windows: a ``looptrace.loop.lag`` root span per window, with the window's figures.

With ``summary_interval``, the ticker ends a window every so many seconds (``_emit_summary``);
``stop()``, and the end of a loop that the pipeline sees ending (``finish_windows``), export the
partial last one, which would otherwise never be exported.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
from typing import TYPE_CHECKING, Any

from ._internals import _state, internal_error
from ._registry import _lock, _running

if TYPE_CHECKING:
    from ._monitor import LagMonitor

SUMMARY_SPAN = "looptrace.loop.lag"
SUMMARY_PREFIX = "looptrace.loop.lag."


def finish_windows(loop: asyncio.AbstractEventLoop) -> None:
    """Export the partial summary window of every monitor on ``loop`` (which is ending)."""
    with _lock:
        monitors = list(_running.get(loop, ()))
    for monitor in monitors:
        monitor.finish_window()


def _finish_window(monitor: LagMonitor) -> None:
    """Export ``monitor``'s current, partial window now (with ``summary_interval``)."""
    if monitor._summary_interval is not None:
        try:
            # In a context of its own: the summary is a root span, whatever the caller's
            # context holds (a span, or the flusher's suppression of tracing).
            contextvars.Context().run(_emit_summary, monitor)
        except Exception as exc:
            internal_error("monitor.summary", exc)


def _emit_summary(monitor: LagMonitor) -> None:
    """End ``monitor``'s window: export its figures as a span over the window, and start anew."""
    snap = monitor.snapshot()
    start_ns = monitor._window_start_ns
    monitor.reset()
    if not snap.count or _state.disabled:
        return
    from ._internals import start_span

    attributes: dict[str, Any] = {
        SUMMARY_PREFIX + field.name: getattr(snap, field.name) for field in dataclasses.fields(snap)
    }
    attributes[SUMMARY_PREFIX + "interval_ms"] = monitor._interval * 1e3
    span = start_span(SUMMARY_SPAN, attributes)
    span.start_ns = start_ns
    span.end()
