"""Worker processes, each talked to over a pair of pipes written and read by the event loop.

Why not ``ProcessPoolExecutor``: it runs two threads in the application's process, a feeder
that writes calls into the queue and a manager that waits for results and wakes the futures.
Both hold the GIL while they work, and both compete with the loop for a core. Over 100 spans of
2.5 MB the application's process spent 285 ms of CPU with the executor and 195 ms with pipes
driven from the loop; the no-tracing baseline was 132 ms (docs/performance.md). Here the loop
writes each call as a small frame (large values travel by address or through the ring, see
:mod:`looptrace._ring`) and reads the answers with ``loop.add_reader``: no thread of ours runs
in the application's process while the pool works.

A frame is a header (payload length, call id) and a pickle: ``(name, args)`` one way,
``(ok, result)`` the other. A worker runs one call at a time, in the order received.

A pool serves one event loop at a time, its *owner*, with which the answer pipes are
registered. The first loop that calls becomes the owner; when the owner is closed or stopped,
the next loop that calls takes over. A call from another loop while the owner runs raises
:class:`Elsewhere`, and the caller does the work itself: moving pipes between two running
loops cannot be done safely from either side.

The processes start with the ``spawn`` method (``fork`` is unsafe in threaded programs), and
never import the user's ``__main__``: a script without an ``if __name__ == "__main__"`` guard
neither breaks nor runs twice.

The child's side (its main loop, and the process class it unpickles) is
:mod:`looptrace._child`, which a worker can import without asyncio.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import select
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from ._child import HEADER as _HEADER
from ._child import Context, serve, yield_cpu

__all__ = ["Elsewhere", "Pool", "WorkerError", "WorkerGone", "start_method", "yield_cpu"]

# At most this much is read or written per loop callback, so that a large answer (an encoded
# span coming back) is spread over several turns of the loop instead of one long copy.
_STEP = 256 * 1024
# Pipes this large hold a whole call frame without the loop having to wait for room. Linux
# lets an unprivileged process grow a pipe to 1 MiB (fs.pipe-max-size).
_PIPE_BYTES = 1 << 20

Release = Callable[[], None]


class WorkerGone(Exception):
    """The answer will not come: a worker died (``reason == "broken"``) or the pool was closed
    (``"shutdown"``)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class WorkerError(Exception):
    """The call raised inside the worker, which lives on. The message names the error."""


class Elsewhere(Exception):
    """The pool serves another running event loop (or this loop cannot watch pipes)."""


def start_method() -> str:
    """The start method of worker processes (always ``spawn``: never ``fork``)."""
    return Context()._name


def _own(conn: Any) -> int:
    """The raw descriptor of a multiprocessing pipe end, taken from its Connection: a
    Connection closes its descriptor when garbage collected, and a descriptor closed while a
    loop still watches it (its number then reused) corrupts that loop's selector."""
    fd = os.dup(conn.fileno())
    conn.close()
    return fd


class _Channel:
    """One worker: its process, the parent's ends of its two pipes, its calls in flight."""

    __slots__ = (
        "answers",
        "frame",
        "got",
        "head",
        "outbox",
        "pending",
        "process",
        "rid",
        "sent",
        "tasks",
    )

    def __init__(self, process: Any, tasks: int, answers: int) -> None:
        self.process = process
        self.tasks = tasks
        self.answers = answers
        self.pending: dict[int, tuple[asyncio.Future[Any], Release | None]] = {}
        self.outbox = bytearray()  # bytes the pipe had no room for yet
        self.sent = 0  # of the outbox
        self.head = bytearray()  # the answer header read so far
        self.frame: bytearray | None = None  # the answer being read
        self.got = 0
        self.rid = 0


# --------------------------------------------------------------------------- parent side


