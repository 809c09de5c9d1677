"""Evaluations: run a task over a dataset, score every output, and compare runs, traced end to end.

    async with looptrace.experiment("qa", metadata={"model": "m1"}) as exp:
        await exp.run(answer, dataset, scorers=[exact_match], concurrency=4)
    # a summary is printed here; exp.summary() and exp.results hold the same data

Spans flow through the normal pipeline: there is no flush per case. A case waits before it starts
only while the pipeline's pending plus in-flight bytes exceed ``backpressure_bytes``
(``LOOPTRACE_FLUSH_BACKPRESSURE_BYTES``); leaving the block flushes once, with the shutdown
deadline, and the summary says what could not be sent.

What lands on the spans (attribute names are stable; the store and viewer read them):

Experiment span (a root, named after the experiment):
    looptrace.span.type          "experiment"
    looptrace.experiment.id      the experiment id: this span's trace id, 32 lowercase hex digits
    looptrace.experiment.name    the name
    looptrace.experiment.metadata  the metadata mapping (JSON string on the wire)
    looptrace.experiment.tags    the tags (list of strings)
    looptrace.experiment.cases   cases finished (set when the block ends)
    looptrace.experiment.errors  cases whose task failed (set when the block ends)

Case root (a root of its own trace, named ``case <index>``, linked to the experiment span;
the task's spans nest under it):
    looptrace.span.type          "case"
    looptrace.experiment.id / looptrace.experiment.name   as above
    looptrace.case.index         position in the dataset (unique within the experiment)
    looptrace.case.repetition    0 .. repetitions-1
    input.value / output.value   the input and the task's output (JSON; LOOPTRACE_CAPTURE_INPUTS /
                                 LOOPTRACE_CAPTURE_OUTPUTS=false leave them out)
    looptrace.expected.value     the expected output (JSON unless a primitive; left out with inputs)
    looptrace.case.metadata      the case's metadata, when it has some
    looptrace.case.duration_ms   how long the task ran (scorers excluded; the whole block for a
                                 manual case)
    looptrace.case.input_tokens / looptrace.case.output_tokens   the sums of gen_ai.usage.*
                                 over the spans of the case's trace that ended before the case
                                 (LLM calls, see docs/genai.md), when there are any
    looptrace.case.error         "Type: message" when the task raised or timed out
    looptrace.score.<name>       each score, a double (a bool scores 1.0 / 0.0)
    looptrace.score.<name>.comment   the score's comment, a string, when there is one
    looptrace.scorer_error.<scorer>  "Type: message" when a scorer raised
    status ERROR, with an ``exception`` event, when the task or a scorer raised.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import inspect
import math
import os
import statistics as _stats
import sys
import time
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable, Mapping, Sequence, Sized
from types import TracebackType
from typing import IO, Any, TypeVar

import anyio
import anyio.to_thread

from . import _clock, _export, _semconv, _state
from ._capture import start_root
from ._context import CURRENT
from ._errors import LoopTraceError, internal_error
from ._span import NonRecordingSpan, Span, StatusCode, _describe, _is_cancellation

__all__ = [
    "Case",
    "CaseResult",
    "Experiment",
    "ExperimentSummary",
    "Score",
    "ScoreSummary",
    "experiment",
    "run_experiment",
]

T = TypeVar("T")

_NOTHING: Any = object()


@dataclasses.dataclass(frozen=True)
class Score:
    """One named score. Scorers may return one (to add a comment) instead of a bare number.

    ``name`` may be left empty in a scorer's return value: the scorer's own name is used.
    """

    name: str
    value: float
    comment: str | None = None


@dataclasses.dataclass(frozen=True)
class CaseResult:
    """What happened to one case: its data, the output, the scores, and any error."""

    index: int
    repetition: int
    input: Any
    expected: Any
    metadata: Mapping[str, Any] | None
    output: Any
    scores: Mapping[str, Score]
    error: str | None
    scorer_errors: Mapping[str, str]
    duration_ms: float
    trace_id: str
    # LLM token usage summed over the case's trace (gen_ai.usage.* attributes).
    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def ok(self) -> bool:
        """True when neither the task nor any scorer raised."""
        return self.error is None and not self.scorer_errors


@dataclasses.dataclass(frozen=True)
class ScoreSummary:
    """One score over all the cases that have it."""

    name: str
    count: int
    mean: float
    stdev: float  # population standard deviation (0 for one case)
    min: float
    max: float


@dataclasses.dataclass(frozen=True)
class ExperimentSummary:
    """The numbers printed when an experiment ends, typed, for notebooks and CI assertions.

    ``spans_sent``/``spans_dropped`` are the pipeline's counters over the experiment's lifetime
    (process-wide: other traffic at the same time is included). ``unsent`` is what the final flush
    could not deliver before its deadline; it and ``flushed`` are only final after the block.
    """

    name: str
    id: str
    cases: int
    errors: int
    scorer_errors: int
    scores: Mapping[str, ScoreSummary]
    latency_p50_ms: float | None
    latency_p95_ms: float | None
    wall_s: float
    spans_sent: int
    spans_dropped: int
    unsent: int
    worst_loop_lag_ms: float | None
    backpressure_waits: int
    backpressure_wait_s: float
    flushed: bool
    # LLM token usage summed over every case.
    input_tokens: int = 0
    output_tokens: int = 0

    def format(self) -> str:
        """The summary as the compact table printed when the block ends."""
        lines = [
            f"experiment {self.name!r}  id {self.id}",
            f"  cases {self.cases}  errors {self.errors}  scorer errors {self.scorer_errors}"
            f"  wall {self.wall_s:.2f} s",
        ]
        if self.scores:
            width = max(5, *(len(n) for n in self.scores))
            lines.append(
                f"  {'score':<{width}}  {'mean':>7} {'stdev':>7} {'min':>7} {'max':>7} {'n':>5}"
            )
            for s in self.scores.values():
                lines.append(
                    f"  {s.name:<{width}}  {s.mean:7.3f} {s.stdev:7.3f} {s.min:7.3f} {s.max:7.3f}"
                    f" {s.count:5d}"
                )
        if self.latency_p50_ms is not None and self.latency_p95_ms is not None:
            lines.append(
                f"  latency p50 {self.latency_p50_ms:.1f} ms  p95 {self.latency_p95_ms:.1f} ms"
            )
        if self.input_tokens or self.output_tokens:
            lines.append(f"  tokens in {self.input_tokens}  out {self.output_tokens}")
        lag = "n/a" if self.worst_loop_lag_ms is None else f"{self.worst_loop_lag_ms:.1f} ms"
        lines.append(
            f"  spans sent {self.spans_sent}  dropped {self.spans_dropped}  unsent {self.unsent}"
            f"  worst loop lag {lag}"
        )
        if self.backpressure_waits:
            lines.append(
                f"  backpressure: waited {self.backpressure_waits} times,"
                f" {self.backpressure_wait_s:.2f} s in all"
            )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()


class Case:
    """One case being evaluated, as given by ``async with exp.case(...) as case``.

    Set ``case.output`` and call ``case.score(name, value)``. An exception raised in the block is
    recorded on the case and does not propagate (so a loop over cases goes on); cancellation
    does propagate.
    """

    def __init__(
        self,
        experiment: Experiment,
        index: int,
        repetition: int,
        input: Any,
        expected: Any,
        metadata: Mapping[str, Any] | None,
    ) -> None:
        self.experiment = experiment
        self.index = index
        self.repetition = repetition
        self.input = input
        self.expected = expected
        self.metadata = metadata
        self.output: Any = None
        self.span: Span = NonRecordingSpan()
        self._scores: dict[str, Score] = {}
        self._scorer_errors: dict[str, str] = {}
        self._error: str | None = None
        self._token: Any = None
        self._t0 = 0.0
        self._duration_ms: float | None = None
        self._finished = False

    def score(self, name: str, value: float | bool | Score, comment: str | None = None) -> None:
        """Record a score on this case (a bool counts as 1.0 or 0.0)."""
        if isinstance(value, Score):
            comment = value.comment if comment is None else comment
            value = value.value
        if isinstance(value, bool):
            number = 1.0 if value else 0.0
        elif isinstance(value, (int, float)):
            number = float(value)
        else:
            raise TypeError(
                f"score {name!r} must be a number or a bool, got {type(value).__name__}"
            )
        self._scores[name] = Score(name, number, comment)
        self.span.set_attribute(_semconv.SCORE_PREFIX + name, number)
        if comment is not None:
            self.span.set_attribute(
                _semconv.SCORE_PREFIX + name + _semconv.SCORE_COMMENT_SUFFIX, str(comment)
            )

    @property
    def scores(self) -> Mapping[str, Score]:
        return dict(self._scores)

    # -- lifecycle, shared by the manual form and Experiment.run --

    def _begin(self) -> None:
        exp = self.experiment
        attributes: dict[str, Any] = {
            _semconv.SPAN_TYPE: _semconv.SPAN_TYPE_CASE,
            _semconv.EXPERIMENT_ID: exp.id,
            _semconv.EXPERIMENT_NAME: exp.name,
            _semconv.CASE_INDEX: self.index,
            _semconv.CASE_REPETITION: self.repetition,
        }
        # Expected values come from the same dataset as the inputs: the same switch keeps both out.
        if self.expected is not None and _state.capture_inputs:
            attributes[_semconv.EXPECTED_VALUE] = self.expected
        if self.metadata:
            attributes[_semconv.CASE_METADATA] = self.metadata
        self.span = _new_root(f"case {self.index}", attributes)
        self.span.add_link(exp._span.context)
        if self.span.is_recording:
            _watch_tokens(self.span.trace_id)
        if _state.capture_inputs:
            self.span.set_inputs(self.input)
        self._token = CURRENT.set(self.span)
        self._t0 = time.perf_counter()

    def _record_error(self, exc: BaseException) -> None:
        self._error = "cancelled" if _is_cancellation(exc) else _describe(exc)
        self.span.fail(exc)
        self.span.set_attribute(_semconv.CASE_ERROR, self._error)

    def _record_scorer_error(self, scorer: str, exc: BaseException) -> None:
        message = _describe(exc)
        self._scorer_errors[scorer] = message
        self.span.record_exception(exc, {"looptrace.scorer": scorer})
        self.span.set_attribute(_semconv.SCORER_ERROR_PREFIX + scorer, message)
        if self._error is None:
            self.span.set_status(StatusCode.ERROR, f"scorer {scorer} failed: {message}")

    def _finish(self, exc: BaseException | None) -> CaseResult:
        if self._finished:  # pragma: no cover - guarded by the callers
            raise LoopTraceError("case finished twice")
        self._finished = True
        if exc is not None:
            self._record_error(exc)
        if self._duration_ms is None:
            self._duration_ms = (time.perf_counter() - self._t0) * 1000.0
        span = self.span
        try:
            CURRENT.reset(self._token)
        except ValueError:
            # Left in another context than it was entered in: the case is over all the same.
            CURRENT.set(self.experiment._span)
        if self.output is not None and _state.capture_outputs:
            span.set_output(self.output)
        span.set_attribute(_semconv.CASE_DURATION_MS, self._duration_ms)
        tokens_in, tokens_out = _unwatch_tokens(span.trace_id)
        if tokens_in or tokens_out:
            span.set_attribute(_semconv.CASE_INPUT_TOKENS, tokens_in)
            span.set_attribute(_semconv.CASE_OUTPUT_TOKENS, tokens_out)
        span.end()
        result = CaseResult(
            index=self.index,
            repetition=self.repetition,
            input=self.input,
            expected=self.expected,
            metadata=self.metadata,
            output=self.output,
            scores=dict(self._scores),
            error=self._error,
            scorer_errors=dict(self._scorer_errors),
            duration_ms=self._duration_ms,
            trace_id=f"{span.trace_id:032x}",
            input_tokens=tokens_in,
            output_tokens=tokens_out,
        )
        self.experiment._record(result)
        return result

    async def _apply(self, scorers: Sequence[_Scorer]) -> None:
        for scorer in scorers:
            try:
                value = scorer.call(self.input, self.output, self.expected, self.metadata)
                if inspect.isawaitable(value):
                    value = await value
                for name, score in _normalize(scorer.name, value):
                    self.score(name, score)
            except Exception as exc:
                self._record_scorer_error(scorer.name, exc)


class _CaseBlock:
    """``async with exp.case(...)``: opens a case, closes it when the block ends."""

    def __init__(self, case: Case) -> None:
        self._case = case

    async def __aenter__(self) -> Case:
        self._case._begin()
        return self._case

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        self._case._finish(exc)
        # Errors belong to the case and the loop goes on; cancellation and exits propagate.
        return isinstance(exc, Exception)


class _Scorer:
    """A user scorer, with its name and a call that passes input/output/expected its way."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.name = _callable_name(fn)
        self.call = _adapt(fn)


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
        self._results: list[CaseResult] = []
        self._next_index = 0
        self._t0 = 0.0
        self._wall_s: float | None = None
        self._stats0: tuple[int, int] = (0, 0)
        self._final_stats: tuple[int, int] | None = None
        self._unsent = 0
        self._flushed = False
        self._monitor: Any = None
        self._final_lag: float | None = None
        self._bp_waits = 0
        self._bp_wait_s = 0.0
        self._bp_waiting = False

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
            _semconv.SPAN_TYPE: _semconv.SPAN_TYPE_EXPERIMENT,
            _semconv.EXPERIMENT_NAME: self.name,
        }
        if self.metadata:
            attributes[_semconv.EXPERIMENT_METADATA] = self.metadata
        if self.tags:
            attributes[_semconv.EXPERIMENT_TAGS] = self.tags
        self._span = _new_root(self.name, attributes)
        trace_id = self._span.trace_id or _clock.new_trace_id()
        self._id = f"{trace_id:032x}"
        self._span.set_attribute(_semconv.EXPERIMENT_ID, self._id)
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
        self._wall_s = time.perf_counter() - self._t0
        span = self._span
        span.set_attribute(_semconv.EXPERIMENT_CASES, len(self._results))
        span.set_attribute(
            _semconv.EXPERIMENT_ERRORS, sum(1 for r in self._results if r.error is not None)
        )
        if exc is not None:
            span.fail(exc)
        span.end()
        self._final_lag = self._lag_ms()
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
        if isinstance(dataset, (str, os.PathLike)):
            dataset = await anyio.to_thread.run_sync(_read_jsonl, os.fspath(dataset))
        total = len(dataset) * repetitions if isinstance(dataset, Sized) else None
        adapted = [_Scorer(s) for s in scorers]
        run_task = _task_caller(task)
        first = len(self._results)
        limit = anyio.Semaphore(concurrency)
        progress = self._progress(total, first)
        base = self._next_index
        position = 0
        try:
            async with anyio.create_task_group() as tg:
                async for item in _aiter(dataset):
                    inp, expected, meta = _unpack(item)
                    self._next_index = base + position + 1
                    for rep in range(repetitions):
                        await limit.acquire()
                        await self._backpressure()
                        case = Case(self, base + position, rep, inp, expected, meta)
                        tg.start_soon(
                            self._run_case, case, run_task, adapted, timeout, limit, progress
                        )
                    position += 1
        finally:
            if progress is not None:
                progress.close()
        return sorted(self._results[first:], key=lambda r: (r.index, r.repetition))

    async def _run_case(
        self,
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
        lag = self._final_lag if self._phase is _Phase.CLOSED else self._lag_ms()
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
            worst_loop_lag_ms=lag,
            backpressure_waits=self._bp_waits,
            backpressure_wait_s=self._bp_wait_s,
            flushed=self._flushed,
            input_tokens=sum(r.input_tokens for r in results),
            output_tokens=sum(r.output_tokens for r in results),
        )

    # -- internals --

    def _check_open(self) -> None:
        if self._phase is not _Phase.OPEN:
            raise LoopTraceError(
                "use the experiment inside its block: async with looptrace.experiment(...) as exp"
            )

    def _record(self, result: CaseResult) -> None:
        self._results.append(result)

    async def _backpressure(self) -> None:
        t0 = time.perf_counter()
        self._bp_waiting = True
        try:
            await _export.backpressure()
        finally:
            self._bp_waiting = False
        waited = time.perf_counter() - t0
        # backpressure() returns at once under the threshold; count only real waits.
        if waited > 0.001:
            self._bp_waits += 1
            self._bp_wait_s += waited

    async def _flush(self) -> None:
        try:
            result = await _export.flush(timeout=_export.get_config().shutdown_timeout)
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
        from .monitor import LagMonitor

        try:
            self._monitor = LagMonitor().start()
        except Exception as exc:
            internal_error("evals.monitor", exc)

    def _lag_ms(self) -> float | None:
        if self._monitor is None:
            return None
        try:
            return float(self._monitor.snapshot().max_ms)
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


