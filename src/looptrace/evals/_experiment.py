"""An experiment's lifecycle: ``async with looptrace.experiment(...)``, and ``run_experiment``.

Entering the block opens the experiment's root span and a lag monitor of its own; cases run
inside it (by hand or through ``Experiment.run``); leaving it closes the span, flushes once
with the shutdown deadline, and prints the summary.
"""

from __future__ import annotations

import asyncio
import enum
import importlib
import os
import sys
import time
from collections.abc import AsyncIterable, Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import IO, Any

import anyio

from looptrace import LoopTraceError, NonRecordingSpan, Span, flush, get_config, statistics

from ._case import Case, _CaseBlock
from ._internals import (
    ATTRIBUTES,
    CURRENT,
    ContextAttributes,
    internal_error,
    new_root,
    new_trace_id,
    semconv,
)
from ._progress import _isatty, _Progress
from ._results import CaseResult, ExperimentSummary, _percentile, _summarize
from ._running import _Backpressure, run_cases

# anyio loads its asyncio backend on first use: inside the first experiment's run, on the event
# loop, where the import would stall the user's loop. Loaded with this module instead.
try:
    importlib.import_module("anyio._backends._asyncio")
except ImportError:  # another anyio layout: it loads the backend itself, as before
    pass


class _Phase(enum.Enum):
    """An experiment's life: made, then opened by ``async with``, then closed, once each."""

    UNOPENED = "unopened"
    OPEN = "open"
    CLOSED = "closed"


