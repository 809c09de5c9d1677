"""Worker processes: fresh interpreters talked to over their standard pipes, one thread each.

Each worker is ``subprocess.Popen`` of this interpreter running :func:`looptrace._offload.worker.main`
(never the application's ``__main__``, never ``multiprocessing``'s start methods), which works
the same on Linux, macOS and Windows and under any event loop. In the parent, one thread per
worker writes its calls and reads its answers with blocking I/O: the GIL is released for the
whole of each transfer, so a large frame costs the application's loop nothing while it moves,
and no event loop needs to watch a pipe (the Windows proactor loop cannot). Callers get a
``concurrent.futures.Future``, which any loop (or thread) can wait on.

A worker runs one call at a time, in the order received; the parent sends each call to the
worker with the fewest calls queued. A worker that dies, or a pipe that breaks, fails every
call in flight with :class:`WorkerGone` and stops the pool: the offloader decides whether to
start another. Workers exit on their own when the parent goes away (their standard input
closes), however it ends.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import pickle
import queue
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from .worker import Raw, RawValue, read_frame, unpack, write_frame, yield_cpu

__all__ = ["Pool", "Raw", "WorkerError", "WorkerGone"]

# Where a pipe can be grown (Linux), a large frame crosses in fewer wake-ups of each side.
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


def _command() -> list[str]:
    # The directory that holds this package goes first on the child's path for the one import
    # that bootstraps it; the worker then takes the application's own sys.path.
    home = str(Path(__file__).resolve().parents[2])
    code = f"import sys; sys.path.insert(0, {home!r}); from looptrace._offload.worker import main; main()"
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
    __slots__ = ("future", "head", "raw")

    def __init__(self, head: bytes, raw: list[RawValue]) -> None:
        self.head = head
        self.raw = raw
        self.future: concurrent.futures.Future[Any] = concurrent.futures.Future()


class _Channel:
    """One worker process and the thread that talks to it."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process
        self.calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self.queued = 0  # calls sent to this worker and not answered yet (a hint, unlocked)
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
        self._pid = os.getpid()
        self.gone: str | None = None  # why the pool stopped: "broken" or "shutdown"
        # A pool dropped without close(): its workers see their input close and exit.
        weakref.finalize(self, _abandon, self._channels, self._pid).atexit = False

    def pids(self) -> list[int]:
        return sorted(ch.process.pid for ch in self._channels)

    def alive(self) -> int:
        """How many worker processes are running."""
        return sum(1 for ch in self._channels if ch.process.poll() is None)

    def start(self, timeout: float) -> None:
        """Launch the workers and wait until each has answered its start-up frame."""
        flags = 0
        if sys.platform == "win32":
            flags = subprocess.IDLE_PRIORITY_CLASS | subprocess.CREATE_NO_WINDOW
        try:
            for _ in range(self.workers):
                process = subprocess.Popen(
                    _command(),
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    creationflags=flags,
                    env=_environment(),
                )
                # A starting interpreter imports for a good part of a second: lower its
                # priority from here, at once, so that its start-up does not take the loop's
                # core (the worker does it again itself where this cannot reach it).
                yield_cpu(process.pid)
                for pipe in (process.stdin, process.stdout):
                    with contextlib.suppress(ImportError, AttributeError, OSError):
                        import fcntl

                        fcntl.fcntl(pipe.fileno(), fcntl.F_SETPIPE_SZ, _PIPE_BYTES)  # type: ignore[union-attr,attr-defined,unused-ignore]
                self._channels.append(_Channel(process))
            hello = (list(sys.path), self._calls_module)
            for ch in self._channels:
                assert ch.process.stdin is not None
                write_frame(ch.process.stdin, 0, hello)
            for ch in self._channels:
                _answer_within(ch, timeout)
            for ch in self._channels:
                ch.thread = threading.Thread(
                    target=self._run, args=(ch,), name="looptrace-worker-io", daemon=True
                )
                ch.thread.start()
        except BaseException:
            self.close(wait=False)
            raise

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
        with self._lock:
            if self.gone is not None:
                raise WorkerGone(self.gone)
            ch = min(self._channels, key=lambda c: c.queued)
            ch.queued += 1
            ch.calls.put(call)
        return call.future

    def _run(self, ch: _Channel) -> None:
        """The thread of one worker: send a call, wait for its answer, settle its future."""
        stdin, stdout = ch.process.stdin, ch.process.stdout
        assert stdin is not None and stdout is not None
        while True:
            call = ch.calls.get()
            if call is None:
                return
            try:
                _send(stdin, call)
                frame = read_frame(stdout)
            except (OSError, ValueError):
                frame = None
            ch.queued -= 1
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

    def _break(self, reason: str, wait: bool = False) -> None:
        """Stop the pool (once): fail every call not yet answered, stop the processes."""
        with self._lock:
            if self.gone is not None:
                return
            self.gone = reason
        channels = self._channels
        for ch in channels:
            # The workers see end of file on their input and exit; their threads stop at the
            # sentinel, or at the end of file of a worker that was killed mid-call.
            with contextlib.suppress(Exception):
                assert ch.process.stdin is not None
                ch.process.stdin.close()
            ch.calls.put(None)
        for ch in channels:
            while True:
                try:
                    call = ch.calls.get_nowait()
                except queue.Empty:
                    break
                if call is not None:
                    _fail(call.future, WorkerGone(reason))
            ch.calls.put(None)
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


def _answer_within(ch: _Channel, timeout: float) -> None:
    """Wait for a worker's start-up answer, on a thread of its own so that the wait has a
    deadline on every platform (a pipe cannot be polled on Windows)."""
    got: list[Any] = []

    def read() -> None:
        assert ch.process.stdout is not None
        got.append(read_frame(ch.process.stdout))

    reader = threading.Thread(target=read, name="looptrace-worker-start", daemon=True)
    reader.start()
    reader.join(timeout)
    if not got:
        raise TimeoutError(f"a worker did not start within {timeout} s")
    if got[0] is None:
        raise OSError(f"a worker exited at start-up (status {ch.process.poll()})")


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


def _abandon(channels: list[_Channel], pid: int) -> None:
    if os.getpid() != pid:
        return
    for ch in channels:
        with contextlib.suppress(Exception):
            ch.process.stdin.close()  # type: ignore[union-attr]
        ch.calls.put(None)
