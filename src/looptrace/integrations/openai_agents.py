"""The OpenAI Agents SDK's traces as looptrace spans (the ``openai-agents`` extra).

:func:`instrument_openai_agents` registers a :class:`Processor`, the SDK's own extension point
for tracing: each SDK trace becomes an ``invoke_workflow`` span under the caller's active
looptrace span (so an agent run is part of the caller's trace), and each SDK span a looptrace
span under it:

    agent         invoke_agent {name}      AGENT   gen_ai.agent.name, tools, handoffs
    generation    chat {model}             LLM     model, server, tokens, messages, cost
    response      chat {model}             LLM     the Responses API call, as instrument_openai
    function      execute_tool {name}      TOOL    gen_ai.tool.name, arguments, result
    handoff       handoff {from} -> {to}   TOOL
    guardrail     guardrail {name}         GUARDRAIL  looptrace.guardrail.triggered
    task          run {workflow name}      CHAIN   one Runner run inside the trace
    turn          turn {n}                 CHAIN   one turn of the agent loop
    custom, mcp_tools and the voice spans: CHAIN spans under their own names

Each span is the active looptrace span while the SDK runs it, so a ``@traced`` function called
by a tool, or an OpenAI call instrumented by ``instrument_openai``, nests where it ran.

The SDK calls a processor synchronously, on its event loop: every callback here creates, fills
or ends a span (a few microseconds) and nothing else; ``shutdown`` returns at once (looptrace's
own exit flush sends what is pending, under its deadline); ``force_flush`` blocks only a thread
that has no running event loop.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any, cast

from agents.tracing import Span as AgentsSpan
from agents.tracing import Trace as AgentsTrace
from agents.tracing import (
    TracingProcessor,
    get_trace_provider,
    set_trace_processors,
)
from agents.tracing.span_data import (
    AgentSpanData,
    CustomSpanData,
    FunctionSpanData,
    GenerationSpanData,
    GuardrailSpanData,
    HandoffSpanData,
    MCPListToolsSpanData,
    ResponseSpanData,
    TaskSpanData,
    TurnSpanData,
)

from .. import _semconv as sc
from .._capture.attributes import get_attributes
from .._capture.spans import Span, SpanKind, StatusCode
from .._capture.start import start_span
from .._genai import _openai
from .._genai._core import Call
from . import _common
from ._common import Open, Runs, guarded

__all__ = ["Processor", "instrument_openai_agents", "uninstrument_openai_agents"]

FRAMEWORK = "openai-agents"
runs = Runs("openai_agents")

# The SDK span types whose span is made the active looptrace span while it runs: those the SDK
# runs as ``with`` blocks or marks current itself (the voice pipeline's spans are started in
# one task and finished in another, and are not).
_ACTIVATED: frozenset[type[Any]] = frozenset(
    (
        AgentSpanData,
        FunctionSpanData,
        GenerationSpanData,
        ResponseSpanData,
        GuardrailSpanData,
        HandoffSpanData,
        CustomSpanData,
        TaskSpanData,
        TurnSpanData,
        MCPListToolsSpanData,
    )
)
_LLM: frozenset[type[Any]] = frozenset((GenerationSpanData, ResponseSpanData))


def _kind(data: Any) -> type | None:
    """The SDK span type ``data`` is (its class, or the known class it derives from). The SDK's
    span data classes are ABCs, whose isinstance checks cost a microsecond each: the exact
    class is looked up first."""
    cls = type(data)
    if cls in _ACTIVATED:
        return cls
    for known in _ACTIVATED:
        if isinstance(data, known):
            return known
    return None


def _server(config: Any) -> tuple[str, int] | None:
    url = config.get("base_url") if isinstance(config, dict) else None
    if not isinstance(url, str) or "://" not in url:
        return None
    scheme, _, rest = url.partition("://")
    host, _, port = rest.partition("/")[0].rpartition(":")
    if not host:
        return rest.partition("/")[0], 443 if scheme == "https" else 80
    if port.isdigit():
        return host, int(port)
    return host + ":" + port, 443 if scheme == "https" else 80


class _CallView:
    """What ``_openai._record_response`` reads of an LLM call: its span and whether content
    is recorded (the SDK made the call; looptrace only describes it)."""

    __slots__ = ("content", "span")

    def __init__(self, span: Span, content: bool) -> None:
        self.span = span
        self.content = content


class Processor(TracingProcessor):
    """An Agents SDK tracing processor that records looptrace spans.

    Register it with :func:`instrument_openai_agents` (or the SDK's own
    ``agents.add_trace_processor(Processor())``)."""

    def __init__(self) -> None:
        self.enabled = True

    # -- traces ---------------------------------------------------------------------------

    @guarded("integrations.openai_agents.trace_start")
    def on_trace_start(self, trace: AgentsTrace) -> None:
        if not self.enabled or _common.disabled():
            return
        attributes: dict[str, Any] = {
            sc.OPENINFERENCE_SPAN_KIND: sc.OI_CHAIN,
            sc.GEN_AI_OPERATION_NAME: sc.GEN_AI_OP_INVOKE_WORKFLOW,
            sc.FRAMEWORK: FRAMEWORK,
            sc.FRAMEWORK_RUN_ID: trace.trace_id,
        }
        exported = trace.export() or {}
        group = exported.get("group_id")
        if isinstance(group, str) and group:
            # The SDK's conversation id: the session, unless looptrace.attributes() set one.
            attributes[sc.GEN_AI_CONVERSATION_ID] = group
            context = get_attributes()
            if context is None or context.session_id is None:
                attributes[sc.SESSION_ID] = group
        span = start_span(trace.name or "Agent workflow", attributes)
        if not span.is_recording:
            return
        entry = Open(span, _common.activate(span))
        if not runs.add(trace.trace_id, entry):
            _common.deactivate(entry.tokens)

    @guarded("integrations.openai_agents.trace_end")
    def on_trace_end(self, trace: AgentsTrace) -> None:
        entry = runs.pop(trace.trace_id)
        if entry is None:
            return
        _common.deactivate(entry.tokens, entry.span)
        entry.span.end()

    # -- spans ----------------------------------------------------------------------------

    @guarded("integrations.openai_agents.span_start")
    def on_span_start(self, span: AgentsSpan[Any]) -> None:
        if not self.enabled or _common.disabled():
            return
        parent_entry = runs.get(span.parent_id or span.trace_id)
        parent = parent_entry.span if parent_entry is not None else None
        data = span.span_data
        kind = _kind(data)
        name, attributes, span_kind = _describe_start(data, kind)
        attributes[sc.FRAMEWORK_RUN_ID] = span.span_id
        started = start_span(name, attributes, parent, span_kind)
        if not started.is_recording:
            return
        tokens = _common.activate(started) if kind is not None else None
        if not runs.add(span.span_id, Open(started, tokens)):
            _common.deactivate(tokens)

    @guarded("integrations.openai_agents.span_end")
    def on_span_end(self, span: AgentsSpan[Any]) -> None:
        entry = runs.pop(span.span_id)
        if entry is None:
            return
        target = entry.span
        _common.deactivate(entry.tokens, target)
        data = span.span_data
        kind = _kind(data)
        try:
            _describe_end(target, data, kind)
        finally:
            error = span.error
            if error is not None:
                _record_error(target, error)
            elif kind in _LLM:
                _common.price(target)
            target.end()

    # -- lifecycle ------------------------------------------------------------------------

    def shutdown(self, timeout: float | None = None) -> None:
        """Called by the SDK at exit: returns at once. looptrace's own exit handling sends
        what is pending, under its own deadline, so nothing here can hold the exit."""
        self.enabled = False

    def force_flush(self) -> None:
        """``agents.flush_traces()``: send what has ended. A thread with a running event
        loop is never blocked: the flush runs as a task of that loop."""
        import looptrace

        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            looptrace.flush_sync(5.0)
            return
        task = loop.create_task(looptrace.flush(5.0))
        _flushes.add(task)
        task.add_done_callback(_flushes.discard)


_flushes: set[asyncio.Task[Any]] = set()


def _describe_start(data: Any, kind: type | None) -> tuple[str, dict[str, Any], int]:
    """A new span's name, attributes and kind from what the SDK knows at its start."""
    if kind is AgentSpanData:
        return (
            f"{sc.GEN_AI_OP_INVOKE_AGENT} {data.name}",
            {
                sc.OPENINFERENCE_SPAN_KIND: sc.OI_AGENT,
                sc.GEN_AI_OPERATION_NAME: sc.GEN_AI_OP_INVOKE_AGENT,
                sc.GEN_AI_PROVIDER_NAME: sc.GEN_AI_PROVIDER_OPENAI,
                sc.GEN_AI_AGENT_NAME: data.name,
            },
            SpanKind.INTERNAL,
        )
    if kind is FunctionSpanData:
        return (
            f"{sc.GEN_AI_OP_EXECUTE_TOOL} {data.name}",
            {
                sc.OPENINFERENCE_SPAN_KIND: sc.OI_TOOL,
                sc.GEN_AI_OPERATION_NAME: sc.GEN_AI_OP_EXECUTE_TOOL,
                sc.GEN_AI_TOOL_NAME: data.name,
                sc.GEN_AI_TOOL_TYPE: "function",
            },
            SpanKind.INTERNAL,
        )
    if kind is GenerationSpanData:
        model = data.model or ""
        attributes = _common.llm_attributes(sc.GEN_AI_OP_CHAT, sc.GEN_AI_PROVIDER_OPENAI, model)
        server = _server(data.model_config)
        if server is not None:
            attributes[sc.SERVER_ADDRESS], attributes[sc.SERVER_PORT] = server
        return (f"chat {model}" if model else "chat"), attributes, SpanKind.CLIENT
    if kind is ResponseSpanData:
        attributes = _common.llm_attributes(sc.GEN_AI_OP_CHAT, sc.GEN_AI_PROVIDER_OPENAI, None)
        return "chat", attributes, SpanKind.CLIENT
    if kind is HandoffSpanData:
        return (
            "handoff",
            {sc.OPENINFERENCE_SPAN_KIND: sc.OI_TOOL, sc.HANDOFF_FROM: data.from_agent or ""},
            SpanKind.INTERNAL,
        )
    if kind is GuardrailSpanData:
        return (
            f"guardrail {data.name}",
            {sc.OPENINFERENCE_SPAN_KIND: sc.OI_GUARDRAIL},
            SpanKind.INTERNAL,
        )
    if kind is CustomSpanData:
        return data.name, {sc.OPENINFERENCE_SPAN_KIND: sc.OI_CHAIN}, SpanKind.INTERNAL
    if kind is TurnSpanData:
        return (
            f"turn {data.turn}",
            {sc.OPENINFERENCE_SPAN_KIND: sc.OI_CHAIN, sc.GEN_AI_AGENT_NAME: data.agent_name},
            SpanKind.INTERNAL,
        )
    if kind is TaskSpanData:
        # One top-level Runner run inside the trace (the trace may hold several).
        return f"run {data.name}", {sc.OPENINFERENCE_SPAN_KIND: sc.OI_CHAIN}, SpanKind.INTERNAL
    if kind is MCPListToolsSpanData:
        server_name = data.server or ""
        return (
            f"mcp list_tools {server_name}".rstrip(),
            {sc.OPENINFERENCE_SPAN_KIND: sc.OI_CHAIN},
            SpanKind.INTERNAL,
        )
    # Speech, transcription and span types added to the SDK after this module.
    return str(getattr(data, "type", "span")), {sc.OPENINFERENCE_SPAN_KIND: sc.OI_CHAIN}, 1


