"""Serialize and encode large spans in a worker process, so big payloads never stall the loop.

The parent runs the user's hooks and builds everything but the payload values
(:func:`looptrace._serialize.prepare`); the worker serializes the values, applies the caps and
encodes the span (:func:`looptrace._serialize.finish` + ``_otlp.encode_span``): the same code,
so the bytes are identical to the inline path (the worker's side is
:mod:`looptrace._offload_child`). The handoff (a small pickle: large values
travel as slots) is written to the worker's pipe by the loop itself (:mod:`looptrace._workers`).

The pool starts lazily, from a worker thread, with the ``spawn`` start method (``fork`` is
unsafe in threaded programs). Its children never import the user's ``__main__``: a script
without an ``if __name__ == "__main__"`` guard neither breaks nor runs twice.

Where the spans go over plain OTLP/HTTP (:class:`Destination`), a large span travels alone and
the worker sends it too (:meth:`Offloader.deliver`): it serializes, encodes, compresses and
POSTs, and answers with the status, so the payload's bytes never come back into this process.
Its large strings and bytes reach the worker without a pickle (:mod:`looptrace._ring`): read
by the worker straight from this process's memory where the kernel allows it, else copied once
into shared memory. The pipeline applies its retry rules to the status the worker reports.
For other transports (the local store, test transports) the worker returns the encoded span
instead (:meth:`Offloader.submit`).

Fallbacks (all inline, counted in :attr:`Offloader.stats` by reason): a payload that does not
pickle (``unpicklable``), an error in the worker (``worker_error``), a pool whose worker died
(``broken_pool``: replaced once; after a second break, ``pool_retired``), no working
subprocesses at all (``unavailable``), after :meth:`Offloader.shutdown` (``shutdown``), a
span encoded on a second event loop while the pool serves another (``other_loop``).
"""

from __future__ import annotations

import asyncio
import os
import pickle
import threading
from collections import Counter
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from . import _ring, _serialize, _workers
from ._offload_child import CALLS, LIFT_BUDGET, Destination, initializer
from ._transport import Response

if TYPE_CHECKING:
    from ._config import Config
    from ._span import Span

__all__ = ["Destination", "Job", "Offloader"]

_START_TIMEOUT = 60.0


async def _done(value: bytes) -> bytes:
    return value


# --------------------------------------------------------------------------- parent side


class Job:
    """A large span prepared once (the user's hooks ran) and delivered by a worker, as often
    as the pipeline retries it."""

    __slots__ = ("counted", "encoding", "nbytes", "prepared")

    def __init__(self, prepared: tuple[Any, Any, Any, Any, int], encoding: str, nbytes: int):
        self.prepared = prepared
        self.encoding = encoding
        self.nbytes = nbytes
        self.counted = False


class _Lifter:
    """Replaces a payload's large str and bytes leaves by slots from ``carrier``: direct reads
    (nothing copied) or the ring.

    Only plain dicts, lists and tuples are rebuilt (shallow copies on the way to a slot), and
    at most ``LIFT_BUDGET`` values are visited: anything else travels in the pickle as before.
    A value met twice (or through a cycle) gets one slot. The lifter holds every value it gave
    a slot (a direct slot is only an address): keep it until the worker has answered."""

    def __init__(self, carrier: _ring.Ring | _ring.Direct) -> None:
        self.carrier = carrier
        self.slots = 0  # slots placed, repeats included: what the worker must find
        self.budget = LIFT_BUDGET
        self._memo: dict[int, tuple[_ring.Slot, Any]] = {}

    @property
    def regions(self) -> list[int]:
        """Offsets of the ring regions this lift took."""
        if type(self.carrier) is not _ring.Ring:
            return []
        return [slot.off for slot, _ in self._memo.values()]

    def lift(self, v: Any) -> Any:
        cls = type(v)
        if cls is str or cls is bytes or cls is bytearray:
            if len(v) < _ring.MIN_COPY_BYTES:
                return v
            taken = self._memo.get(id(v))
            if taken is None:
                slot = self.carrier.put(v)
                if slot is None:
                    return v
                self._memo[id(v)] = (slot, v)
            else:
                slot = taken[0]
            self.slots += 1
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


def _new_pool(workers: int) -> _workers.Pool:
    if os.name != "posix":
        raise OSError("worker processes are talked to over POSIX pipes")
    pool = _workers.Pool(workers, initializer, (os.getpid(),), CALLS)
    pool.start(_START_TIMEOUT)
    return pool