class Pool:
    """``workers`` processes, each running ``init(*init_args)`` then serving ``calls`` by name.

    :meth:`start` blocks (run it off the loop); :meth:`call` is for the owner loop;
    :meth:`close` may be called from any thread."""

    def __init__(
        self,
        workers: int,
        init: Callable[..., None],
        init_args: tuple[Any, ...],
        calls: dict[str, Callable[..., Any]],
    ) -> None:
        self.workers = workers
        self._init = init
        self._init_args = init_args
        self._calls = calls
        self._channels: list[_Channel] = []
        self._owner: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self._next = 0
        self.gone: str | None = None  # why the pool stopped: "broken" or "shutdown"
        # A pool dropped without close() (nothing of a loop's refers to it any more, or its
        # callbacks would keep it alive): its workers would wait on their pipes until exit.
        weakref.finalize(self, _close_channels, self._channels, True).atexit = False

    def pids(self) -> list[int]:
        return sorted(ch.process.pid for ch in self._channels)

    def start(self, timeout: float) -> None:
        """Launch the workers and wait until each has answered a first call."""
        ctx = Context()
        try:
            for _ in range(self.workers):
                task_r, task_w = ctx.Pipe(duplex=False)
                answer_r, answer_w = ctx.Pipe(duplex=False)
                process = ctx.Process(
                    target=serve,
                    args=(task_r, answer_w, self._init, self._init_args, self._calls),
                    name="looptrace-worker",
                    daemon=True,
                )
                process.start()
                # A starting interpreter imports for a good part of a second: lower its
                # priority from here, at once, so its start-up does not take the loop's core.
                assert process.pid is not None  # 0 would mean this process
                yield_cpu(process.pid)
                task_r.close()
                answer_w.close()
                channel = _Channel(process, _own(task_w), _own(answer_r))
                self._channels.append(channel)
                for fd in (channel.tasks, channel.answers):
                    os.set_blocking(fd, False)
                    with contextlib.suppress(AttributeError, OSError):
                        import fcntl

                        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)  # type: ignore[attr-defined,unused-ignore]
            for channel in self._channels:
                self.call_sync("ping", (), timeout, channel)
        except BaseException:
            self.close(wait=False)
            raise

    def call_sync(
        self, name: str, args: tuple[Any, ...], timeout: float, channel: _Channel | None = None
    ) -> Any:
        """A call answered on this thread: for the start-up, before any loop owns the pool."""
        ch = channel or self._channels[0]
        assert self._owner is None, "the pool already belongs to a loop"
        rid = self._next
        self._next += 1
        payload = pickle.dumps((name, args), protocol=5)
        deadline = time.monotonic() + timeout
        data = memoryview(_HEADER.pack(len(payload), rid) + payload)
        while data:
            if not _ready(ch.tasks, select.POLLOUT, deadline):
                raise TimeoutError(f"worker did not take {name!r} in {timeout} s")
            data = data[os.write(ch.tasks, data) :]
        while True:
            if not _ready(ch.answers, select.POLLIN, deadline):
                raise TimeoutError(f"worker did not answer {name!r} in {timeout} s")
            frames = self._take(ch, _STEP)
            if frames is None:
                raise WorkerGone("broken")
            for got, frame in frames:
                if got == rid:
                    ok, result = pickle.loads(frame)
                    if not ok:
                        raise WorkerError(result)
                    return result

    def call(self, name: str, args: tuple[Any, ...], release: Release | None = None) -> Any:
        """Send a call from the running loop; returns an ``asyncio.Future`` of its result.

        ``release`` runs once the worker can no longer be using anything of the call's
        (after its answer, or after its process is gone), even if the future was cancelled.
        Raises :class:`WorkerGone` or :class:`Elsewhere` when the call cannot be sent, and the
        pickling error when ``args`` do not pickle (before anything is sent). ``args`` are
        pickled once, here: the caller need not pickle them first."""
        loop = asyncio.get_running_loop()
        payload = pickle.dumps((name, args), protocol=5)
        with self._lock:
            if self.gone is not None:
                raise WorkerGone(self.gone)
            if self._owner is not loop:
                self._bind(loop)
            ch = min(self._channels, key=lambda c: len(c.pending))
            rid = self._next
            self._next += 1
            future: asyncio.Future[Any] = loop.create_future()
            ch.pending[rid] = (future, release)
            try:
                self._send(ch, _HEADER.pack(len(payload), rid), payload)
                return future
            except OSError:
                del ch.pending[rid]  # the caller keeps its values: nothing was sent
        self._break("broken")
        raise WorkerGone("broken")

    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        old = self._owner
        if old is not None and not old.is_closed():
            if old.is_running():
                raise Elsewhere("the worker pool serves another running event loop")
            self._unregister(old)
        try:
            for ch in self._channels:
                loop.add_reader(ch.answers, self._on_readable, ch)
                if len(ch.outbox) > ch.sent:
                    loop.add_writer(ch.tasks, self._on_writable, ch)
        except NotImplementedError as exc:  # a loop without add_reader (Windows' proactor)
            self._unregister(loop)
            raise Elsewhere("this event loop cannot watch pipes") from exc
        self._owner = loop

    def _unregister(self, loop: asyncio.AbstractEventLoop) -> None:
        for ch in self._channels:
            with contextlib.suppress(Exception):
                loop.remove_reader(ch.answers)
            with contextlib.suppress(Exception):
                loop.remove_writer(ch.tasks)

    def _send(self, ch: _Channel, head: bytes, payload: bytes) -> None:
        if len(ch.outbox) > ch.sent:
            ch.outbox += head
            ch.outbox += payload
            return
        try:
            sent = os.writev(ch.tasks, [head, payload])
        except BlockingIOError:
            sent = 0
        if sent < len(head) + len(payload):
            # The pipe is full (a large frame, or a worker behind): the rest goes out as the
            # worker makes room, a step per loop callback.
            ch.outbox = bytearray(memoryview(head + payload)[sent:])
            ch.sent = 0
            assert self._owner is not None
            self._owner.add_writer(ch.tasks, self._on_writable, ch)

    def _on_writable(self, ch: _Channel) -> None:
        with self._lock:
            if self.gone is not None:
                return
            try:
                with memoryview(ch.outbox) as view:
                    ch.sent += os.write(ch.tasks, view[ch.sent : ch.sent + _STEP])
            except BlockingIOError:
                return
            except OSError:
                broken = True
            else:
                broken = False
                if ch.sent == len(ch.outbox):
                    ch.outbox = bytearray()
                    ch.sent = 0
                    if self._owner is not None:
                        self._owner.remove_writer(ch.tasks)
        if broken:
            self._break("broken")

    def _on_readable(self, ch: _Channel) -> None:
        with self._lock:
            if self.gone is not None:
                return
            try:
                frames = self._take(ch, _STEP)
            except OSError:
                frames = None
            answered = [(ch.pending.pop(rid, None), frame) for rid, frame in frames or ()]
        for entry, frame in answered:
            if entry is not None:
                try:
                    ok, result = pickle.loads(frame)
                except Exception as exc:
                    ok, result = False, f"{type(exc).__name__}: {exc}"
                _settle(entry, ok, result)
        if frames is None:  # end of file: the worker is gone
            self._break("broken")

    @staticmethod
    def _take(ch: _Channel, budget: int) -> list[tuple[int, bytearray]] | None:
        """Whole answers read so far (at most ``budget`` bytes read now); None at end of file."""
        out: list[tuple[int, bytearray]] = []
        fd = ch.answers
        while budget > 0:
            frame = ch.frame
            if frame is None:
                try:
                    data = os.read(fd, _HEADER.size - len(ch.head))
                except BlockingIOError:
                    break
                if not data:
                    return None
                ch.head += data
                if len(ch.head) < _HEADER.size:
                    continue
                n, ch.rid = _HEADER.unpack(ch.head)
                ch.head.clear()
                frame = ch.frame = bytearray(n)
                ch.got = 0
            want = min(len(frame) - ch.got, budget)
            if want:
                try:
                    with memoryview(frame) as view:
                        k = os.readv(fd, [view[ch.got : ch.got + want]])
                except BlockingIOError:
                    break
                if k == 0:
                    return None
                ch.got += k
                budget -= k
            if ch.got == len(frame):
                out.append((ch.rid, frame))
                ch.frame = None
        return out

    def _break(self, reason: str, wait: bool = False) -> None:
        """Stop the pool (once): fail every call in flight, stop the processes, close the
        pipes. Safe from any thread."""
        with self._lock:
            if self.gone is not None:
                return
            self.gone = reason
            owner = self._owner
            entries = [e for ch in self._channels for e in ch.pending.values()]
            for ch in self._channels:
                ch.pending.clear()
                ch.outbox = bytearray()
        here = owner is None or owner.is_closed() or not owner.is_running()
        with contextlib.suppress(RuntimeError):
            here = here or asyncio.get_running_loop() is owner
        if here:
            self._close_pipes(owner)
        else:
            try:
                owner.call_soon_threadsafe(self._close_pipes, owner)  # type: ignore[union-attr]
            except RuntimeError:  # closed meanwhile
                self._close_pipes(None)
        for future, _ in entries:
            _settle_soon(future, WorkerGone(reason))
        processes = [ch.process for ch in self._channels]
        for process in processes:
            with contextlib.suppress(Exception):
                process.kill()
        # What a worker was given stays alive until its process is surely gone: it may be
        # reading it from this process's memory right now.
        releases = [release for _, release in entries if release is not None]
        if wait:
            _reap(processes, releases)
            return
        try:
            threading.Thread(
                target=_reap, args=(processes, releases), name="looptrace-reaper", daemon=True
            ).start()
        except RuntimeError:  # interpreter shutdown: no new threads
            _reap(processes, releases)

    def _close_pipes(self, owner: asyncio.AbstractEventLoop | None) -> None:
        if owner is not None and not owner.is_closed():
            self._unregister(owner)
        _close_channels(self._channels)

    def close(self, wait: bool = True) -> None:
        """Stop the workers; calls in flight fail with ``WorkerGone("shutdown")``. With
        ``wait``, return once the processes have exited."""
        self._break("shutdown", wait)