class Experiment:
    """An experiment: one root span, and one trace per case linked to it.

    Made by :func:`experiment`; use it as ``async with`` (it can be opened once).
    """

    def __init__(
        self,
        name: str,
        metadata: Mapping[str, Any] | None = None,
        tags: Sequence[str] | None = None,
        *,
        progress: bool | None = None,
        quiet: bool = False,
        stream: IO[str] | None = None,
    ) -> None:
        self.name = name
        self.metadata = dict(metadata) if metadata else {}
        self.tags = list(tags) if tags else []
        self._progress_wanted = progress
        self._quiet = quiet
        self._stream = stream
        self._phase = _Phase.UNOPENED
        self._span: Span = NonRecordingSpan()
        self._id = ""
        self._token: Any = None
        self._attributes: ContextAttributes | None = None
        self._attributes_token: Any = None
        self._results: list[CaseResult] = []
        self._next_index = 0
        self._t0 = 0.0
        self._wall_s: float | None = None
        self._stats0: tuple[int, int] = (0, 0)
        self._final_stats: tuple[int, int] | None = None
        self._unsent = 0
        self._flushed = False
        self._monitor: Any = None
        self._final_lag: Any = None
        self._backpressure = _Backpressure()

    @property
    def id(self) -> str:
        """The experiment id: the experiment span's trace id in hex (set when the block opens)."""
        if self._phase is _Phase.UNOPENED:
            raise LoopTraceError("the experiment has no id until its block is entered")
        return self._id

    @property
    def span(self) -> Span:
        """The experiment's root span."""
        return self._span

    @property
    def results(self) -> list[CaseResult]:
        """Every finished case so far, ordered by (index, repetition)."""
        return sorted(self._results, key=lambda r: (r.index, r.repetition))

    async def __aenter__(self) -> Experiment:
        if self._phase is not _Phase.UNOPENED:
            raise LoopTraceError("an experiment can be entered only once")
        self._stats0 = _counters()
        attributes: dict[str, Any] = {
            semconv.SPAN_TYPE: semconv.SPAN_TYPE_EXPERIMENT,
            semconv.EXPERIMENT_NAME: self.name,
        }
        if self.metadata:
            attributes[semconv.EXPERIMENT_METADATA] = self.metadata
        if self.tags:
            attributes[semconv.EXPERIMENT_TAGS] = self.tags
        self._span = new_root(self.name, attributes)
        trace_id = self._span.trace_id or new_trace_id()
        self._id = f"{trace_id:032x}"
        self._span.set_attribute(semconv.EXPERIMENT_ID, self._id)
        self._enter_attributes()
        self._token = CURRENT.set(self._span)
        self._start_monitor()
        self._t0 = time.perf_counter()
        self._phase = _Phase.OPEN
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._phase = _Phase.CLOSED
        try:
            CURRENT.reset(self._token)
        except ValueError:
            CURRENT.set(None)
        try:
            ATTRIBUTES.reset(self._attributes_token)
        except ValueError:
            ATTRIBUTES.set(None)
        self._wall_s = time.perf_counter() - self._t0
        span = self._span
        span.set_attribute(semconv.EXPERIMENT_CASES, len(self._results))
        span.set_attribute(
            semconv.EXPERIMENT_ERRORS, sum(1 for r in self._results if r.error is not None)
        )
        if exc is not None:
            span.fail(exc)
        span.end()
        self._final_lag = self._loop_figures()
        self._stop_monitor()
        # Cancelled or not, what the cases recorded is sent: the flush is shielded and has its
        # own deadline.
        with anyio.CancelScope(shield=True):
            await self._flush()
        if not self._quiet:
            self._print(self.summary().format())

    def case(
        self,
        input: Any = None,
        expected: Any = None,
        metadata: Mapping[str, Any] | None = None,
        *,
        repetition: int = 0,
    ) -> _CaseBlock:
        """Open one case by hand: ``async with exp.case(input=q, expected=a) as case:``."""
        self._check_open()
        index = self._next_index
        self._next_index += 1
        return _CaseBlock(Case(self, index, repetition, input, expected, metadata))

    async def run(
        self,
        task: Callable[[Any], Any],
        dataset: Iterable[Any] | AsyncIterable[Any] | str | os.PathLike[str],
        scorers: Sequence[Callable[..., Any]] = (),
        *,
        concurrency: int = 4,
        repetitions: int = 1,
        timeout: float | None = None,  # noqa: ASYNC109 - a per-case limit, not this call's
    ) -> list[CaseResult]:
        """Run ``task`` on every case of ``dataset`` (``repetitions`` times each), at most
        ``concurrency`` cases at once, score each output, and return this run's results.

        ``task`` takes the input; a coroutine function runs on the loop, a plain function in a
        worker thread. ``dataset`` is an iterable or async iterable of cases
        (``{"input": ..., "expected": ..., "metadata": ...}``; anything else is taken as the
        input itself) or the path of a JSONL file of such objects. A task that raises or runs
        past ``timeout`` seconds, or a scorer that raises, is recorded on its case; the run goes
        on.
        """
        self._check_open()
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if repetitions < 1:
            raise ValueError("repetitions must be at least 1")
        if timeout is not None and timeout <= 0:
            raise ValueError("timeout must be a positive number of seconds")
        return await run_cases(
            self,
            task,
            dataset,
            scorers,
            concurrency=concurrency,
            repetitions=repetitions,
            case_timeout=timeout,
        )

    def summary(self) -> ExperimentSummary:
        """The experiment's numbers so far (final once the block has ended)."""
        results = self._results
        scores: dict[str, list[float]] = {}
        for r in results:
            for name, s in r.scores.items():
                scores.setdefault(name, []).append(s.value)
        # Failed cases took time too; cancelled ones were cut short at an arbitrary point.
        latencies = sorted(r.duration_ms for r in results if r.error != "cancelled")
        sent, dropped = self._final_stats if self._final_stats is not None else _counters()
        wall = self._wall_s if self._wall_s is not None else time.perf_counter() - self._t0
        loop = self._final_lag if self._phase is _Phase.CLOSED else self._loop_figures()
        return ExperimentSummary(
            name=self.name,
            id=self._id,
            cases=len(results),
            errors=sum(1 for r in results if r.error is not None),
            scorer_errors=sum(1 for r in results if r.scorer_errors),
            scores={name: _summarize(name, values) for name, values in scores.items()},
            latency_p50_ms=_percentile(latencies, 0.50),
            latency_p95_ms=_percentile(latencies, 0.95),
            wall_s=wall if self._phase is not _Phase.UNOPENED else 0.0,
            spans_sent=max(0, sent - self._stats0[0]),
            spans_dropped=max(0, dropped - self._stats0[1]),
            unsent=self._unsent,
            worst_loop_lag_ms=float(loop.max_ms) if loop is not None else None,
            backpressure_waits=self._backpressure.waits,
            backpressure_wait_s=self._backpressure.wait_s,
            flushed=self._flushed,
            input_tokens=sum(r.input_tokens for r in results),
            output_tokens=sum(r.output_tokens for r in results),
            loop=loop,
            cost_usd=_total_cost(results),
        )

    # -- internals --

    def _enter_attributes(self) -> None:
        """Put the experiment's session and metadata in force for its span and its cases.

        Each case is a trace of its own (the store and viewer read it so), which the
        OpenInference backends show as unrelated roots: the experiment id as the session
        (unless the application set one) groups the experiment's trace and its cases' traces
        as one session there, and the metadata names the experiment (and, on a case's
        spans, the case) for their filters."""
        outer = ATTRIBUTES.get()
        own = ContextAttributes(
            None if outer is not None and outer.session_id is not None else self._id,
            None,
            tuple(self.tags),
            {"experiment_id": self._id, "experiment_name": self.name},
        )
        values = own if outer is None else outer.merged(own)
        self._attributes = values
        # The span started before its id (its trace id) was known.
        if self._span.is_recording:
            self._span.context_attributes = values
        self._attributes_token = ATTRIBUTES.set(values)

    def _check_open(self) -> None:
        if self._phase is not _Phase.OPEN:
            raise LoopTraceError(
                "use the experiment inside its block: async with looptrace.experiment(...) as exp"
            )

    def _record(self, result: CaseResult) -> None:
        self._results.append(result)

    async def _flush(self) -> None:
        try:
            result = await flush(timeout=get_config().shutdown_timeout)
        except Exception as exc:
            internal_error("evals.flush", exc)
            return
        self._flushed = True
        self._unsent = result.pending
        self._final_stats = _counters()

    def _start_monitor(self) -> None:
        # A ticker of our own, even when a program-wide monitor runs: its window started before
        # the experiment, ours covers exactly the experiment. asyncio only (no figure on trio).
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        from looptrace.monitor import LagMonitor

        try:
            self._monitor = LagMonitor().start()
        except Exception as exc:
            internal_error("evals.monitor", exc)

    def _loop_figures(self) -> Any:
        """The monitor's snapshot over the experiment's window so far (a LagSnapshot), or
        None."""
        if self._monitor is None:
            return None
        try:
            return self._monitor.snapshot()
        except Exception as exc:
            internal_error("evals.monitor", exc)
            return None

    def _stop_monitor(self) -> None:
        if self._monitor is not None:
            try:
                self._monitor.stop()
            except Exception as exc:
                internal_error("evals.monitor", exc)

    def _progress(self, total: int | None, first: int) -> _Progress | None:
        stream = self._stream if self._stream is not None else sys.stderr
        wanted = self._progress_wanted
        if wanted is None:
            wanted = not self._quiet and _isatty(stream)
        return _Progress(stream, self.name, total, self._results, first) if wanted else None

    def _print(self, text: str) -> None:
        stream = self._stream if self._stream is not None else sys.stderr
        try:
            print(text, file=stream, flush=True)
        except Exception as exc:  # a closed stream must not turn a finished run into an error
            internal_error("evals.print", exc)


