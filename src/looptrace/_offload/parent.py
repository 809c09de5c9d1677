"""Serialize and encode large spans in a worker process, so big payloads never stall the loop.

The parent runs the user's hooks and builds everything but the payload values
(:func:`looptrace._serialize.prepare`); the worker serializes the values, applies the caps and
encodes the span (:func:`looptrace._serialize.finish` + ``_otlp.encode_span``): the same code,
so the bytes are identical to the inline path (the worker's side is
:mod:`looptrace._offload.child`, the processes :mod:`looptrace._offload.pool`).

A payload's large strings and bytes do not go through the pickle: the parent replaces them by
slots and the pool's thread sends them after it (a ``bytes`` as it is; a ``str`` encoded a
piece at a time, the GIL let go of in each write), so the loop copies nothing large. The
encoded span comes back the same way, raw after the answer's pickle, and the pipeline sends it
like any other span, through the application's own transport.

Fallbacks (all inline, counted in :attr:`Offloader.stats` by reason): a payload that does not
pickle (``unpicklable``), an error in the worker (``worker_error``), a pool whose worker died
(``broken_pool``: replaced once; after a second break, ``pool_retired``), no working
subprocesses at all (``unavailable``), after :meth:`Offloader.shutdown` (``shutdown``).
"""

from __future__ import annotations

import asyncio
import enum
import functools
import os
import threading
from collections import Counter
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from .. import _serialize
from . import pool as _workers
from .child import LIFT_BUDGET, Slot

if TYPE_CHECKING:
    from .._capture.spans import Span
    from .._config import Config

__all__ = ["FALLBACKS", "Offloader"]

FALLBACKS = (
    "unpicklable",
    "worker_error",
    "broken_pool",
    "pool_retired",
    "unavailable",
    "shutdown",
    "workers_busy",
)

_START_TIMEOUT = 60.0
# The raw strings and bytes of large spans handed over and not answered yet, per worker, past
# which the next large span is serialized in the application's process (in steps) instead: the
# workers run at idle priority and can fall behind a steady stream of images, and a span
# queued behind others is delivered only once they are done. A worker with nothing queued
# always takes the span.
QUEUED_BYTES_PER_WORKER = 16 * 1024 * 1024
# A str or bytes at least this large travels raw, after the pickle.
MIN_RAW_BYTES = 64 * 1024


async def _done(value: bytes) -> bytes:
    return value


class PoolState(str, enum.Enum):
    """Where the worker pool is in its life:
    UNSTARTED -> RUNNING -> (BROKEN -> RUNNING) ... -> RETIRED | UNAVAILABLE | SHUTDOWN.
    BROKEN (a worker died) starts again on the next large span; the last three are final."""

    UNSTARTED = "unstarted"
    RUNNING = "running"
    BROKEN = "broken"
    RETIRED = "retired"  # replaced too often: large spans are serialized in this process
    UNAVAILABLE = "unavailable"  # could not start (or interpreter exit)
    SHUTDOWN = "shutdown"


# States in which the next large span starts the pool.
STARTABLE = frozenset((PoolState.UNSTARTED, PoolState.BROKEN))


class _Lifter:
    """Replaces a payload's large str and bytes leaves by :class:`Slot` s, numbered in the
    order met, and keeps the values to send raw (both types are immutable, so the pool's
    thread may copy them into the pipe while the loop goes on; a ``bytearray`` could change,
    and travels in the pickle).

    Only plain dicts, lists and tuples are rebuilt (shallow copies on the way to a slot), and
    at most ``LIFT_BUDGET`` values are visited: anything else travels in the pickle. A value
    met twice (or through a cycle) gets one slot."""

    def __init__(self) -> None:
        self.values: list[str | bytes] = []
        self.budget = LIFT_BUDGET
        self._memo: dict[int, Slot] = {}

    def lift(self, v: Any) -> Any:
        cls = type(v)
        if cls is str or cls is bytes:
            if len(v) < MIN_RAW_BYTES:
                return v
            slot = self._memo.get(id(v))
            if slot is None:
                slot = self._memo[id(v)] = Slot(len(self.values), cls.__name__)
                self.values.append(v)
            return slot
        if cls is dict or cls is list or cls is tuple:
            out: Any = None
            for k, x in v.items() if cls is dict else enumerate(v):
                self.budget -= 1
                if self.budget < 0:
                    break
                y = self.lift(x)
                if y is not x:
                    if out is None:
                        out = dict(v) if cls is dict else list(v)
                    out[k] = y
            if out is None:
                return v
            return tuple(out) if cls is tuple else out
        return v


