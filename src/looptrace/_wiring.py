"""The package's top-level wiring: what connects stages that must not import each other.

The export stage sits below the lag monitor and never imports it. It offers a registration
point (``_export.register_lag_monitor``); this module registers a hook there that loads the
monitor when the first span on a loop needs it (``lag_monitor`` on), and the monitor, once
loaded, registers its own. The package root calls :func:`wire` whenever it loads the export
stage for a public name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import _export

if TYPE_CHECKING:
    import asyncio

    from ._config import Config

__all__ = ["wire"]

_wired = False


class _MonitorOnDemand:
    """The lag monitor, loaded at the first call (importing it costs a program that never
    monitors nothing)."""

    def start(self, cfg: Config) -> object:
        from .monitor import ensure_from_config

        return ensure_from_config(cfg)

    def loop_ends(self, loop: asyncio.AbstractEventLoop) -> None:
        from .monitor import finish_windows

        finish_windows(loop)


def wire() -> None:
    """Register what the export stage calls above it (once; the monitor's own registration,
    if it is loaded already, stands)."""
    global _wired
    if _wired:
        return
    _wired = True
    if _export.lag_hook.registered() is None:
        _export.register_lag_monitor(_MonitorOnDemand())
