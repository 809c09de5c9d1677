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

Which monitors run on which loop and thread is kept in one place (``_registry``); how the
export stage starts the monitor and tells it a loop ended, in ``_wiring`` (export never
imports the monitor: the monitor registers with it).

asyncio only: loops that do not run ``asyncio.events.Handle`` objects (uvloop) get the ticker,
span lag and the heartbeat but no culprits. See ``docs/lag-monitor.md``.
"""

from __future__ import annotations

from ._culprits import CAUSE_CODE, CAUSE_GC, CAUSE_LOOPTRACE, CAUSE_UNSCHEDULED, Culprit
from ._histogram import LagSnapshot
from ._monitor import LagMonitor, ensure_from_config
from ._registry import active_monitor
from ._span_lag import blocked_ns
from ._summary import finish_windows
from ._wiring import register as _register_with_export

_register_with_export()

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