def _describe_end(span: Span, data: Any, kind: type | None) -> None:
    """What the SDK filled in while the span ran (tokens, output, the tools an agent had)."""
    if kind is GenerationSpanData:
        _end_generation(span, data)
    elif kind is ResponseSpanData:
        _end_response(span, data)
    elif kind is FunctionSpanData:
        if _common.content_enabled():
            if data.input is not None:
                span.set_attribute(sc.GEN_AI_TOOL_CALL_ARGUMENTS, data.input)
                span.set_inputs(data.input)
            if data.output is not None:
                span.set_attribute(sc.GEN_AI_TOOL_CALL_RESULT, str(data.output))
                span.set_output(data.output)
        if data.mcp_data:
            span.set_attribute(sc.FRAMEWORK_DATA, data.mcp_data)
    elif kind is AgentSpanData:
        attributes: dict[str, Any] = {}
        if data.tools:
            attributes[sc.AGENT_TOOLS] = list(data.tools)
        if data.handoffs:
            attributes[sc.AGENT_HANDOFFS] = list(data.handoffs)
        if data.output_type:
            attributes[sc.AGENT_OUTPUT_TYPE] = data.output_type
        if attributes:
            span.set_attributes(attributes)
    elif kind is HandoffSpanData:
        span.name = f"handoff {data.from_agent or '?'} -> {data.to_agent or '?'}"
        span.set_attribute(sc.HANDOFF_FROM, data.from_agent or "")
        span.set_attribute(sc.HANDOFF_TO, data.to_agent or "")
    elif kind is GuardrailSpanData:
        span.set_attribute(sc.GUARDRAIL_TRIGGERED, bool(data.triggered))
    elif kind is CustomSpanData:
        if data.data:
            span.set_attribute(sc.FRAMEWORK_DATA, data.data)
    elif kind is MCPListToolsSpanData and data.result:
        span.set_attribute(sc.AGENT_TOOLS, list(data.result))


