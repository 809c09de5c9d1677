"""The lag monitor's registration point in the export stage. The monitor sits above export and
registers a hook here (or looptrace's package root does, one that loads the monitor when first
needed); export calls it and never imports the monitor:

- with ``lag_monitor`` on, the first span on a loop starts the monitor there (a start hook in
  ``_state``, so a stall inside that very span is measured);
- a loop that goes away under its flusher gets the monitor's last summary window
  (``flusher.ON_LOOP_END``).
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from typing import TYPE_CHECKING, Protocol

from .. import _state

if TYPE_CHECKING:
    from .._capture.spans import Span
    from .._config import Config

__all__ = ["LagMonitorHook", "register_lag_monitor", "registered"]

logger = logging.getLogger("looptrace")


class LagMonitorHook(Protocol):
    """What the export stage asks of the lag monitor, which sits above it and registers
    itself here (:func:`register_lag_monitor`): export never imports the monitor."""

    def start(self, cfg: Config) -> object:
        """Start the monitor on the running loop, as ``cfg`` says (``lag_monitor`` is on)."""
        ...

    def loop_ends(self, loop: asyncio.AbstractEventLoop) -> None:
        """``loop`` is going away under its flusher: export the monitor's last summary
        window of it (the private thread sends it)."""
        ...


_lag_monitor: LagMonitorHook | None = None
_unwired_said = False


def register_lag_monitor(hook: LagMonitorHook | None) -> None:
    """The lag monitor's registration point: with ``lag_monitor`` on, export starts it on each
    loop at the loop's first span and tells it when a loop goes away. looptrace's package root
    registers a hook that imports the monitor when first needed; the monitor replaces it with
    its own when imported."""
    global _lag_monitor
    _lag_monitor = hook


def _wire_lag_monitor(cfg: Config) -> None:
    """With ``lag_monitor`` on, the monitor starts on a loop when the first span starts there."""
    if cfg.lag_monitor and not cfg.disabled:
        _state.add_hooks(start=_start_lag_monitor)
    else:
        _state.remove_hooks(start=_start_lag_monitor)


def _monitor_loop_ends(cfg: Config, loop: asyncio.AbstractEventLoop) -> None:
    """The monitor's last summary window of a loop going away, which the private thread sends."""
    hook = _lag_monitor
    if cfg.lag_monitor and hook is not None:
        hook.loop_ends(loop)


def _start_lag_monitor(span: Span) -> None:
    """Start the monitor on this loop at its first span, so a stall inside that very span is
    measured (once per loop: one lookup per span after)."""
    global _unwired_said
    loop = asyncio._get_running_loop()
    if loop is None or loop in _monitored:
        return
    try:
        _monitored.add(loop)
    except TypeError:  # pragma: no cover - a loop without weakref support
        return
    hook = _lag_monitor
    if hook is None:
        if not _unwired_said:
            _unwired_said = True
            logger.warning(
                "looptrace: lag_monitor is on but the lag monitor is not loaded; "
                "import looptrace.monitor (or use looptrace's public API) to start it"
            )
        return
    cfg = _state.config
    if cfg is not None:
        hook.start(cfg)


_monitored: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()


def registered() -> LagMonitorHook | None:
    """The hook registered, if any."""
    return _lag_monitor
