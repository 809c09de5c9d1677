"""Serialize and encode large spans in a worker process, so big payloads never stall the loop.

The parent runs the user's hooks and builds everything but the payload values
(:func:`looptrace._serialize.prepare`); the worker serializes the values, applies the caps and
encodes the span (:func:`looptrace._serialize.finish` + ``_otlp.encode_span``): the same code,
so the bytes are identical to the inline path. Pickling happens in the executor's feeder thread,
not on the loop.

The pool starts lazily, from a worker thread, with the ``spawn`` start method (``fork`` is
unsafe in threaded programs). Its children never import the user's ``__main__``: a script
without an ``if __name__ == "__main__"`` guard neither breaks nor runs twice.

Fallbacks (all inline, counted in :attr:`Offloader.stats` by reason): a payload that does not
pickle (``unpicklable``), an error in the worker (``worker_error``), a pool whose worker died
(``broken_pool``: replaced once; after a second break, ``pool_retired``), no working
subprocesses at all (``unavailable``), after :meth:`Offloader.shutdown` (``shutdown``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import multiprocessing
import multiprocessing.context
import multiprocessing.spawn
import os
import pickle
import signal
import threading
from collections import Counter
from collections.abc import Awaitable, Iterator
from concurrent.futures.process import BrokenProcessPool
from typing import TYPE_CHECKING, Any

from . import _serialize

if TYPE_CHECKING:
    from ._config import Config
    from ._span import Span

__all__ = ["Offloader"]

_START_TIMEOUT = 60.0
_MAIN_KEYS = ("init_main_from_path", "init_main_from_name")
_patch_lock = threading.Lock()


# --------------------------------------------------------------------------- worker side


async def _done(value: bytes) -> bytes:
    return value


def _initializer() -> None:
    """Runs in each worker before any task: stay quiet on Ctrl-C (the parent handles it), and
    yield the CPU to the application: on a small machine a busy worker otherwise delays the
    very event loop it exists to protect."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        os.nice(10)
    except OSError:
        pass


def _ping() -> int:
    return os.getpid()


def _work(blob: bytes) -> tuple[bytes | None, dict[str, int]]:
    """The worker's entry point: unpickle one prepared span, finish serializing, encode it.

    The payload arrives pickled by the parent and is unpickled here, inside a try: a value the
    worker cannot rebuild (a class defined in the user's ``__main__``) is then an ordinary
    error answer instead of a dead worker and a broken pool."""
    from . import _otlp

    try:
        wire, inputs, output, pol, max_span_bytes, encoding = pickle.loads(blob)
        with _serialize.counted() as counts:
            wire = _serialize.finish(wire, inputs, output, pol, max_span_bytes)
        body = _otlp.encode_span(wire, encoding)
    except Exception as exc:
        return None, {"error": 1, type(exc).__name__: 1}
    return body, dict(counts)


# --------------------------------------------------------------------------- parent side


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
    @staticmethod
    def _Popen(process_obj: Any) -> Any:
        with _without_main():
            return multiprocessing.context.SpawnProcess._Popen(process_obj)


class _Context(multiprocessing.context.SpawnContext):
    Process = _Process


def _new_pool(workers: int) -> concurrent.futures.ProcessPoolExecutor:
    pool = concurrent.futures.ProcessPoolExecutor(
        max_workers=workers, mp_context=_Context(), initializer=_initializer
    )
    try:
        # Launches the workers now (on this thread, not the loop's) and proves they run.
        started = pool.submit(_ping)
        # A starting interpreter imports for a good part of a second; lower its priority from
        # here, at once, so that start-up does not take a core from the application's loop.
        for pid in list(getattr(pool, "_processes", None) or ()):
            try:
                os.setpriority(os.PRIO_PROCESS, pid, 10)
            except (AttributeError, OSError):
                pass
        started.result(timeout=_START_TIMEOUT)
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    return pool


