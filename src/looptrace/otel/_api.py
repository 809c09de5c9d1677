"""The OpenTelemetry API, implemented by looptrace spans.

A span started through this provider is a looptrace span (captured as ``@traced`` captures:
no lock, no serialization, no I/O) wrapped in an :class:`OTelSpan`, the face the OpenTelemetry
API and its instrumentation packages talk to. It ends into looptrace's pipeline and carries its
instrumentation scope to the wire.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from types import MappingProxyType, TracebackType
from typing import Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace
from opentelemetry.trace import INVALID_SPAN as OTEL_INVALID_SPAN
from opentelemetry.trace import SpanContext as OTelSpanContext
from opentelemetry.trace import Status
from opentelemetry.trace import StatusCode as OTelStatusCode
from opentelemetry.util import types

from .. import _capture, _clock, _state
from .._context import CURRENT
from .._errors import internal_error
from .._semconv import EXCEPTION_EVENT
from .._span import Event, SpanContext, StatusCode
from .._span import Span as LoopSpan
from . import _bridge

F = TypeVar("F", bound=Callable[..., Any])

_ESCAPED = "exception.escaped"
_SAMPLED = _bridge._SAMPLED


class OTelSpan(otel_trace.Span):
    """An OpenTelemetry API span that is a looptrace span underneath.

    Every call is honoured as the OpenTelemetry SDK honours it: attributes, events, links,
    status (``OK`` is final, ``UNSET`` changes nothing), exceptions, ``update_name`` and
    ``end(end_time)``; after ``end`` the span ignores changes."""

    __slots__ = ("_context", "_record_exception", "_set_status_on_exception", "looptrace_span")

    def __init__(
        self,
        span: LoopSpan,
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
                s.trace_id, s.span_id, False, _SAMPLED, _bridge.otel_trace_state(s.trace_state)
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
            _record_escape(self, exc_val, self._record_exception, self._set_status_on_exception)
        self.end()


def _record_escape(span: OTelSpan, exc: BaseException, record: bool, set_status: bool) -> None:
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
        _bridge.trace_state_of(ctx.trace_state),
        ctx.is_remote,
    )


_KINDS = {kind: kind.value + 1 for kind in otel_trace.SpanKind}  # the API counts from 0, OTLP 1
_API_KINDS = {number: kind for kind, number in _KINDS.items()}
_EMPTY: Mapping[str, Any] = MappingProxyType({})


def types_proxy(attributes: dict[str, Any] | None) -> Mapping[str, Any]:
    return _EMPTY if attributes is None else MappingProxyType(attributes)


class Tracer(otel_trace.Tracer):
    """Starts looptrace spans under one instrumentation scope."""

    def __init__(self, provider: TracerProvider, scope: tuple[str, str]) -> None:
        self._provider = provider
        self.scope = scope

    def __repr__(self) -> str:
        return f"<looptrace Tracer {self.scope[0]!r} {self.scope[1]!r}>"

    def start_span(
        self,
        name: str,
        context: otel_context.Context | None = None,
        kind: otel_trace.SpanKind = otel_trace.SpanKind.INTERNAL,
        attributes: types.Attributes = None,
        links: otel_trace._Links = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
    ) -> otel_trace.Span:
        try:
            return self._start(
                name,
                context,
                kind,
                attributes,
                links,
                start_time,
                record_exception,
                set_status_on_exception,
            )[1]
        except Exception as exc:  # tracing never raises into the instrumented code
            internal_error("otel.start_span", exc)
            return OTEL_INVALID_SPAN

    def _start(
        self,
        name: str,
        context: otel_context.Context | None,
        kind: otel_trace.SpanKind,
        attributes: types.Attributes,
        links: otel_trace._Links,
        start_time: int | None,
        record_exception: bool,
        set_status_on_exception: bool,
    ) -> tuple[LoopSpan | None, otel_trace.Span]:
        if _state.disabled or self._provider._closed:
            return None, OTEL_INVALID_SPAN
        if context is None:
            parent = CURRENT.get()
            bridge = _state.bridge
            if bridge is not None:
                parent = bridge.parent(parent)
        else:
            parent = _bridge.from_otel(otel_trace.get_current_span(context))
        s = _capture.start_scoped_span(
            name,
            dict(attributes) if attributes else None,
            parent,
            _KINDS.get(kind, 1),
            self.scope,
            start_time,
        )
        if not s.is_recording:
            return s, _bridge.to_otel(s)
        if links:
            for link in links:
                if link.context.is_valid or link.attributes:
                    s.add_link(to_looptrace_context(link.context), link.attributes)
        return s, OTelSpan(s, record_exception, set_status_on_exception)

    def start_as_current_span(  # type: ignore[override]
        self,
        name: str,
        context: otel_context.Context | None = None,
        kind: otel_trace.SpanKind = otel_trace.SpanKind.INTERNAL,
        attributes: types.Attributes = None,
        links: otel_trace._Links = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
        end_on_exit: bool = True,
    ) -> CurrentSpan:
        return CurrentSpan(
            self,
            (
                name,
                context,
                kind,
                attributes,
                links,
                start_time,
                record_exception,
                set_status_on_exception,
            ),
            end_on_exit,
        )


class CurrentSpan:
    """What ``start_as_current_span`` returns: a context manager that makes the new span the
    active one for both APIs, and, as the SDK's, a decorator (a new span per call)."""

    __slots__ = ("_args", "_end_on_exit", "_loop_span", "_span", "_tokens", "_tracer")

    def __init__(self, tracer: Tracer, args: tuple[Any, ...], end_on_exit: bool) -> None:
        self._tracer = tracer
        self._args = args
        self._end_on_exit = end_on_exit
        self._span: otel_trace.Span = OTEL_INVALID_SPAN
        self._loop_span: LoopSpan | None = None
        self._tokens: tuple[Any, Any] | None = None

    def __enter__(self) -> otel_trace.Span:
        try:
            loop_span, span = self._tracer._start(*self._args)
            token = CURRENT.set(loop_span) if loop_span is not None else None
            self._tokens = (token, otel_context.attach(otel_trace.set_span_in_context(span)))
        except Exception as exc:
            internal_error("otel.start_as_current_span", exc)
            return OTEL_INVALID_SPAN
        self._loop_span, self._span = loop_span, span
        return span

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        tokens, span = self._tokens, self._span
        if tokens is None:
            return
        self._tokens = None
        try:
            otel_context.detach(tokens[1])
            if tokens[0] is not None:
                try:
                    CURRENT.reset(tokens[0])
                except ValueError:  # left in another context than it was entered in
                    CURRENT.set(None)
            if exc is not None and type(span) is OTelSpan:
                record, set_status = self._args[6], self._args[7]
                if record or set_status:
                    _record_escape(span, exc, record, set_status)
            if self._end_on_exit:
                span.end()
        except Exception as error:
            internal_error("otel.end_current_span", error)

    def __call__(self, fn: F) -> F:
        tracer, args, end_on_exit = self._tracer, self._args, self._end_on_exit
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def async_wrapper(*a: Any, **kw: Any) -> Any:
                with CurrentSpan(tracer, args, end_on_exit):
                    return await fn(*a, **kw)

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(fn)
        def wrapper(*a: Any, **kw: Any) -> Any:
            with CurrentSpan(tracer, args, end_on_exit):
                return fn(*a, **kw)

        return wrapper  # type: ignore[return-value]


