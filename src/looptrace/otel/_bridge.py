"""One active span for looptrace and the OpenTelemetry API.

looptrace keeps its active span in its own ContextVar; the OpenTelemetry API keeps a span in
its ``Context``. With the bridge installed, every span looptrace activates is also made the
OpenTelemetry API's current span (as an :class:`~looptrace.otel._api.OTelSpan` around it), and
every parent lookup on looptrace's side asks the OpenTelemetry context too, so a span started
through either API, in any order, nests under the innermost one.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace
from opentelemetry.trace import INVALID_SPAN as OTEL_INVALID_SPAN
from opentelemetry.trace import NonRecordingSpan as OTelNonRecordingSpan
from opentelemetry.trace import SpanContext as OTelSpanContext
from opentelemetry.trace import TraceFlags, TraceState

from .. import _state
from .._span import INVALID_SPAN, NonRecordingSpan, Span

# The key every instrumentation package checks before it records anything; the
# OpenTelemetry SDK's own exporters set it around their requests, as looptrace does. (None on
# an API without it: suppression then stays looptrace's own.)
SUPPRESS_KEY: str | None = getattr(otel_context, "_SUPPRESS_INSTRUMENTATION_KEY", None)

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_UNSAMPLED = TraceFlags(TraceFlags.DEFAULT)
_attach = otel_context.attach
_detach = otel_context.detach
_set_value = otel_context.set_value
_get_current_span = otel_trace.get_current_span
_set_span_in_context = otel_trace.set_span_in_context


class ForeignParent(Span):
    """Stands for a span of another tracer (the OpenTelemetry SDK's, or one read from a
    ``traceparent``): looptrace spans parent to it; it is never ended or exported."""

    __slots__ = ()


class RemoteForeignParent(ForeignParent):
    __slots__ = ()
    is_remote = True


def trace_state_of(state: TraceState) -> str:
    return state.to_header() if state else ""


def otel_trace_state(header: str) -> TraceState:
    return TraceState.from_header([header]) if header else TraceState()


def from_otel(span: otel_trace.Span) -> Span | None:
    """The looptrace span to parent to, for an OpenTelemetry span (None: no span)."""
    from ._api import OTelSpan

    if type(span) is OTelSpan:
        return span.looptrace_span
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return None
    state = trace_state_of(ctx.trace_state)
    if not ctx.trace_flags.sampled:
        return NonRecordingSpan(ctx.trace_id, ctx.span_id, state)
    cls = RemoteForeignParent if ctx.is_remote else ForeignParent
    return cls("", ctx.trace_id, ctx.span_id, 0, 0, None, state)


def to_otel(span: Span) -> otel_trace.Span:
    """The OpenTelemetry API's view of a looptrace span."""
    from ._api import OTelSpan

    if span.is_recording and not span.is_remote and not isinstance(span, ForeignParent):
        return OTelSpan(span)
    if not span.trace_id:
        return OTEL_INVALID_SPAN
    return OTelNonRecordingSpan(
        OTelSpanContext(
            span.trace_id,
            span.span_id,
            span.is_remote or isinstance(span, RemoteForeignParent),
            _SAMPLED if span.is_recording else _UNSAMPLED,
            otel_trace_state(span.trace_state),
        )
    )


class Bridge:
    """looptrace's :class:`~looptrace._state.ContextBridge` for the OpenTelemetry API."""

    def parent(self, current: Span | None) -> Span | None:
        if current is INVALID_SPAN:  # looptrace.suppress_tracing(): nothing records
            return current
        other = _get_current_span()
        if other is OTEL_INVALID_SPAN:
            return current
        found = from_otel(other)
        if found is None or current is None or found is current:
            return found if found is not None else current
        if (
            current.is_recording
            and not current.is_remote
            and found.is_recording
            and current.start_ns > found.start_ns
        ):
            # Both are active in this context, so they nest: the later one is the inner one.
            # (looptrace activated ``current`` without telling the other API: an experiment's
            # case, or a span active before the bridge was installed.)
            return current
        return found

    def enter(self, span: Span) -> Any:
        if span is INVALID_SPAN:
            ctx = _set_span_in_context(OTEL_INVALID_SPAN)
            if SUPPRESS_KEY is not None:
                ctx = _set_value(SUPPRESS_KEY, True, ctx)
            return _attach(ctx)
        return _attach(_set_span_in_context(to_otel(span)))

    def exit(self, token: Any) -> None:
        _detach(token)


BRIDGE = Bridge()


def install() -> None:
    _state.bridge = BRIDGE


def uninstall() -> None:
    if _state.bridge is BRIDGE:
        _state.bridge = None