class Offloader:
    """Encodes spans in a process pool, falling back to inline encoding whenever it must.

    ``encode`` always returns the encoded span; ``stats`` counts spans encoded in the pool
    (``offloaded``) and each fallback by reason.
    """

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers or _default_workers()
        self.stats: Counter[str] = Counter()
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        # unstarted -> running -> (broken -> running) -> retired | unavailable | shutdown
        self._state = "unstarted"
        self._replaced = False
        self._lock = threading.Lock()

    @property
    def state(self) -> str:
        return self._state

    def worker_pids(self) -> list[int]:
        """Process ids of the current workers (for diagnostics and tests)."""
        pool = self._pool
        procs = getattr(pool, "_processes", None) or {}
        return sorted(procs)

    async def encode(self, span: Span, cfg: Config, encoding: str) -> bytes:
        """The encoded span chunk (``_otlp.encode_span(to_wire(span, cfg), encoding)``)."""
        if self._state != "running":
            await self._ensure_pool()
        return await self.submit(span, cfg, encoding)

    async def ready(self) -> None:
        """Start the pool if it has not been started (in a thread, never on the loop)."""
        if self._state in ("unstarted", "broken"):
            await self._ensure_pool()

    def submit(self, span: Span, cfg: Config, encoding: str) -> Awaitable[bytes]:
        """Hand ``span`` to a worker now; await the result for its encoded chunk.

        The handoff (running the user's hooks, pickling the payload) happens in this call, on
        the caller's thread, so a caller that hands over many spans can yield between them
        (the pipeline's time-sliced encode loop does); only the wait is deferred."""
        pool = self._pool if self._state == "running" else None
        if pool is None:
            if self._state in ("unstarted", "broken"):
                return self.encode(span, cfg, encoding)  # starts the pool first
            return _done(self._inline(span, cfg, encoding, self._fallback_reason()))
        wire, inputs, output, pol, max_span = _serialize.prepare(span, cfg)
        try:
            # Pickled here, not by the executor: a failure is then this span's problem only.
            blob = pickle.dumps((wire, inputs, output, pol, max_span, encoding), protocol=5)
        except Exception:
            return _done(
                self._finish_inline(wire, inputs, output, pol, max_span, encoding, "unpicklable")
            )
        try:
            future = pool.submit(_work, blob)
        except RuntimeError:
            # Submitted after shutdown (a race with Offloader.shutdown or interpreter exit).
            return _done(
                self._finish_inline(wire, inputs, output, pol, max_span, encoding, "shutdown")
            )
        except BrokenProcessPool:
            self._broken(pool)
            return _done(
                self._finish_inline(wire, inputs, output, pol, max_span, encoding, "broken_pool")
            )
        return self._collect(pool, future, (wire, inputs, output, pol, max_span, encoding))

    async def _collect(
        self,
        pool: concurrent.futures.ProcessPoolExecutor,
        future: concurrent.futures.Future[tuple[bytes | None, dict[str, int]]],
        prepared: tuple[Any, Any, Any, Any, int, str],
    ) -> bytes:
        try:
            body, counts = await asyncio.wrap_future(future)
        except BrokenProcessPool:
            self._broken(pool)
            reason = "broken_pool"
        except Exception:
            reason = "worker_error"
        else:
            if body is not None:
                self.stats["offloaded"] += 1
                _serialize.stats.update(counts)
                return body
            reason = "worker_error"
        return self._finish_inline(*prepared, reason)

    def _inline(self, span: Span, cfg: Config, encoding: str, reason: str) -> bytes:
        from . import _otlp

        self.stats[reason] += 1
        return _otlp.encode_span(_serialize.to_wire(span, cfg), encoding)

    def _finish_inline(
        self,
        wire: Any,
        inputs: Any,
        output: Any,
        pol: Any,
        max_span: int,
        encoding: str,
        reason: str,
    ) -> bytes:
        from . import _otlp

        self.stats[reason] += 1
        # ``prepare`` already ran the user's hooks once; finish the same payload here.
        return _otlp.encode_span(_serialize.finish(wire, inputs, output, pol, max_span), encoding)

    def _fallback_reason(self) -> str:
        return {"retired": "pool_retired", "shutdown": "shutdown"}.get(self._state, "unavailable")

    async def _ensure_pool(self) -> concurrent.futures.ProcessPoolExecutor | None:
        if self._state in ("unstarted", "broken"):
            await asyncio.to_thread(self._start)
        return self._pool if self._state == "running" else None

    def _start(self) -> None:
        with self._lock:
            if self._state not in ("unstarted", "broken"):
                return
            try:
                pool = _new_pool(self.workers)
            except Exception as exc:
                _serialize.logger.warning(
                    "looptrace: no worker process (%s); serializing inline", exc
                )
                self._state = "unavailable"
                return
            if self._state not in ("unstarted", "broken"):
                pool.shutdown(wait=False)  # shut down while we were starting
                return
            self._pool = pool
            self._state = "running"

    def _broken(self, pool: concurrent.futures.ProcessPoolExecutor) -> None:
        with self._lock:
            if self._pool is not pool:
                return  # another span already dealt with this pool
            self._pool = None
            if self._state == "running":
                # Replace a broken pool once; a second break means something kills workers.
                self._state = "retired" if self._replaced else "broken"
                self._replaced = True
        pool.shutdown(wait=False, cancel_futures=True)

    def shutdown(self, wait: bool = True) -> None:
        """Stop the workers; later ``encode`` calls serialize inline."""
        with self._lock:
            pool, self._pool = self._pool, None
            self._state = "shutdown"
        if pool is not None:
            pool.shutdown(wait=wait, cancel_futures=True)


def _default_workers() -> int:
    return 1 if (os.cpu_count() or 1) <= 2 else 2


def start_method() -> str:
    """The start method the pool uses (always ``spawn``: never ``fork``)."""
    return _Context()._name
