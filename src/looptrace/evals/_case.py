"""One case of an experiment: its root span, its output and scores, and its result.

A case is opened by hand (``async with exp.case(...) as case``) or by ``Experiment.run``; either
way it begins (a root span of its own trace, linked to the experiment's, made active), collects
the output and scores, and finishes into a :class:`CaseResult` the experiment records.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

from looptrace import LoopTraceError, NonRecordingSpan, Span, StatusCode

from ._internals import (
    ATTRIBUTES,
    CURRENT,
    ContextAttributes,
    capture_inputs,
    capture_outputs,
    describe,
    emit_score,
    evaluation_attributes,
    internal_error,
    is_cancellation,
    new_root,
    new_time_ns,
    semconv,
)
from ._results import CaseResult, Score
from ._scorers import _normalize, _Scorer
from ._tokens import _unwatch_tokens, _watch_tokens

if TYPE_CHECKING:
    from ._experiment import Experiment


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
        self._attributes_token: Any = None
        self._t0 = 0.0
        self._duration_ms: float | None = None
        self._finished = False

    def score(self, name: str, value: float | bool | Score, comment: str | None = None) -> None:
        """Record a score on this case (a bool counts as 1.0 or 0.0): on the case span, and as
        an evaluation span under it (as ``looptrace.score`` makes)."""
        self._score(name, value, comment, None)

    def _score(
        self, name: str, value: float | bool | Score, comment: str | None, start_ns: int | None
    ) -> None:
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
        self.span.set_attribute(semconv.SCORE_PREFIX + name, number)
        if comment is not None:
            self.span.set_attribute(
                semconv.SCORE_PREFIX + name + semconv.SCORE_COMMENT_SUFFIX, str(comment)
            )
        if self.span.is_recording:
            try:
                evaluation = evaluation_attributes(
                    name, number, None, None if comment is None else str(comment)
                )
                emit_score(self.span, name, evaluation, start_ns)
            except Exception as exc:
                internal_error("evals.score_span", exc)

    @property
    def scores(self) -> Mapping[str, Score]:
        return dict(self._scores)

    # -- lifecycle, shared by the manual form and Experiment.run --

    def _begin(self) -> None:
        exp = self.experiment
        attributes: dict[str, Any] = {
            semconv.SPAN_TYPE: semconv.SPAN_TYPE_CASE,
            semconv.EXPERIMENT_ID: exp.id,
            semconv.EXPERIMENT_NAME: exp.name,
            semconv.CASE_INDEX: self.index,
            semconv.CASE_REPETITION: self.repetition,
        }
        # Expected values come from the same dataset as the inputs: the same switch keeps both out.
        if self.expected is not None and capture_inputs():
            attributes[semconv.EXPECTED_VALUE] = self.expected
        if self.metadata:
            attributes[semconv.CASE_METADATA] = self.metadata
        # The case's spans, its own included, carry the experiment's session and metadata
        # with the case's index (see Experiment.__aenter__).
        own = ContextAttributes(None, None, (), {"case_index": self.index})
        outer = ATTRIBUTES.get()
        self._attributes_token = ATTRIBUTES.set(own if outer is None else outer.merged(own))
        self.span = new_root(f"case {self.index}", attributes)
        self.span.add_link(exp.span.context)
        if self.span.is_recording:
            _watch_tokens(self.span.trace_id)
        if capture_inputs():
            self.span.set_inputs(self.input)
        self._token = CURRENT.set(self.span)
        self._t0 = time.perf_counter()

    def _record_error(self, exc: BaseException) -> None:
        self._error = "cancelled" if is_cancellation(exc) else describe(exc)
        self.span.fail(exc)
        self.span.set_attribute(semconv.CASE_ERROR, self._error)

    def _record_scorer_error(self, scorer: str, exc: BaseException) -> None:
        message = describe(exc)
        self._scorer_errors[scorer] = message
        self.span.record_exception(exc, {"looptrace.scorer": scorer})
        self.span.set_attribute(semconv.SCORER_ERROR_PREFIX + scorer, message)
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
            CURRENT.set(self.experiment.span)
        try:
            ATTRIBUTES.reset(self._attributes_token)
        except ValueError:
            ATTRIBUTES.set(self.experiment._attributes)
        if self.output is not None and capture_outputs():
            span.set_output(self.output)
        span.set_attribute(semconv.CASE_DURATION_MS, self._duration_ms)
        tokens_in, tokens_out, cost = _unwatch_tokens(span.trace_id)
        if tokens_in or tokens_out:
            span.set_attribute(semconv.CASE_INPUT_TOKENS, tokens_in)
            span.set_attribute(semconv.CASE_OUTPUT_TOKENS, tokens_out)
        if cost is not None:
            # Summed at export (left out there when no call had a price).
            span.set_attribute(semconv.CASE_COST_USD, cost)
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
            _cost=cost,
        )
        self.experiment._record(result)
        return result

    async def _apply(self, scorers: Sequence[_Scorer]) -> None:
        for scorer in scorers:
            try:
                start_ns = new_time_ns()
                value = scorer.call(self.input, self.output, self.expected, self.metadata)
                if inspect.isawaitable(value):
                    value = await value
                # Each result's evaluation span covers the scorer's run.
                for name, score in _normalize(scorer.name, value):
                    self._score(name, score, None, start_ns)
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