def _usage(attributes: dict[str, Any], usage: Any) -> None:
    if not isinstance(usage, dict):
        return
    inputs = usage.get("input_tokens_details")
    outputs = usage.get("output_tokens_details")
    input_tokens, output_tokens = usage.get("input_tokens"), usage.get("output_tokens")
    if not input_tokens and not output_tokens:
        return  # the SDK's zeros for a call whose usage the provider did not report
    _common.set_usage(
        attributes,
        input_tokens,
        output_tokens,
        inputs.get("cached_tokens") if isinstance(inputs, dict) else None,
        None,
        outputs.get("reasoning_tokens") if isinstance(outputs, dict) else None,
    )


def _end_generation(span: Span, data: GenerationSpanData) -> None:
    attributes: dict[str, Any] = {}
    _usage(attributes, data.usage)
    if _common.content_enabled():
        # Chat Completions messages (the SDK's ``input`` holds the system message too).
        if data.input:
            messages = _openai._chat_input(list(data.input))
            if messages is not None:
                attributes[sc.GEN_AI_INPUT_MESSAGES] = messages
            span.set_inputs(data.input)
        if data.output:
            messages = _openai._chat_input(list(data.output))
            if messages is not None:
                attributes[sc.GEN_AI_OUTPUT_MESSAGES] = messages
            span.set_output(data.output)
    span.set_attributes(attributes)


