"""``@traced`` and ``looptrace.span``: record a span per call, and nothing more.

The hot path allocates one Span, reads a few module attributes, sets a ContextVar and hands the
ended span to the sink. Everything that is slow (binding a signature, formatting a traceback,
JSON) is done once per function at decoration time or later, in the pipeline.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import AsyncGenerator, Awaitable, Callable, Generator, Mapping
from types import TracebackType
from typing import Any, ParamSpec, TypeVar, overload

from . import _clock, _state
from ._context import CURRENT
from ._errors import internal_error
from ._semconv import GENERATOR_CLOSED_EARLY, GENERATOR_ITEMS
from ._span import (
    CallSite,
    NonRecordingSpan,
    RemoteChildSpan,
    ScopedSpan,
    Span,
    SpanContext,
    SpanKind,
)

P = ParamSpec("P")
R = TypeVar("R")
F = TypeVar("F", bound=Callable[..., Any])

_MASK64 = (1 << 64) - 1
_current_get = CURRENT.get


def start_span(
    name: str,
    attributes: dict[str, Any] | None = None,
    parent: Span | None = None,
    kind: int = 1,
) -> Span:
    """Create (but do not activate) a span under ``parent`` or the active span."""
    if parent is None:
        parent = _current_get()
        bridge = _state.bridge
        if bridge is not None:
            parent = bridge.parent(parent)
    if parent is None:
        trace_id = _clock.new_trace_id()
        if (trace_id & _MASK64) >= _state.sample_threshold:
            return NonRecordingSpan(trace_id, _clock.new_span_id())
        span = Span(name, trace_id, _clock.new_span_id(), 0, _clock.now_ns(), attributes, "", kind)
        _report_start(span)
    elif not parent.is_recording:
        # Unsampled or suppressed: children share the non-recording parent, at no cost.
        return parent
    else:
        remote = parent.is_remote  # the parent lives in another process (from extract)
        span = (RemoteChildSpan if remote else Span)(
            name,
            parent.trace_id,
            _clock.new_span_id(),
            parent.span_id,
            _clock.now_ns(),
            attributes,
            parent.trace_state,
            kind,
        )
        if remote:
            _report_start(span)  # the local root of a distributed trace
    if _state.start_hooks:
        for hook in _state.start_hooks:
            try:
                hook(span)
            except Exception as exc:
                internal_error("span.start_hook", exc)
    return span


def start_scoped_span(
    name: str,
    attributes: dict[str, Any] | None,
    parent: Span | None,
    kind: int,
    scope: tuple[str, str] | None,
    start_ns: int | None = None,
) -> Span:
    """:func:`start_span` for a span made through another tracing API: under ``parent``
    exactly (None: a new trace), exported under ``scope``, started at ``start_ns``."""
    if start_ns is None:
        start_ns = _clock.now_ns()
    if parent is None:
        trace_id = _clock.new_trace_id()
        if (trace_id & _MASK64) >= _state.sample_threshold:
            return NonRecordingSpan(trace_id, _clock.new_span_id())
        span: Span = ScopedSpan(
            name, trace_id, _clock.new_span_id(), 0, start_ns, attributes, "", kind, scope, False
        )
        _report_start(span)
    elif not parent.is_recording:
        return parent
    else:
        remote = parent.is_remote
        span = ScopedSpan(
            name,
            parent.trace_id,
            _clock.new_span_id(),
            parent.span_id,
            start_ns,
            attributes,
            parent.trace_state,
            kind,
            scope,
            remote,
        )
        if remote:
            _report_start(span)
    if _state.start_hooks:
        for hook in _state.start_hooks:
            try:
                hook(span)
            except Exception as exc:
                internal_error("span.start_hook", exc)
    return span


def start_root(name: str, attributes: dict[str, Any] | None = None) -> Span:
    """A span that starts a new trace, whatever span is active (in either API)."""
    return start_scoped_span(name, attributes, None, SpanKind.INTERNAL, None)


def _activate(span: Span) -> tuple[Any, Any, Any]:
    """Make ``span`` the active span (in the bridged API's context too, when there is one)."""
    bridge = _state.bridge
    return CURRENT.set(span), bridge, bridge.enter(span) if bridge is not None else None


def _deactivate(tokens: tuple[Any, Any, Any]) -> None:
    token, bridge, bridged = tokens
    if bridge is not None:
        _bridge_exit(bridge, bridged)
    CURRENT.reset(token)


def _report_start(root: Span) -> None:
    try:
        _state.sink.on_start(root)
    except Exception as exc:
        internal_error("span.start", exc)


class span:
    """Trace a block: ``with looptrace.span("name") as s:`` or ``async with``.

    ``parent`` may be a remote :class:`SpanContext` (from ``looptrace.extract``) or a span.
    An exception leaving the block is recorded on the span and re-raised untouched.
    """

    __slots__ = ("_attributes", "_kind", "_name", "_parent", "_span", "_tokens")

    def __init__(
        self,
        name: str,
        attributes: Mapping[str, Any] | None = None,
        *,
        parent: Span | SpanContext | None = None,
        kind: SpanKind | int = SpanKind.INTERNAL,
    ) -> None:
        self._name = name
        self._attributes = dict(attributes) if attributes else None
        self._parent = parent
        self._kind = int(kind)
        self._span: Span | None = None
        self._tokens: Any = None

    def __enter__(self) -> Span:
        parent = self._parent
        if isinstance(parent, SpanContext):
            from ._context import _RemoteParent

            if parent.sampled:
                parent = _RemoteParent(
                    "", parent.trace_id, parent.span_id, 0, 0, None, parent.trace_state
                )
            else:
                parent = NonRecordingSpan(parent.trace_id, parent.span_id, parent.trace_state)
        if _state.disabled:
            s: Span = NonRecordingSpan()
        else:
            s = start_span(self._name, self._attributes, parent, self._kind)
        self._span = s
        self._tokens = _activate(s)
        return s

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        s = self._span
        if s is None:
            return
        try:
            _deactivate(self._tokens)
        except ValueError:
            # Entered in one context and left in another (a generator resumed elsewhere):
            # the block is still over, so fall back to the span's parent.
            CURRENT.set(None)
        if exc is not None:
            s.fail(exc)
        s.end()

    async def __aenter__(self) -> Span:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc, tb)