# -- helpers --


# Token usage of the cases running now, by trace id: [input, output]. The end hook that fills
# it is installed only while a case runs, and costs other spans one dict lookup.
_case_tokens: dict[int, list[int]] = {}


def _count_tokens(span: Span) -> None:
    counts = _case_tokens.get(span.trace_id)
    if counts is None:
        return
    attributes = span.attributes
    if not attributes:
        return
    value = attributes.get(_semconv.GENAI_INPUT_TOKENS)
    if type(value) is int:
        counts[0] += value
    value = attributes.get(_semconv.GENAI_OUTPUT_TOKENS)
    if type(value) is int:
        counts[1] += value


def _watch_tokens(trace_id: int) -> None:
    if not _case_tokens:
        _state.add_hooks(end=_count_tokens)
    _case_tokens.setdefault(trace_id, [0, 0])


def _unwatch_tokens(trace_id: int) -> tuple[int, int]:
    counts = _case_tokens.pop(trace_id, None)
    if not _case_tokens:
        _state.remove_hooks(end=_count_tokens)
    return (counts[0], counts[1]) if counts is not None else (0, 0)


def _new_root(name: str, attributes: dict[str, Any]) -> Span:
    """A span that starts a new trace whatever span is active."""
    if _state.disabled:
        return NonRecordingSpan(_clock.new_trace_id(), _clock.new_span_id())
    return start_root(name, attributes)


