"""Worker processes: fresh interpreters talked to over their standard pipes, one thread each.

Each worker is ``subprocess.Popen`` of this interpreter running :func:`looptrace._offload.worker.main`
(never the application's ``__main__``, never ``multiprocessing``'s start methods), which works
the same on Linux, macOS and Windows and under any event loop. In the parent, one thread per
worker writes its calls and reads its answers with blocking I/O: the GIL is released for the
whole of each transfer, so a large frame costs the application's loop nothing while it moves,
and no event loop needs to watch a pipe (the Windows proactor loop cannot). Callers get a
``concurrent.futures.Future``, which any loop (or thread) can wait on.

Calls wait in one queue, in the order submitted; each worker's thread takes the next one as
soon as its worker has answered the last. A worker that dies, or a pipe that breaks, fails every
call in flight with :class:`WorkerGone` and stops the pool: the offloader decides whether to
start another. Workers exit on their own when the parent goes away (their standard input
closes), however it ends.

Workers run only when a core is otherwise idle (:func:`~.worker.yield_cpu`), so that on a quiet
machine they never take the loop's core; on a machine whose cores are never idle they hardly
run at all, and a flush of large spans waited minutes for them. When a call has waited
``BEHIND_SECONDS`` without a worker taking it, one helper worker at the ordinary priority is
started to share the queue (an unprivileged process cannot raise a worker's priority back);
it exits once it has found nothing to do for ``HELPER_IDLE_SECONDS``.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import pickle
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from .._errors import WorkerError as WorkerError
from .._errors import WorkerGone as WorkerGone
from .worker import Raw, RawValue, read_frame, unpack, write_frame, yield_cpu

__all__ = ["Pool", "Raw", "WorkerError", "WorkerGone"]

# Where a pipe can be grown (Linux), a large frame crosses in fewer wake-ups of each side.
_PIPE_BYTES = 1 << 20
# A call that no worker has taken this long after it was queued: the workers are starved of
# CPU (or busy with something long), and a helper at the ordinary priority is started.
BEHIND_SECONDS = 0.5
# A helper that has found no call to take for this long exits.
HELPER_IDLE_SECONDS = 5.0
# A pool whose idle-priority workers have not started within this long (0.2 s on an idle
# machine; tens of seconds when its cores are never idle) starts a helper alongside them.
START_HELP_SECONDS = 2.0

logger = logging.getLogger("looptrace")

Release = Callable[[], None]


def _command(idle: bool = True) -> list[str]:
    # The directory that holds this package goes first on the child's path for the one import
    # that bootstraps it; the worker then takes the application's own sys.path.
    home = str(Path(__file__).resolve().parents[2])
    code = (
        f"import sys; sys.path.insert(0, {home!r}); "
        f"from looptrace._offload.worker import main; main(idle={idle!r})"
    )
    return [sys.executable, "-c", code]


# Where OpenTelemetry's auto-instrumentation (``opentelemetry-instrument``) keeps the
# sitecustomize it puts on PYTHONPATH, which would instrument every interpreter started below.
_AUTO_INSTRUMENTATION = os.path.join("opentelemetry", "instrumentation", "auto_instrumentation")


def _environment() -> dict[str, str]:
    """The application's environment for a worker, without OpenTelemetry's auto-instrumentation:
    a worker does looptrace's own work, which is never traced."""
    env = dict(os.environ)
    path = env.get("PYTHONPATH")
    if path:
        kept = [
            p
            for p in path.split(os.pathsep)
            if not os.path.normpath(p).endswith(_AUTO_INSTRUMENTATION)
        ]
        if kept:
            env["PYTHONPATH"] = os.pathsep.join(kept)
        else:
            del env["PYTHONPATH"]
    env["OTEL_SDK_DISABLED"] = "true"  # should an SDK be set up anyway, it records nothing
    return env


class _Call:
    __slots__ = ("answered", "copied", "future", "head", "queued_at", "raw", "taken_at")

    def __init__(self, head: bytes, raw: list[RawValue]) -> None:
        self.head = head
        self.raw = raw
        self.queued_at = time.monotonic()
        self.taken_at = 0.0  # when a worker's thread took it
        self.copied = False  # a helper was given it too (its worker was behind)
        self.answered = False
        self.future: concurrent.futures.Future[Any] = concurrent.futures.Future()


