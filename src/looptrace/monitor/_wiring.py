"""The monitor registers with the export stage, which sits below it and never imports it: with
``lag_monitor`` on, export starts the monitor on each loop at the loop's first span, and tells
it when a loop goes away under its flusher (the last summary window)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._internals import _export
from ._monitor import LagMonitor, ensure_from_config
from ._summary import finish_windows

if TYPE_CHECKING:
    import asyncio

    from ._internals import Config


class ExportHook:
    """The monitor as ``_export.register_lag_monitor`` takes it."""

    def start(self, cfg: Config) -> LagMonitor | None:
        return ensure_from_config(cfg)

    def loop_ends(self, loop: asyncio.AbstractEventLoop) -> None:
        finish_windows(loop)


def register() -> None:
    """Register the monitor with the export stage (the package does it when it loads)."""
    _export.register_lag_monitor(ExportHook())
