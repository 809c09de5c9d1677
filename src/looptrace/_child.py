"""The worker process's side of :mod:`looptrace._workers`: what a spawned child imports to
start and to answer calls, and nothing else.

A worker's start-up is mostly imports, on a machine whose cores the application wants, so
this module (which the child must import: its process class and its main loop live here)
imports neither asyncio nor the HTTP client. The calls a pool answers come from the modules
their functions are defined in (:mod:`looptrace._offload_child` for the offloader).
"""

from __future__ import annotations

import contextlib
import multiprocessing.context
import multiprocessing.spawn
import os
import pickle
import signal
import struct
import threading
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["HEADER", "Context", "serve", "yield_cpu"]

HEADER = struct.Struct("<IQ")  # payload bytes, call id
_MAIN_KEYS = ("init_main_from_path", "init_main_from_name")
_patch_lock = threading.Lock()


def yield_cpu(pid: int) -> None:
    """Make process ``pid`` (0: this one) run only when a core is otherwise idle.

    With nice 10 a worker still held the loop's core for a few milliseconds after the loop
    woke up (the scheduler lets a running task finish its slice): 120-135 ms of waiting for a
    CPU in 100 large spans. A ``SCHED_IDLE`` task gives up its core as soon as a normal one
    wants it. A process can take this policy safely; a thread could not, since it would hold
    the GIL while starved.
    """
    try:
        os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))  # type: ignore[attr-defined,unused-ignore]
        return
    except (AttributeError, OSError):
        pass
    try:
        os.setpriority(os.PRIO_PROCESS, pid, 19)
    except (AttributeError, OSError):
        pass


def _read_exact(fd: int, n: int) -> bytearray | None:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = os.readv(fd, [view[got:]])
        if k == 0:
            return None
        got += k
    return buf


def _write_all(fd: int, head: bytes, payload: bytes) -> None:
    sent = os.writev(fd, [head, payload])
    total = len(head) + len(payload)
    if sent < total:
        rest = memoryview(head + payload)[sent:]
        while rest:
            rest = rest[os.write(fd, rest) :]


def serve(
    tasks: Any,
    answers: Any,
    init: Callable[..., None],
    init_args: tuple[Any, ...],
    calls: dict[str, Callable[..., Any]],
) -> None:
    """A worker's whole life: answer calls in order until the parent closes its pipe (or
    dies). Every error inside a call is an answer; only a lost pipe ends the worker."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    yield_cpu(0)
    rfd, wfd = tasks.fileno(), answers.fileno()
    init(*init_args)
    while True:
        try:
            head = _read_exact(rfd, HEADER.size)
            if head is None:
                return
            n, rid = HEADER.unpack(head)
            body = _read_exact(rfd, n)
            if body is None:
                return
        except OSError:
            return
        try:
            # Unpickled here, inside the try: a value this process cannot rebuild (a class
            # from the user's __main__) is an error answer, not a dead worker.
            name, args = pickle.loads(body)
            answer = pickle.dumps((True, calls[name](*args)), protocol=5)
        except Exception as exc:
            answer = pickle.dumps((False, f"{type(exc).__name__}: {exc}"), protocol=5)
        try:
            _write_all(wfd, HEADER.pack(len(answer), rid), answer)
        except OSError:
            return


# --------------------------------------------------------------------------- starting


@contextlib.contextmanager
def _without_main() -> Iterator[None]:
    # spawn tells the child to re-run the parent's __main__ (by path or module name); for a
    # script without a __main__ guard that would run the user's program a second time. The
    # worker needs nothing from __main__, so the child is launched without that instruction.
    original = multiprocessing.spawn.get_preparation_data

    def preparation_data(name: str) -> dict[str, Any]:
        data = original(name)
        for key in _MAIN_KEYS:
            data.pop(key, None)
        return data

    with _patch_lock:
        multiprocessing.spawn.get_preparation_data = preparation_data
        try:
            yield
        finally:
            multiprocessing.spawn.get_preparation_data = original


class _Process(multiprocessing.context.SpawnProcess):
    # Unpickled by the child before it runs anything: defined here, not with the pool.

    @staticmethod
    def _Popen(process_obj: Any) -> Any:
        with _without_main():
            return multiprocessing.context.SpawnProcess._Popen(process_obj)


class Context(multiprocessing.context.SpawnContext):
    Process = _Process
