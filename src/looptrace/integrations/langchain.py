"""LangChain and LangGraph runs as looptrace spans (the ``langchain`` extra).

:class:`Handler` is a LangChain callback handler. :func:`instrument_langchain` registers one
for every run of the process (through ``langchain_core``'s configure hook, the mechanism its
own tracers use), or pass one per call: ``chain.invoke(x, config={"callbacks": [Handler()]})``.
Either way each run becomes a span, parented by LangChain's ``parent_run_id`` (so parallel
branches and LangGraph's nodes nest as they ran) and, for a top-level run, under the caller's
active looptrace span:

    chain / runnable / graph / node   {run name}            CHAIN      inputs, outputs (long
                                                                       lists summarized), node
    chat model                        chat {model}          LLM        messages, tokens, cost
    LLM (text completion)             text_completion {model}  LLM
    tool                              execute_tool {name}   TOOL       arguments, result, call id
    retriever                         retrieval {name}      RETRIEVER  query, documents

Each span is the active looptrace span while its run runs, so an instrumented SDK call or a
``@traced`` function inside a tool or a node nests under it. A run's ``tags`` and ``metadata``
become looptrace's tags, session, user and metadata on its spans.

The handler runs inline (``run_inline``): LangChain calls it on the caller's thread or event
loop, without a hop to a thread pool, and each callback only creates, fills or ends a span and
keeps references to what it records (payloads are serialized later, by the exporter).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from contextvars import ContextVar
from types import MappingProxyType
from typing import Any, cast
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import BaseMessage
from langchain_core.tracers.context import register_configure_hook

from .. import _clock
from .. import _semconv as sc
from .._capture.attributes import ContextAttributes
from .._capture.spans import Span, SpanKind
from .._capture.start import start_span
from . import _common
from ._common import Open, Runs, guarded

__all__ = ["Handler", "instrument_langchain", "uninstrument_langchain"]

FRAMEWORK = "langchain"

_EMPTY: Mapping[str, Any] = MappingProxyType({})

# The tag LangGraph puts on its own plumbing runs, which LangSmith does not show.
_HIDDEN = "langsmith:hidden"
# How many hidden runs in a row a run looks through for its traced ancestor.
_HIDDEN_DEPTH = 16

# BaseMessage.type -> the GenAI conventions' role.
_ROLES = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool"}
_ROLES_CHUNKS = {"HumanMessageChunk": "user", "AIMessageChunk": "assistant"}


def _text_parts(content: Any) -> list[Any]:
    if isinstance(content, str):
        return [{"type": "text", "content": content}] if content else []
    parts: list[Any] = []
    if isinstance(content, list):
        for part in content:
            if isinstance(part, str):
                parts.append({"type": "text", "content": part})
            elif isinstance(part, dict) and part.get("type") == "text":
                parts.append({"type": "text", "content": part.get("text")})
            else:
                parts.append(part)
    return parts


def _message(message: Any) -> dict[str, Any]:
    """A LangChain message in the GenAI conventions' shape (new lists and dicts pointing at the
    message's own strings: nothing is copied or serialized here)."""
    kind = getattr(message, "type", None)
    role = _ROLES.get(kind) if isinstance(kind, str) else None
    if role is None:
        role = getattr(message, "role", None) or (kind if isinstance(kind, str) else "user")
    if kind == "tool":
        parts: list[Any] = [
            {
                "type": "tool_call_response",
                "id": getattr(message, "tool_call_id", None),
                "response": message.content,
            }
        ]
    else:
        parts = _text_parts(getattr(message, "content", None))
        for call in getattr(message, "tool_calls", None) or ():
            parts.append(
                {
                    "type": "tool_call",
                    "id": call.get("id"),
                    "name": call.get("name"),
                    "arguments": call.get("args"),
                }
            )
    return {"role": role, "parts": parts}


# Messages converted to the conventions' shape, by the message object: an agent sends a model
# the same messages again on every call, each time with one or two more, so each message is
# converted once, not once per call it is part of. The cache holds the messages it converted
# (at most _CONVERTED_MAX per handler); when full, it starts over.
_CONVERTED_MAX = 4096


