"""Where a flusher runs: a :class:`Home` is a task on an asyncio loop (the application's, or a
private one in a daemon thread), and :class:`Homes` the set of them a flusher has, with the one
producers kick; a :class:`Waiter` is someone waiting in ``flush()`` or ``backpressure()``, on a
loop or in a thread."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import sys
import threading
import weakref
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from .._errors import report_internal
from .batch import Batch
from .exporter import Session

if TYPE_CHECKING:
    from .._capture.spans import Span

__all__ = [
    "Home",
    "Homes",
    "PrivateLoop",
    "Waiter",
    "running_asyncio_loop",
    "wait_event",
    "wait_future",
]


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
        # Batches this loop took to encode and has not finished, with their spans: a flush
        # that blocks this loop hands them to the private thread (``Pipeline.flush_sync``).
        self.encoding: dict[Batch, list[Span]] = {}
        self.session: Session | None = None  # the exporter on this loop
        self.urgent = False  # drain now: a flush or shutdown is waiting
        self.awaiting_slot = False  # a drain waits for a request slot: a sender wakes it
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


class Homes:
    """A flusher's homes: where each runs, which one producers kick (``primary``), and the
    application loops that went away under one (never used again). ``run(home)`` is the
    flusher's own coroutine; it calls :meth:`forget` as it winds down."""

    def __init__(self, run: Callable[[Home], Coroutine[Any, Any, None]], slots: int) -> None:
        self._run = run
        self._slots = slots
        self.lock = threading.Lock()
        self.all: list[Home] = []
        self.primary: Home | None = None
        self._dead_loops: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()

    def alive(self) -> list[Home]:
        with self.lock:
            return [h for h in self.all if h.alive()]

    def ensure(self, prefer_thread: bool = False) -> Home:
        """The live primary home, started if needed: on the running asyncio loop (unless one
        that went away under a flusher), else in a private thread."""
        with self.lock:
            home = self.primary
            if home is not None and home.alive():
                return home
            if home is not None:
                self._forget(home)
            loop = None if prefer_thread else running_asyncio_loop()
            if loop is not None and loop in self._dead_loops:
                loop = None
            home = self._start_on_loop(loop) if loop is not None else self._start_thread()
            self.primary = home
            return home

    def kick(self, urgent: bool) -> Home:
        """Wake the primary home (started if needed)."""
        home = self.primary
        if home is None or not home.alive():
            home = self.ensure()
        home.kick(urgent)
        return home

    def thread_home(self) -> Home:
        """A live private-thread home (started if needed), without changing the primary unless
        there is none."""
        with self.lock:
            for home in self.all:
                if home.private and home.alive():
                    return home
            home = self._start_thread()
            if self.primary is None or not self.primary.alive():
                self.primary = home
            return home

    def adopt(self, home: Home) -> None:
        """Count a home started by someone else (an inline drain's)."""
        with self.lock:
            self.all.append(home)

    def forget(self, home: Home) -> list[Home]:
        """``home`` has stopped; the homes still alive."""
        with self.lock:
            self._forget(home)
            return [h for h in self.all if h.alive()]

    def _forget(self, home: Home) -> None:
        if home in self.all:
            self.all.remove(home)
        if self.primary is home:
            self.primary = None

    def loop_went_away(self, loop: asyncio.AbstractEventLoop) -> None:
        """An application's loop cancelled its flusher (``asyncio.run`` ending): never start
        one on it again."""
        try:
            self._dead_loops.add(loop)
        except TypeError:  # pragma: no cover - a loop without weakref support
            pass

    def cancel_all(self) -> None:
        with self.lock:
            homes = list(self.all)
        for home in homes:
            home.cancel()

    def _start_on_loop(self, loop: asyncio.AbstractEventLoop) -> Home:
        home = Home(private=False)
        home.loop = loop
        home.thread_id = threading.get_ident()
        home.event = asyncio.Event()
        home.slots = asyncio.Semaphore(self._slots)
        coro = self._run(home)
        if sys.version_info >= (3, 11):
            # An empty context: the flusher must not inherit the span that happened to end first.
            home.task = loop.create_task(
                coro, name="looptrace-flusher", context=contextvars.Context()
            )
        else:  # pragma: no cover
            home.task = loop.create_task(coro, name="looptrace-flusher")
        self.all.append(home)
        return home

    def _start_thread(self) -> Home:
        home = Home(private=True)
        self.all.append(home)
        thread = threading.Thread(
            target=self._thread_main, args=(home,), name="looptrace-flusher", daemon=True
        )
        try:
            thread.start()
        except RuntimeError:
            # "can't create new thread at interpreter shutdown": the caller drains inline.
            home.done.set()
            self.all.remove(home)
        return home

    def _thread_main(self, home: Home) -> None:
        loop = PrivateLoop()
        try:
            home.loop = loop
            home.thread_id = threading.get_ident()

            async def main() -> None:
                home.event = asyncio.Event()
                home.slots = asyncio.Semaphore(self._slots)
                home.task = asyncio.current_task()
                await self._run(home)

            contextvars.Context().run(loop.run_until_complete, main())
        except BaseException as exc:  # pragma: no cover - the thread must never die noisily
            if not isinstance(exc, asyncio.CancelledError):
                report_internal("pipeline.thread", exc)
        finally:
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
                # Starts a thread to join the executor's: refused at interpreter exit.
                with contextlib.suppress(RuntimeError):
                    loop.run_until_complete(loop.shutdown_default_executor())
            finally:
                loop.close()
                home.done.set()


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