def experiment(
    name: str,
    metadata: Mapping[str, Any] | None = None,
    tags: Sequence[str] | None = None,
    *,
    progress: bool | None = None,
    quiet: bool = False,
    stream: IO[str] | None = None,
) -> Experiment:
    """Open an experiment: ``async with looptrace.experiment("name") as exp:``.

    ``progress`` shows a one-line bar while cases run (default: only when ``stream`` is a
    terminal and not ``quiet``); ``quiet`` skips the summary printed when the block ends.
    Both go to ``stream`` (default ``sys.stderr``, so a program's stdout stays its own).
    """
    return Experiment(name, metadata, tags, progress=progress, quiet=quiet, stream=stream)


def run_experiment(
    name: str,
    task: Callable[[Any], Any],
    dataset: Iterable[Any] | AsyncIterable[Any] | str | os.PathLike[str],
    scorers: Sequence[Callable[..., Any]] = (),
    *,
    concurrency: int = 4,
    repetitions: int = 1,
    timeout: float | None = None,
    metadata: Mapping[str, Any] | None = None,
    tags: Sequence[str] | None = None,
    progress: bool | None = None,
    quiet: bool = False,
    stream: IO[str] | None = None,
    backend: str = "asyncio",
) -> Experiment:
    """Run an experiment from sync code (a script, a notebook cell without a loop, a CI job).

    Runs an event loop (``backend`` "asyncio" or "trio") until the experiment has ended and
    flushed, and returns the closed :class:`Experiment` (``.summary()``, ``.results``).
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise LoopTraceError(
            "run_experiment() blocks; inside async code use: async with looptrace.experiment(...)"
        )
    exp = experiment(name, metadata, tags, progress=progress, quiet=quiet, stream=stream)

    async def main() -> None:
        async with exp:
            await exp.run(
                task,
                dataset,
                scorers,
                concurrency=concurrency,
                repetitions=repetitions,
                timeout=timeout,
            )

    anyio.run(main, backend=backend)
    return exp


def _total_cost(results: list[CaseResult]) -> float | None:
    total: float | None = None
    for r in results:
        cost = r.cost_usd
        if cost is not None:
            total = (total or 0.0) + cost
    return total


def _counters() -> tuple[int, int]:
    """(spans sent, spans dropped) from the pipeline, process-wide."""
    try:
        st = statistics()
        return st.spans_sent, sum(st.dropped.values())
    except Exception as exc:
        internal_error("evals.statistics", exc)
        return 0, 0