class _Converted:
    __slots__ = ("_by_id",)

    def __init__(self) -> None:
        # id -> (the message, kept so that its id is not reused while here; its conversion)
        self._by_id: dict[int, tuple[Any, dict[str, Any]]] = {}

    def __call__(self, message: Any) -> dict[str, Any]:
        hit = self._by_id.get(id(message))
        if hit is not None and hit[0] is message:
            return hit[1]
        converted = _message(message)
        if len(self._by_id) >= _CONVERTED_MAX:
            self._by_id.clear()
        self._by_id[id(message)] = (message, converted)
        return converted


# What a chain, graph or node span records of its input and output. A LangGraph node gets the
# graph's whole state (in a tool-calling agent, every message so far), a conditional edge
# returns it inside its Send objects, a graph returns it: recorded whole, each step would
# record, and the exporter serialize, the run so far, a cost that grows with the run
# (quadratic over it) and competes with the run for the interpreter. So a list or tuple of
# more than _LIST_MAX items is recorded as its length and its last _LAST items (what the step
# added; the LLM spans keep every message they were sent), found in dicts, lists, pydantic
# models, dataclasses and LangGraph's Send walked _DEPTH levels deep, at most _KEYS_MAX keys
# each, _BUDGET values in all. Past those bounds a value is kept as it is. A message is
# recorded as the LLM spans record it (converted once, see _Converted); the walk makes new
# containers for what it walked (so a list the run appends to later stays as it was) and
# keeps references to the rest, which the exporter serializes later.
_LIST_MAX = 4
_LAST = 2
_DEPTH = 5
_KEYS_MAX = 32
_BUDGET = 256
SUMMARY_COUNT = "count"
SUMMARY_LAST = "last"
SUMMARY_OMITTED_KEYS = "looptrace.omitted_keys"


def _fields(value: Any) -> dict[str, Any] | None:
    """The fields of a pydantic model, a dataclass or LangGraph's ``Send`` as a dict (a
    LangGraph state can be a model or a dataclass, a prompt's value is a model); None for
    anything else."""
    cls = type(value)
    fields = getattr(cls, "__pydantic_fields__", None)
    if not isinstance(fields, dict):
        fields = getattr(cls, "__dataclass_fields__", None)
        if not isinstance(fields, dict) or isinstance(value, type):
            if cls.__name__ == "Send" and cls.__module__.startswith("langgraph"):
                return {"node": getattr(value, "node", None), "arg": getattr(value, "arg", None)}
            return None
    return {name: getattr(value, name, None) for name in fields}


_IS_MESSAGE: dict[type, bool] = {}


class _Walk:
    __slots__ = ("convert", "left")

    def __init__(self, convert: _Converted | None) -> None:
        self.left = _BUDGET
        self.convert = convert

    def value(self, value: Any, depth: int) -> Any:
        cls = type(value)
        if cls is str or cls is int or cls is float or cls is bool or value is None:
            return value
        self.left -= 1
        is_message = _IS_MESSAGE.get(cls)
        if is_message is None:
            # Asked once per class: isinstance on a pydantic model goes through pydantic's
            # metaclass, in Python.
            is_message = _IS_MESSAGE[cls] = issubclass(cls, BaseMessage)
        if is_message:
            # In the conventions' shape, as the LLM spans record it (converted once per
            # message, see _Converted): plain dicts the exporter serializes quickly.
            return self.convert(value) if self.convert is not None else value
        if cls is list or cls is tuple:
            if len(value) > _LIST_MAX:
                return {SUMMARY_COUNT: len(value), SUMMARY_LAST: self.items(value[-_LAST:], depth)}
            return self.items(value, depth)
        if depth >= _DEPTH or self.left <= 0:
            return value
        if isinstance(value, dict):
            items: Any = value
        else:
            items = _fields(value)
            if items is None:
                return value
        out: dict[Any, Any] = {}
        for key, item in items.items():
            if len(out) == _KEYS_MAX:
                out[SUMMARY_OMITTED_KEYS] = len(items) - _KEYS_MAX
                break
            out[key] = self.value(item, depth + 1)
        return out

    def items(self, values: Any, depth: int) -> list[Any]:
        if depth >= _DEPTH or self.left <= 0:
            return list(values)
        return [self.value(v, depth + 1) for v in values]


def bounded(value: Any, convert: _Converted | None = None) -> Any:
    """A chain span's input or output as recorded: ``value`` with long lists summarized and
    messages converted by ``convert`` (see above)."""
    return _Walk(convert).value(value, 0)