def _binder(fn: Callable[..., Any]) -> Callable[[tuple[Any, ...], dict[str, Any]], dict[str, Any]]:
    """Map a call's arguments to parameter names, from a signature read once.

    Arguments are recorded as passed (defaults are not filled in). The first parameter of a
    method (``self``/``cls``) is left out.
    """
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = []
    skip = 0
    if params and params[0].name in ("self", "cls") and "." in getattr(fn, "__qualname__", ""):
        skip = 1
        params = params[1:]
    names = tuple(p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))
    var_name = next((p.name for p in params if p.kind is p.VAR_POSITIONAL), "args")
    n = len(names)

    def bind(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        if skip:
            args = args[skip:]
        bound = dict(zip(names, args, strict=False))
        if len(args) > n:
            bound[var_name] = args[n:]
        if kwargs:
            bound.update(kwargs)
        return _snapshot(bound)

    if 0 < n <= 16:
        return _fast_binder(names, skip, bind)
    return bind


# Small mutable containers are copied at call time (see _snapshot).
_COPIED = frozenset((list, dict, set, bytearray))


def _snapshot(bound: dict[str, Any]) -> dict[str, Any]:
    # Serialization happens later, so a caller that appends to the list it passed (a chat
    # history, say) would otherwise change the record of this call. Copying small top-level
    # containers makes the common case faithful for well under a microsecond; deeper mutation
    # still shows (docs/serialization.md).
    for key, value in bound.items():
        if type(value) in _COPIED and len(value) <= 256:
            bound[key] = value.copy()
    return bound


def _fast_binder(
    names: tuple[str, ...],
    skip: int,
    general: Callable[[tuple[Any, ...], dict[str, Any]], dict[str, Any]],
) -> Callable[[tuple[Any, ...], dict[str, Any]], dict[str, Any]]:
    """A binder generated for this signature (as dataclasses generates ``__init__``): a call
    that passes exactly the positional parameters, the common case, builds its dict with one
    display instead of ``dict(zip())``; any other call takes the general path."""
    n = len(names)
    values = [f"_v{i}" for i in range(n)]
    unpack = ", ".join(values) + ("," if n == 1 else "")
    offset = f"args[{skip}:]" if skip else "args"
    display = ", ".join(f"{name!r}: {v}" for name, v in zip(names, values, strict=True))
    copied = " or ".join(f"type({v}) in _COPIED" for v in values)
    source = (
        "def bind(args, kwargs):\n"
        f"    if kwargs or len(args) != {n + skip}:\n"
        "        return general(args, kwargs)\n"
        f"    {unpack} = {offset}\n"
        f"    bound = {{{display}}}\n"
        f"    return _snapshot(bound) if {copied} else bound\n"
    )
    scope: dict[str, Any] = {"general": general, "_COPIED": _COPIED, "_snapshot": _snapshot}
    exec(source, scope)  # names are parameter names: identifiers, embedded with repr()
    return scope["bind"]  # type: ignore[no-any-return]


@overload
def traced(fn: F, /) -> F: ...


@overload
def traced(
    *,
    name: str | None = None,
    attributes: Mapping[str, Any] | None = None,
    capture_inputs: bool | None = None,
    capture_output: bool | None = None,
    process_inputs: Callable[[Any], Any] | None = None,
    process_outputs: Callable[[Any], Any] | None = None,
) -> Callable[[F], F]: ...


def traced(
    fn: Any = None,
    /,
    *,
    name: str | None = None,
    attributes: Mapping[str, Any] | None = None,
    capture_inputs: bool | None = None,
    capture_output: bool | None = None,
    process_inputs: Callable[[Any], Any] | None = None,
    process_outputs: Callable[[Any], Any] | None = None,
) -> Any:
    """Record a span for every call of a function, coroutine function, generator or async
    generator (also methods, classmethods and staticmethods).

    The span is named after the function's qualified name unless ``name`` is given; inputs are
    the call's arguments and the output its return value (or the first items a generator
    yields), unless turned off here or globally. ``process_inputs``/``process_outputs`` transform
    those values at export time (for redaction); if they raise, the value is replaced by an
    error marker, never sent raw.
    """

    def decorate(target: Any) -> Any:
        if isinstance(target, (classmethod, staticmethod)):
            return type(target)(decorate(target.__func__))
        # Decorating happens ahead of the calls (mostly at import time): the export path's
        # start-up is done here, not in the first traced call.
        _state.prepare_ahead()
        return _wrap(
            target,
            CallSite(
                name or getattr(target, "__qualname__", None) or repr(target),
                getattr(target, "__qualname__", ""),
                getattr(target, "__module__", "") or "",
                attributes,
                capture_inputs,
                capture_output,
                process_inputs,
                process_outputs,
            ),
        )

    if fn is None:
        return decorate
    return decorate(fn)


def _wrap(fn: Callable[..., Any], site: CallSite) -> Callable[..., Any]:
    bind = _binder(fn)
    want_inputs = site.capture_inputs
    want_output = site.capture_output
    name = site.name
    set_current = CURRENT.set
    reset_current = CURRENT.reset

    def begin(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Span:
        s = start_span(name)
        if s.is_recording:
            s.site = site
            if want_inputs if want_inputs is not None else _state.capture_inputs:
                try:
                    s.inputs = bind(args, kwargs)
                except Exception as exc:
                    internal_error("capture.inputs", exc)
        return s

    def keep_output() -> bool:
        return want_output if want_output is not None else _state.capture_outputs

    if inspect.isasyncgenfunction(fn):
        return _wrap_async_generator(fn, begin, keep_output)
    if inspect.isgeneratorfunction(fn):
        return _wrap_generator(fn, begin, keep_output)
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            if _state.disabled:
                return await fn(*args, **kwargs)
            s = start_span(name)
            recording = s.is_recording
            if recording:
                s.site = site
                if want_inputs if want_inputs is not None else _state.capture_inputs:
                    s.inputs = bind(args, kwargs)
            token = set_current(s)
            bridge = _state.bridge
            bridged = bridge.enter(s) if bridge is not None else None
            try:
                result = await fn(*args, **kwargs)
            except BaseException as exc:
                s.fail(exc)
                raise
            else:
                if recording and (
                    want_output if want_output is not None else _state.capture_outputs
                ):
                    s.output = result
                return result
            finally:
                if bridge is not None:
                    _bridge_exit(bridge, bridged)
                reset_current(token)
                s.end()

        return async_wrapper

    @functools.wraps(fn)
    def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
        if _state.disabled:
            return fn(*args, **kwargs)
        s = start_span(name)
        recording = s.is_recording
        if recording:
            s.site = site
            if want_inputs if want_inputs is not None else _state.capture_inputs:
                s.inputs = bind(args, kwargs)
        token = set_current(s)
        bridge = _state.bridge
        bridged = bridge.enter(s) if bridge is not None else None
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            s.fail(exc)
            raise
        else:
            if recording and (want_output if want_output is not None else _state.capture_outputs):
                s.output = result
            return result
        finally:
            if bridge is not None:
                _bridge_exit(bridge, bridged)
            reset_current(token)
            s.end()

    return sync_wrapper


def _bridge_exit(bridge: _state.ContextBridge, token: object) -> None:
    try:
        bridge.exit(token)
    except Exception as exc:
        internal_error("span.bridge_exit", exc)


def _finish_items(s: Span, items: list[Any], count: int, keep: bool) -> None:
    if s.is_recording:
        if keep:
            s.output = items
        s.set_attribute(GENERATOR_ITEMS, count)


def _wrap_generator(
    fn: Callable[..., Generator[Any, Any, Any]],
    begin: Callable[[tuple[Any, ...], dict[str, Any]], Span],
    keep_output: Callable[[], bool],
) -> Callable[..., Generator[Any, Any, Any]]:
    @functools.wraps(fn)
    def gen_wrapper(*args: Any, **kwargs: Any) -> Generator[Any, Any, Any]:
        if _state.disabled:
            return (yield from fn(*args, **kwargs))
        s = begin(args, kwargs)
        keep = keep_output()
        limit = _state.max_generator_items
        items: list[Any] = []
        count = 0
        # The span is active only while the generator's own code runs, never between yields,
        # so the caller's spans do not nest under it.
        token = _activate(s)
        try:
            gen = fn(*args, **kwargs)
        except BaseException as exc:
            s.fail(exc)
            s.end()
            raise
        finally:
            _deactivate(token)
        send: Callable[[Any], Any] = gen.send
        value: Any = None
        try:
            while True:
                token = _activate(s)
                try:
                    item = send(value)
                except StopIteration as stop:
                    return stop.value
                finally:
                    _deactivate(token)
                count += 1
                if keep and len(items) < limit:
                    items.append(item)
                try:
                    value = yield item
                    send = gen.send
                except GeneratorExit:
                    s.set_attribute(GENERATOR_CLOSED_EARLY, True)
                    token = _activate(s)
                    try:
                        gen.close()
                    finally:
                        _deactivate(token)
                    raise
                except BaseException as exc:
                    send, value = gen.throw, exc
        except GeneratorExit:
            raise
        except BaseException as exc:
            s.fail(exc)
            raise
        finally:
            _finish_items(s, items, count, keep)
            s.end()

    return gen_wrapper


def _wrap_async_generator(
    fn: Callable[..., AsyncGenerator[Any, Any]],
    begin: Callable[[tuple[Any, ...], dict[str, Any]], Span],
    keep_output: Callable[[], bool],
) -> Callable[..., AsyncGenerator[Any, Any]]:
    @functools.wraps(fn)
    async def agen_wrapper(*args: Any, **kwargs: Any) -> AsyncGenerator[Any, Any]:
        if _state.disabled:
            agen0 = fn(*args, **kwargs)
            try:
                async for item in agen0:
                    yield item
            finally:
                await agen0.aclose()
            return
        s = begin(args, kwargs)
        keep = keep_output()
        limit = _state.max_generator_items
        items: list[Any] = []
        count = 0
        token = _activate(s)
        try:
            agen = fn(*args, **kwargs)
        finally:
            _deactivate(token)
        send: Callable[[Any], Awaitable[Any]] = agen.asend
        value: Any = None
        try:
            while True:
                token = _activate(s)
                try:
                    item = await send(value)
                except StopAsyncIteration:
                    return
                finally:
                    _deactivate(token)
                count += 1
                if keep and len(items) < limit:
                    items.append(item)
                try:
                    value = yield item
                    send = agen.asend
                except GeneratorExit:
                    s.set_attribute(GENERATOR_CLOSED_EARLY, True)
                    token = _activate(s)
                    try:
                        await agen.aclose()
                    finally:
                        _deactivate(token)
                    raise
                except BaseException as exc:
                    send, value = agen.athrow, exc
        except GeneratorExit:
            raise
        except BaseException as exc:
            s.fail(exc)
            raise
        finally:
            _finish_items(s, items, count, keep)
            s.end()

    return agen_wrapper
