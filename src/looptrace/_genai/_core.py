"""What every instrumented LLM call shares: its span, the stream proxies, and method wrapping.

A call costs one span, one dict of request attributes and, when content is captured, the
messages turned into the GenAI parts shape (new lists and dicts pointing at the caller's strings:
nothing is copied or serialized here). A stream adds one list append per text delta; the text is
joined once, when the stream ends.
"""

from __future__ import annotations

import functools
import sys
import threading
import types
from collections.abc import AsyncGenerator, Awaitable, Callable, Generator, Mapping
from typing import Any

# The pipeline, for its wiring too: an LLM call may be the only thing a program traces.
from .. import _clock, _export, _state
from .. import _semconv as sc
from .._capture.spans import Span, SpanKind
from .._capture.start import _activate, _deactivate, start_span
from .._errors import internal_error
from . import _cost

# Attribute names: the table in looptrace._semconv (OpenTelemetry GenAI conventions v1.41,
# OpenInference's span kind, and looptrace's own figures).
PROVIDER = sc.GEN_AI_PROVIDER_NAME
OPERATION = sc.GEN_AI_OPERATION_NAME
REQUEST_MODEL = sc.GEN_AI_REQUEST_MODEL
RESPONSE_MODEL = sc.GEN_AI_RESPONSE_MODEL
RESPONSE_ID = sc.GEN_AI_RESPONSE_ID
FINISH_REASONS = sc.GEN_AI_RESPONSE_FINISH_REASONS
INPUT_TOKENS = sc.GEN_AI_USAGE_INPUT_TOKENS
OUTPUT_TOKENS = sc.GEN_AI_USAGE_OUTPUT_TOKENS
CACHE_READ = sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS
CACHE_CREATION = sc.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS
REASONING = sc.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS
INPUT_MESSAGES = sc.GEN_AI_INPUT_MESSAGES
OUTPUT_MESSAGES = sc.GEN_AI_OUTPUT_MESSAGES
SYSTEM_INSTRUCTIONS = sc.GEN_AI_SYSTEM_INSTRUCTIONS
TOOL_DEFINITIONS = sc.GEN_AI_TOOL_DEFINITIONS
STREAMING = sc.GEN_AI_REQUEST_STREAM

# Whether OTEL_SEMCONV_STABILITY_OPT_IN asks for the latest GenAI conventions only: read when
# an SDK is instrumented (instrument_openai / instrument_anthropic), not per call.
latest = False


def refresh_conventions() -> None:
    global latest
    latest = sc.gen_ai_latest_experimental()


# Request arguments never recorded: credentials travel in headers, and the others are transport.
_NOT_RECORDED = frozenset(("extra_headers", "extra_query", "extra_body", "timeout", "api_key"))


def content_enabled() -> bool:
    cfg = _state.config
    if cfg is None:
        cfg = _export.get_config()
    return cfg.capture_genai_content


def _blocked_ns() -> int | None:
    # The monitor module is only consulted when something already loaded it (it is running).
    monitor = sys.modules.get("looptrace.monitor")
    if monitor is None:
        return None
    try:
        value: int | None = monitor.blocked_ns()
    except Exception as exc:  # called from the caller's exception handlers: never raise there
        internal_error("genai.loop_blocked", exc)
        return None
    return value


def request_inputs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments as its ``input.value``: credentials and transport options left
    out, top-level lists copied so a history the caller appends to later stays as sent."""
    out = {}
    for key, value in kwargs.items():
        if key in _NOT_RECORDED:
            continue
        out[key] = value.copy() if type(value) is list else value
    return out


def field(obj: Any, name: str) -> Any:
    """``obj[name]`` of a dict, ``obj.name`` of anything else (the SDKs' pydantic models, which
    callers pass back in a conversation: a previous reply, its tool calls, its content blocks);
    None when absent."""
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


# id(base_url) -> (base_url, host, port): a client's URL is parsed once, not on every call.
_servers: dict[int, tuple[Any, str, int]] = {}
_DEFAULT_PORTS = {"https": 443, "http": 80}


def server(resource: Any) -> tuple[str, int] | None:
    """The host and port of the API a resource object's client calls (its ``base_url``)."""
    client = getattr(resource, "_client", None)
    url = getattr(client, "base_url", None)
    if url is None:
        return None
    entry = _servers.get(id(url))
    if entry is None or entry[0] is not url:
        host = getattr(url, "host", None)
        if not isinstance(host, str) or not host:
            return None
        port = getattr(url, "port", None)
        if not isinstance(port, int):
            port = _DEFAULT_PORTS.get(str(getattr(url, "scheme", "")), 0)
        if len(_servers) >= 64:
            _servers.clear()
        entry = _servers[id(url)] = (url, host, port)
    return entry[1], entry[2]


