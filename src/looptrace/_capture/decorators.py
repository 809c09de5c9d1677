"""``@traced`` and ``looptrace.span``: record a span per call, and nothing more.

The hot path allocates one Span, reads a few module attributes, sets a ContextVar and hands the
ended span to the sink. Everything that is slow (binding a signature, formatting a traceback,
JSON) is done once per function at decoration time or later, in the pipeline.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, ParamSpec, TypeVar, overload

from .. import _state
from .._errors import internal_error
from .._semconv import (
    GEN_AI_AGENT_NAME,
    GEN_AI_OP_EXECUTE_TOOL,
    GEN_AI_OP_INVOKE_AGENT,
    GEN_AI_OPERATION_NAME,
    GEN_AI_TOOL_NAME,
    OI_AGENT,
    OI_KINDS,
    OI_TOOL,
    OPENINFERENCE_SPAN_KIND,
)
from .context import CURRENT
from .context import reset_current as _reset_current
from .context import set_current as _set_current
from .generators import _wrap_async_generator, _wrap_generator
from .spans import CallSite, NonRecordingSpan, Span, SpanContext, SpanKind
from .start import (
    _bridge_exit,
    start_root,
    start_scoped_span,
    start_span,
)

__all__ = [
    "kind_attributes",
    "span",
    "start_root",
    "start_scoped_span",
    "start_span",
    "traced",
]


def kind_attributes(as_type: str | None, name: str) -> dict[str, Any]:
    """What ``as_type`` says on a span: ``openinference.span.kind``, and for a tool or an
    agent the GenAI operation and the tool's or agent's name (the span's name).

    Without one, looptrace's own spans are exported as CHAIN (see _serialize.spans)."""
    if as_type is None:
        return {}
    if not isinstance(as_type, str) or as_type.lower() not in OI_KINDS:
        raise ValueError(f"as_type must be one of {', '.join(sorted(OI_KINDS))}, got {as_type!r}")
    kind = OI_KINDS[as_type.lower()]
    out: dict[str, Any] = {OPENINFERENCE_SPAN_KIND: kind}
    if kind == OI_TOOL:
        out[GEN_AI_OPERATION_NAME] = GEN_AI_OP_EXECUTE_TOOL
        out[GEN_AI_TOOL_NAME] = name
    elif kind == OI_AGENT:
        out[GEN_AI_OPERATION_NAME] = GEN_AI_OP_INVOKE_AGENT
        out[GEN_AI_AGENT_NAME] = name
    return out


P = ParamSpec("P")
R = TypeVar("R")
F = TypeVar("F", bound=Callable[..., Any])


class span:
    """Trace a block: ``with looptrace.span("name") as s:`` or ``async with``.

    ``parent`` may be a remote :class:`SpanContext` (from ``looptrace.extract``) or a span.
    ``kind`` is the OpenTelemetry span kind; ``as_type`` what the span is to the
    OpenInference backends ("chain", the default, "tool", "agent", "llm", "embedding",
    "retriever", "reranker", "guardrail", "evaluator"). An exception leaving the block is
    recorded on the span and re-raised untouched.
    """

    __slots__ = (
        "_attributes",
        "_bridge",
        "_bridged",
        "_kind",
        "_name",
        "_parent",
        "_span",
        "_token",
    )

    def __init__(
        self,
        name: str,
        attributes: Mapping[str, Any] | None = None,
        *,
        parent: Span | SpanContext | None = None,
        kind: SpanKind | int = SpanKind.INTERNAL,
        as_type: str | None = None,
    ) -> None:
        self._name = name
        self._attributes = dict(attributes) if attributes else None
        if as_type is not None:
            self._attributes = {**kind_attributes(as_type, name), **(self._attributes or {})}
        self._parent = parent
        self._kind = int(kind)
        self._span: Span | None = None

    def __enter__(self) -> Span:
        parent = self._parent
        if parent is not None and isinstance(parent, SpanContext):
            from .context import _RemoteParent

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
        # Activation written out (as in the decorators' wrappers) rather than through
        # _activate/_deactivate: the two calls and their tuple were a sixth of a block's cost.
        self._token = _set_current(s)
        bridge = self._bridge = _state.bridge
        if bridge is not None:
            self._bridged = bridge.enter(s)
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
            bridge = self._bridge
            if bridge is not None:
                _bridge_exit(bridge, self._bridged)
            _reset_current(self._token)
        except ValueError:
            # Entered in one context and left in another (a generator resumed elsewhere):
            # the block is still over, so this context is left with no active span.
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
    as_type: str | None = None,
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
    as_type: str | None = None,
) -> Any:
    """Record a span for every call of a function, coroutine function, generator or async
    generator (also methods, classmethods and staticmethods).

    The span is named after the function's qualified name unless ``name`` is given; inputs are
    the call's arguments and the output its return value (or the first items a generator
    yields), unless turned off here or globally. ``process_inputs``/``process_outputs`` transform
    those values at export time (for redaction); if they raise, the value is replaced by an
    error marker, never sent raw. ``as_type`` says what the function is to the OpenInference
    backends (``openinference.span.kind``): "chain" (the default), "tool", "agent", "llm",
    "embedding", "retriever", "reranker", "guardrail" or "evaluator"; a tool's and an agent's
    spans also carry the GenAI ``execute_tool`` / ``invoke_agent`` operation and their name.
    """
    if as_type is not None:
        kind_attributes(as_type, "")  # a wrong value fails here, not at the first call

    def decorate(target: Any) -> Any:
        if isinstance(target, (classmethod, staticmethod)):
            return type(target)(decorate(target.__func__))
        # Decorating happens ahead of the calls (mostly at import time): the export path's
        # start-up is done here, not in the first traced call.
        _state.prepare_ahead()
        span_name = name or getattr(target, "__qualname__", None) or repr(target)
        static = attributes
        if as_type is not None:
            # Static attributes are applied at export: the kind costs the call nothing.
            static = {**kind_attributes(as_type, span_name), **(attributes or {})}
        return _wrap(
            target,
            CallSite(
                span_name,
                getattr(target, "__qualname__", ""),
                getattr(target, "__module__", "") or "",
                static,
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