# A run's tags and metadata, onto looptrace's trace model (looptrace.attributes): the tags as
# tags, session_id (else thread_id, LangGraph's conversation thread, else conversation_id) as
# the session, user_id as the user, the rest of what the application put in the metadata as
# metadata. What LangChain and LangGraph add on their own is left out: the tags naming a
# step's position (seq:step:2, graph:step:3, map:key:x) and LangSmith's markers, and the
# metadata of their bookkeeping (ls_*, langgraph_*, checkpoint ids), which changes at every
# node and is on the spans already where it says something (model, provider, node, step).
_SESSION_KEYS = ("session_id", "thread_id", "conversation_id")
_USER_KEY = "user_id"
_OWN_TAGS = ("seq:step:", "graph:step:", "map:key:", "langsmith:")
_OWN_METADATA = ("ls_", "langgraph_", "lc_", "checkpoint_", "__")
_OWN_METADATA_KEYS = frozenset(("checkpoint_ns", "revision_id", *_SESSION_KEYS, _USER_KEY))
# (where the run started, its tags, its metadata) -> the merged values; when full it starts
# over. A graph's runs share their tags and metadata, so they share one object, which the
# exporter encodes once.
_VALUES_MAX = 256


# Whether a tag or a metadata key is the application's (True) or LangChain's own (False),
# learned once per string: a graph's runs repeat the same few; when full, it starts over.
_FRAMEWORK_TAGS: dict[str, bool] = {}
_FRAMEWORK_KEYS: dict[str, bool] = {}


def _ours(name: Any, prefixes: tuple[str, ...], learned: dict[str, bool]) -> bool:
    if type(name) is not str:
        return False
    hit = learned.get(name)
    if hit is None:
        hit = name not in _OWN_METADATA_KEYS and not name.startswith(prefixes)
        if len(learned) >= _VALUES_MAX:
            learned.clear()
        learned[name] = hit
    return hit


def _session(metadata: dict[str, Any]) -> Any:
    for key in _SESSION_KEYS:
        value = metadata.get(key)
        if value is not None and value != "":
            return value
    return None


def _context_attributes(
    cache: dict[Any, ContextAttributes],
    outer: ContextAttributes | None,
    tags: list[str] | None,
    metadata: dict[str, Any] | None,
) -> ContextAttributes | None:
    """The values a run with ``tags`` and ``metadata`` puts in force, merged over ``outer``
    (those in force where it started); None when it adds nothing."""
    own_tags = tuple(t for t in tags if _ours(t, _OWN_TAGS, _FRAMEWORK_TAGS)) if tags else ()
    session = user = None
    extra: tuple[tuple[str, Any], ...] = ()
    if metadata:
        session = _session(metadata)
        user = metadata.get(_USER_KEY)
        extra = tuple(
            (k, v) for k, v in metadata.items() if _ours(k, _OWN_METADATA, _FRAMEWORK_KEYS)
        )
    if not own_tags and session is None and user is None and not extra:
        return None
    key: Any = (outer, own_tags, session, user, extra)
    try:
        hit = cache.get(key)
    except TypeError:  # a metadata value that cannot be hashed: not cached
        key = None
        hit = None
    if hit is not None:
        return hit
    own = ContextAttributes(
        None if session is None else str(session),
        None if user is None else str(user),
        own_tags,
        MappingProxyType(dict(extra)) if extra else _EMPTY,
    )
    values = own if outer is None else outer.merged(own)
    if key is not None:
        if len(cache) >= _VALUES_MAX:
            cache.clear()
        cache[key] = values
    return values


def _model(metadata: dict[str, Any] | None, kwargs: dict[str, Any]) -> str | None:
    if metadata:
        name = metadata.get("ls_model_name")
        if isinstance(name, str) and name:
            return name
    params = kwargs.get("invocation_params")
    if isinstance(params, dict):
        for key in ("model", "model_name", "model_id"):
            name = params.get(key)
            if isinstance(name, str) and name:
                return name
    return None


def _name(serialized: Any, kwargs: dict[str, Any], default: str) -> str:
    name = kwargs.get("name")
    if isinstance(name, str) and name:
        return name
    if isinstance(serialized, dict):
        name = serialized.get("name")
        if isinstance(name, str) and name:
            return name
        ids = serialized.get("id")
        if isinstance(ids, list) and ids and isinstance(ids[-1], str):
            return ids[-1]
    return default