def base_attributes(
    resource: Any, provider: str, operation: str, model: str, kind: str
) -> dict[str, Any]:
    """What every LLM call span starts with: the attributes a sampler may read (operation,
    provider, model, server) and the OpenInference span kind."""
    attributes: dict[str, Any] = {
        sc.OPENINFERENCE_SPAN_KIND: kind,
        PROVIDER: provider,
        OPERATION: operation,
        REQUEST_MODEL: model,
    }
    if not latest:
        attributes[sc.GEN_AI_SYSTEM] = provider
    address = server(resource)
    if address is not None:
        attributes[sc.SERVER_ADDRESS], attributes[sc.SERVER_PORT] = address
    return attributes


def converted(convert: Any, value: Any) -> Any:
    """``convert(value)``, or None when a message of a shape not foreseen here cannot be read:
    the call is traced all the same, without it."""
    try:
        return convert(value)
    except Exception as exc:
        internal_error("genai.messages", exc)
        return None


def error_type(exc: BaseException) -> str:
    """``error.type`` of a failed call: the exception's class under the name its package exports
    it by (``openai.RateLimitError``, ``anthropic.APIConnectionError``,
    ``asyncio.CancelledError``), else its module and qualified name; builtins bare."""
    cls = type(exc)
    module = cls.__module__
    name = cls.__qualname__
    if module == "builtins":
        return name
    top = module.partition(".")[0]
    package = sys.modules.get(top)
    if package is not None and getattr(package, name, None) is cls:
        return f"{top}.{name}"
    return f"{module}.{name}"


class Call:
    """One LLM call: its span, and what a stream accumulates until it ends."""

    __slots__ = ("blocked_at_start", "content", "done", "first_ns", "span")

    def __init__(self, name: str, attributes: dict[str, Any], content: bool) -> None:
        self.span: Span = start_span(name, attributes, None, SpanKind.CLIENT)
        self.content = content and self.span.is_recording
        self.first_ns = 0
        self.done = False
        self.blocked_at_start = _blocked_ns()

    def first_token(self) -> None:
        """The first content arrived: date it, as an event and as an attribute."""
        now = _clock.now_ns()
        self.first_ns = now
        span = self.span
        span.add_event(sc.GENAI_FIRST_CHUNK_EVENT, None, now)
        span.set_attribute(sc.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK, (now - span.start_ns) / 1e9)
        if self.blocked_at_start is not None:
            blocked = _blocked_ns()
            if blocked is not None:
                span.set_attribute(
                    sc.GENAI_LOOP_BLOCKED_BEFORE_FIRST_CHUNK_MS,
                    max(blocked - self.blocked_at_start, 0) / 1e6,
                )

    def end(self, exc: BaseException | None = None) -> None:
        if self.done:
            return
        self.done = True
        span = self.span
        if self.blocked_at_start is not None:
            blocked = _blocked_ns()
            if blocked is not None:
                span.set_attribute(
                    sc.GENAI_LOOP_BLOCKED_MS, max(blocked - self.blocked_at_start, 0) / 1e6
                )
        if exc is not None:
            span.set_attribute(sc.ERROR_TYPE, error_type(exc))
            span.fail(exc)
        elif _cost.ready:
            try:
                _cost.attach(span)
            except Exception as error:  # on the caller's path: never raise there
                internal_error("genai.cost.attach", error)
        span.end()


