"""LiteLLM calls as looptrace spans (the ``litellm`` extra).

:func:`instrument_litellm` adds a :class:`Callback` (LiteLLM's ``CustomLogger``) to LiteLLM's
callbacks. Every ``completion`` / ``acompletion`` (plain or streamed) then ends as one LLM
CLIENT span, ``chat {model}``, with the provider, model, server, tokens, messages, finish
reasons, LiteLLM's own cost (``llm.cost.*`` from its ``response_cost``), and on failure the
exception and ``error.type``.

Why the callback interface and not LiteLLM's OpenTelemetry integration: the callback is called
in a copy of the calling context (LiteLLM copies it into the task or thread that logs), so the
span's parent is the caller's active looptrace span, and the span is made from values LiteLLM
already computed (no second cost lookup); LiteLLM's OpenTelemetry logger needs the
OpenTelemetry SDK's tracer provider, which looptrace's bridge is not. The span is recorded once the call is over, with LiteLLM's start and end times: spans
started inside the call (an instrumented OpenAI SDK underneath) are its siblings, not
children.

The callback only builds a span from references and ends it: it does no I/O and never waits,
so it cannot stall ``acompletion`` (LiteLLM runs its async callbacks as tasks of the caller's
loop, and the sync ones on a logging thread of its own).
"""

from __future__ import annotations

import datetime
import threading
from typing import Any

import litellm
from litellm.integrations.custom_logger import CustomLogger

from .. import _semconv as sc
from .. import _state
from .._capture.context import CURRENT
from .._capture.spans import SpanKind
from .._capture.start import start_scoped_span
from .._genai import _openai
from . import _common
from ._common import guarded

__all__ = ["Callback", "instrument_litellm", "uninstrument_litellm"]

FRAMEWORK = "litellm"

_SAMPLING = {
    "temperature": sc.GEN_AI_REQUEST_TEMPERATURE,
    "top_p": sc.GEN_AI_REQUEST_TOP_P,
    "max_tokens": sc.GEN_AI_REQUEST_MAX_TOKENS,
    "max_completion_tokens": sc.GEN_AI_REQUEST_MAX_TOKENS,
    "frequency_penalty": sc.GEN_AI_REQUEST_FREQUENCY_PENALTY,
    "presence_penalty": sc.GEN_AI_REQUEST_PRESENCE_PENALTY,
    "seed": sc.GEN_AI_REQUEST_SEED,
    "n": sc.GEN_AI_REQUEST_CHOICE_COUNT,
}


def _ns(value: Any) -> int | None:
    if isinstance(value, datetime.datetime):
        return int(value.timestamp() * 1e9)
    if isinstance(value, (int, float)) and value > 0:
        return int(value * 1e9)
    return None


def _server(api_base: Any) -> tuple[str, int] | None:
    if not isinstance(api_base, str) or "://" not in api_base:
        return None
    scheme, _, rest = api_base.partition("://")
    hostport = rest.partition("/")[0]
    host, sep, port = hostport.rpartition(":")
    if sep and port.isdigit():
        return host, int(port)
    return hostport, 443 if scheme == "https" else 80


