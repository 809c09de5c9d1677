"""The span: the live object user code talks to, and, once ended, the record the pipeline ships.

One slotted object per span, never copied: capture fills it, ``end()`` hands it to the sink with
one call, and serialization happens later, off the caller's path. Values set on a span are kept
as they are (no copying, no JSON); see ``docs/serialization.md`` for what that means when a caller
mutates an argument after the call.
"""

from __future__ import annotations

import enum
import sys
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, Final, NamedTuple

from .. import _clock, _state
from .._semconv import CANCELLED, EXCEPTION_EVENT
from .attributes import ContextAttributes, get_attributes


class StatusCode(enum.IntEnum):
    """OpenTelemetry span status codes (the OTLP numbering)."""

    UNSET = 0
    OK = 1
    ERROR = 2


class SpanKind(enum.IntEnum):
    """OpenTelemetry span kinds (the OTLP numbering)."""

    INTERNAL = 1
    SERVER = 2
    CLIENT = 3
    PRODUCER = 4
    CONSUMER = 5


class _Unset:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<unset>"

    def __bool__(self) -> bool:
        return False


UNSET: Final[Any] = _Unset()


class SpanContext(NamedTuple):
    """The identity of a span, as carried across process boundaries (W3C trace context)."""

    trace_id: int
    span_id: int
    sampled: bool = True
    trace_state: str = ""
    is_remote: bool = False

    @property
    def trace_id_hex(self) -> str:
        return f"{self.trace_id:032x}"

    @property
    def span_id_hex(self) -> str:
        return f"{self.span_id:016x}"


class Event:
    """Something that happened at a point in a span's life."""

    __slots__ = ("attributes", "exception", "name", "time_ns", "traceback")

    def __init__(
        self,
        name: str,
        time_ns: int,
        attributes: dict[str, Any] | None = None,
        exception: BaseException | None = None,
        traceback: TracebackType | None = None,
    ) -> None:
        self.name = name
        self.time_ns = time_ns
        self.attributes = attributes
        # Kept as objects: the type, message and stack are formatted at export, not on the caller.
        self.exception = exception
        self.traceback = traceback

    def __repr__(self) -> str:
        return f"Event({self.name!r}, time_ns={self.time_ns})"


class Link(NamedTuple):
    """A reference from one span to another, possibly in another trace."""

    context: SpanContext
    attributes: Mapping[str, Any] | None = None


class CallSite:
    """What ``@traced`` knows about a function, computed once at decoration time."""

    __slots__ = (
        "attributes",
        "capture_inputs",
        "capture_output",
        "module",
        "name",
        "process_inputs",
        "process_outputs",
        "qualname",
    )

    def __init__(
        self,
        name: str,
        qualname: str,
        module: str,
        attributes: Mapping[str, Any] | None = None,
        capture_inputs: bool | None = None,
        capture_output: bool | None = None,
        process_inputs: Callable[[Any], Any] | None = None,
        process_outputs: Callable[[Any], Any] | None = None,
    ) -> None:
        self.name = name
        self.qualname = qualname
        self.module = module
        self.attributes = dict(attributes) if attributes else None
        self.capture_inputs = capture_inputs
        self.capture_output = capture_output
        self.process_inputs = process_inputs
        self.process_outputs = process_outputs

    def __repr__(self) -> str:
        return f"<CallSite {self.module}.{self.qualname}>"