class Recorder:
    """A stream's bookkeeping: providers override ``on_chunk`` and ``complete``."""

    __slots__ = ("call",)

    def __init__(self, call: Call) -> None:
        self.call = call

    def on_chunk(self, chunk: Any) -> None:
        raise NotImplementedError

    def complete(self) -> None:
        """Set what the whole stream says (text, tool calls, usage) on the span."""
        raise NotImplementedError

    def finish(self, exc: BaseException | None = None, early: bool = False) -> None:
        call = self.call
        if call.done:
            return
        try:
            if early:
                call.span.set_attribute(sc.GENAI_STREAM_CLOSED_EARLY, True)
            self.complete()
        except Exception as error:
            internal_error("genai.stream.finish", error)
        call.end(exc)

    def abandon(self) -> None:
        """The stream was garbage-collected before it ended."""
        try:
            if not self.call.done:
                self.call.span.set_attribute(sc.GENAI_STREAM_ABANDONED, True)
                self.finish(early=True)
        except Exception as exc:  # a finalizer: nobody to raise to
            internal_error("genai.stream.abandon", exc)


def _record(stream: Any, recorder: Recorder) -> Generator[Any, None, None]:
    """Yield the stream's chunks, recording each; the stream's end or error ends the span.
    (A function of its own, so the generator holds no reference to the proxy.)"""
    on_chunk = recorder.on_chunk
    try:
        for chunk in stream:
            try:
                on_chunk(chunk)
            except Exception as exc:
                internal_error("genai.stream.chunk", exc)
            yield chunk
    except GeneratorExit:
        raise  # the proxy was closed or dropped: close() and __del__ end the span
    except BaseException as exc:
        recorder.finish(exc)
        raise
    recorder.finish()


class SyncStream:
    """Iterates the SDK's stream for the caller, recording each chunk; everything else (the
    response, headers, helpers) is the SDK stream's own, reached through attribute access."""

    __slots__ = ("__weakref__", "_it", "_recorder", "_stream")

    def __init__(self, stream: Any, recorder: Recorder) -> None:
        self._stream = stream
        self._recorder = recorder
        self._it: Generator[Any, None, None] | None = None

    def __del__(self) -> None:
        # Abandoned (collected before its end or a close): the span ends here. A __del__ costs
        # nothing per stream, where a weakref.finalize would be registered for every one.
        try:
            self._recorder.abandon()
        except Exception:
            pass

    def __iter__(self) -> Generator[Any, None, None]:
        # A generator, not this object: a for loop then resumes it without a Python-level
        # __next__ call per chunk.
        it = self._it
        if it is None:
            it = self._it = _record(self._stream, self._recorder)
        return it

    def __next__(self) -> Any:
        return next(self.__iter__())

    def close(self) -> None:
        # Only the SDK's stream is closed: a loop reading this stream goes on exactly as it
        # would over the SDK's own (which may still yield what it had read, or raise), so
        # the iterating generator is left to end, or be collected, as the SDK's iteration does.
        try:
            self._stream.close()
        finally:
            self._recorder.finish(early=True)

    def __enter__(self) -> SyncStream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    def __repr__(self) -> str:
        return f"<looptrace stream over {self._stream!r}>"


async def _arecord(stream: Any, recorder: Recorder) -> AsyncGenerator[Any, None]:
    """The asynchronous counterpart of :func:`_record`."""
    on_chunk = recorder.on_chunk
    try:
        async for chunk in stream:
            try:
                on_chunk(chunk)
            except Exception as exc:
                internal_error("genai.stream.chunk", exc)
            yield chunk
    except GeneratorExit:
        raise
    except BaseException as exc:
        recorder.finish(exc)
        raise
    recorder.finish()


class AsyncStream:
    """The asynchronous counterpart of :class:`SyncStream`."""

    __slots__ = ("__weakref__", "_it", "_recorder", "_stream")

    def __init__(self, stream: Any, recorder: Recorder) -> None:
        self._stream = stream
        self._recorder = recorder
        self._it: AsyncGenerator[Any, None] | None = None

    def __del__(self) -> None:
        try:
            self._recorder.abandon()
        except Exception:
            pass

    def __aiter__(self) -> AsyncGenerator[Any, None]:
        it = self._it
        if it is None:
            it = self._it = _arecord(self._stream, self._recorder)
        return it

    def __anext__(self) -> Awaitable[Any]:
        return self.__aiter__().__anext__()

    async def close(self) -> None:
        # As SyncStream.close: the caller's loop goes on as over the SDK's own stream.
        try:
            await self._stream.close()
        finally:
            self._recorder.finish(early=True)

    async def aclose(self) -> None:
        await self.close()

    async def __aenter__(self) -> AsyncStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    def __repr__(self) -> str:
        return f"<looptrace stream over {self._stream!r}>"


