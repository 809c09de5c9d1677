"""Where a flusher runs: a :class:`Home` is a task on an asyncio loop (the application's, or a
private one in a daemon thread); a :class:`Waiter` is someone waiting in ``flush()`` or
``backpressure()``, on a loop or in a thread."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from .buffer import Batch
from .exporter import Session

__all__ = ["Home", "PrivateLoop", "Waiter", "running_asyncio_loop", "wait_event", "wait_future"]


class PrivateLoop(asyncio.SelectorEventLoop):
    """The loop of looptrace's own thread, which creates it. Programs and test suites that
    walk ``gc.get_objects()`` and close every event loop they find (anyio's among them) would
    fail on it ("Cannot close a running event loop"), or close it under looptrace's thread: a
    ``close()`` from any other thread is ignored, and the thread closes it itself when it is
    done. A selector loop on every platform: it only makes client connections."""

    def __init__(self) -> None:
        # Set first: a gc walk on another thread can find the loop while it is being built.
        self._owner = threading.get_ident()
        super().__init__()

    def close(self) -> None:
        if threading.get_ident() != getattr(self, "_owner", None):
            return
        super().close()


class Waiter:
    """Someone waiting in flush() / backpressure(): a future on some loop, or a thread."""

    __slots__ = ("event", "future", "loop", "target")

    def __init__(
        self,
        target: int,
        loop: asyncio.AbstractEventLoop | None = None,
        future: asyncio.Future[None] | None = None,
    ) -> None:
        self.target = target  # flush: a sequence number; backpressure: -1
        self.loop = loop
        self.future = future
        self.event = threading.Event() if future is None else None

    def fire(self) -> None:
        if self.event is not None:
            self.event.set()
            return
        assert self.loop is not None
        assert self.future is not None
        try:
            self.loop.call_soon_threadsafe(_resolve, self.future)
        except RuntimeError:  # that loop is closed: nobody is waiting any more
            pass


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Home:
    """One flusher: a task on an asyncio loop (the application's, or a private one in a thread)."""

    def __init__(self, private: bool) -> None:
        self.private = private
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread_id = 0
        self.task: asyncio.Task[None] | None = None
        self.event: asyncio.Event | None = None
        self.slots: asyncio.Semaphore | None = None
        self.senders: set[asyncio.Task[None]] = set()
        # Encoded batches this loop holds in flight: being sent, or waiting for a slot.
        self.sending: set[Batch] = set()
        self.session: Session | None = None  # the exporter on this loop
        self.urgent = False  # drain now: a flush or shutdown is waiting
        self.stopping = False  # cancelled on purpose: do not hand work to another home
        self.done = threading.Event()

    def alive(self) -> bool:
        loop = self.loop
        if self.done.is_set():
            return False
        return loop is None or not loop.is_closed()

    def kick(self, urgent: bool = False) -> None:
        if urgent:
            self.urgent = True
        loop = self.loop
        if loop is None:  # still starting: it drains as soon as it runs
            return
        if threading.get_ident() == self.thread_id:
            if self.event is not None:
                self.event.set()
            return
        try:
            loop.call_soon_threadsafe(self._set)
        except RuntimeError:  # closed meanwhile; the pipeline notices on the next kick
            pass

    def _set(self) -> None:
        if self.event is not None:
            self.event.set()

    def cancel(self) -> None:
        """Stop this flusher on purpose (shutdown): its in-flight batches go back to pending."""
        self.stopping = True
        loop, task = self.loop, self.task
        if loop is None or task is None:
            return
        try:
            if threading.get_ident() == self.thread_id:
                task.cancel()
            else:
                loop.call_soon_threadsafe(task.cancel)
        except RuntimeError:  # its loop was closed with the task still pending
            pass


async def wait_event(event: asyncio.Event, timeout: float) -> None:
    if event.is_set():
        return
    waiter = asyncio.ensure_future(event.wait())
    try:
        await wait_future(waiter, max(0.0, timeout))
    finally:
        waiter.cancel()


async def wait_future(future: asyncio.Future[Any], timeout: float | None) -> None:
    """Wait for ``future`` for at most ``timeout`` seconds; on timeout leave it pending.

    Not ``asyncio.wait_for``: before Python 3.12 it swallows a cancellation that arrives as
    the awaited thing completes. A span that ended just before ``asyncio.run`` returned set the
    flusher's event in the same turn in which ``asyncio.run`` cancelled the flusher; the flusher
    went back to waiting on its event, forever, and ``asyncio.run`` never returned."""
    await asyncio.wait((future,), timeout=timeout)


def running_asyncio_loop() -> asyncio.AbstractEventLoop | None:
    return asyncio._get_running_loop()