def _ready(fd: int, event: int, deadline: float) -> bool:
    # poll, not select: select refuses descriptors above 1023, which a busy server has.
    poller = select.poll()
    poller.register(fd, event)
    return bool(poller.poll(max(deadline - time.monotonic(), 0.0) * 1000))


def _close_channels(channels: list[_Channel], kill: bool = False) -> None:
    for ch in channels:
        for fd in (ch.tasks, ch.answers):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        ch.tasks = ch.answers = -1  # closed once: the numbers may belong to new files now
        if kill:
            with contextlib.suppress(Exception):
                ch.process.kill()


def _settle(entry: tuple[asyncio.Future[Any], Release | None], ok: bool, result: Any) -> None:
    future, release = entry
    if release is not None:
        release()
    _settle_soon(future, result if ok else WorkerError(result), ok)


def _settle_soon(future: asyncio.Future[Any], outcome: Any, ok: bool = False) -> None:
    """Resolve ``future`` on its own loop (a stopped loop resolves it when it runs again)."""
    loop = future.get_loop()
    if loop.is_closed():
        return
    try:
        here = asyncio.get_running_loop() is loop
    except RuntimeError:
        here = False
    if here:
        _resolve(future, outcome, ok)
    else:
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_resolve, future, outcome, ok)


def _resolve(future: asyncio.Future[Any], outcome: Any, ok: bool) -> None:
    if future.done():  # cancelled: the caller gave up waiting
        return
    if ok:
        future.set_result(outcome)
    else:
        future.set_exception(outcome)


def _reap(processes: list[Any], releases: list[Release]) -> None:
    for process in processes:
        with contextlib.suppress(Exception):
            process.join(10.0)
    for release in releases:
        with contextlib.suppress(Exception):
            release()