# A provider's hooks for one method: ``begin(resource, kwargs)`` starts the call (None: do not
# trace it; ``resource`` is the SDK object whose method is called, e.g. ``client.chat.completions``)
# and ``done(call, kwargs, result)`` records a result and returns what the caller gets (a
# stream proxy for a stream).
Begin = Callable[[Any, dict[str, Any]], Call | None]
Done = Callable[[Call, dict[str, Any], Any], Any]


def _safe_begin(begin: Begin, resource: Any, kwargs: dict[str, Any]) -> Call | None:
    if _state.disabled:
        return None
    try:
        return begin(resource, kwargs)
    except Exception as exc:
        internal_error("genai.begin", exc)
        return None


def _safe_done(done: Done, call: Call, kwargs: dict[str, Any], result: Any) -> Any:
    try:
        return done(call, kwargs, result)
    except Exception as exc:
        internal_error("genai.result", exc)
        call.end()
        return result


def wrap_sync(original: Callable[..., Any], begin: Begin, done: Done) -> Callable[..., Any]:
    @functools.wraps(original)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        call = _safe_begin(begin, self, kwargs)
        if call is None:
            return original(self, *args, **kwargs)
        tokens = _activate(call.span)
        try:
            result = original(self, *args, **kwargs)
        except BaseException as exc:
            call.end(exc)
            raise
        finally:
            _deactivate(tokens)
        return _safe_done(done, call, kwargs, result)

    wrapper.__looptrace_original__ = original  # type: ignore[attr-defined]
    return wrapper


def wrap_async(original: Callable[..., Any], begin: Begin, done: Done) -> Callable[..., Any]:
    @functools.wraps(original)
    async def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        call = _safe_begin(begin, self, kwargs)
        if call is None:
            return await original(self, *args, **kwargs)
        tokens = _activate(call.span)
        try:
            result = await original(self, *args, **kwargs)
        except BaseException as exc:
            call.end(exc)
            raise
        finally:
            _deactivate(tokens)
        return _safe_done(done, call, kwargs, result)

    wrapper.__looptrace_original__ = original  # type: ignore[attr-defined]
    return wrapper


# (class, method name) -> the method the class had before it was wrapped.
_originals: dict[tuple[type, str], Any] = {}
_lock = threading.Lock()

Wrap = Callable[[Callable[..., Any]], Callable[..., Any]]


def patch_class(cls: type, name: str, wrap: Wrap) -> None:
    with _lock:
        if (cls, name) in _originals:
            return
        original = cls.__dict__[name]
        _originals[(cls, name)] = original
        setattr(cls, name, wrap(original))


def unpatch_class(cls: type, name: str) -> None:
    with _lock:
        original = _originals.pop((cls, name), None)
        if original is not None:
            setattr(cls, name, original)


def patch_instance(resource: object, name: str, wrap: Wrap) -> None:
    """Wrap one resource object's method (one client), around the class's unwrapped method so
    a call is traced once even when the class is instrumented too."""
    with _lock:
        if getattr(resource.__dict__.get(name), "__looptrace_original__", None) is not None:
            return
        cls = type(resource)
        original = _originals.get((cls, name), cls.__dict__.get(name))
        if original is None:
            original = getattr(cls, name)
        resource.__dict__[name] = types.MethodType(wrap(original), resource)


def unpatch_instance(resource: object, name: str) -> None:
    with _lock:
        current = resource.__dict__.get(name)
        if getattr(current, "__looptrace_original__", None) is not None:
            del resource.__dict__[name]


def set_count(attributes: dict[str, Any], key: str, value: Any) -> None:
    """Set a token count the provider reported, when it is a positive int (absent means 0)."""
    if type(value) is int and value > 0:
        attributes[key] = value


def set_if(attributes: dict[str, Any], key: str, value: Any) -> None:
    """Set ``key`` when the argument was given (the SDKs' omit/NOT_GIVEN markers are falsy
    objects that are not None, and are skipped too)."""
    if value is None or value is False:
        return
    if isinstance(value, (bool, int, float, str)):
        attributes[key] = value
    elif isinstance(value, (list, tuple)):
        attributes[key] = list(value)