class Callback(CustomLogger):
    """A LiteLLM callback that records each call as a looptrace span: add it with
    :func:`instrument_litellm` (or ``litellm.callbacks.append(Callback())``)."""

    def log_success_event(
        self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        _record(kwargs, response_obj, start_time, end_time, None)

    async def async_log_success_event(
        self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        _record(kwargs, response_obj, start_time, end_time, None)

    def log_failure_event(
        self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        _record(kwargs, response_obj, start_time, end_time, _exception(kwargs))

    async def async_log_failure_event(
        self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        _record(kwargs, response_obj, start_time, end_time, _exception(kwargs))


def _exception(kwargs: Any) -> BaseException:
    exc = kwargs.get("exception") if isinstance(kwargs, dict) else None
    if isinstance(exc, BaseException):
        return exc
    return RuntimeError(str(exc) if exc is not None else "LiteLLM call failed")


@guarded("integrations.litellm.record")
def _record(
    kwargs: Any,
    response: Any,
    start_time: Any,
    end_time: Any,
    exc: BaseException | None,
) -> None:
    if _state.disabled or not isinstance(kwargs, dict):
        return
    log = kwargs.get("standard_logging_object")
    log = log if isinstance(log, dict) else {}
    params = kwargs.get("litellm_params")
    params = params if isinstance(params, dict) else {}
    model = log.get("model") or kwargs.get("model") or ""
    provider = _common.provider_name(
        log.get("custom_llm_provider") or kwargs.get("custom_llm_provider")
    )
    attributes = _common.llm_attributes(sc.GEN_AI_OP_CHAT, provider, model)
    attributes[sc.FRAMEWORK] = FRAMEWORK
    call_id = kwargs.get("litellm_call_id")
    if isinstance(call_id, str):
        attributes[sc.FRAMEWORK_RUN_ID] = call_id
    optional = kwargs.get("optional_params")
    if isinstance(optional, dict):
        for key, value in optional.items():
            name = _SAMPLING.get(key)
            if name is not None and isinstance(value, (int, float)):
                attributes[name] = value
        if optional.get("stream") is True:
            attributes[sc.GEN_AI_REQUEST_STREAM] = True
    if kwargs.get("stream") is True:
        attributes[sc.GEN_AI_REQUEST_STREAM] = True
    hidden = log.get("hidden_params")
    api_base = params.get("api_base") or log.get("api_base")
    if not api_base and isinstance(hidden, dict):
        api_base = hidden.get("api_base")
    server = _server(api_base)
    if server is not None:
        attributes[sc.SERVER_ADDRESS], attributes[sc.SERVER_PORT] = server

    # The caller's active span: LiteLLM calls back in a copy of the context of the call.
    parent = CURRENT.get()
    bridge = _state.bridge
    if bridge is not None:
        parent = bridge.parent(parent)
    start_ns = _ns(start_time)
    name = f"{sc.GEN_AI_OP_CHAT} {model}" if model else sc.GEN_AI_OP_CHAT
    span = start_scoped_span(name, attributes, parent, SpanKind.CLIENT, None, start_ns)
    if not span.is_recording:
        return
    try:
        content = _common.content_enabled()
        messages = kwargs.get("messages")
        if content and isinstance(messages, list):
            converted = _openai._chat_input(messages)
            if converted is not None:
                span.set_attribute(sc.GEN_AI_INPUT_MESSAGES, converted)
            span.set_inputs(messages)
        first = _ns(kwargs.get("completion_start_time"))
        if attributes.get(sc.GEN_AI_REQUEST_STREAM) and first and start_ns and first > start_ns:
            span.set_attribute(sc.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK, (first - start_ns) / 1e9)
        if exc is not None:
            _common.fail(span, exc)
        else:
            _record_response(span, response, content)
            _record_cost(span, kwargs, log)
    finally:
        span.end(_ns(end_time))


def _record_response(span: Any, response: Any, content: bool) -> None:
    attributes: dict[str, Any] = {}
    response_id = getattr(response, "id", None)
    if isinstance(response_id, str) and response_id:
        attributes[sc.GEN_AI_RESPONSE_ID] = response_id
    response_model = getattr(response, "model", None)
    if isinstance(response_model, str) and response_model:
        attributes[sc.GEN_AI_RESPONSE_MODEL] = response_model
    choices = getattr(response, "choices", None) or ()
    reasons = [c.finish_reason for c in choices if getattr(c, "finish_reason", None)]
    if reasons:
        attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS] = [str(r) for r in reasons]
    usage = getattr(response, "usage", None)
    if usage is not None:
        _common.set_usage(
            attributes,
            getattr(usage, "prompt_tokens", None),
            getattr(usage, "completion_tokens", None),
            getattr(getattr(usage, "prompt_tokens_details", None), "cached_tokens", None),
            getattr(usage, "cache_creation_input_tokens", None),
            getattr(getattr(usage, "completion_tokens_details", None), "reasoning_tokens", None),
        )
    if content and choices:
        messages = []
        for choice in choices:
            message = getattr(choice, "message", None)
            if message is None:
                continue
            converted = _openai._chat_input([message])
            if converted:
                entry = converted[0]
                entry["finish_reason"] = getattr(choice, "finish_reason", None)
                messages.append(entry)
        if messages:
            attributes[sc.GEN_AI_OUTPUT_MESSAGES] = messages
        span.set_output(response)
    span.set_attributes(attributes)


def _record_cost(span: Any, kwargs: dict[str, Any], log: dict[str, Any]) -> None:
    """LiteLLM's own price of the call, when it has one; else genai-prices' table."""
    total = log.get("response_cost", kwargs.get("response_cost"))
    if isinstance(total, (int, float)) and not isinstance(total, bool) and total > 0:
        cost = {sc.LLM_COST_TOTAL: float(total)}
        breakdown = log.get("cost_breakdown")
        if isinstance(breakdown, dict):
            prompt, completion = breakdown.get("input_cost"), breakdown.get("output_cost")
            if isinstance(prompt, (int, float)):
                cost[sc.LLM_COST_PROMPT] = float(prompt)
            if isinstance(completion, (int, float)):
                cost[sc.LLM_COST_COMPLETION] = float(completion)
        span.set_attributes(cost)
    else:
        _common.price(span)


# -- instrument / uninstrument ------------------------------------------------------------

_callback: Callback | None = None
_lock = threading.Lock()


def instrument_litellm() -> Callback:
    """Record every LiteLLM ``completion`` / ``acompletion`` as a looptrace span. Idempotent;
    returns the callback. :func:`uninstrument_litellm` undoes it."""
    global _callback
    _common.load_prices()
    with _lock:
        if _callback is None:
            _callback = Callback()
        if _callback not in litellm.callbacks:
            litellm.logging_callback_manager.add_litellm_callback(_callback)
        return _callback


def uninstrument_litellm() -> None:
    """Remove looptrace's callback from every LiteLLM callback list."""
    with _lock:
        if _callback is not None:
            litellm.logging_callback_manager.remove_callback_from_all_lists(_callback)
