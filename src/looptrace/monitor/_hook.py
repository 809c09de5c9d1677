"""The culprit hook: the opt-in wrapper around ``asyncio.events.Handle._run``.

``Handle._run`` is a class attribute shared by every loop in the process. The wrapper goes in
when the first monitor asks for culprits, passes straight through on loops no monitor watches,
and the original is put back, the same object, when the last such monitor stops (``_patch``,
``_refresh_patch``).
Everything else about culprits (the watchdog, the samples, the report) is in ``_culprits``.
"""

from __future__ import annotations

import asyncio
import asyncio.events
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from ._internals import internal_error

if TYPE_CHECKING:
    from ._culprits import _Watch


# What Handle._run was before we wrapped it (read when the wrapper goes in, put back when the
# last culprit monitor stops).
_original_run: Callable[[asyncio.Handle], None] = asyncio.events.Handle._run
_watches: dict[asyncio.AbstractEventLoop, _Watch] = {}
_watch_get = _watches.get


def _wrapped_run(self: asyncio.Handle) -> None:
    watch = _watch_get(self._loop)  # type: ignore[attr-defined]
    if watch is None:
        _original_run(self)
        return
    watch.handle = self
    s = watch.seq = watch.seq + 1
    try:
        _original_run(self)
    finally:
        watch.done = s
        watch.handle = None
        if watch.flagged == s:
            try:
                watch.finish(self)
            except Exception as exc:
                internal_error("monitor.culprit", exc)


def _patch(on: bool) -> None:
    global _original_run
    handle_cls = asyncio.events.Handle
    current = handle_cls.__dict__["_run"]
    if on:
        if current is not _wrapped_run:
            _original_run = current
            setattr(handle_cls, "_run", _wrapped_run)  # noqa: B010
    elif current is _wrapped_run:
        setattr(handle_cls, "_run", _original_run)  # noqa: B010


def _refresh_patch() -> None:
    """Put ``Handle._run`` back once no watched loop names culprits (under the registry's
    lock): a watch that only keeps the heartbeat needs no wrapper."""
    if not any(watch.hooked for watch in _watches.values()):
        _patch(False)


def _release_watch(loop: asyncio.AbstractEventLoop) -> threading.Thread | None:
    """Forget ``loop``'s watch and stop its watchdog; put ``Handle._run`` back when no loop
    names culprits any more. Called under the registry's lock. Returns the watchdog thread to
    join."""
    watch = _watches.pop(loop, None)
    thread = None
    if watch is not None:
        watch.stop.set()
        thread = watch.thread
    _refresh_patch()
    return thread