class Offloader:
    """Encodes spans in worker processes, falling back to inline encoding whenever it must.

    ``encode`` always returns the encoded span; ``stats`` counts spans encoded in the pool
    (``offloaded``) and each fallback by reason.
    """

    def __init__(self, workers: int | None = None, ring_size: int = _ring.DEFAULT_SIZE) -> None:
        self.workers = workers or _default_workers()
        self.stats: Counter[str] = Counter()
        self._pool: _workers.Pool | None = None
        self._ring: _ring.Ring | None = None
        self._ring_size = ring_size
        self._direct: _ring.Direct | None = None
        self._last_settings: tuple[Destination, Any, bytes] | None = None
        # unstarted -> running -> (broken -> running) -> retired | unavailable | shutdown
        self._state = "unstarted"
        self._replaced = False
        self._lock = threading.Lock()
        # The start in progress, shared by every span that needs the pool meanwhile.
        self._starting: asyncio.Task[None] | None = None

    @property
    def state(self) -> str:
        return self._state

    def worker_pids(self) -> list[int]:
        """Process ids of the current workers (for diagnostics and tests)."""
        pool = self._pool
        return pool.pids() if pool is not None else []

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
        prepared = (*_serialize.prepare(span, cfg), encoding)
        try:
            future = pool.call("work", prepared)
        except Exception as exc:
            return _done(self._finish_inline(*prepared, self._unsent(pool, exc)))
        return self._collect(pool, future, prepared)

    def job(self, span: Span, cfg: Config, encoding: str, nbytes: int) -> Job:
        """Prepare ``span`` for :meth:`deliver`: the user's hooks run here, once."""
        return Job(_serialize.prepare(span, cfg), encoding, nbytes)

    async def deliver(self, job: Job, dest: Destination) -> Response | str | bytes:
        """Have a worker send ``job`` to ``dest`` as a request of its own.

        Returns the backend's ``Response``; a ``str`` naming the error when no answer came
        (retry as for any request); or the encoded span (``bytes``) when the worker could not
        take it, for the caller to send itself (the reason is counted)."""
        if self._state != "running":
            await self._ensure_pool()
        pool = self._pool if self._state == "running" else None
        if pool is None:
            return self._finish_inline(*job.prepared, job.encoding, self._fallback_reason())
        handed = self._hand_off(pool, job, dest)
        if isinstance(handed, bytes):
            return handed
        try:
            kind, detail, counts = await handed
        except Exception as exc:
            return self._finish_inline(*job.prepared, job.encoding, self._refused(pool, exc))
        if kind == "error":
            return self._finish_inline(*job.prepared, job.encoding, "worker_error")
        if not job.counted:
            job.counted = True
            self.stats["offloaded"] += 1
            _serialize.stats.update(counts)
        if kind == "unsent":
            return str(detail)
        status, retry_after, body = detail
        return Response(status, {"retry-after": retry_after} if retry_after else {}, body)

    def _hand_off(
        self, pool: _workers.Pool, job: Job, dest: Destination
    ) -> asyncio.Future[tuple[str, Any, dict[str, int]]] | bytes:
        """Send ``job`` to a worker: its large strings and bytes as slots, the rest pickled.
        The encoded span instead when it cannot go (the reason is counted)."""
        ring = self._ring
        carrier = self._direct or ring
        wire, inputs, output, pol, max_span = job.prepared
        lifter = _Lifter(carrier) if carrier is not None else None
        try:
            if lifter is not None:
                inputs = (inputs[0], lifter.lift(inputs[1]))
                output = (output[0], lifter.lift(output[1]))
            slots = lifter.slots if lifter is not None else 0
            regions = lifter.regions if lifter is not None else []
            rings = (ring.name, ring.size) if ring is not None and regions else None
            args = (wire, inputs, output, max_span, self._settings(dest, pol), slots, rings)
            # The regions are released, and the values read directly let go, when the worker
            # is done with them (also when the task awaiting the answer is cancelled), never
            # before: the pool holds the release, the release holds the lifter, which holds
            # the values.
            release = (lambda: self._release(ring, lifter)) if slots else None
            return pool.call("deliver", args, release)  # type: ignore[no-any-return]
        except Exception as exc:
            self._release(ring, lifter)  # not sent: no worker reads it
            return self._finish_inline(*job.prepared, job.encoding, self._unsent(pool, exc))

    def _unsent(self, pool: _workers.Pool, exc: Exception) -> str:
        """The fallback reason for a call that could not be sent: the pool's, or else the
        arguments did not pickle (``Pool.call`` pickles them, once, before anything else)."""
        if isinstance(exc, (_workers.WorkerGone, _workers.Elsewhere)):
            return self._refused(pool, exc)
        return "unpicklable"

    def _refused(self, pool: _workers.Pool, exc: Exception) -> str:
        """The fallback reason for a call the pool could not answer."""
        if isinstance(exc, _workers.WorkerGone):
            if exc.reason == "broken":
                self._broken(pool)
                return "broken_pool"
            return "shutdown"
        if isinstance(exc, _workers.Elsewhere):
            return "other_loop"
        return "worker_error"

    def _settings(self, dest: Destination, pol: Any) -> bytes:
        # Pickled once, not per span: on the loop, a pickle of the destination and policy cost
        # as much as the span's own.
        last = self._last_settings
        if last is None or last[0] is not dest or last[1] is not pol:
            last = self._last_settings = (dest, pol, pickle.dumps((dest, pol), protocol=5))
        return last[2]

    @staticmethod
    def _release(ring: _ring.Ring | None, lifter: _Lifter | None) -> None:
        if ring is not None and lifter is not None:
            for off in lifter.regions:
                ring.release(off)

    async def _collect(
        self,
        pool: _workers.Pool,
        future: asyncio.Future[tuple[bytes | None, dict[str, int]]],
        prepared: tuple[Any, Any, Any, Any, int, str],
    ) -> bytes:
        try:
            body, counts = await future
        except Exception as exc:
            reason = self._refused(pool, exc)
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

    async def _ensure_pool(self) -> _workers.Pool | None:
        if self._state in ("unstarted", "broken"):
            # One start, awaited by all: the first large spans arrive together (one sender per
            # request slot), and each start of its own took a thread from the loop's executor,
            # whose creation blocks the loop for 0.4-3 ms.
            loop = asyncio.get_running_loop()
            starting = self._starting
            if starting is None or starting.done() or starting.get_loop() is not loop:
                starting = self._starting = loop.create_task(self._start_off_loop())
            await asyncio.shield(starting)
        return self._pool if self._state == "running" else None

    async def _start_off_loop(self) -> None:
        try:
            await asyncio.to_thread(self._start)
        except RuntimeError:
            # Interpreter exit: no new threads to start the pool from, and no time to.
            with self._lock:
                if self._state in ("unstarted", "broken"):
                    self._state = "unavailable"

    def _start(self) -> None:
        with self._lock:
            if self._state not in ("unstarted", "broken"):
                return
            pool = None
            try:
                pool = _new_pool(self.workers)
                direct = _can_read_directly(pool)
            except Exception as exc:
                if pool is not None:
                    pool.close(wait=False)
                _serialize.logger.warning(
                    "looptrace: no worker process (%s); serializing inline", exc
                )
                self._state = "unavailable"
                return
            # The ring carries what direct reads cannot. Where they work, bytearrays are too
            # rare to be worth 64 MiB of shared memory and faulting it in: they travel in the
            # pickle. A replacement pool gets a new ring: the old one may still be read by a
            # dying worker's last call.
            ring = _ring.create(self._ring_size) if direct is None and self._ring_size else None
            self._pool = pool
            self._ring = ring
            self._direct = direct
            self._state = "running"

    def _broken(self, pool: _workers.Pool) -> None:
        with self._lock:
            if self._pool is not pool:
                return  # another span already dealt with this pool
            self._pool = None
            ring, self._ring = self._ring, None
            self._direct = None
            if self._state == "running":
                # Replace a broken pool once; a second break means something kills workers.
                self._state = "retired" if self._replaced else "broken"
                self._replaced = True
        pool.close(wait=False)
        if ring is not None:
            ring.close()

    def shutdown(self, wait: bool = True) -> None:
        """Stop the workers; later ``encode`` calls serialize inline."""
        with self._lock:
            pool, self._pool = self._pool, None
            ring, self._ring = self._ring, None
            self._direct = None
            self._state = "shutdown"
        if pool is not None:
            pool.close(wait=wait)
        if ring is not None:
            ring.close()


def _can_read_directly(pool: _workers.Pool) -> _ring.Direct | None:
    """A :class:`~looptrace._ring.Direct` if a worker can read this process's memory (one
    test read, off the loop, when the pool starts); None where the kernel refuses it."""
    try:
        direct = _ring.Direct()
        probe = b"looptrace direct read " + os.urandom(16)
        slot = direct.put(probe)
        if slot is None:
            return None
        back = pool.call_sync("read_back", (slot,), _START_TIMEOUT)
    except _workers.WorkerGone:
        raise
    except Exception:
        return None
    return direct if back == probe else None


def _default_workers() -> int:
    return 1 if (os.cpu_count() or 1) <= 2 else 2


def start_method() -> str:
    """The start method the pool uses (always ``spawn``: never ``fork``)."""
    return _workers.start_method()
