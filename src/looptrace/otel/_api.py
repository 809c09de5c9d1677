"""The OpenTelemetry API, implemented by looptrace spans.

A span started through this provider is a looptrace span (captured as ``@traced`` captures:
no lock, no serialization, no I/O) wrapped in an :class:`OTelSpan`, the face the OpenTelemetry
API and its instrumentation packages talk to. It ends into looptrace's pipeline and carries its
instrumentation scope to the wire.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace
from opentelemetry.trace import INVALID_SPAN as OTEL_INVALID_SPAN
from opentelemetry.util import types

from .. import _export, _state
from .._capture.context import CURRENT
from .._capture.spans import Span as LoopSpan
from .._capture.start import start_scoped_span
from .._errors import internal_error
from . import _bridge
from ._span import KINDS, OTelSpan, from_otel, record_escape, to_looptrace_context, to_otel

F = TypeVar("F", bound=Callable[..., Any])

_ = _export  # imported for its wiring: the spans made here need the pipeline's sink

_INTERNAL = otel_trace.SpanKind.INTERNAL
_attach = otel_context.attach
_set_value = otel_context.set_value
_SPAN_KEY = _bridge.SPAN_KEY


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
            parent = from_otel(otel_trace.get_current_span(context))
        s = start_scoped_span(
            name,
            dict(attributes) if attributes else None,
            parent,
            1 if kind is _INTERNAL else KINDS.get(kind, 1),  # an enum's hash is Python code
            self.scope,
            start_time,
        )
        if not s.is_recording:
            return s, to_otel(s)
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
            self._tokens = (token, _attach(_set_value(_SPAN_KEY, span)))
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
                    record_escape(span, exc, record, set_status)
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
