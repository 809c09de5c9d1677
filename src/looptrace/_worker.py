"""The worker process: answers calls from :mod:`looptrace._workers` over its standard pipes.

A worker is started as ``python -c "...; from looptrace._worker import main; main()"``: a
fresh interpreter that never imports the application's ``__main__`` (a script without an
``if __name__ == "__main__"`` guard neither breaks nor runs twice), whatever start method the
application's own ``multiprocessing`` uses. It reads calls on standard input and answers on a
private copy of standard output; the real standard output is pointed at standard error, so a
stray ``print`` in imported code cannot corrupt an answer.

Frames, both ways: a header (``FRAME``: pickle bytes, raw bytes, call id), a pickle, then raw
bytes. The raw part carries large strings and bytes that the parent did not pickle (see
:class:`Raw`), so neither side copies them into or out of a pickle. The first frame is the
start-up: the parent's ``sys.path`` and the module whose ``CALLS`` the worker answers.

This module imports the standard library only: a worker's start-up is mostly imports, on
cores the application wants.
"""

from __future__ import annotations

import importlib
import os
import pickle
import signal
import struct
import sys
from collections.abc import Callable
from typing import IO, Any

__all__ = ["FRAME", "Raw", "main", "read_frame", "write_frame", "yield_cpu"]

FRAME = struct.Struct("<QQQ")  # pickle bytes, raw bytes, call id


class Raw:
    """A call's argument or answer whose ``data`` travels after the pickle, unpickled.

    ``meta`` is pickled as usual. On the other side the receiver gets ``Raw(data, meta)``
    with ``data`` as one ``bytes`` object, read straight from the pipe."""

    __slots__ = ("data", "meta")

    def __init__(self, data: bytes | list[bytes], meta: Any = None) -> None:
        self.data = data
        self.meta = meta


def yield_cpu(pid: int) -> None:
    """Let process ``pid`` (0: this one) run only when a core is otherwise idle.

    A worker that shares the application's cores at normal priority holds the loop's core for
    a scheduler slice at a time. Linux has a policy for exactly this (``SCHED_IDLE``); other
    POSIX systems get the lowest nice value; Windows workers are created at idle priority by
    the parent instead (``subprocess.IDLE_PRIORITY_CLASS``)."""
    sched = getattr(os, "sched_setscheduler", None)
    if sched is not None:
        try:
            sched(pid, os.SCHED_IDLE, os.sched_param(0))  # type: ignore[attr-defined,unused-ignore]
            return
        except OSError:
            pass
    setpriority = getattr(os, "setpriority", None)
    if setpriority is not None:
        try:
            setpriority(os.PRIO_PROCESS, pid, 19)  # type: ignore[attr-defined,unused-ignore]
        except OSError:
            pass


def write_frame(out: IO[bytes], rid: int, value: Any) -> None:
    """Write ``value`` as one frame: a :class:`Raw` sends its data after the pickle."""
    if type(value) is Raw:
        pieces = value.data if isinstance(value.data, list) else [value.data]
        head = pickle.dumps((True, value.meta), protocol=5)
    else:
        pieces = []
        head = pickle.dumps((False, value), protocol=5)
    out.write(FRAME.pack(len(head), sum(map(len, pieces)), rid))
    out.write(head)
    for piece in pieces:
        out.write(piece)
    out.flush()


def read_frame(src: IO[bytes]) -> tuple[int, bytes, bytes] | None:
    """``(call id, pickle, raw)`` of the next frame; None at end of file."""
    header = src.read(FRAME.size)
    if len(header) < FRAME.size:
        return None
    n_pickle, n_raw, rid = FRAME.unpack(header)
    # A buffered reader reads a large frame straight into the bytes object it returns.
    head = src.read(n_pickle)
    raw = src.read(n_raw) if n_raw else b""
    if len(head) < n_pickle or len(raw) < n_raw:
        return None
    return rid, head, raw


def unpack(head: bytes, raw: bytes) -> Any:
    """The value a frame carries (a :class:`Raw` again where one was sent)."""
    is_raw, value = pickle.loads(head)
    return Raw(raw, value) if is_raw else value


def serve(src: IO[bytes], out: IO[bytes], calls: dict[str, Callable[..., Any]]) -> None:
    """Answer calls in order until the parent closes the pipe. Every error inside a call is
    an answer ``(False, message)``; only a lost pipe ends the worker."""
    while True:
        frame = read_frame(src)
        if frame is None:
            return
        rid, head, raw = frame
        try:
            # Unpickled inside the try: a value this process cannot rebuild (a class from the
            # application's __main__) is an error answer, not a dead worker.
            call = unpack(head, raw)
            if type(call) is Raw:  # large values travelled after the pickle: the last argument
                name, args = call.meta
                args = (*args, call.data)
            else:
                name, args = call
            answer: Any = (True, calls[name](*args))
            if type(answer[1]) is Raw:
                answer = answer[1]  # sent raw; the parent knows it as a success
        except Exception as exc:
            answer = (False, f"{type(exc).__name__}: {exc}")
        try:
            write_frame(out, rid, answer)
        except OSError:
            return


def main() -> None:
    """The worker's whole life (its parent starts it; it is not a command of its own)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the application's to handle
    yield_cpu(0)
    src = open(sys.stdin.fileno(), "rb", closefd=False)  # noqa: SIM115 - for the process's life
    # Answers go to a private copy of standard output; fd 1 becomes standard error.
    out = open(os.dup(sys.stdout.fileno()), "wb")  # noqa: SIM115
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr
    frame = read_frame(src)
    if frame is None:
        return
    rid, head, raw = frame
    path, module = unpack(head, raw)
    # The application's import path, so its own types in a payload unpickle here too (but
    # never its __main__, which this process does not run).
    sys.path[:] = path
    calls: dict[str, Callable[..., Any]] = importlib.import_module(module).CALLS
    write_frame(out, rid, (True, os.getpid()))
    serve(src, out, calls)
