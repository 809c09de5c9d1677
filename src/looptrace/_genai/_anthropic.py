"""The Anthropic client: ``messages.create`` (plain and ``stream=True``) and the
``messages.stream(...)`` context manager, sync and async.

Imported only by ``instrument_anthropic``: it imports the ``anthropic`` package.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import anthropic
from anthropic.resources.messages import AsyncMessages, Messages

from .. import _semconv as sc
from .._capture.start import _activate, _deactivate
from .._errors import internal_error
from . import _core
from ._core import (
    CACHE_CREATION,
    CACHE_READ,
    FINISH_REASONS,
    INPUT_MESSAGES,
    INPUT_TOKENS,
    OUTPUT_MESSAGES,
    OUTPUT_TOKENS,
    RESPONSE_ID,
    RESPONSE_MODEL,
    STREAMING,
    SYSTEM_INSTRUCTIONS,
    TOOL_DEFINITIONS,
    Call,
    Recorder,
    field,
    set_if,
)


def _parts(content: Any) -> list[Any]:
    # Blocks may be dicts or the SDK's models (a previous reply's content passed back).
    if isinstance(content, str):
        return [{"type": "text", "content": content}]
    parts: list[Any] = []
    if not isinstance(content, (list, tuple)):
        return parts
    for block in content:
        if not isinstance(block, Mapping):
            parts.append(_block_part(block))
            continue
        kind = block.get("type")
        if kind == "text":
            parts.append({"type": "text", "content": block.get("text")})
        elif kind == "tool_use":
            parts.append(
                {
                    "type": "tool_call",
                    "id": block.get("id"),
                    "name": block.get("name"),
                    "arguments": block.get("input"),
                }
            )
        elif kind == "tool_result":
            parts.append(
                {
                    "type": "tool_call_response",
                    "id": block.get("tool_use_id"),
                    "response": block.get("content"),
                }
            )
        else:
            parts.append(block)
    return parts


def _block_part(block: Any) -> Any:
    """A content block of a response (a pydantic model) as a GenAI message part."""
    kind = getattr(block, "type", None)
    if kind == "text":
        return {"type": "text", "content": block.text}
    if kind == "tool_use":
        return {"type": "tool_call", "id": block.id, "name": block.name, "arguments": block.input}
    if kind == "thinking":
        return {"type": "reasoning", "content": block.thinking}
    return block


def _messages(messages: list[Any] | tuple[Any, ...]) -> list[dict[str, Any]]:
    out = []
    for message in messages:
        role = field(message, "role")
        out.append(
            {
                "role": role if isinstance(role, str) else str(role),
                "parts": _parts(field(message, "content")),
            }
        )
    return out


def _begin(resource: Any, kwargs: dict[str, Any], stream: bool = False) -> Call:
    model = kwargs.get("model")
    model = model if isinstance(model, str) else ""
    attributes = _core.base_attributes(
        resource, sc.GEN_AI_PROVIDER_ANTHROPIC, sc.GEN_AI_OP_CHAT, model, sc.OI_LLM
    )
    get = kwargs.get
    set_if(attributes, sc.GEN_AI_REQUEST_MAX_TOKENS, get("max_tokens"))
    set_if(attributes, sc.GEN_AI_REQUEST_TEMPERATURE, get("temperature"))
    set_if(attributes, sc.GEN_AI_REQUEST_TOP_P, get("top_p"))
    set_if(attributes, sc.GEN_AI_REQUEST_TOP_K, get("top_k"))
    set_if(attributes, sc.GEN_AI_REQUEST_STOP_SEQUENCES, get("stop_sequences"))
    tools = get("tools")
    if isinstance(tools, (list, tuple)) and tools:
        attributes[TOOL_DEFINITIONS] = list(tools)
    if stream or get("stream") is True:
        attributes[STREAMING] = True
    content = _core.content_enabled()
    if content:
        messages = get("messages")
        if isinstance(messages, (list, tuple)):
            converted = _core.converted(_messages, messages)
            if converted is not None:
                attributes[INPUT_MESSAGES] = converted
        system = get("system")
        if isinstance(system, (str, list, tuple)):
            instructions = _core.converted(_parts, system)
            if instructions is not None:
                attributes[SYSTEM_INSTRUCTIONS] = instructions
    call = Call(f"chat {model}" if model else "chat", attributes, content)
    if call.content:
        call.span.set_inputs(_core.request_inputs(kwargs))
    return call


def _begin_stream(resource: Any, kwargs: dict[str, Any]) -> Call:
    return _begin(resource, kwargs, stream=True)


def _usage(span: Any, usage: Any) -> None:
    if usage is None:
        return
    total = 0
    for name, attribute in (
        ("cache_read_input_tokens", CACHE_READ),
        ("cache_creation_input_tokens", CACHE_CREATION),
    ):
        value = getattr(usage, name, None)
        if isinstance(value, int) and value:
            span.set_attribute(attribute, value)
            total += value
    value = getattr(usage, "input_tokens", None)
    if isinstance(value, int):
        # The GenAI conventions count cached input in the input tokens; Anthropic does not.
        span.set_attribute(INPUT_TOKENS, value + total)
    value = getattr(usage, "output_tokens", None)
    if isinstance(value, int):
        span.set_attribute(OUTPUT_TOKENS, value)


def _done(call: Call, kwargs: dict[str, Any], result: Any) -> Any:
    if isinstance(result, anthropic.Stream):
        return _core.SyncStream(result, _MessagesStream(call))
    if isinstance(result, anthropic.AsyncStream):
        return _core.AsyncStream(result, _MessagesStream(call))
    span = call.span
    span.set_attribute(RESPONSE_ID, getattr(result, "id", None) or "")
    span.set_attribute(RESPONSE_MODEL, getattr(result, "model", None) or "")
    reason = getattr(result, "stop_reason", None)
    span.set_attribute(FINISH_REASONS, [str(reason)] if reason else [])
    _usage(span, getattr(result, "usage", None))
    if call.content:
        parts = [_block_part(b) for b in getattr(result, "content", None) or ()]
        span.set_attribute(
            OUTPUT_MESSAGES, [{"role": "assistant", "parts": parts, "finish_reason": reason}]
        )
        span.set_output(result)  # a pydantic model: serialized at export, off this path
    call.end()
    return result


class _MessagesStream(Recorder):
    __slots__ = ("blocks", "id", "input_usage", "model", "output_tokens", "stop_reason")

    def __init__(self, call: Call) -> None:
        super().__init__(call)
        # Per content block: [kind, text fragments, tool id, tool name].
        self.blocks: dict[int, list[Any]] = {}
        self.id = ""
        self.model = ""
        self.stop_reason: str | None = None
        self.input_usage: Any = None
        self.output_tokens: int | None = None

    def on_chunk(self, event: Any) -> None:
        kind = event.type
        if kind == "content_block_delta":
            if not self.call.first_ns:
                self.call.first_token()
            block = self.blocks.get(event.index)
            if block is None:
                block = self.blocks[event.index] = ["text", [], None, None]
            delta = event.delta
            delta_kind = delta.type
            if delta_kind == "text_delta":
                block[1].append(delta.text)
            elif delta_kind == "input_json_delta":
                block[1].append(delta.partial_json)
            elif delta_kind == "thinking_delta":
                block[1].append(delta.thinking)
        elif kind == "content_block_start":
            cb = event.content_block
            cb_kind = cb.type
            if cb_kind == "tool_use":
                self.blocks[event.index] = ["tool_use", [], cb.id, cb.name]
            elif cb_kind == "thinking":
                self.blocks[event.index] = ["thinking", [], None, None]
            else:
                self.blocks[event.index] = [cb_kind, [], None, None]
        elif kind == "message_start":
            message = event.message
            self.id = message.id
            self.model = message.model
            self.input_usage = message.usage
        elif kind == "message_delta":
            if event.delta.stop_reason:
                self.stop_reason = event.delta.stop_reason
            if event.usage is not None:
                self.output_tokens = event.usage.output_tokens

    def complete(self) -> None:
        call = self.call
        span = call.span
        span.set_attribute(RESPONSE_ID, self.id)
        span.set_attribute(RESPONSE_MODEL, self.model)
        reason = self.stop_reason
        span.set_attribute(FINISH_REASONS, [reason] if reason else [])
        _usage(span, self.input_usage)
        if self.output_tokens is not None:
            span.set_attribute(OUTPUT_TOKENS, self.output_tokens)
        if not call.content:
            return
        parts: list[Any] = []
        texts: list[str] = []
        tool_calls = []
        for index in sorted(self.blocks):
            kind, fragments, tool_id, tool_name = self.blocks[index]
            joined = "".join(fragments)
            if kind == "tool_use":
                part = {"type": "tool_call", "id": tool_id, "name": tool_name, "arguments": joined}
                parts.append(part)
                tool_calls.append(part)
            elif kind == "thinking":
                parts.append({"type": "reasoning", "content": joined})
            elif kind == "text":
                parts.append({"type": "text", "content": joined})
                texts.append(joined)
        span.set_attribute(
            OUTPUT_MESSAGES, [{"role": "assistant", "parts": parts, "finish_reason": reason}]
        )
        span.set_output(
            {
                "role": "assistant",
                "content": "".join(texts),
                "tool_calls": tool_calls,
                "stop_reason": reason,
            }
        )


# -- messages.stream(...) -------------------------------------------------------------------


def _adopt(stream: Any, call: Call, proxy: type) -> None:
    """Make the helper's MessageStream read its events through a recording proxy, so its
    ``text_stream``, ``get_final_message()`` and iteration all feed the span."""
    try:
        stream._raw_stream = proxy(stream._raw_stream, _MessagesStream(call))
    except Exception as exc:
        internal_error("genai.anthropic.stream", exc)


class _StreamManager:
    __slots__ = ("_call", "_kwargs", "_manager", "_resource")

    def __init__(self, manager: Any, resource: Any, kwargs: dict[str, Any]) -> None:
        self._manager = manager
        self._resource = resource
        self._kwargs = kwargs
        self._call: Call | None = None

    def __enter__(self) -> Any:
        call = _core._safe_begin(_begin_stream, self._resource, self._kwargs)
        if call is None:
            return self._manager.__enter__()
        tokens = _activate(call.span)
        try:
            stream = self._manager.__enter__()
        except BaseException as exc:
            call.end(exc)
            raise
        finally:
            _deactivate(tokens)
        self._call = call
        _adopt(stream, call, _core.SyncStream)
        return stream

    def __exit__(self, *exc_info: Any) -> Any:
        try:
            return self._manager.__exit__(*exc_info)
        finally:
            if self._call is not None and not self._call.done:
                self._call.end()

    async def __aenter__(self) -> Any:
        call = _core._safe_begin(_begin_stream, self._resource, self._kwargs)
        if call is None:
            return await self._manager.__aenter__()
        tokens = _activate(call.span)
        try:
            stream = await self._manager.__aenter__()
        except BaseException as exc:
            call.end(exc)
            raise
        finally:
            _deactivate(tokens)
        self._call = call
        _adopt(stream, call, _core.AsyncStream)
        return stream

    async def __aexit__(self, *exc_info: Any) -> Any:
        try:
            return await self._manager.__aexit__(*exc_info)
        finally:
            if self._call is not None and not self._call.done:
                self._call.end()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._manager, name)


def _wrap_stream(original: Any) -> Any:
    @functools.wraps(original)
    def stream(self: Any, *args: Any, **kwargs: Any) -> Any:
        manager = original(self, *args, **kwargs)
        return _StreamManager(manager, self, kwargs)

    stream.__looptrace_original__ = original  # type: ignore[attr-defined]
    return stream


# (resource class, method, begin, done, path from the client to the resource object)
TARGETS: tuple[tuple[type, str, _core.Begin, _core.Done, tuple[str, ...]], ...] = (
    (Messages, "create", _begin, _done, ("messages",)),
    (AsyncMessages, "create", _begin, _done, ("messages",)),
)
# The stream helpers, wrapped by _wrap_stream.
STREAM_TARGETS: tuple[tuple[type, str, tuple[str, ...]], ...] = (
    (Messages, "stream", ("messages",)),
    (AsyncMessages, "stream", ("messages",)),
)