class Span:
    """A unit of work: created by ``@traced`` or ``looptrace.span()``, ended exactly once."""

    __slots__ = (
        "__weakref__",
        "_outer",
        "attributes",
        "context_attributes",
        "end_ns",
        "events",
        "inputs",
        "kind",
        "links",
        "name",
        "output",
        "parent_span_id",
        "pending_bytes",
        "site",
        "span_id",
        "start_ns",
        "status_code",
        "status_message",
        "trace_id",
        "trace_state",
    )

    is_recording: bool = True
    is_remote: bool = False
    # True only on the local root of a distributed trace (see RemoteChildSpan); a class
    # attribute so ordinary spans pay nothing for it.
    parent_is_remote: bool = False
    # The instrumentation scope (name, version) of a span made through another tracing API
    # (see ScopedSpan); None puts the span under looptrace's own scope.
    scope: tuple[str, str] | None = None
    # The decorated function this span came from (None for ``looptrace.span``): its static
    # attributes, code location and hooks are applied at export instead of on every call.
    site: CallSite | None
    # The bytes the export buffer counted for the span while it waits there (set by the
    # buffer, not here): kept on the span rather than in a (span, size) pair beside it, so a
    # backlog of pending spans is no more objects for the garbage collector to walk.
    pending_bytes: int

    def __init__(
        self,
        name: str,
        trace_id: int,
        span_id: int,
        parent_span_id: int,
        start_ns: int,
        attributes: dict[str, Any] | None = None,
        trace_state: str = "",
        kind: int = 1,
    ) -> None:
        self.name = name
        self.trace_id = trace_id
        self.span_id = span_id
        self.parent_span_id = parent_span_id  # 0 for a root
        self.start_ns = start_ns
        self.end_ns = 0  # 0 while the span is open
        self.attributes = attributes
        self.events: list[Event] | None = None
        self.links: list[Link] | None = None
        self.inputs: Any = UNSET
        self.output: Any = UNSET
        self.status_code = 0
        self.status_message = ""
        self.trace_state = trace_state
        self.kind = kind
        # Set as the span ends in another context than the one that made it the active span
        # (LangChain ends an async run in a copy of the caller's context), where it could not
        # be made inactive again: the span that was active there before it (NO_OUTER: none).
        # A span started where this one is still active goes under that one instead (see
        # context._in_place_of). None on every other span.
        self._outer: Span | None = None
        self.site = None
        # The looptrace.attributes() block in force where the span starts (exported as
        # session.id, user.id, tag.tags, metadata): one ContextVar read, nothing copied.
        self.context_attributes: ContextAttributes | None = get_attributes()

    def __repr__(self) -> str:
        state = "ended" if self.end_ns else "open"
        return f"<Span {self.name!r} {self.trace_id:032x}/{self.span_id:016x} {state}>"

    @property
    def context(self) -> SpanContext:
        return SpanContext(self.trace_id, self.span_id, True, self.trace_state)

    @property
    def is_root(self) -> bool:
        return self.parent_span_id == 0

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns if self.end_ns else 0

    @property
    def exception(self) -> BaseException | None:
        """The last exception recorded on this span, if any."""
        if self.events:
            for event in reversed(self.events):
                if event.exception is not None:
                    return event.exception
        return None

    def set_attribute(self, key: str, value: Any) -> None:
        """Set one attribute; non-primitive values are serialized to JSON at export."""
        if self.end_ns:
            return
        if self.attributes is None:
            self.attributes = {key: value}
        else:
            self.attributes[key] = value

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        if self.end_ns:
            return
        if self.attributes is None:
            self.attributes = dict(attributes)
        else:
            self.attributes.update(attributes)

    def set_inputs(self, inputs: Any) -> None:
        """Record what went in (exported as ``input.value``, JSON)."""
        if not self.end_ns:
            self.inputs = inputs

    def set_output(self, output: Any) -> None:
        """Record what came out (exported as ``output.value``, JSON)."""
        if not self.end_ns:
            self.output = output

    def add_event(
        self, name: str, attributes: Mapping[str, Any] | None = None, time_ns: int | None = None
    ) -> None:
        if self.end_ns:
            return
        event = Event(
            name,
            _clock.now_ns() if time_ns is None else time_ns,
            dict(attributes) if attributes else None,
        )
        if self.events is None:
            self.events = [event]
        else:
            self.events.append(event)

    def add_link(self, context: SpanContext, attributes: Mapping[str, Any] | None = None) -> None:
        if self.end_ns:
            return
        if self.links is None:
            self.links = []
        self.links.append(Link(context, attributes))

    def record_exception(
        self, exc: BaseException, attributes: Mapping[str, Any] | None = None
    ) -> None:
        """Add an ``exception`` event; type, message and stack are formatted at export."""
        if self.end_ns:
            return
        event = Event(
            EXCEPTION_EVENT,
            _clock.now_ns(),
            dict(attributes) if attributes else None,
            exc,
            exc.__traceback__,
        )
        if self.events is None:
            self.events = [event]
        else:
            self.events.append(event)

    def set_status(self, code: StatusCode | int, message: str = "") -> None:
        if self.end_ns:
            return
        self.status_code = int(code)
        self.status_message = message if code == StatusCode.ERROR else ""

    def fail(self, exc: BaseException) -> None:
        """Record ``exc`` and mark the span as failed (cancellation included)."""
        self.record_exception(exc)
        if _is_cancellation(exc):
            self.set_attribute(CANCELLED, True)
            self.set_status(StatusCode.ERROR, "cancelled")
        else:
            self.set_status(StatusCode.ERROR, _describe(exc))

    def end(self, end_ns: int | None = None) -> None:
        """Finish the span and hand it to the pipeline. A second call does nothing."""
        if self.end_ns:
            return
        self.end_ns = _clock.now_ns() if end_ns is None else end_ns
        try:
            if _state.end_hooks:
                for hook in _state.end_hooks:
                    hook(self)
            _state.sink.on_end(self)
        except Exception as exc:
            try:
                from .._errors import internal_error
            except Exception:  # the interpreter is being torn down: nothing left to tell
                return
            internal_error("span.end", exc)