class TracerProvider(otel_trace.TracerProvider):
    """The OpenTelemetry API's tracer provider, backed by looptrace.

    Spans go through looptrace's pipeline (batches, offload, byte budget, drops counted), with
    looptrace's resource, sampling and ``disabled`` switch. Creating one installs the context
    bridge, so spans of both APIs nest whichever started first."""

    def __init__(self) -> None:
        self._tracers: dict[tuple[str, str], Tracer] = {}
        self._closed = False
        _bridge.install()

    def get_tracer(
        self,
        instrumenting_module_name: str,
        instrumenting_library_version: str | None = None,
        schema_url: str | None = None,
        attributes: types.Attributes = None,
    ) -> Tracer:
        scope = (instrumenting_module_name or "", instrumenting_library_version or "")
        tracer = self._tracers.get(scope)
        if tracer is None:
            if len(self._tracers) >= 1024:  # a name per request would otherwise grow this
                self._tracers.clear()
            tracer = self._tracers[scope] = Tracer(self, scope)
        return tracer

    def close(self) -> None:
        """From now on, tracers of this provider make non-recording spans."""
        self._closed = True

    def open(self) -> None:
        self._closed = False
        _bridge.install()


__all__ = ["CurrentSpan", "OTelSpan", "Tracer", "TracerProvider"]
