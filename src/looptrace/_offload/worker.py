"""The worker process: answers calls from :mod:`looptrace._offload.pool` over its standard pipes.

A worker is started as ``python -c "...; from looptrace._offload.worker import main; main()"``: a
fresh interpreter that never imports the application's ``__main__`` (a script without an
``if __name__ == "__main__"`` guard neither breaks nor runs twice), whatever start method the
application's own ``multiprocessing`` uses. It reads calls on standard input and answers on a
private copy of standard output; the real standard output is pointed at standard error, so a
stray ``print`` in imported code cannot corrupt an answer.

Frames, both ways: a header (``FRAME``: pickle bytes, raw values, call id), a pickle, then the
raw values, each as chunks (a length, then that many bytes; a length of 0 ends the value). The
raw values are large strings and bytes that were not pickled (see :class:`Raw`), so neither
side copies them into or out of a pickle. The first frame is the
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
from typing import IO, Any, Union

__all__ = ["FRAME", "Raw", "main", "read_frame", "write_frame", "yield_cpu"]

FRAME = struct.Struct("<QQQ")  # pickle bytes, raw values, call id
CHUNK = struct.Struct("<Q")  # a raw value's next chunk: its length (0 ends the value)
# A str is encoded and written this many characters at a time: the writing thread holds the
# GIL for one piece's copy at most (tens of microseconds), and lets go of it in each write.
PIECE_CHARS = 64 * 1024

RawValue = Union[str, bytes]


class Raw:
    """A call's arguments or answer with ``values`` sent after the pickle, unpickled.

    Each value is a ``str`` (sent as UTF-8, lone surrogates kept) or ``bytes`` (sent as it
    is); ``meta`` is pickled as usual. The receiver gets ``Raw(values, meta)`` with each value
    as ``bytes``, read straight from the pipe."""

    __slots__ = ("meta", "values")

    def __init__(self, values: list[RawValue], meta: Any = None) -> None:
        self.values = values
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


def write_frame(out: IO[bytes], rid: int, value: Any, head: bytes | None = None) -> None:
    """Write ``value`` as one frame: a :class:`Raw` sends its values after the pickle, a chunk
    at a time. ``head``, when given, is the frame's pickle already made."""
    values: list[RawValue] = value.values if type(value) is Raw else []
    if head is None:
        head = pickle.dumps((type(value) is Raw, value.meta if values else value), protocol=5)
    out.write(FRAME.pack(len(head), len(values), rid))
    out.write(head)
    for v in values:
        if isinstance(v, bytes) or v.isascii():
            # ASCII text encodes with one copy, no slicing first (the GIL is held for that copy
            # alone; a bytes needs none).
            data = v if isinstance(v, bytes) else v.encode("ascii")
            if data:
                out.write(CHUNK.pack(len(data)))
                out.write(data)
        else:
            for i in range(0, len(v), PIECE_CHARS):
                piece = v[i : i + PIECE_CHARS].encode("utf-8", "surrogatepass")
                out.write(CHUNK.pack(len(piece)))
                out.write(piece)
        out.write(CHUNK.pack(0))
    out.flush()


def read_frame(src: IO[bytes]) -> tuple[int, bytes, list[bytes]] | None:
    """``(call id, pickle, raw values)`` of the next frame; None at end of file."""
    header = src.read(FRAME.size)
    if len(header) < FRAME.size:
        return None
    n_pickle, n_values, rid = FRAME.unpack(header)
    # A buffered reader reads a large chunk straight into the bytes object it returns.
    head = src.read(n_pickle)
    if len(head) < n_pickle:
        return None
    values: list[bytes] = []
    for _ in range(n_values):
        chunks: list[bytes] = []
        while True:
            size = src.read(CHUNK.size)
            if len(size) < CHUNK.size:
                return None
            (n,) = CHUNK.unpack(size)
            if n == 0:
                break
            chunk = src.read(n)
            if len(chunk) < n:
                return None
            chunks.append(chunk)
        values.append(chunks[0] if len(chunks) == 1 else b"".join(chunks))
    return rid, head, values


def unpack(head: bytes, values: list[bytes]) -> Any:
    """The value a frame carries (a :class:`Raw` again where one was sent)."""
    is_raw, value = pickle.loads(head)
    return Raw(values, value) if is_raw else value  # type: ignore[arg-type]


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
                args = (*args, call.values)
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


def main(idle: bool = True) -> None:
    """The worker's whole life (its parent starts it; it is not a command of its own).
    ``idle``: run only when a core is otherwise idle (a helper, started when the idle workers
    fall behind, runs at the priority it was started with)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the application's to handle
    if idle:
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
