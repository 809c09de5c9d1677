"""looptrace inside the OpenTelemetry ecosystem (needs the ``otel`` extra).

- :func:`instrument_opentelemetry` installs a tracer provider for the OpenTelemetry API whose
  spans are looptrace spans: everything instrumented through that API (hand-made spans and
  every ``opentelemetry-instrumentation-*`` package) lands in looptrace's traces, exported by
  looptrace's pipeline.
- :class:`SpanProcessor` is for an application that already runs the OpenTelemetry SDK: added
  to its tracer provider, it hands the SDK's finished spans to looptrace's pipeline.

Either way, looptrace's active span and the OpenTelemetry API's current span are one: a span
started through one API inside a span of the other is its child. See docs/opentelemetry.md.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

from opentelemetry import trace as otel_trace

from . import _bridge
from ._api import OTelSpan, Tracer, TracerProvider

if TYPE_CHECKING:
    from ._sdk import SpanProcessor

__all__ = [
    "OTelSpan",
    "SpanProcessor",
    "Tracer",
    "TracerProvider",
    "instrument_opentelemetry",
    "uninstrument_opentelemetry",
]


def instrument_opentelemetry() -> bool:
    """Make looptrace the OpenTelemetry API's tracer provider. Idempotent.

    Returns True when looptrace's provider is the global one. When the application already
    installed another provider (the OpenTelemetry SDK's, typically), nothing changes: a
    :class:`RuntimeWarning` says so and names the remedy (:class:`SpanProcessor`), and the
    result is False."""
    current = otel_trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        current.open()
        return True
    if not isinstance(current, otel_trace.ProxyTracerProvider):
        kind = f"{type(current).__module__}.{type(current).__qualname__}"
        warnings.warn(
            f"looptrace.instrument_opentelemetry() changed nothing: the application already "
            f"installed a tracer provider ({kind}), and OpenTelemetry allows one. To send its "
            "spans through looptrace, add looptrace's span processor to it: "
            "provider.add_span_processor(looptrace.otel.SpanProcessor())",
            RuntimeWarning,
            stacklevel=2,
        )
        return False
    provider = TracerProvider()
    otel_trace.set_tracer_provider(provider)
    if otel_trace.get_tracer_provider() is not provider:  # another thread set one first
        provider.close()
        return instrument_opentelemetry()
    return True


def uninstrument_opentelemetry() -> None:
    """Undo :func:`instrument_opentelemetry`: the OpenTelemetry API's spans stop recording
    (OpenTelemetry does not allow replacing its global provider, so looptrace's stays in
    place, inert) and the two contexts are no longer joined."""
    current = otel_trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        current.close()
    _bridge.uninstall()


def __getattr__(name: str) -> object:
    # The SDK is needed only by the span processor: the API-only install does not import it.
    if name == "SpanProcessor":
        from ._sdk import SpanProcessor

        return SpanProcessor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