class Handler(BaseCallbackHandler):
    """A LangChain callback handler that records each run as a looptrace span.

    ``chain.invoke(x, config={"callbacks": [Handler()]})`` traces one call and its children;
    :func:`instrument_langchain` traces every run of the process (a handler passed by hand is
    then not added twice)."""

    # Called on the caller's thread or loop, not through a thread pool hop (LangChain runs a
    # handler that is not inline in an executor, in a copy of the context, for every event).
    run_inline = True
    raise_error = False

    def __init__(self) -> None:
        super().__init__()
        self.runs = Runs("langchain")
        self._converted = _Converted()
        self._values: dict[Any, ContextAttributes] = {}
        # Hidden runs (see _start) still open: run id -> parent run id.
        self._hidden: dict[UUID, UUID | None] = {}
        # The price table, once per process (a few hundred milliseconds the first time): make
        # the first handler at start-up, not inside a request on an event loop.
        _common.load_prices()

    # -- starting and ending --------------------------------------------------------------

    def _start(
        self,
        run_id: UUID,
        parent_run_id: UUID | None,
        name: str,
        attributes: dict[str, Any],
        kind: int = SpanKind.INTERNAL,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Span | None:
        if _common.disabled():
            return None
        parent = None
        if parent_run_id is not None:
            entry = self.runs.get(parent_run_id)
            if entry is None and self._hidden:
                entry = self._traced_ancestor(parent_run_id)
            if entry is not None:
                parent = entry.span
        attributes[sc.FRAMEWORK] = FRAMEWORK
        attributes[sc.FRAMEWORK_RUN_ID] = str(run_id)
        span = start_span(name, attributes, parent, kind)
        if not span.is_recording:
            return None
        if tags or metadata:
            # On the run's span only, not put in force in the calling context: LangChain ends
            # an async run in a copy of that context (its end callbacks are shielded tasks),
            # where nothing set at the start can be taken back, so the values would stay on
            # the caller's later spans. The run's child runs inherit its tags and metadata
            # from LangChain itself.
            values = _context_attributes(self._values, span.context_attributes, tags, metadata)
            if values is not None:
                span.context_attributes = values
        entry = Open(span, _common.activate(span))
        if not self.runs.add(run_id, entry):
            _common.deactivate(entry.tokens)
            return None
        return span

    def _hide(self, run_id: UUID, parent_run_id: UUID | None) -> None:
        """A chain run tagged ``langsmith:hidden``: LangGraph's own plumbing (its start node,
        channel writes), which LangSmith does not show either, gets no span; the runs inside
        it go under its nearest traced ancestor. (Only chains: an LLM, tool or retriever run
        is always traced, wherever it is.)"""
        hidden = self._hidden
        if len(hidden) >= _common.MAX_OPEN:
            hidden.clear()  # hidden runs that never ended: forgotten
        hidden[run_id] = parent_run_id

    def _traced_ancestor(self, run_id: UUID | None) -> Open | None:
        """The open entry of ``run_id`` or, past hidden runs, of its nearest traced ancestor."""
        for _ in range(_HIDDEN_DEPTH):
            if run_id is None:
                return None
            entry = self.runs.get(run_id)
            if entry is not None:
                return entry
            run_id = self._hidden.get(run_id)
        return None

    def _end(self, run_id: UUID, error: BaseException | None = None) -> Open | None:
        entry = self.runs.pop(run_id)
        if entry is None:
            if self._hidden:
                self._hidden.pop(run_id, None)
            return None
        span = entry.span
        _common.deactivate(entry.tokens, span)
        if error is not None:
            _common.fail(span, error)
        return entry

    # -- chains, runnables, LangGraph graphs and nodes ------------------------------------

    @guarded("integrations.langchain.chain_start")
    def on_chain_start(
        self,
        serialized: dict[str, Any] | None,
        inputs: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if tags and _HIDDEN in tags:
            self._hide(run_id, parent_run_id)
            return
        attributes: dict[str, Any] = {sc.OPENINFERENCE_SPAN_KIND: sc.OI_CHAIN}
        if metadata:
            node = metadata.get("langgraph_node")
            if isinstance(node, str):
                attributes[sc.LANGGRAPH_NODE] = node
                step = metadata.get("langgraph_step")
                if type(step) is int:
                    attributes[sc.LANGGRAPH_STEP] = step
        span = self._start(
            run_id,
            parent_run_id,
            _name(serialized, kwargs, "chain"),
            attributes,
            tags=tags,
            metadata=metadata,
        )
        if span is not None and _common.content_enabled():
            entry = self.runs.get(run_id)
            if entry is not None:
                entry.inputs = inputs
            parent = self.runs.get(parent_run_id) if parent_run_id is not None else None
            # The steps of a node's sequence (LangGraph's call_model, the model's prompt
            # chain) are handed the very state object the node was: recorded once, on the
            # node's span, not walked and serialized again for each step.
            if parent is None or parent.inputs is not inputs:
                span.set_inputs(bounded(inputs, self._converted))

    @guarded("integrations.langchain.chain_end")
    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        entry = self._end(run_id)
        if entry is not None:
            if outputs is not None and _common.content_enabled():
                entry.span.set_output(bounded(outputs, self._converted))
            entry.span.end()

    @guarded("integrations.langchain.chain_error")
    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        entry = self._end(run_id, error=error)
        if entry is not None:
            entry.span.end()

    @guarded("integrations.langchain.agent_action")
    def on_agent_action(self, action: Any, *, run_id: UUID, **kwargs: Any) -> None:
        entry = self.runs.get(run_id)
        tool = getattr(action, "tool", None)
        if entry is not None and isinstance(tool, str):
            entry.span.add_event("gen_ai.agent.action", {sc.GEN_AI_TOOL_NAME: tool})

    # -- chat models and LLMs -------------------------------------------------------------

    def _start_llm(
        self,
        operation: str,
        run_id: UUID,
        parent_run_id: UUID | None,
        tags: list[str] | None,
        metadata: dict[str, Any] | None,
        kwargs: dict[str, Any],
    ) -> Span | None:
        model = _model(metadata, kwargs)
        provider = _common.provider_name((metadata or {}).get("ls_provider"))
        attributes = _common.llm_attributes(operation, provider, model)
        if metadata:
            _core_set(attributes, sc.GEN_AI_REQUEST_TEMPERATURE, metadata.get("ls_temperature"))
            _core_set(attributes, sc.GEN_AI_REQUEST_MAX_TOKENS, metadata.get("ls_max_tokens"))
            _core_set(attributes, sc.GEN_AI_REQUEST_STOP_SEQUENCES, metadata.get("ls_stop"))
        name = f"{operation} {model}" if model else operation
        return self._start(run_id, parent_run_id, name, attributes, SpanKind.CLIENT, tags, metadata)

    @guarded("integrations.langchain.chat_model_start")
    def on_chat_model_start(
        self,
        serialized: dict[str, Any] | None,
        messages: list[list[Any]],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        span = self._start_llm(sc.GEN_AI_OP_CHAT, run_id, parent_run_id, tags, metadata, kwargs)
        if span is not None and _common.content_enabled() and messages:
            # One list of messages per prompt; a chat model call has one.
            convert = self._converted
            prompts = [[convert(m) for m in conversation] for conversation in messages]
            conversation = prompts[0]
            system = [m for m in conversation if m["role"] == "system"]
            attributes: dict[str, Any] = {
                sc.GEN_AI_INPUT_MESSAGES: [m for m in conversation if m["role"] != "system"]
            }
            if system:
                attributes[sc.GEN_AI_SYSTEM_INSTRUCTIONS] = [p for m in system for p in m["parts"]]
            span.set_attributes(attributes)
            # The converted messages, not LangChain's objects: plain dicts and lists, which
            # the exporter serializes several times faster than the objects.
            span.set_inputs(conversation if len(prompts) == 1 else prompts)

    @guarded("integrations.langchain.llm_start")
    def on_llm_start(
        self,
        serialized: dict[str, Any] | None,
        prompts: list[str],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        span = self._start_llm(
            sc.GEN_AI_OP_TEXT_COMPLETION, run_id, parent_run_id, tags, metadata, kwargs
        )
        if span is not None and _common.content_enabled():
            span.set_attribute(
                sc.GEN_AI_INPUT_MESSAGES,
                [{"role": "user", "parts": [{"type": "text", "content": p}]} for p in prompts],
            )
            span.set_inputs(prompts[0] if len(prompts) == 1 else prompts)

    @guarded("integrations.langchain.llm_new_token")
    def on_llm_new_token(self, token: Any, *, run_id: UUID, **kwargs: Any) -> None:
        entry = self.runs.get(run_id)
        if entry is None or entry.first_ns:
            return
        now = _clock.now_ns()
        entry.first_ns = now
        span = entry.span
        span.add_event(sc.GENAI_FIRST_CHUNK_EVENT, None, now)
        span.set_attributes(
            {
                sc.GEN_AI_REQUEST_STREAM: True,
                sc.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK: (now - span.start_ns) / 1e9,
            }
        )

    @guarded("integrations.langchain.llm_end")
    def on_llm_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> None:
        entry = self._end(run_id)
        if entry is None:
            return
        span = entry.span
        try:
            _record_llm_result(span, response, self._converted)
        finally:
            _common.price(span)
            span.end()

    @guarded("integrations.langchain.llm_error")
    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        entry = self._end(run_id, error=error)
        if entry is not None:
            entry.span.end()

    # -- tools ----------------------------------------------------------------------------

    @guarded("integrations.langchain.tool_start")
    def on_tool_start(
        self,
        serialized: dict[str, Any] | None,
        input_str: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        inputs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        name = _name(serialized, kwargs, "tool")
        attributes: dict[str, Any] = {
            sc.OPENINFERENCE_SPAN_KIND: sc.OI_TOOL,
            sc.GEN_AI_OPERATION_NAME: sc.GEN_AI_OP_EXECUTE_TOOL,
            sc.GEN_AI_TOOL_NAME: name,
            sc.GEN_AI_TOOL_TYPE: "function",
        }
        call_id = kwargs.get("tool_call_id")
        if isinstance(call_id, str) and call_id:
            attributes[sc.GEN_AI_TOOL_CALL_ID] = call_id
        if isinstance(serialized, dict):
            description = serialized.get("description")
            if isinstance(description, str) and description:
                attributes[sc.GEN_AI_TOOL_DESCRIPTION] = description
        content = _common.content_enabled()
        if content:
            attributes[sc.GEN_AI_TOOL_CALL_ARGUMENTS] = inputs if inputs is not None else input_str
        span = self._start(
            run_id,
            parent_run_id,
            f"{sc.GEN_AI_OP_EXECUTE_TOOL} {name}",
            attributes,
            tags=tags,
            metadata=metadata,
        )
        if span is not None and content:
            span.set_inputs(inputs if inputs is not None else input_str)

    @guarded("integrations.langchain.tool_end")
    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        entry = self._end(run_id)
        if entry is None:
            return
        if _common.content_enabled():
            # A ToolMessage (a tool called by a model) or the tool's own return value. Of a
            # ToolMessage, its content: the message object itself costs the exporter several
            # times the rest of the span to serialize (it is a pydantic model), and the call
            # id is on the span already.
            is_message = isinstance(output, BaseMessage)
            result = output.content if is_message else output
            span = entry.span
            span.set_output(result)
            span.set_attribute(
                sc.GEN_AI_TOOL_CALL_RESULT, result if isinstance(result, str) else str(result)
            )
        entry.span.end()

    @guarded("integrations.langchain.tool_error")
    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        entry = self._end(run_id, error=error)
        if entry is not None:
            entry.span.end()

    # -- retrievers -----------------------------------------------------------------------

    @guarded("integrations.langchain.retriever_start")
    def on_retriever_start(
        self,
        serialized: dict[str, Any] | None,
        query: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        name = _name(serialized, kwargs, "retriever")
        attributes: dict[str, Any] = {
            sc.OPENINFERENCE_SPAN_KIND: sc.OI_RETRIEVER,
            sc.GEN_AI_OPERATION_NAME: sc.GEN_AI_OP_RETRIEVAL,
            sc.GEN_AI_DATA_SOURCE_ID: name,
        }
        span = self._start(
            run_id,
            parent_run_id,
            f"{sc.GEN_AI_OP_RETRIEVAL} {name}",
            attributes,
            tags=tags,
            metadata=metadata,
        )
        if span is not None and _common.content_enabled():
            span.set_inputs(query)

    @guarded("integrations.langchain.retriever_end")
    def on_retriever_end(self, documents: Any, *, run_id: UUID, **kwargs: Any) -> None:
        entry = self._end(run_id)
        if entry is None:
            return
        if _common.content_enabled():
            entry.span.set_output(
                [
                    {
                        "page_content": getattr(d, "page_content", None),
                        "metadata": getattr(d, "metadata", None),
                    }
                    for d in documents or ()
                ]
            )
        entry.span.end()

    @guarded("integrations.langchain.retriever_error")
    def on_retriever_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        entry = self._end(run_id, error=error)
        if entry is not None:
            entry.span.end()


def _core_set(attributes: dict[str, Any], key: str, value: Any) -> None:
    if isinstance(value, (int, float, str)) and not isinstance(value, bool):
        attributes[key] = value
    elif isinstance(value, (list, tuple)) and value:
        attributes[key] = list(value)


def _record_llm_result(span: Span, response: Any, convert: _Converted | None = None) -> None:
    """Tokens, response model and id, finish reasons and output messages of an LLMResult."""
    attributes: dict[str, Any] = {}
    generations = getattr(response, "generations", None) or ()
    outputs: list[dict[str, Any]] = []
    reasons: list[str] = []
    usage: Any = None
    response_model: Any = None
    response_id: Any = None
    for generation in generations[0] if generations else ():
        message = getattr(generation, "message", None)
        info = getattr(generation, "generation_info", None) or {}
        reason = info.get("finish_reason")
        if message is not None:
            metadata = getattr(message, "response_metadata", None) or {}
            reason = reason or metadata.get("finish_reason") or metadata.get("stop_reason")
            response_model = response_model or metadata.get("model_name") or metadata.get("model")
            response_id = response_id or getattr(message, "id", None)
            usage = usage or getattr(message, "usage_metadata", None)
            out = dict(convert(message)) if convert is not None else _message(message)
        else:
            out = {"role": "assistant", "parts": _text_parts(getattr(generation, "text", ""))}
        if isinstance(reason, str):
            reasons.append(reason)
            out["finish_reason"] = reason
        outputs.append(out)
    if isinstance(usage, dict):
        inputs = usage.get("input_token_details") or {}
        outs = usage.get("output_token_details") or {}
        _common.set_usage(
            attributes,
            usage.get("input_tokens"),
            usage.get("output_tokens"),
            inputs.get("cache_read"),
            inputs.get("cache_creation"),
            outs.get("reasoning"),
        )
    else:
        llm_output = getattr(response, "llm_output", None) or {}
        token_usage = llm_output.get("token_usage") or llm_output.get("usage") or {}
        if isinstance(token_usage, dict):
            _common.set_usage(
                attributes,
                token_usage.get("prompt_tokens", token_usage.get("input_tokens")),
                token_usage.get("completion_tokens", token_usage.get("output_tokens")),
            )
        response_model = response_model or llm_output.get("model_name")
    if isinstance(response_model, str) and response_model:
        attributes[sc.GEN_AI_RESPONSE_MODEL] = response_model
    if isinstance(response_id, str) and response_id:
        attributes[sc.GEN_AI_RESPONSE_ID] = response_id
    if reasons:
        attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS] = reasons
    if _common.content_enabled() and outputs:
        attributes[sc.GEN_AI_OUTPUT_MESSAGES] = outputs
        span.set_output(outputs[0] if len(outputs) == 1 else outputs)
    span.set_attributes(attributes)


# -- the process-wide handler -------------------------------------------------------------


class _Installed:
    """What ``langchain_core``'s configure hook reads with ``.get()``, as it reads a
    ContextVar: the process's handler while instrumented, for every context (a ContextVar
    set here would reach only this context and those copied from it later)."""

    __slots__ = ("handler",)

    def __init__(self) -> None:
        self.handler: Handler | None = None

    def get(self) -> Handler | None:
        return self.handler


_installed = _Installed()
_registered = False
_lock = threading.Lock()


def instrument_langchain() -> Handler:
    """Record every LangChain and LangGraph run of the process as looptrace spans.
    Idempotent; returns the handler. :func:`uninstrument_langchain` undoes it."""
    global _registered
    _common.load_prices()
    with _lock:
        if not _registered:
            # Registered once for the life of the process (langchain_core has no way to take
            # a hook back); uninstrument_langchain makes it hand out nothing.
            register_configure_hook(cast("ContextVar[Handler | None]", _installed), True, Handler)
            _registered = True
        handler = _installed.handler
        if handler is None:
            handler = _installed.handler = Handler()
        return handler


def uninstrument_langchain() -> None:
    """Stop adding looptrace's handler to new runs (runs already started finish traced)."""
    _installed.handler = None
