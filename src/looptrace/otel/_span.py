"""The OpenTelemetry API's view of a looptrace span, and back.

:class:`OTelSpan` is the face the OpenTelemetry API and its instrumentation packages talk to; the
looptrace span underneath is what is captured and exported. A span of another tracer (the SDK's,
or one read from a ``traceparent``) becomes a stand-in looptrace spans can parent to.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType, TracebackType
from typing import Any

from opentelemetry import trace as otel_trace
from opentelemetry.trace import INVALID_SPAN as OTEL_INVALID_SPAN
from opentelemetry.trace import NonRecordingSpan as OTelNonRecordingSpan
from opentelemetry.trace import SpanContext as OTelSpanContext
from opentelemetry.trace import Status, TraceFlags, TraceState
from opentelemetry.trace import StatusCode as OTelStatusCode
from opentelemetry.util import types

from .. import _clock
from .._capture.spans import Event, NonRecordingSpan, ScopedSpan, Span, SpanContext, StatusCode
from .._semconv import EXCEPTION_EVENT

_ESCAPED = "exception.escaped"
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_UNSAMPLED = TraceFlags(TraceFlags.DEFAULT)


class OTelSpan(otel_trace.Span):
    """An OpenTelemetry API span that is a looptrace span underneath.

    Every call is honoured as the OpenTelemetry SDK honours it: attributes, events, links,
    status (``OK`` is final, ``UNSET`` changes nothing), exceptions, ``update_name`` and
    ``end(end_time)``; after ``end`` the span ignores changes."""

    __slots__ = ("_context", "_record_exception", "_set_status_on_exception", "looptrace_span")

    def __init__(
        self,
        span: Span,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
    ) -> None:
        self.looptrace_span = span
        self._context: OTelSpanContext | None = None
        self._record_exception = record_exception
        self._set_status_on_exception = set_status_on_exception

    def __repr__(self) -> str:
        return f"<looptrace OTelSpan {self.looptrace_span!r}>"

    def __eq__(self, other: object) -> bool:
        # Two views of one looptrace span (one per activation) are the same span.
        if type(other) is OTelSpan:
            return other.looptrace_span is self.looptrace_span
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.looptrace_span)

    def get_span_context(self) -> OTelSpanContext:
        ctx = self._context
        if ctx is None:
            s = self.looptrace_span
            ctx = self._context = OTelSpanContext(
                s.trace_id, s.span_id, False, _SAMPLED, otel_trace_state(s.trace_state)
            )
        return ctx

    def is_recording(self) -> bool:
        return not self.looptrace_span.end_ns

    # Read by instrumentation packages as they read the SDK's span (the ASGI middleware
    # checks ``kind``, for one).
    @property
    def kind(self) -> otel_trace.SpanKind:
        return _API_KINDS.get(self.looptrace_span.kind, otel_trace.SpanKind.INTERNAL)

    @property
    def name(self) -> str:
        return self.looptrace_span.name

    @property
    def attributes(self) -> Mapping[str, Any]:
        return types_proxy(self.looptrace_span.attributes)

    @property
    def start_time(self) -> int:
        return self.looptrace_span.start_ns

    @property
    def end_time(self) -> int | None:
        return self.looptrace_span.end_ns or None

    def end(self, end_time: int | None = None) -> None:
        self.looptrace_span.end(end_time)

    def set_attribute(self, key: str, value: types.AnyValue) -> None:
        self.looptrace_span.set_attribute(key, value)

    def set_attributes(self, attributes: Mapping[str, types.AnyValue]) -> None:
        self.looptrace_span.set_attributes(attributes)

    def add_event(
        self,
        name: str,
        attributes: types.Attributes = None,
        timestamp: int | None = None,
    ) -> None:
        self.looptrace_span.add_event(name, attributes, timestamp)

    def add_link(self, context: OTelSpanContext, attributes: types.Attributes = None) -> None:
        if not context.is_valid and not attributes:
            return  # as the SDK: an empty link says nothing
        self.looptrace_span.add_link(to_looptrace_context(context), attributes)

    def update_name(self, name: str) -> None:
        s = self.looptrace_span
        if not s.end_ns:
            s.name = name

    def set_status(self, status: Status | OTelStatusCode, description: str | None = None) -> None:
        s = self.looptrace_span
        if s.end_ns or s.status_code == StatusCode.OK:
            return
        if isinstance(status, Status):
            code, description = status.status_code, status.description
        else:
            code = status
        if code is OTelStatusCode.UNSET:
            return
        s.set_status(int(code.value), description or "")

    def record_exception(
        self,
        exception: BaseException,
        attributes: types.Attributes = None,
        timestamp: int | None = None,
        escaped: bool = False,
    ) -> None:
        s = self.looptrace_span
        if s.end_ns:
            return
        attrs = dict(attributes) if attributes else {}
        if escaped:
            attrs[_ESCAPED] = True
        event = Event(
            EXCEPTION_EVENT,
            _clock.now_ns() if timestamp is None else timestamp,
            attrs or None,
            exception,
            exception.__traceback__,
        )
        if s.events is None:
            s.events = [event]
        else:
            s.events.append(event)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        # ``with tracer.start_span(...) as span:`` records what escapes, as the SDK's span does.
        if exc_val is not None:
            record_escape(self, exc_val, self._record_exception, self._set_status_on_exception)
        self.end()


def record_escape(span: OTelSpan, exc: BaseException, record: bool, set_status: bool) -> None:
    s = span.looptrace_span
    if s.end_ns:
        return
    if record and set_status and s.status_code != StatusCode.OK:
        s.fail(exc)  # looptrace's wording, and a cancellation is marked as one
        return
    if record:
        span.record_exception(exc, escaped=True)
    if set_status:
        span.set_status(Status(OTelStatusCode.ERROR, f"{type(exc).__name__}: {exc}"))


def to_looptrace_context(ctx: OTelSpanContext) -> SpanContext:
    return SpanContext(
        ctx.trace_id,
        ctx.span_id,
        ctx.trace_flags.sampled,
        trace_state_of(ctx.trace_state),
        ctx.is_remote,
    )


KINDS = {kind: kind.value + 1 for kind in otel_trace.SpanKind}  # the API counts from 0, OTLP 1
_API_KINDS = {number: kind for kind, number in KINDS.items()}
_EMPTY: Mapping[str, Any] = MappingProxyType({})


def types_proxy(attributes: dict[str, Any] | None) -> Mapping[str, Any]:
    return _EMPTY if attributes is None else MappingProxyType(attributes)


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
    cls = type(span)
    if cls is Span or cls is ScopedSpan:
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