def _counters() -> tuple[int, int]:
    """(spans sent, spans dropped) from the pipeline, process-wide."""
    try:
        st = _export.statistics()
        return st.spans_sent, sum(st.dropped.values())
    except Exception as exc:
        internal_error("evals.statistics", exc)
        return 0, 0


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


_SCORER_ARGS = ("input", "output", "expected", "metadata")


def _adapt(fn: Callable[..., Any]) -> Callable[[Any, Any, Any, Any], Any]:
    """Call a scorer by parameter name when it names them (input, output, expected, metadata),
    else positionally as (input, output, expected), as many as it takes."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return lambda i, o, e, m: fn(i, o, e)
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return lambda i, o, e, m: fn(input=i, output=o, expected=e, metadata=m)
    named = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    required = [p.name for p in params if p.default is p.empty and p.kind is not p.VAR_POSITIONAL]
    if required and all(n in _SCORER_ARGS for n in required):
        wanted = [n for n in _SCORER_ARGS if n in named]

        def by_name(i: Any, o: Any, e: Any, m: Any) -> Any:
            values = {"input": i, "output": o, "expected": e, "metadata": m}
            return fn(**{n: values[n] for n in wanted})

        return by_name
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        count = 3
    else:
        count = min(
            3, sum(1 for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))
        )
    return lambda i, o, e, m: fn(*(i, o, e)[:count])


def _callable_name(fn: Any) -> str:
    target = getattr(fn, "func", fn)  # functools.partial
    name = getattr(target, "__name__", None)
    return name if isinstance(name, str) else type(target).__name__


def _normalize(default: str, value: Any) -> list[tuple[str, float | bool | Score]]:
    """A scorer's return value as (name, value) pairs; None means no score."""
    if value is None:
        return []
    if isinstance(value, Score):
        return [(value.name or default, value)]
    if isinstance(value, (bool, int, float)):
        return [(default, value)]
    if isinstance(value, Mapping):
        out: list[tuple[str, float | bool | Score]] = []
        for key, item in value.items():
            if isinstance(item, Mapping):
                raise TypeError(f"scorer {default!r} returned a nested dict under {key!r}")
            out.extend(_normalize(str(key), item))
        return out
    # A duck-typed result object (``.score``/``.value`` and maybe ``.comment``/``.name``).
    number = getattr(value, "score", getattr(value, "value", None))
    if isinstance(number, (bool, int, float)):
        name = getattr(value, "name", None)
        comment = getattr(value, "comment", None)
        return [
            (
                name if isinstance(name, str) and name else default,
                Score("", float(number), None if comment is None else str(comment)),
            )
        ]
    raise TypeError(
        f"scorer {default!r} returned {type(value).__name__}; expected a number, a bool, "
        "a dict of named scores, or a Score"
    )


