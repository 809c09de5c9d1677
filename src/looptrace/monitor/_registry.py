"""Which monitors run where: per loop, and per thread for the span hook, under one lock.

Every module of the monitor reads these tables; only the monitor's lifecycle (``start``, the
binding to its loop's thread, ``_detach``) and the clean-up of loops that closed under a running
monitor (here) change them.
"""

from __future__ import annotations

import asyncio
import asyncio.events
import threading
from typing import TYPE_CHECKING

from ._hook import _release_watch

if TYPE_CHECKING:
    from ._monitor import LagMonitor

_get_running_loop = asyncio.events._get_running_loop

_lock = threading.RLock()
# Every running monitor per loop, oldest first; the first one feeds span lag.
_running: dict[asyncio.AbstractEventLoop, list[LagMonitor]] = {}
_active: dict[asyncio.AbstractEventLoop, LagMonitor] = {}
_active_get = _active.get
# The same monitors by the id of the thread their loop runs in, for the span hooks: on Linux
# asyncio's _get_running_loop() makes a getpid() system call, threading.get_ident() does not.
_by_thread: dict[int, LagMonitor] = {}
_by_thread_get = _by_thread.get
_get_ident = threading.get_ident


def active_monitor() -> LagMonitor | None:
    """The monitor running on the current thread's event loop (the first started), if any."""
    loop = _get_running_loop()
    if loop is None:
        return None
    return _active_get(loop)


def _prune_closed() -> None:
    """Forget monitors whose loop closed without stop() (asyncio.run ending while one ran)."""
    for loop in [loop for loop in _running if loop.is_closed()]:
        thread = _forget_loop(loop)
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=1.0)  # it wakes at once: the stop event is set


def _forget_loop(loop: asyncio.AbstractEventLoop) -> threading.Thread | None:
    thread = None
    with _lock:
        for monitor in list(_running.get(loop, ())):
            monitor._handle = None
            thread = monitor._detach() or thread
        thread = _release_watch(loop) or thread
    return thread
