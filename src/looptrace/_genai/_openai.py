"""The OpenAI client: ``chat.completions.create``, ``responses.create`` and
``embeddings.create``, plain and streamed, sync and async.

Imported only by ``instrument_openai``: it imports the ``openai`` package.
"""

from __future__ import annotations

from typing import Any

import openai
from openai.resources.chat.completions import AsyncCompletions, Completions
from openai.resources.embeddings import AsyncEmbeddings, Embeddings
from openai.resources.responses import AsyncResponses, Responses

from .. import _semconv as sc
from . import _core
from ._core import (
    CACHE_READ,
    FINISH_REASONS,
    INPUT_MESSAGES,
    INPUT_TOKENS,
    OUTPUT_MESSAGES,
    OUTPUT_TOKENS,
    REASONING,
    RESPONSE_ID,
    RESPONSE_MODEL,
    STREAMING,
    SYSTEM_INSTRUCTIONS,
    TOOL_DEFINITIONS,
    Call,
    Recorder,
    field,
    set_count,
    set_if,
)


def _base(resource: Any, operation: str, kwargs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    model = kwargs.get("model")
    model = model if isinstance(model, str) else ""
    kind = sc.OI_EMBEDDING if operation == sc.GEN_AI_OP_EMBEDDINGS else sc.OI_LLM
    attributes = _core.base_attributes(resource, sc.GEN_AI_PROVIDER_OPENAI, operation, model, kind)
    return (f"{operation} {model}" if model else operation), attributes


# Request arguments recorded as attributes (the GenAI name of each).
_PARAMETERS = {
    "temperature": sc.GEN_AI_REQUEST_TEMPERATURE,
    "top_p": sc.GEN_AI_REQUEST_TOP_P,
    "max_tokens": sc.GEN_AI_REQUEST_MAX_TOKENS,
    "max_completion_tokens": sc.GEN_AI_REQUEST_MAX_TOKENS,
    "max_output_tokens": sc.GEN_AI_REQUEST_MAX_TOKENS,
    "frequency_penalty": sc.GEN_AI_REQUEST_FREQUENCY_PENALTY,
    "presence_penalty": sc.GEN_AI_REQUEST_PRESENCE_PENALTY,
    "seed": sc.GEN_AI_REQUEST_SEED,
    "n": sc.GEN_AI_REQUEST_CHOICE_COUNT,
    "stop": sc.GEN_AI_REQUEST_STOP_SEQUENCES,
}


def _sampling(attributes: dict[str, Any], kwargs: dict[str, Any]) -> None:
    # One pass over the arguments given (a handful), not a lookup per parameter known.
    for key, value in kwargs.items():
        name = _PARAMETERS.get(key)
        if name is not None:
            set_if(attributes, name, [value] if key == "stop" and type(value) is str else value)
        elif key == "tools":
            if isinstance(value, (list, tuple)) and value:
                attributes[TOOL_DEFINITIONS] = list(value)
        elif key == "stream" and value is True:
            attributes[STREAMING] = True


# Where each API's usage object keeps its counts: (input, output, input details, output details).
_CHAT_USAGE = (
    "prompt_tokens",
    "completion_tokens",
    "prompt_tokens_details",
    "completion_tokens_details",
)
_RESPONSES_USAGE = (
    "input_tokens",
    "output_tokens",
    "input_tokens_details",
    "output_tokens_details",
)


def _usage(attributes: dict[str, Any], usage: Any, names: tuple[str, str, str, str]) -> None:
    """Token counts; OpenAI's input count already includes the cached tokens, and its output
    count the reasoning tokens, as the GenAI conventions count them."""
    if usage is None:
        return
    value = getattr(usage, names[0], None)
    if isinstance(value, int):
        attributes[INPUT_TOKENS] = value
    value = getattr(usage, names[1], None)
    if isinstance(value, int):
        attributes[OUTPUT_TOKENS] = value
    set_count(
        attributes, CACHE_READ, getattr(getattr(usage, names[2], None), "cached_tokens", None)
    )
    details = getattr(usage, names[3], None)
    set_count(attributes, REASONING, getattr(details, "reasoning_tokens", None))


_TEXT_PARTS = frozenset(("text", "input_text", "output_text"))


def _text_parts(content: Any) -> list[Any]:
    # A part may be a dict or the SDK's own model (content passed back from a response).
    if isinstance(content, str):
        return [{"type": "text", "content": content}]
    parts: list[Any] = []
    if isinstance(content, (list, tuple)):
        for part in content:
            if field(part, "type") in _TEXT_PARTS:
                parts.append({"type": "text", "content": field(part, "text")})
            else:
                parts.append(part)
    return parts


def _role(message: Any) -> str:
    role = field(message, "role")
    return role if isinstance(role, str) else str(role)


# -- chat.completions -----------------------------------------------------------------------


def _chat_input(messages: Any) -> list[dict[str, Any]] | None:
    """Each message, its tool calls and their function may be a dict or the SDK's model (a
    previous ``ChatCompletionMessage`` and its ``ChatCompletionMessageToolCall`` objects are
    commonly passed back in a tool loop)."""
    if not isinstance(messages, (list, tuple)):
        return None  # an iterator would be consumed here and not reach the API
    out: list[dict[str, Any]] = []
    for message in messages:
        role = field(message, "role")
        if role is None and field(message, "type") is not None:
            # A Responses API item (a function call, its output) among chat messages: an
            # Agents SDK model of the user's own may record those in its generation span.
            out.extend(_responses_input((message,)) or ())
            continue
        role = role if isinstance(role, str) else str(role)
        if role == "tool":
            parts: list[Any] = [
                {
                    "type": "tool_call_response",
                    "id": field(message, "tool_call_id"),
                    "response": field(message, "content"),
                }
            ]
        else:
            parts = _text_parts(field(message, "content"))
            for tool_call in field(message, "tool_calls") or ():
                parts.append(_tool_call_part(tool_call))
        out.append({"role": role, "parts": parts})
    return out


def _begin_chat(resource: Any, kwargs: dict[str, Any]) -> Call:
    name, attributes = _base(resource, sc.GEN_AI_OP_CHAT, kwargs)
    _sampling(attributes, kwargs)
    content = _core.content_enabled()
    if content:
        messages = _core.converted(_chat_input, kwargs.get("messages"))
        if messages is not None:
            attributes[INPUT_MESSAGES] = messages
    call = Call(name, attributes, content)
    if call.content:
        call.span.set_inputs(_core.request_inputs(kwargs))
    return call


def _tool_call_part(tool_call: Any) -> dict[str, Any]:
    function = field(tool_call, "function")
    return {
        "type": "tool_call",
        "id": field(tool_call, "id"),
        "name": field(function, "name"),
        "arguments": field(function, "arguments"),
    }


def _done_chat(call: Call, kwargs: dict[str, Any], result: Any) -> Any:
    if isinstance(result, openai.Stream):
        return _core.SyncStream(result, _ChatStream(call))
    if isinstance(result, openai.AsyncStream):
        return _core.AsyncStream(result, _ChatStream(call))
    span = call.span
    choices = getattr(result, "choices", None) or ()
    attributes: dict[str, Any] = {
        RESPONSE_ID: getattr(result, "id", None) or "",
        RESPONSE_MODEL: getattr(result, "model", None) or "",
        FINISH_REASONS: [str(c.finish_reason) for c in choices if c.finish_reason],
    }
    _usage(attributes, getattr(result, "usage", None), _CHAT_USAGE)
    span.set_attributes(attributes)
    if call.content:
        messages = []
        for choice in choices:
            message = choice.message
            parts = _text_parts(message.content) if message.content else []
            parts.extend(_tool_call_part(t) for t in message.tool_calls or ())
            messages.append(
                {"role": message.role, "parts": parts, "finish_reason": choice.finish_reason}
            )
        span.set_attribute(OUTPUT_MESSAGES, messages)
        span.set_output(result)  # a pydantic model: serialized at export, off this path
    call.end()
    return result


class _ChatStream(Recorder):
    __slots__ = ("finish_reasons", "id", "model", "texts", "tools", "usage")

    def __init__(self, call: Call) -> None:
        super().__init__(call)
        self.texts: dict[int, list[str]] = {}
        # choice index -> tool call index -> [id, name, argument fragments]
        self.tools: dict[int, dict[int, list[Any]]] = {}
        self.finish_reasons: dict[int, str] = {}
        self.id = ""
        self.model = ""
        self.usage: Any = None

    def on_chunk(self, chunk: Any) -> None:
        if not self.id:
            self.id = chunk.id or ""
            self.model = chunk.model or ""
        if chunk.usage is not None:
            self.usage = chunk.usage
        for choice in chunk.choices:
            delta = choice.delta
            text = delta.content
            if text:
                if not self.call.first_ns:
                    self.call.first_token()
                texts = self.texts.get(choice.index)
                if texts is None:
                    self.texts[choice.index] = [text]
                else:
                    texts.append(text)
            if delta.tool_calls:
                if not self.call.first_ns:
                    self.call.first_token()
                tools = self.tools.setdefault(choice.index, {})
                for tool_call in delta.tool_calls:
                    entry = tools.get(tool_call.index)
                    if entry is None:
                        entry = tools[tool_call.index] = [None, None, []]
                    if tool_call.id:
                        entry[0] = tool_call.id
                    function = tool_call.function
                    if function is not None:
                        if function.name:
                            entry[1] = function.name
                        if function.arguments:
                            entry[2].append(function.arguments)
            if choice.finish_reason:
                self.finish_reasons[choice.index] = choice.finish_reason

    def complete(self) -> None:
        call = self.call
        reasons = self.finish_reasons
        attributes: dict[str, Any] = {
            RESPONSE_ID: self.id,
            RESPONSE_MODEL: self.model,
            FINISH_REASONS: [reasons[i] for i in sorted(reasons)],
        }
        _usage(attributes, self.usage, _CHAT_USAGE)
        outputs: list[dict[str, Any]] = []
        if call.content:
            messages: list[dict[str, Any]] = []
            for index in sorted(self.texts.keys() | self.tools.keys()):
                text = "".join(self.texts.get(index, ()))
                calls = [
                    {"type": "tool_call", "id": tool_id, "name": name, "arguments": "".join(args)}
                    for _, (tool_id, name, args) in sorted(self.tools.get(index, {}).items())
                ]
                parts: list[Any] = [{"type": "text", "content": text}] if text else []
                parts += calls
                reason = reasons.get(index)
                messages.append({"role": "assistant", "parts": parts, "finish_reason": reason})
                outputs.append(
                    {
                        "role": "assistant",
                        "content": text,
                        "tool_calls": calls,
                        "finish_reason": reason,
                    }
                )
            attributes[OUTPUT_MESSAGES] = messages
        span = call.span
        span.set_attributes(attributes)
        if outputs:
            span.set_output(outputs[0] if len(outputs) == 1 else outputs)


# -- responses ------------------------------------------------------------------------------


def _responses_input(value: Any) -> list[dict[str, Any]] | None:
    if isinstance(value, str):
        return [{"role": "user", "parts": [{"type": "text", "content": value}]}]
    if not isinstance(value, (list, tuple)):
        return None
    # Items may be dicts or the SDK's models (a previous response's ``output`` passed back).
    out: list[dict[str, Any]] = []
    for item in value:
        kind = field(item, "type")
        if kind == "function_call_output":
            part: dict[str, Any] = {
                "type": "tool_call_response",
                "id": field(item, "call_id"),
                "response": field(item, "output"),
            }
            out.append({"role": "tool", "parts": [part]})
        elif kind == "function_call":
            part = {
                "type": "tool_call",
                "id": field(item, "call_id"),
                "name": field(item, "name"),
                "arguments": field(item, "arguments"),
            }
            out.append({"role": "assistant", "parts": [part]})
        elif kind in (None, "message"):
            out.append({"role": _role(item), "parts": _text_parts(field(item, "content"))})
        else:  # the model's own output items (reasoning, built-in tool calls), as given
            out.append({"role": "assistant", "parts": [item]})
    return out


def _begin_responses(resource: Any, kwargs: dict[str, Any]) -> Call:
    name, attributes = _base(resource, sc.GEN_AI_OP_CHAT, kwargs)
    _sampling(attributes, kwargs)
    content = _core.content_enabled()
    if content:
        messages = _core.converted(_responses_input, kwargs.get("input"))
        if messages is not None:
            attributes[INPUT_MESSAGES] = messages
        instructions = kwargs.get("instructions")
        if isinstance(instructions, str):
            attributes[SYSTEM_INSTRUCTIONS] = [{"type": "text", "content": instructions}]
    call = Call(name, attributes, content)
    if call.content:
        call.span.set_inputs(_core.request_inputs(kwargs))
    return call


def _record_response(call: Call, response: Any, text: str | None = None) -> None:
    """Everything a final Response object says; ``text`` is the streamed text, when known."""
    span = call.span
    attributes: dict[str, Any] = {
        RESPONSE_ID: getattr(response, "id", None) or "",
        RESPONSE_MODEL: getattr(response, "model", None) or "",
    }
    _usage(attributes, getattr(response, "usage", None), _RESPONSES_USAGE)
    span.set_attributes(attributes)
    parts: list[Any] = []
    has_tool_call = False
    for item in getattr(response, "output", None) or ():
        kind = getattr(item, "type", None)
        if kind == "message" and text is None:
            for piece in item.content or ():
                if getattr(piece, "type", None) == "output_text":
                    parts.append({"type": "text", "content": piece.text})
        elif kind == "function_call":
            has_tool_call = True
            parts.append(
                {
                    "type": "tool_call",
                    "id": item.call_id,
                    "name": item.name,
                    "arguments": item.arguments,
                }
            )
    if text:
        parts.insert(0, {"type": "text", "content": text})
    status = getattr(response, "status", None)
    details = getattr(response, "incomplete_details", None)
    if status == "incomplete" and details is not None and details.reason:
        reason = str(details.reason)
    elif status == "completed":
        reason = "tool_call" if has_tool_call else "stop"
    else:
        reason = str(status)
    span.set_attribute(FINISH_REASONS, [reason])
    if call.content:
        span.set_attribute(
            OUTPUT_MESSAGES, [{"role": "assistant", "parts": parts, "finish_reason": reason}]
        )


def _done_responses(call: Call, kwargs: dict[str, Any], result: Any) -> Any:
    if isinstance(result, openai.Stream):
        return _core.SyncStream(result, _ResponsesStream(call))
    if isinstance(result, openai.AsyncStream):
        return _core.AsyncStream(result, _ResponsesStream(call))
    _record_response(call, result)
    if call.content:
        call.span.set_output(result)
    call.end()
    return result


class _ResponsesStream(Recorder):
    __slots__ = ("response", "texts")

    def __init__(self, call: Call) -> None:
        super().__init__(call)
        self.texts: list[str] = []
        self.response: Any = None

    def on_chunk(self, event: Any) -> None:
        kind = event.type
        if kind == "response.output_text.delta":
            if not self.call.first_ns:
                self.call.first_token()
            self.texts.append(event.delta)
        elif kind == "response.function_call_arguments.delta":
            if not self.call.first_ns:
                self.call.first_token()
        elif kind in (
            "response.created",
            "response.completed",
            "response.incomplete",
            "response.failed",
        ):
            self.response = event.response

    def complete(self) -> None:
        call = self.call
        text = "".join(self.texts)
        if self.response is not None:
            _record_response(call, self.response, text)
        if call.content:
            call.span.set_output({"role": "assistant", "content": text})


# -- embeddings -----------------------------------------------------------------------------


def _begin_embeddings(resource: Any, kwargs: dict[str, Any]) -> Call:
    name, attributes = _base(resource, sc.GEN_AI_OP_EMBEDDINGS, kwargs)
    encoding = kwargs.get("encoding_format")
    if isinstance(encoding, str):
        attributes[sc.GEN_AI_REQUEST_ENCODING_FORMATS] = [encoding]
    set_if(attributes, sc.GEN_AI_EMBEDDINGS_DIMENSION_COUNT, kwargs.get("dimensions"))
    content = _core.content_enabled()
    call = Call(name, attributes, content)
    if call.content:
        call.span.set_inputs(_core.request_inputs(kwargs))
    return call


def _done_embeddings(call: Call, kwargs: dict[str, Any], result: Any) -> Any:
    span = call.span
    attributes: dict[str, Any] = {RESPONSE_MODEL: getattr(result, "model", None) or ""}
    _usage(attributes, getattr(result, "usage", None), _CHAT_USAGE)
    span.set_attributes(attributes)
    data = getattr(result, "data", None) or ()
    if data:
        dimensions = len(data[0].embedding)
        span.set_attribute(sc.GEN_AI_EMBEDDINGS_DIMENSION_COUNT, dimensions)
        # The vectors are bulky and say little in a trace: their shape is the output.
        span.set_output({"embeddings": len(data), "dimensions": dimensions})
    call.end()
    return result


# -- wiring ---------------------------------------------------------------------------------

# (resource class, method, begin, done, path from the client to the resource object)
TARGETS: tuple[tuple[type, str, _core.Begin, _core.Done, tuple[str, ...]], ...] = (
    (Completions, "create", _begin_chat, _done_chat, ("chat", "completions")),
    (AsyncCompletions, "create", _begin_chat, _done_chat, ("chat", "completions")),
    (Responses, "create", _begin_responses, _done_responses, ("responses",)),
    (AsyncResponses, "create", _begin_responses, _done_responses, ("responses",)),
    (Embeddings, "create", _begin_embeddings, _done_embeddings, ("embeddings",)),
    (AsyncEmbeddings, "create", _begin_embeddings, _done_embeddings, ("embeddings",)),
)
