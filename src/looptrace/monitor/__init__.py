"""The event-loop lag monitor: how late the loop runs, what blocked it, and which spans it hurt.

    async with looptrace.LagMonitor(culprits=True) as monitor:
        await serve()
    print(monitor.snapshot())          # LagSnapshot(count=..., p99_ms=..., max_ms=...)
    for c in monitor.culprits:         # the callbacks and task steps that held the loop
        print(c.duration_ms, c.qualname, f"{c.filename}:{c.lineno}")

Four parts, each paying only for what it measures:

* A ticker (``_monitor``, ``_histogram``): one ``loop.call_at`` callback every ``interval``
  seconds that records how late the loop woke it into a constant-memory log-linear histogram.
  ~100 callbacks a second by default. With ``summary_interval``, each window's figures become a
  ``looptrace.loop.lag`` span (``_summary``).
* Span lag (``_span_lag``): while a monitor runs, every span that ends on its loop gets the
  worst stall observed while it was open (``looptrace.loop.lag_max_ms``), from one end hook: a
  bisect of the span's start time over a monotonic max-stack of tick stalls.
* Causes (``_causes``, ``_frames``): every monitor's loop has a watchdog thread whose looks are a
  heartbeat, so time the process did not run (a stopped process, a loaded machine) is told
  apart from a stall; ``gc.callbacks`` times collections; a stack whose blocking work was
  looptrace's own (its start-up imports, its flusher) is named so, never the user's.
* Culprits (opt-in; ``_hook``, ``_culprits``): ``asyncio.events.Handle._run`` is wrapped, only
  while some monitor asks for culprits, so each callback bumps a counter; a watchdog thread dates
  callbacks from that counter and samples the loop thread's stack (``sys._current_frames``) once
  one has run for half the threshold, which names the exact line that is blocking (a
  ``time.sleep`` included). When the step ends above the threshold it becomes a
  :class:`Culprit` with its cause, and a ``looptrace.loop.stall`` event on the span that was active in the
  blocked code (or a warning on the ``looptrace.monitor`` logger when there was none). Stopping
  the last such monitor puts the original ``Handle._run`` back.

Which monitors run on which loop and thread is kept in one place (``_registry``).

asyncio only: loops that do not run ``asyncio.events.Handle`` objects (uvloop) get the ticker,
span lag and the heartbeat but no culprits. See ``docs/lag-monitor.md``.
"""

from __future__ import annotations

from typing import Any

from . import _hook
from ._causes import GC_LOG as GC_LOG
from ._culprits import _MAX_SAMPLES as _MAX_SAMPLES
from ._culprits import CAUSE_CODE as CAUSE_CODE
from ._culprits import CAUSE_GC as CAUSE_GC
from ._culprits import CAUSE_LOOPTRACE as CAUSE_LOOPTRACE
from ._culprits import CAUSE_UNSCHEDULED as CAUSE_UNSCHEDULED
from ._culprits import STALL_EVENT as STALL_EVENT
from ._culprits import Culprit
from ._culprits import _append_event as _append_event
from ._culprits import _event_attributes as _event_attributes
from ._culprits import _make_culprit as _make_culprit
from ._culprits import _stall_start_ns as _stall_start_ns
from ._culprits import _Watch as _Watch
from ._culprits import logger as logger
from ._frames import _CORO_FLAGS as _CORO_FLAGS
from ._frames import _DEMO_FILE as _DEMO_FILE
from ._frames import _LOOPTRACE_DIR as _LOOPTRACE_DIR
from ._frames import _MAX_STACK as _MAX_STACK
from ._frames import _STDLIB_DIR as _STDLIB_DIR
from ._frames import _Frame as _Frame
from ._frames import _is_library as _is_library
from ._frames import _own_work as _own_work
from ._frames import _pick as _pick
from ._frames import _walk as _walk
from ._histogram import _MAX_US as _MAX_US
from ._histogram import _N_BUCKETS as _N_BUCKETS
from ._histogram import LagSnapshot
from ._histogram import _bucket as _bucket
from ._histogram import _bucket_bounds as _bucket_bounds
from ._histogram import _Histogram as _Histogram
from ._hook import _patch as _patch
from ._hook import _watch_get as _watch_get
from ._hook import _watches as _watches
from ._hook import _wrapped_run as _wrapped_run
from ._monitor import _MAX_CULPRITS as _MAX_CULPRITS
from ._monitor import LagMonitor, ensure_from_config
from ._registry import _active as _active
from ._registry import _active_get as _active_get
from ._registry import _by_thread as _by_thread
from ._registry import _by_thread_get as _by_thread_get
from ._registry import _forget_loop as _forget_loop
from ._registry import _get_ident as _get_ident
from ._registry import _get_running_loop as _get_running_loop
from ._registry import _lock as _lock
from ._registry import _prune_closed as _prune_closed
from ._registry import _running as _running
from ._registry import active_monitor
from ._span_lag import _span_end as _span_end
from ._span_lag import blocked_ns
from ._summary import SUMMARY_PREFIX as SUMMARY_PREFIX
from ._summary import SUMMARY_SPAN as SUMMARY_SPAN
from ._summary import finish_windows

__all__ = [
    "CAUSE_CODE",
    "CAUSE_GC",
    "CAUSE_LOOPTRACE",
    "CAUSE_UNSCHEDULED",
    "Culprit",
    "LagMonitor",
    "LagSnapshot",
    "active_monitor",
    "blocked_ns",
    "ensure_from_config",
    "finish_windows",
]


def __getattr__(name: str) -> Any:
    # What Handle._run was before the hook went in: _patch rebinds it, so it is read from the
    # hook's module each time rather than copied here once.
    if name == "_original_run":
        return _hook._original_run
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
