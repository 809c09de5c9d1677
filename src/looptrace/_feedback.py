"""``looptrace.score``: feedback attached after the fact to a span or trace that has ended.

A score is a span of its own, in the scored span's trace and parented to it, so it reaches any
OpenTelemetry backend as plain OTLP, from any process that knows the two ids (a web handler
receiving a thumbs up minutes later needs only the ``traceparent`` it handed out). It carries
the GenAI evaluation attributes twice over, as the conventions model a result both ways:

    span       ``evaluation <name>``, openinference.span.kind EVALUATOR,
               looptrace.span.type "score", gen_ai.evaluation.name / .score.value (a double;
               a bool is 1.0 or 0.0) / .score.label / .explanation (the comment)
    event      ``gen_ai.evaluation.result`` on that span, with the same gen_ai.evaluation.*

Arguments of the wrong type raise ``TypeError`` (and a score with neither value nor label
``ValueError``) at the call: they are mistakes in the code, found by its first run. A target
that names no recorded span (a malformed ``traceparent``, an unsampled or non-recording span)
is data, often from a request: the score is dropped, one line is logged for the first one, and
each is counted in ``looptrace.statistics().internal_errors["score.invalid_target"]``.
"""

from __future__ import annotations

import threading
from typing import Any

from . import _clock, _errors, _state
from ._capture.context import _RemoteParent, extract
from ._capture.spans import Span, SpanContext, SpanKind
from ._capture.start import start_scoped_span
from ._semconv import (
    GEN_AI_EVALUATION_EXPLANATION,
    GEN_AI_EVALUATION_NAME,
    GEN_AI_EVALUATION_RESULT,
    GEN_AI_EVALUATION_SCORE_LABEL,
    GEN_AI_EVALUATION_SCORE_VALUE,
    OI_EVALUATOR,
    OPENINFERENCE_SPAN_KIND,
    SPAN_TYPE,
    SPAN_TYPE_SCORE,
)

INVALID_TARGET = "score.invalid_target"
_warned = threading.Event()


def score(
    target: Span | SpanContext | str,
    name: str,
    value: float | bool | None = None,
    *,
    label: str | None = None,
    comment: str | None = None,
) -> SpanContext | None:
    """Attach a score to ``target``: a :class:`Span` (ended or not), a :class:`SpanContext`,
    or a W3C ``traceparent`` string (``00-<trace id>-<span id>-<flags>``).

    ``value`` is a number (a bool counts as 1.0 or 0.0), ``label`` a category ("correct",
    "thumbs_up"), ``comment`` an explanation; a score needs a value, a label or both. Returns
    the new evaluation span's context, or None when nothing was recorded (tracing disabled, or
    a target naming no recorded span: logged once and counted, never raised).
    """
    attributes = evaluation_attributes(name, value, label, comment)
    if _state.disabled:
        return None
    parent = _parent(target)
    if parent is None:
        return None
    return emit(parent, name, attributes)


def evaluation_attributes(
    name: str, value: float | bool | None, label: str | None, comment: str | None
) -> dict[str, Any]:
    """The gen_ai.evaluation.* attributes of one score, its arguments checked."""
    if not isinstance(name, str):
        raise TypeError(f"a score's name must be a string, got {type(name).__name__}")
    if not name:
        raise ValueError("a score needs a name")
    if value is not None and not isinstance(value, (bool, int, float)):
        raise TypeError(
            f"score {name!r}: value must be a number or a bool, got {type(value).__name__}"
        )
    if label is not None and not isinstance(label, str):
        raise TypeError(f"score {name!r}: label must be a string, got {type(label).__name__}")
    if comment is not None and not isinstance(comment, str):
        raise TypeError(f"score {name!r}: comment must be a string, got {type(comment).__name__}")
    if value is None and label is None:
        raise ValueError(f"score {name!r} needs a value, a label or both")
    attributes: dict[str, Any] = {GEN_AI_EVALUATION_NAME: name}
    if value is not None:
        attributes[GEN_AI_EVALUATION_SCORE_VALUE] = float(value)  # True -> 1.0
    if label is not None:
        attributes[GEN_AI_EVALUATION_SCORE_LABEL] = label
    if comment is not None:
        attributes[GEN_AI_EVALUATION_EXPLANATION] = comment
    return attributes


def emit(
    parent: Span, name: str, evaluation: dict[str, Any], start_ns: int | None = None
) -> SpanContext | None:
    """Record one evaluation span under ``parent`` (from ``start_ns``, default now, to now)."""
    if _state.disabled:
        return None
    attributes = {
        **evaluation,
        OPENINFERENCE_SPAN_KIND: OI_EVALUATOR,
        SPAN_TYPE: SPAN_TYPE_SCORE,
    }
    span = start_scoped_span(
        f"evaluation {name}", attributes, parent, SpanKind.INTERNAL, None, start_ns
    )
    if not span.is_recording:
        return None
    end_ns = _clock.now_ns()
    span.add_event(GEN_AI_EVALUATION_RESULT, evaluation, end_ns)
    span.end(end_ns)
    return span.context


def _parent(target: Any) -> Span | None:
    """The span a score of ``target`` goes under, or None (said and counted) when there is
    none to record one under."""
    if isinstance(target, Span):
        if target.is_recording and target.trace_id and target.span_id:
            return target
        _invalid("the span is not recording (unsampled, suppressed or disabled)")
        return None
    if isinstance(target, SpanContext):
        context: SpanContext | None = target
    elif isinstance(target, str):
        context = extract({"traceparent": target})
        if context is None:
            _invalid("the traceparent is malformed")
            return None
    else:
        raise TypeError(
            "a score's target must be a Span, a SpanContext or a traceparent string, "
            f"got {type(target).__name__}"
        )
    assert context is not None
    if not context.trace_id or not context.span_id:
        _invalid("the span context has a zero id")
        return None
    if not context.sampled:
        _invalid("the trace is not sampled")
        return None
    # A context from another process (extract, a traceparent) makes the score the local root
    # of its part of the trace, as any span under a remote parent is.
    cls = _RemoteParent if context.is_remote else Span
    return cls("", context.trace_id, context.span_id, 0, 0, None, context.trace_state)


def _invalid(why: str) -> None:
    """Say (the first time) and count a score dropped for its target."""
    with _errors._lock:
        _errors.counts[INVALID_TARGET] += 1
    if not _warned.is_set():
        _warned.set()
        _errors.logger.warning(
            "looptrace.score: score dropped: %s (further ones are counted in "
            "looptrace.statistics().internal_errors[%r])",
            why,
            INVALID_TARGET,
        )