class _Channel:
    """One worker process and the thread that talks to it."""

    def __init__(self, process: subprocess.Popen[bytes], helper: bool = False) -> None:
        self.process = process
        self.helper = helper  # started at the ordinary priority, while the queue was behind
        self.current: _Call | None = None  # the call its worker has
        self.ready = False  # answered its start-up frame
        self.failed = False  # exited (or its pipe broke) before answering it
        self.thread: threading.Thread | None = None


class Pool:
    """``workers`` processes answering the calls of module ``calls`` (its ``CALLS`` dict).

    :meth:`start` blocks (run it off the loop); :meth:`submit` may be called from any thread;
    :meth:`close` too."""

    def __init__(self, workers: int, calls: str) -> None:
        self.workers = workers
        self._calls_module = calls
        self._channels: list[_Channel] = []
        self._lock = threading.Lock()
        # Guards the queue, the counts and the helper; wakes the workers' threads and the watch.
        self._cond = threading.Condition(self._lock)
        self._pending: deque[_Call] = deque()  # calls no worker has taken yet
        self.queued = 0  # calls submitted and not answered yet
        self._helper = False  # a helper is starting or running (at most one at a time)
        self.helpers_started = 0
        self._pid = os.getpid()
        self.gone: str | None = None  # why the pool stopped: "broken" or "shutdown"
        # A pool dropped without close(): its workers see their input close and exit.
        weakref.finalize(self, _abandon, self._channels, self._pid).atexit = False

    def pids(self) -> list[int]:
        with self._lock:
            return sorted(ch.process.pid for ch in self._channels)

    def alive(self) -> int:
        """How many worker processes are running."""
        with self._lock:
            channels = list(self._channels)
        return sum(1 for ch in channels if ch.process.poll() is None)

    def _spawn(self, idle: bool) -> _Channel:
        flags = 0
        if sys.platform == "win32":
            flags = subprocess.CREATE_NO_WINDOW
            if idle:
                flags |= subprocess.IDLE_PRIORITY_CLASS
        process = subprocess.Popen(
            _command(idle),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            creationflags=flags,
            env=_environment(),
        )
        if idle:
            # A starting interpreter imports for a good part of a second: lower its
            # priority from here, at once, so that its start-up does not take the loop's
            # core (the worker does it again itself where this cannot reach it).
            yield_cpu(process.pid)
        for pipe in (process.stdin, process.stdout):
            with contextlib.suppress(ImportError, AttributeError, OSError):
                import fcntl

                fcntl.fcntl(pipe.fileno(), fcntl.F_SETPIPE_SZ, _PIPE_BYTES)  # type: ignore[union-attr,attr-defined,unused-ignore]
        return _Channel(process, helper=not idle)

    def _hello(self, ch: _Channel) -> None:
        assert ch.process.stdin is not None
        write_frame(ch.process.stdin, 0, (list(sys.path), self._calls_module))

    def _serve(self, ch: _Channel) -> None:
        ch.thread = threading.Thread(
            target=self._life, args=(ch,), name="looptrace-worker-io", daemon=True
        )
        ch.thread.start()

    def _started(self, until: float) -> bool | None:
        """Wait (holding the lock) until a worker has started (True), every one has failed
        (None), or ``until`` (False)."""
        while True:
            if any(ch.ready for ch in self._channels):
                return True
            if all(ch.failed for ch in self._channels):
                return None
            left = until - time.monotonic()
            if left <= 0:
                return False
            self._cond.wait(left)

    def start(self, timeout: float) -> None:
        """Launch the workers and wait until one has answered its start-up frame (the others
        join as they answer theirs). Idle-priority workers that have not answered within
        ``START_HELP_SECONDS`` get a helper."""
        now = time.monotonic()
        deadline = now + timeout
        try:
            with self._lock:
                for _ in range(self.workers):
                    self._channels.append(self._spawn(idle=True))
            for ch in self._channels:
                self._hello(ch)
                self._serve(ch)
            with self._cond:
                started = self._started(min(deadline, now + START_HELP_SECONDS))
                if started is False:
                    self._helper = True
            if started is False:
                self._start_helper()
                with self._cond:
                    started = self._started(deadline)
            if started is None:
                raise OSError("a worker exited at start-up")
            if started is False:
                raise TimeoutError(f"a worker did not start within {timeout} s")
            threading.Thread(target=self._watch, name="looptrace-worker-watch", daemon=True).start()
        except BaseException:
            self.close(wait=False)
            raise

    def _life(self, ch: _Channel) -> None:
        """The thread of one worker: its start-up answer, then its calls."""
        assert ch.process.stdout is not None
        try:
            frame = read_frame(ch.process.stdout)
        except (OSError, ValueError):
            frame = None
        with self._cond:
            if frame is not None:
                ch.ready = True
            else:
                ch.failed = True
                if ch.helper and ch in self._channels:
                    self._channels.remove(ch)
            # A worker lost after another had started breaks the pool, as at any time.
            broken = (
                frame is None
                and not ch.helper
                and self.gone is None
                and any(c.ready for c in self._channels)
            )
            self._cond.notify_all()
        if frame is None:
            if ch.helper and self.gone is None:
                logger.warning(
                    "looptrace: a helper worker exited at start-up (status %s); the"
                    " idle-priority ones go on",
                    ch.process.poll(),
                )
                _kill([ch])
            elif broken:
                self._break("broken")
            return
        self._run(ch)

    def submit(self, name: str, args: tuple[Any, ...], raw: list[RawValue] | None = None) -> Any:
        """Queue a call; returns a ``concurrent.futures.Future`` of its result.

        ``raw`` values (immutable ``str`` and ``bytes``) travel after the pickle, written by the
        worker's thread, and reach the call as a list of ``bytes``, its last argument. A call
        whose answer is a :class:`Raw` resolves to that ``Raw``. ``args`` are pickled here, on
        the caller's thread, so that a value that does not pickle raises now (nothing is sent)
        and the worker sees the values as they were at this call."""
        # The same header the worker's own frames have: (whether raw bytes follow, the value).
        head = pickle.dumps((bool(raw), (name, args)), protocol=5)
        call = _Call(head, raw or [])
        with self._cond:
            if self.gone is not None:
                raise WorkerGone(self.gone)
            self.queued += 1
            self._pending.append(call)
            self._cond.notify_all()
        return call.future

    def _next(self, ch: _Channel) -> _Call | None:
        """The next call for ``ch``'s worker; None when the pool stops, or when a helper has
        had nothing to do for ``HELPER_IDLE_SECONDS`` (it is then off the list).

        A helper with an empty queue also takes a copy of a call that an idle-priority worker
        has held for ``BEHIND_SECONDS`` (the first answer settles it): a starved worker
        always holds one call, and a flush would wait for it."""
        with self._cond:
            idle_since = time.monotonic()
            while self.gone is None:
                if self._pending:
                    call = self._pending.popleft()
                    call.taken_at = time.monotonic()
                    ch.current = call
                    return call
                if not ch.helper:
                    self._cond.wait()
                    continue
                now = time.monotonic()
                wait = idle_since + HELPER_IDLE_SECONDS - now
                for other in self._channels:
                    held = other.current
                    if other.helper or held is None or held.copied or held.answered:
                        continue
                    late = held.taken_at + BEHIND_SECONDS - now
                    if late <= 0:
                        held.copied = True
                        ch.current = held
                        return held
                    wait = min(wait, late)
                if wait <= 0:
                    self._channels.remove(ch)
                    self._helper = False
                    self._cond.notify_all()
                    return None
                self._cond.wait(wait)
            return None

    def _run(self, ch: _Channel) -> None:
        """The thread of one worker: take a call, send it, wait for its answer, settle its
        future."""
        stdin, stdout = ch.process.stdin, ch.process.stdout
        assert stdin is not None and stdout is not None
        while True:
            call = self._next(ch)
            if call is None:
                if ch.helper and self.gone is None:  # a helper with nothing left to do
                    with contextlib.suppress(OSError):
                        stdin.close()  # it exits at the end of its input
                    _reap([ch])
                return
            try:
                _send(stdin, call)
                frame = read_frame(stdout)
            except (OSError, ValueError):
                frame = None
            with self._lock:
                ch.current = None
                first = not call.answered
                call.answered = True
                if first:
                    self.queued -= 1
            if frame is None:  # the worker died, or the pool was closed under it
                _fail(call.future, WorkerGone(self.gone or "broken"))
                self._break("broken")
                return
            _, head, raw = frame
            try:
                answer = unpack(head, raw)
            except Exception as exc:
                answer = (False, f"{type(exc).__name__}: {exc}")
            if type(answer) is Raw:
                _settle(call.future, answer)
            elif answer[0]:
                _settle(call.future, answer[1])
            else:
                _fail(call.future, WorkerError(answer[1]))

    def _oldest(self) -> float | None:
        """Since when the oldest call has waited for a worker: in the queue, or held by an
        idle-priority worker that has not answered it (None: no call waits)."""
        since = [self._pending[0].queued_at] if self._pending else []
        for ch in self._channels:
            held = ch.current
            if not ch.helper and held is not None and not held.answered:
                since.append(held.taken_at)
        return min(since) if since else None

    def _watch(self) -> None:
        """Start a helper when a call has waited ``BEHIND_SECONDS`` for a worker."""
        while True:
            with self._cond:
                while True:
                    if self.gone is not None:
                        return
                    oldest = None if self._helper else self._oldest()
                    if oldest is None:
                        # Idle (or helped): until a submit or the helper's exit wakes it.
                        self._cond.wait(None if self._helper or not self.queued else BEHIND_SECONDS)
                        continue
                    late = oldest + BEHIND_SECONDS - time.monotonic()
                    if late > 0:
                        self._cond.wait(late)
                        continue
                    self._helper = True
                    break
            self._start_helper()

    def _start_helper(self) -> None:
        """Start a helper; its thread waits for its start-up answer, then serves."""
        try:
            ch = self._spawn(idle=False)
        except Exception as exc:
            # self._helper stays set: no second attempt.
            logger.warning("looptrace: no helper worker (%s); the idle-priority ones go on", exc)
            return
        try:
            self._hello(ch)
        except Exception as exc:
            logger.warning("looptrace: no helper worker (%s); the idle-priority ones go on", exc)
            _kill([ch])
            return
        with self._lock:
            stopped = self.gone is not None
            if not stopped:
                self._channels.append(ch)
                self.helpers_started += 1
        if stopped:
            _kill([ch])
            return
        with contextlib.suppress(RuntimeError):  # interpreter shutdown: no new threads
            self._serve(ch)

    def _break(self, reason: str, wait: bool = False) -> None:
        """Stop the pool (once): fail every call not yet answered, stop the processes."""
        with self._cond:
            if self.gone is not None:
                return
            self.gone = reason
            waiting = list(self._pending)
            self._pending.clear()
            channels = list(self._channels)
            self._cond.notify_all()  # the workers' threads and the watch stop
        for call in waiting:
            _fail(call.future, WorkerGone(reason))
        for ch in channels:
            # The workers see end of file on their input and exit; their threads stop, or
            # see the end of file of a worker that was killed mid-call.
            with contextlib.suppress(Exception):
                assert ch.process.stdin is not None
                ch.process.stdin.close()
        # Killed, not asked: a worker may be in the middle of a long call, and what it held
        # is given back to the caller (the failed futures) to encode itself.
        for ch in channels:
            with contextlib.suppress(Exception):
                ch.process.kill()
        if wait:
            _reap(channels)
            return
        try:
            threading.Thread(
                target=_reap, args=(channels,), name="looptrace-reaper", daemon=True
            ).start()
        except RuntimeError:  # interpreter shutdown: no new threads
            pass

    def close(self, wait: bool = True) -> None:
        """Stop the workers; calls not answered yet fail with ``WorkerGone("shutdown")``.
        With ``wait``, return once the processes have exited."""
        if os.getpid() != self._pid:
            return  # a forked child: the workers are the parent's
        self._break("shutdown", wait)