class Offloader:
    """Encodes spans in worker processes, falling back to inline encoding whenever it must.

    ``encode`` always returns the encoded span; ``stats`` counts spans encoded in the pool
    (``offloaded``) and each fallback by reason.
    """

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers or _default_workers()
        self.stats: Counter[str] = Counter()
        self._pool: _workers.Pool | None = None
        self._state = PoolState.UNSTARTED
        self._replaced = False
        self._lock = threading.Lock()
        # The start in progress, shared by every span that needs the pool meanwhile.
        self._starting: asyncio.Task[None] | None = None
        self._queued_bytes = 0  # raw values handed to the pool, not answered yet

    @property
    def state(self) -> PoolState:
        return self._state

    def worker_pids(self) -> list[int]:
        """Process ids of the current workers (for diagnostics and tests)."""
        pool = self._pool
        return pool.pids() if pool is not None else []

    def workers_alive(self) -> int:
        pool = self._pool
        return pool.alive() if pool is not None and pool.gone is None else 0

    async def encode(self, span: Span, cfg: Config, encoding: str) -> bytes:
        """The encoded span chunk (``_otlp.encode_span(to_wire(span, cfg), encoding)``)."""
        if self._state is not PoolState.RUNNING:
            await self._ensure_pool()
        return await self.submit(span, cfg, encoding)

    async def ready(self) -> None:
        """Start the pool if it has not been started (in a thread, never on the loop)."""
        if self._state in STARTABLE:
            await self._ensure_pool()

    def has_room(self) -> bool:
        """Whether a large span handed over now would wait behind less than
        :data:`QUEUED_BYTES_PER_WORKER` per worker (a pool not running yet has room: the span
        starts it, or falls back by the usual reasons)."""
        return self._queued_bytes < QUEUED_BYTES_PER_WORKER * self.workers

    def submit(self, span: Span, cfg: Config, encoding: str) -> Awaitable[bytes]:
        """Hand ``span`` to a worker; await the result for its encoded chunk.

        The user's hooks run in this call, on the caller's thread, so a caller that hands over
        many spans can yield between them (the pipeline's time-sliced encode loop does)."""
        pool = self._pool if self._state is PoolState.RUNNING else None
        if pool is None:
            if self._state in STARTABLE:
                return self.encode(span, cfg, encoding)  # starts the pool first
            return _done(self._inline(span, cfg, encoding, self._fallback_reason()))
        wire, inputs, output, pol, max_span = _serialize.prepare(span, cfg)
        prepared = (wire, inputs, output, pol, max_span, encoding)
        # Lifted here, not in the task: a drain hands over several spans before any of their
        # tasks runs, and the queue is counted from the handoff.
        lifter = _Lifter()
        lifted = ((inputs[0], lifter.lift(inputs[1])), (output[0], lifter.lift(output[1])))
        size = sum(len(v) for v in lifter.values)
        work = asyncio.ensure_future(self._work(pool, prepared, lifted, lifter))
        self._queued_bytes += size
        work.add_done_callback(functools.partial(self._answered, size))
        return work

    def _answered(self, size: int, work: asyncio.Future[bytes]) -> None:
        self._queued_bytes -= size

    async def _work(
        self,
        pool: _workers.Pool,
        prepared: tuple[Any, Any, Any, Any, int, str],
        lifted: tuple[Any, Any],
        lifter: _Lifter,
    ) -> bytes:
        wire, _, _, pol, max_span, encoding = prepared
        inputs, output = lifted
        try:
            future = pool.submit(
                "work", (wire, inputs, output, pol, max_span, encoding), lifter.values
            )
        except Exception as exc:
            return self._finish_inline(*prepared, self._unsent(pool, exc))
        try:
            answer = await asyncio.wrap_future(future)
        except Exception as exc:
            return self._finish_inline(*prepared, self._refused(pool, exc))
        if type(answer) is not _workers.Raw:
            return self._finish_inline(*prepared, "worker_error")
        self.stats["offloaded"] += 1
        _serialize.stats.update(answer.meta)
        return answer.values[0]  # type: ignore[return-value]

    def _unsent(self, pool: _workers.Pool, exc: Exception) -> str:
        """The fallback reason for a call that could not be queued: the pool's, or else the
        arguments did not pickle (``Pool.submit`` pickles them, once, before anything else)."""
        if isinstance(exc, _workers.WorkerGone):
            return self._refused(pool, exc)
        return "unpicklable"

    def _refused(self, pool: _workers.Pool, exc: Exception) -> str:
        """The fallback reason for a call the pool could not answer."""
        if isinstance(exc, _workers.WorkerGone):
            if exc.reason == "broken":
                self._broken(pool)
                return "broken_pool"
            return "shutdown"
        return "worker_error"

    def _inline(self, span: Span, cfg: Config, encoding: str, reason: str) -> bytes:
        from .. import _otlp

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
        from .. import _otlp

        self.stats[reason] += 1
        # ``prepare`` already ran the user's hooks once; finish the same payload here.
        return _otlp.encode_span(_serialize.finish(wire, inputs, output, pol, max_span), encoding)

    def _fallback_reason(self) -> str:
        return {PoolState.RETIRED: "pool_retired", PoolState.SHUTDOWN: "shutdown"}.get(
            self._state, "unavailable"
        )

    async def _ensure_pool(self) -> _workers.Pool | None:
        if self._state in STARTABLE:
            # One start, awaited by all: the first large spans arrive together.
            loop = asyncio.get_running_loop()
            starting = self._starting
            if starting is None or starting.done() or starting.get_loop() is not loop:
                starting = self._starting = loop.create_task(self._start_off_loop())
            await asyncio.shield(starting)
        return self._pool if self._state is PoolState.RUNNING else None

    async def _start_off_loop(self) -> None:
        try:
            await asyncio.to_thread(self._start)
        except RuntimeError:
            # Interpreter exit: no new threads to start the pool from, and no time to.
            with self._lock:
                if self._state in STARTABLE:
                    self._state = PoolState.UNAVAILABLE

    def _start(self) -> None:
        with self._lock:
            if self._state not in STARTABLE:
                return
            try:
                pool = _new_pool(self.workers)
            except Exception as exc:
                _serialize.logger.warning(
                    "looptrace: no worker process (%s); serializing inline", exc
                )
                self._state = PoolState.UNAVAILABLE
                return
            self._pool = pool
            self._state = PoolState.RUNNING

    def _broken(self, pool: _workers.Pool) -> None:
        with self._lock:
            if self._pool is not pool:
                return  # another span already dealt with this pool
            self._pool = None
            if self._state is PoolState.RUNNING:
                # Replace a broken pool once; a second break means something kills workers.
                self._state = PoolState.RETIRED if self._replaced else PoolState.BROKEN
                self._replaced = True
        pool.close(wait=False)

    def shutdown(self, wait: bool = True) -> None:
        """Stop the workers; later ``encode`` calls serialize inline."""
        with self._lock:
            pool, self._pool = self._pool, None
            self._state = PoolState.SHUTDOWN
        if pool is not None:
            pool.close(wait=wait)


def _new_pool(workers: int) -> _workers.Pool:
    pool = _workers.Pool(workers, "looptrace._offload.child")
    pool.start(_START_TIMEOUT)
    return pool


def _default_workers() -> int:
    return 1 if (os.cpu_count() or 1) <= 2 else 2
