"""One active span for looptrace and the OpenTelemetry API.

looptrace keeps its active span in its own ContextVar; the OpenTelemetry API keeps a span in
its ``Context``. With the bridge installed, every span looptrace activates is also made the
OpenTelemetry API's current span (as an :class:`~looptrace.otel.OTelSpan` around it), and
every parent lookup on looptrace's side asks the OpenTelemetry context too, so a span started
through either API, in any order, nests under the innermost one.

This runs for every traced call while the bridge is installed, so it reads and writes the
OpenTelemetry context with the fewest calls the public API allows.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace
from opentelemetry.trace import INVALID_SPAN as OTEL_INVALID_SPAN

from .. import _state
from .._capture.spans import INVALID_SPAN, ScopedSpan, Span
from ._span import OTelSpan, from_otel, to_otel

# The key every instrumentation package checks before it records anything; the
# OpenTelemetry SDK's own exporters set it around their requests, as looptrace does. (None on
# an API without it: suppression then stays looptrace's own.)
SUPPRESS_KEY: str | None = getattr(otel_context, "_SUPPRESS_INSTRUMENTATION_KEY", None)


def _span_key() -> str:
    # The context key the API keeps the current span under, learnt through the public API,
    # so the bridge can read and set it in one step instead of three.
    (key,) = otel_trace.set_span_in_context(OTEL_INVALID_SPAN, otel_context.Context()).keys()
    return key


SPAN_KEY = _span_key()
_attach = otel_context.attach
_detach = otel_context.detach
_get_current = otel_context.get_current
_set_value = otel_context.set_value
_Span = Span
_ScopedSpan = ScopedSpan
_OTelSpan = OTelSpan


class Bridge:
    """looptrace's :class:`~looptrace._state.ContextBridge` for the OpenTelemetry API."""

    def parent(self, current: Span | None) -> Span | None:
        if current is INVALID_SPAN:  # looptrace.suppress_tracing(): nothing records
            return current
        other = _get_current().get(SPAN_KEY)
        if other is None or other is OTEL_INVALID_SPAN:
            return current
        if type(other) is _OTelSpan:
            found: Span | None = other.looptrace_span
        elif isinstance(other, otel_trace.Span):
            found = from_otel(other)
        else:  # not a span: the API's get_current_span() ignores it too
            return current
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
        cls = type(span)
        if cls is _Span or cls is _ScopedSpan:
            return _attach(_set_value(SPAN_KEY, _OTelSpan(span)))
        if span is INVALID_SPAN:
            ctx = _set_value(SPAN_KEY, OTEL_INVALID_SPAN)
            if SUPPRESS_KEY is not None:
                ctx = _set_value(SUPPRESS_KEY, True, ctx)
            return _attach(ctx)
        return _attach(_set_value(SPAN_KEY, to_otel(span)))

    def exit(self, token: Any) -> None:
        _detach(token)


BRIDGE = Bridge()


def install() -> None:
    _state.bridge = BRIDGE


def uninstall() -> None:
    if _state.bridge is BRIDGE:
        _state.bridge = None