def _summarize(name: str, values: list[float]) -> ScoreSummary:
    return ScoreSummary(
        name=name,
        count=len(values),
        mean=_stats.fmean(values),
        stdev=_stats.pstdev(values) if len(values) > 1 else 0.0,
        min=min(values),
        max=max(values),
    )


def _percentile(ordered: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default) on a sorted list."""
    if not ordered:
        return None
    pos = (len(ordered) - 1) * q
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def _unpack(item: Any) -> tuple[Any, Any, Mapping[str, Any] | None]:
    if isinstance(item, Mapping) and "input" in item:
        meta = item.get("metadata")
        return item["input"], item.get("expected"), meta if isinstance(meta, Mapping) else None
    return item, None, None


async def _aiter(dataset: Iterable[T] | AsyncIterable[T]) -> Any:
    if isinstance(dataset, AsyncIterable):
        async for item in dataset:
            yield item
    else:
        for item in dataset:
            yield item


def _read_jsonl(path: str) -> list[Any]:
    import orjson

    cases: list[Any] = []
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                cases.append(orjson.loads(line))
            except orjson.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not valid JSON ({exc})") from None
    return cases


def _isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except Exception:
        return False


class _Progress:
    """A one-line ``\\r`` progress bar, redrawn at most every 0.1 s."""

    def __init__(
        self,
        stream: IO[str],
        name: str,
        total: int | None,
        results: list[CaseResult],
        first: int,
    ) -> None:
        self.stream = stream
        self.name = name
        self.total = total
        self.results = results
        self.first = first
        self.t0 = time.perf_counter()
        self.last = 0.0
        self.drawn = False

    def update(self) -> None:
        results = self.results[self.first :]
        now = time.perf_counter()
        if now - self.last < 0.1 and (self.total is None or len(results) < self.total):
            return
        self.last = now
        done = len(results)
        errors = sum(1 for r in results if r.error is not None)
        if self.total:
            filled = min(20, done * 20 // self.total)
            bar = f"[{'#' * filled}{'.' * (20 - filled)}] {done}/{self.total}"
        else:
            bar = f"{done} cases"
        line = f"\r{self.name} {bar}  errors {errors}  {now - self.t0:.1f} s"
        try:
            self.stream.write(line)
            self.stream.flush()
            self.drawn = True
        except Exception as exc:
            internal_error("evals.progress", exc)

    def close(self) -> None:
        if self.drawn:
            try:
                self.stream.write("\n")
                self.stream.flush()
            except Exception as exc:
                internal_error("evals.progress", exc)
