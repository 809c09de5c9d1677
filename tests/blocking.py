"""The blocking-call detector the capture, export and agent-framework tests run under."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def no_blocking_on_the_loop() -> Iterator[None]:
    """Fail on a blocking call (time.sleep, a blocking socket or file operation...) made by
    looptrace's code while an application's loop runs, as anyio's suite does for its own code.
    Exempt: the loop of looptrace's private thread (waiting there holds up no one), the calls
    whose contract is to block (flush_sync, shutdown_sync), and the store's reading API the
    tests inspect with."""
    from blockbuster import BlockBuster

    from looptrace._export.homes import PrivateLoop

    def on_private_loop() -> bool:
        try:
            return isinstance(asyncio.get_running_loop(), PrivateLoop)
        except RuntimeError:
            return True

    buster = BlockBuster(
        scanned_modules=["looptrace"], excluded_modules=["looptrace._store", "looptrace.testing"]
    )
    for function in buster.functions.values():
        function.can_block_in("looptrace/_export/__init__.py", {"flush_sync", "shutdown_sync"})
        allowed = function.can_block_predicate
        function.can_block_predicate = lambda *a, _allowed=allowed, **k: (
            on_private_loop() or _allowed(*a, **k)
        )
    buster.activate()
    try:
        yield
    finally:
        buster.deactivate()