def _end_response(span: Span, data: ResponseSpanData) -> None:
    response = data.response
    content = _common.content_enabled()
    if response is not None:
        model = getattr(response, "model", None)
        if isinstance(model, str) and model:
            # The SDK's response span does not say which model was asked for: the span is
            # named after the one that answered.
            span.name = f"chat {model}"
        _openai._record_response(cast(Call, _CallView(span, content)), response)
        if content:
            span.set_output(response)
    if data.usage and (span.attributes or {}).get(sc.GEN_AI_USAGE_INPUT_TOKENS) is None:
        attributes: dict[str, Any] = {}
        _usage(attributes, data.usage)
        span.set_attributes(attributes)
    if content and data.input is not None:
        messages = _openai._responses_input(data.input)
        if messages is not None:
            span.set_attribute(sc.GEN_AI_INPUT_MESSAGES, messages)
        span.set_inputs(data.input)


def _record_error(span: Span, error: Any) -> None:
    """The SDK's error for a span: its message (and detail) as the status. The exception
    itself, when one is on its way out through the span's end, is recorded with its type as
    ``error.type``; otherwise (a tool error the SDK handled and sent back to the model) the
    SDK's message is the type, a short fixed text such as ``Error running tool``."""
    message = str(error.get("message") or "error") if isinstance(error, dict) else str(error)
    detail = error.get("data") if isinstance(error, dict) else None
    described = message
    if isinstance(detail, dict) and detail.get("error"):
        described = f"{message}: {detail['error']}"
    exc = sys.exc_info()[1]
    if exc is not None:
        span.record_exception(exc)
        span.set_attribute(sc.ERROR_TYPE, _common.error_type(exc))
    else:
        span.set_attribute(sc.ERROR_TYPE, message)
    span.set_status(StatusCode.ERROR, described)


# -- instrument / uninstrument ------------------------------------------------------------

_processor: Processor | None = None
# The processors the SDK had when instrument_openai_agents(keep_openai_export=False) replaced
# them, so uninstrument puts them back.
_replaced: list[TracingProcessor] | None = None


def _current_processors() -> list[TracingProcessor] | None:
    # The SDK has no public getter for its processor list; its default provider keeps it here.
    multi = getattr(get_trace_provider(), "_multi_processor", None)
    processors = getattr(multi, "_processors", None)
    return list(processors) if isinstance(processors, tuple) else None


def instrument_openai_agents(*, keep_openai_export: bool = True) -> Processor:
    """Record every Agents SDK trace and span as looptrace spans. Idempotent; returns the
    processor.

    ``keep_openai_export=True`` (the default) adds looptrace's processor next to the SDK's
    own, which goes on exporting traces to the OpenAI dashboard; ``False`` makes looptrace's
    the only processor (nothing is sent to OpenAI's tracing endpoint) until
    :func:`uninstrument_openai_agents` restores the SDK's processors."""
    global _processor, _replaced
    _common.load_prices()
    processor = _processor
    if processor is None:
        processor = _processor = Processor()
    processor.enabled = True
    current = _current_processors()
    if keep_openai_export:
        if current is None or processor not in current:
            get_trace_provider().register_processor(processor)
    else:
        if _replaced is None:
            _replaced = [p for p in current or () if p is not processor]
        set_trace_processors([processor])
    return processor


def uninstrument_openai_agents() -> None:
    """Stop recording Agents SDK traces; the SDK's own processors are as before
    :func:`instrument_openai_agents`."""
    global _replaced
    processor = _processor
    if processor is None:
        return
    processor.enabled = False
    if _replaced is not None:
        set_trace_processors(_replaced)
        _replaced = None
        return
    current = _current_processors()
    if current is not None and processor in current:
        set_trace_processors([p for p in current if p is not processor])
