"""pydantic-ai agents as looptrace spans (the ``pydantic-ai`` extra).

pydantic-ai records its agent runs, model requests and tool calls through the OpenTelemetry
API, under the GenAI conventions (``invoke_agent {agent}``, ``chat {model}``,
``execute_tool {tool}``, with tokens and messages). :func:`instrument_pydantic_ai` is the one
call that sends them through looptrace: it makes looptrace the OpenTelemetry API's tracer
provider (:func:`looptrace.instrument_opentelemetry`), switches pydantic-ai's instrumentation on
for every agent (``Agent.instrument_all()``), and adds what OpenInference backends read and
pydantic-ai does not write: ``openinference.span.kind`` (AGENT, LLM, TOOL) from each span's
``gen_ai.operation.name``, and an LLM span's cost in USD (``llm.cost.*``, from genai-prices'
table, worked out at export).

The spans are looptrace spans from the start (the OpenTelemetry bridge captures them as
``@traced`` does), so an agent run is in the caller's trace and a ``@traced`` function called
by a tool nests under the tool's span.
"""

from __future__ import annotations

from pydantic_ai import Agent
from pydantic_ai.models.instrumented import InstrumentationSettings

from .. import _semconv as sc
from .. import _state
from .._capture.spans import Span
from .._errors import internal_error
from . import _common

__all__ = ["instrument_pydantic_ai", "uninstrument_pydantic_ai"]

# The instrumentation scope pydantic-ai's tracer has.
SCOPE = "pydantic-ai"

_KINDS = {
    sc.GEN_AI_OP_INVOKE_AGENT: sc.OI_AGENT,
    sc.GEN_AI_OP_CHAT: sc.OI_LLM,
    sc.GEN_AI_OP_TEXT_COMPLETION: sc.OI_LLM,
    "generate_content": sc.OI_LLM,
    sc.GEN_AI_OP_EMBEDDINGS: sc.OI_EMBEDDING,
    sc.GEN_AI_OP_EXECUTE_TOOL: sc.OI_TOOL,
}


def _on_end(span: Span) -> None:
    """An end hook (it runs for every span while installed: one tuple test for the others).
    The span has ended, so it writes to its attribute dict directly."""
    scope = span.scope
    if scope is None or scope[0] != SCOPE:
        return
    try:
        attributes = span.attributes
        if not attributes:
            return
        kind = _KINDS.get(attributes.get(sc.GEN_AI_OPERATION_NAME, ""))
        if kind is None:
            return
        attributes.setdefault(sc.OPENINFERENCE_SPAN_KIND, kind)
        if span.status_code == 2 and sc.ERROR_TYPE not in attributes:
            exc = span.exception
            if exc is not None:
                attributes[sc.ERROR_TYPE] = _common.error_type(exc)
        if kind == sc.OI_LLM and span.status_code != 2:
            # _cost.attach sets its Deferred prices through the span's own methods, which an
            # ended span ignores: it is reopened for that one call, on this thread, before any
            # exporter has it (the hook runs before the span reaches the pipeline).
            end_ns = span.end_ns
            span.end_ns = 0
            try:
                _common.price(span)
            finally:
                span.end_ns = end_ns
    except Exception as exc:  # an end hook that raised would lose the span
        internal_error("integrations.pydantic_ai.end", exc)


def instrument_pydantic_ai(settings: InstrumentationSettings | None = None) -> bool:
    """Send every pydantic-ai agent's spans through looptrace. Idempotent.

    ``settings`` are pydantic-ai's own (``InstrumentationSettings(include_content=False)``
    leaves messages out, for one); their tracer provider, when not given, is the global one,
    which this call makes looptrace's. Returns False, with the warning
    :func:`looptrace.instrument_opentelemetry` gives, when the application already installed
    another tracer provider (the OpenTelemetry SDK's): add ``looptrace.otel.SpanProcessor()``
    to it instead."""
    from ..otel import instrument_opentelemetry

    _common.load_prices()
    installed = instrument_opentelemetry()
    Agent.instrument_all(settings if settings is not None else True)
    _state.add_hooks(end=_on_end)
    return installed


def uninstrument_pydantic_ai() -> None:
    """Switch pydantic-ai's instrumentation off for every agent and remove looptrace's end
    hook. The OpenTelemetry bridge stays (other instrumentations may use it):
    :func:`looptrace.uninstrument_opentelemetry` removes it."""
    Agent.instrument_all(False)
    _state.remove_hooks(end=_on_end)