class RemoteChildSpan(Span):
    """A span whose parent lives in another process (its context came from ``extract``)."""

    __slots__ = ()
    parent_is_remote = True


class ScopedSpan(Span):
    """A span made through the OpenTelemetry API (``looptrace.otel``): it is exported under
    the instrumentation scope that made it, and may be the local root of a remote parent."""

    __slots__ = ("parent_is_remote", "scope")

    def __init__(
        self,
        name: str,
        trace_id: int,
        span_id: int,
        parent_span_id: int,
        start_ns: int,
        attributes: dict[str, Any] | None,
        trace_state: str,
        kind: int,
        scope: tuple[str, str] | None,
        parent_is_remote: bool,
    ) -> None:
        # Span.__init__'s assignments, written out: this runs for every span made through the
        # OpenTelemetry API, and a call into the base class costs a tenth of the capture.
        self.name = name
        self.trace_id = trace_id
        self.span_id = span_id
        self.parent_span_id = parent_span_id
        self.start_ns = start_ns
        self.end_ns = 0
        self.attributes = attributes
        self.events = None
        self.links = None
        self.inputs = UNSET
        self.output = UNSET
        self.status_code = 0
        self.status_message = ""
        self.trace_state = trace_state
        self.kind = kind
        self._outer = None
        self.site = None
        self.context_attributes = get_attributes()
        self.scope = scope
        self.parent_is_remote = parent_is_remote


class NonRecordingSpan(Span):
    """A span that records nothing: unsampled, suppressed, disabled, or no span at all.

    It keeps its ids so children of an unsampled span stay in the same (unsampled) trace and a
    propagated ``traceparent`` still says which trace this was.
    """

    __slots__ = ("_sampled",)

    is_recording = False

    def __init__(self, trace_id: int = 0, span_id: int = 0, trace_state: str = "") -> None:
        # Deliberately skips Span.__init__: a non-recording span is as cheap as it can be.
        self.name = ""
        self.trace_id = trace_id
        self.span_id = span_id
        self.parent_span_id = 0
        self.trace_state = trace_state
        self.end_ns = 0
        self.attributes = None
        self.events = None
        self.links = None
        self.status_code = 0
        self.context_attributes = None
        self._outer = None

    @property
    def context(self) -> SpanContext:
        return SpanContext(self.trace_id, self.span_id, False, self.trace_state)

    def set_attribute(self, key: str, value: Any) -> None:
        pass

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        pass

    def set_inputs(self, inputs: Any) -> None:
        pass

    def set_output(self, output: Any) -> None:
        pass

    def add_event(
        self, name: str, attributes: Mapping[str, Any] | None = None, time_ns: int | None = None
    ) -> None:
        pass

    def add_link(self, context: SpanContext, attributes: Mapping[str, Any] | None = None) -> None:
        pass

    def record_exception(
        self, exc: BaseException, attributes: Mapping[str, Any] | None = None
    ) -> None:
        pass

    def set_status(self, code: StatusCode | int, message: str = "") -> None:
        pass

    def fail(self, exc: BaseException) -> None:
        pass

    def end(self, end_ns: int | None = None) -> None:
        pass

    def __repr__(self) -> str:
        return "<NonRecordingSpan>"


INVALID_SPAN: Final = NonRecordingSpan()
# Span.outer of a span marked while no span was active before it: a span started where it is
# still active starts a trace.
NO_OUTER: Final[Span] = NonRecordingSpan()


def _is_cancellation(exc: BaseException) -> bool:
    # asyncio is looked up, not imported: worker processes load this module and never run a
    # loop, and an exception cannot be asyncio's before asyncio is loaded.
    asyncio = sys.modules.get("asyncio")
    if asyncio is not None and isinstance(exc, asyncio.CancelledError):
        return True
    # trio's Cancelled, without importing trio in programs that never use it.
    cls = type(exc)
    return cls.__name__ == "Cancelled" and cls.__module__.startswith("trio")


def _describe(exc: BaseException) -> str:
    try:
        message = str(exc)
    except Exception:
        message = "<str() failed>"
    name = type(exc).__qualname__
    return f"{name}: {message}" if message else name


class Deferred:
    """An attribute value worked out when the span is exported rather than when it is set,
    for a value that costs more than the caller's path may spend (an LLM call's price, from a
    table lookup of a millisecond). The serializer calls ``resolve`` on the flusher, once per
    encoding; it must not raise, and returns None to leave the attribute out."""

    __slots__ = ()

    def resolve(self) -> bool | int | float | str | None:
        raise NotImplementedError