def _send(stdin: IO[bytes], call: _Call) -> None:
    write_frame(stdin, 0, Raw(call.raw) if call.raw else None, call.head)


def _settle(future: concurrent.futures.Future[Any], result: Any) -> None:
    with contextlib.suppress(concurrent.futures.InvalidStateError):
        future.set_result(result)


def _fail(future: concurrent.futures.Future[Any], exc: BaseException) -> None:
    with contextlib.suppress(concurrent.futures.InvalidStateError):
        future.set_exception(exc)


def _reap(channels: list[_Channel]) -> None:
    for ch in channels:
        try:
            ch.process.wait(10.0)
        except Exception:
            with contextlib.suppress(Exception):
                ch.process.kill()
                ch.process.wait(1.0)
        for pipe in (ch.process.stdin, ch.process.stdout):
            with contextlib.suppress(Exception):
                pipe.close()  # type: ignore[union-attr]


def _kill(channels: list[_Channel]) -> None:
    for ch in channels:
        with contextlib.suppress(Exception):
            ch.process.kill()
    _reap(channels)


def _abandon(channels: list[_Channel], pid: int) -> None:
    # The workers' threads hold the pool itself, so a pool that is collected has none left
    # running: only the processes remain, and they exit when their input closes.
    if os.getpid() != pid:
        return
    for ch in list(channels):
        with contextlib.suppress(Exception):
            ch.process.stdin.close()  # type: ignore[union-attr]
