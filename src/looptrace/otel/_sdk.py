"""A span processor for the OpenTelemetry SDK that hands finished spans to looptrace.

For an application that already runs the SDK: its spans, whatever made them, go through
looptrace's pipeline (parallel batches, the byte budget, counted drops, a truthful flush) and
so to the local store and viewer, or to the endpoint looptrace is configured with.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace import Span as SdkSpan
from opentelemetry.sdk.trace import SpanProcessor as SdkSpanProcessor

from .. import _state
from .._capture.attributes import get_attributes
from .._capture.spans import Event, Link, ScopedSpan, SpanContext
from .._errors import internal_error
from .._semconv import LANGFUSE_TRACE_METADATA, METADATA
from . import _bridge
from ._span import trace_state_of

if TYPE_CHECKING:
    from .._capture.spans import Span


class SpanProcessor(SdkSpanProcessor):
    """Add to an SDK tracer provider: ``provider.add_span_processor(SpanProcessor())``.

    Sampled spans are handed to looptrace's pipeline as they end (O(1), no I/O, nothing
    serialized on the caller's thread); they keep their instrumentation scope and go out
    under looptrace's resource. Creating one also joins the two APIs' contexts, so a
    ``@looptrace.traced`` call inside an SDK span is its child, and the other way round.

    ``force_flush`` waits for looptrace's flush; ``shutdown`` flushes and leaves the pipeline
    running (looptrace closes it at exit, as it always does)."""

    def __init__(self) -> None:
        _bridge.install()

    def on_start(self, span: SdkSpan, parent_context: Context | None = None) -> None:
        # A looptrace.attributes() block in force goes on the SDK's span as plain attributes
        # (as OpenInference's instrumentations do), so the SDK's other exporters send it too.
        shared = get_attributes()
        if shared is None:
            return
        try:
            values = shared.as_attributes()
            metadata = values.get(METADATA)
            if metadata is not None:
                text = json.dumps(metadata, default=str, ensure_ascii=False)
                values[METADATA] = values[LANGFUSE_TRACE_METADATA] = text
            for key, value in values.items():
                if span.attributes is None or key not in span.attributes:
                    span.set_attribute(key, value)
        except Exception as exc:
            internal_error("otel.processor_start", exc)

    def on_end(self, span: ReadableSpan) -> None:
        try:
            ctx = span.context
            if ctx is None or not ctx.trace_flags.sampled or _state.disabled:
                return
            _state.sink.on_end(from_readable(span))
        except Exception as exc:
            internal_error("otel.processor", exc)

    def shutdown(self) -> None:
        self.force_flush()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        from .._export import flush_sync

        try:
            return flush_sync(timeout_millis / 1000.0).ok
        except Exception as exc:
            internal_error("otel.processor_flush", exc)
            return False


def from_readable(span: ReadableSpan) -> Span:
    """An ended looptrace span with everything the SDK recorded on ``span``."""
    ctx = span.context
    assert ctx is not None
    parent = span.parent
    scope = span.instrumentation_scope
    out = ScopedSpan(
        span.name,
        ctx.trace_id,
        ctx.span_id,
        parent.span_id if parent is not None else 0,
        span.start_time or 0,
        dict(span.attributes) if span.attributes else None,
        trace_state_of(ctx.trace_state),
        span.kind.value + 1,  # the API counts kinds from 0, OTLP from 1
        (scope.name, scope.version or "") if scope is not None else None,
        parent is not None and parent.is_remote,
    )
    # Made where the span ended, not where it started: on_start put the block's values on it.
    out.context_attributes = None
    if span.events:
        out.events = [
            Event(e.name, e.timestamp, dict(e.attributes) if e.attributes else None)
            for e in span.events
        ]
    if span.links:
        out.links = [
            Link(
                SpanContext(
                    link.context.trace_id,
                    link.context.span_id,
                    link.context.trace_flags.sampled,
                    trace_state_of(link.context.trace_state),
                    link.context.is_remote,
                ),
                dict(link.attributes) if link.attributes else None,
            )
            for link in span.links
        ]
    status = span.status
    out.status_code = status.status_code.value
    out.status_message = status.description or "" if out.status_code == 2 else ""
    out.end_ns = span.end_time or span.start_time or 0
    return out
