"""Running a task over a dataset: bounded concurrency, backpressure, per-case timeouts.

``Experiment.run`` validates its arguments and hands over to :func:`run_cases`, which starts a
case for each item (each repetition) once a concurrency slot is free and the pipeline has room,
runs the task (a coroutine function on the loop, a plain function in a worker thread), scores
its output, and records the result; a task or scorer that fails is recorded on its case.
"""

from __future__ import annotations

import inspect
import os
import time
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable, Sequence, Sized
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from looptrace import backpressure

from ._case import Case
from ._dataset import _aiter, _read_jsonl, _unpack
from ._progress import _Progress
from ._results import CaseResult
from ._scorers import _Scorer

if TYPE_CHECKING:
    from ._experiment import Experiment


class _Backpressure:
    """Waits for room in the pipeline before a case starts, and counts the waits that were real."""

    def __init__(self) -> None:
        self.waits = 0
        self.wait_s = 0.0
        self.waiting = False

    async def wait(self) -> None:
        t0 = time.perf_counter()
        self.waiting = True
        try:
            await backpressure()
        finally:
            self.waiting = False
        waited = time.perf_counter() - t0
        # backpressure() returns at once under the threshold; count only real waits.
        if waited > 0.001:
            self.waits += 1
            self.wait_s += waited


async def run_cases(
    exp: Experiment,
    task: Callable[[Any], Any],
    dataset: Iterable[Any] | AsyncIterable[Any] | str | os.PathLike[str],
    scorers: Sequence[Callable[..., Any]],
    *,
    concurrency: int,
    repetitions: int,
    case_timeout: float | None,
) -> list[CaseResult]:
    """Run ``task`` on every case of ``dataset`` in ``exp``; this run's results, in order."""
    if isinstance(dataset, (str, os.PathLike)):
        dataset = await anyio.to_thread.run_sync(_read_jsonl, os.fspath(dataset))
    total = len(dataset) * repetitions if isinstance(dataset, Sized) else None
    adapted = [_Scorer(s) for s in scorers]
    run_task = _task_caller(task)
    first = len(exp._results)
    limit = anyio.Semaphore(concurrency)
    progress = exp._progress(total, first)
    base = exp._next_index
    position = 0
    try:
        async with anyio.create_task_group() as tg:
            async for item in _aiter(dataset):
                inp, expected, meta = _unpack(item)
                exp._next_index = base + position + 1
                for rep in range(repetitions):
                    await limit.acquire()
                    await exp._backpressure.wait()
                    case = Case(exp, base + position, rep, inp, expected, meta)
                    tg.start_soon(_run_case, case, run_task, adapted, case_timeout, limit, progress)
                position += 1
    finally:
        if progress is not None:
            progress.close()
    return sorted(exp._results[first:], key=lambda r: (r.index, r.repetition))


async def _run_case(
    case: Case,
    run_task: Callable[[Any], Awaitable[Any]],
    scorers: Sequence[_Scorer],
    case_timeout: float | None,
    limit: anyio.Semaphore,
    progress: _Progress | None,
) -> None:
    try:
        case._begin()
        error: BaseException | None = None
        try:
            try:
                if case_timeout is None:
                    case.output = await run_task(case.input)
                else:
                    with anyio.move_on_after(case_timeout) as scope:
                        case.output = await run_task(case.input)
                    if scope.cancelled_caught:
                        raise TimeoutError(f"the task took longer than {case_timeout:g} s")
            finally:
                case._duration_ms = (time.perf_counter() - case._t0) * 1000.0
            await case._apply(scorers)
        except Exception as exc:
            error = exc
        except BaseException as exc:
            case._finish(exc)
            raise
        case._finish(error)
    finally:
        limit.release()
        if progress is not None:
            progress.update()


def _task_caller(task: Callable[[Any], Any]) -> Callable[[Any], Awaitable[Any]]:
    if _is_async(task):

        async def call_async(value: Any) -> Any:
            return await task(value)

        return call_async

    async def call_sync(value: Any) -> Any:
        # A plain function may block (an HTTP client, a model): keep it off the loop. The
        # worker runs in a copy of this context, so its spans nest under the case.
        out = await anyio.to_thread.run_sync(task, value, abandon_on_cancel=True)
        if inspect.isawaitable(out):
            out = await out
        return out

    return call_sync


def _is_async(fn: Any) -> bool:
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(fn, "__call__", None)  # noqa: B004 - an object with an async __call__
    return call is not None and inspect.iscoroutinefunction(call)
