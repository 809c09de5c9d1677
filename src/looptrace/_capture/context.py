"""The active span, carried in a ContextVar, and W3C trace-context propagation.

Because the active span lives in a ContextVar, parenting follows ``await``, tasks created with
``asyncio.create_task``/``gather``/``TaskGroup`` and ``asyncio.to_thread`` for free; plain threads
and ``run_in_executor`` need :func:`bind_context`.

A span that ended while still the active span of a context it could not be removed from (a
framework that ends its runs in a copy of the caller's context, as LangChain does for async
runs; see ``start._release``) is not the parent of what starts there afterwards: the span
that was active before it is. Any other ended span stays the parent of spans started under it
(a task that outlives the call that created it).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import re
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from typing import ParamSpec, TypeVar

from .. import _state
from .spans import INVALID_SPAN, NO_OUTER, NonRecordingSpan, Span, SpanContext

P = ParamSpec("P")
R = TypeVar("R")

CURRENT: contextvars.ContextVar[Span | None] = contextvars.ContextVar(
    "looptrace_current_span", default=None
)
# Bound once: the decorators' wrappers, span blocks and generators' items activate their span
# with these directly, on every call or item.
set_current = CURRENT.set
reset_current = CURRENT.reset


# How many marked spans a new span looks through for one to go under (each mark is resolved
# as it is set, so a chain is only as long as runs that ended out of order were nested).
_MAX_HOPS = 64


def _in_place_of(span: Span | None) -> Span | None:
    """The span a new span goes under where ``span`` is the active one: ``span`` itself, or,
    for a span marked with ``_outer`` as it ended (see start._release), the nearest span that
    was active before it and not marked (None: there was none, or too many to look through;
    the new span starts a trace). An ended span that is not marked stays the parent (a task
    that outlives the call that created it)."""
    for _ in range(_MAX_HOPS):
        if span is None:
            return None
        outer = span._outer
        if outer is None:
            return span
        if outer is NO_OUTER:
            return None
        span = outer
    return None


def current_span() -> Span:
    """The span active in this context, or a non-recording span when there is none."""
    span = CURRENT.get()
    bridge = _state.bridge
    if bridge is not None:
        span = bridge.parent(span)
    if span is not None and span._outer is not None:
        span = _in_place_of(span)
    return INVALID_SPAN if span is None else span


class _RemoteParent(Span):
    """Stands for a span in another process; local spans parent to it, nobody ends it."""

    __slots__ = ()
    is_remote = True


@contextlib.contextmanager
def attach(context: SpanContext | None) -> Iterator[None]:
    """Make a remote span context (from :func:`extract`) the parent of spans in this block."""
    if context is None:
        yield
        return
    if context.sampled:
        parent: Span = _RemoteParent(
            "", context.trace_id, context.span_id, 0, 0, None, context.trace_state
        )
    else:
        parent = NonRecordingSpan(context.trace_id, context.span_id, context.trace_state)
    with _active(parent):
        yield


@contextlib.contextmanager
def suppress_tracing() -> Iterator[None]:
    """No span is recorded inside this block (the exporter runs under it, so it never traces
    its own requests). Costs nothing extra on the hot path: the active span is simply a
    non-recording one."""
    with _active(INVALID_SPAN):
        yield


@contextlib.contextmanager
def _active(span: Span) -> Iterator[None]:
    token = CURRENT.set(span)
    bridge = _state.bridge
    bridged = bridge.enter(span) if bridge is not None else None
    try:
        yield
    finally:
        if bridge is not None:
            bridge.exit(bridged)
        CURRENT.reset(token)


def bind_context(fn: Callable[P, R]) -> Callable[P, R]:
    """Wrap ``fn`` so it runs with the caller's active span, in any thread.

    For ``loop.run_in_executor(None, bind_context(work))`` and ``threading.Thread(target=...)``;
    ``asyncio.to_thread`` already does this. Each call runs in its own copy of the context, so
    the wrapper may be called from several threads at once.
    """
    ctx = contextvars.copy_context()

    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        return ctx.copy().run(fn, *args, **kwargs)

    return run


_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")


def inject(carrier: MutableMapping[str, str] | None = None) -> MutableMapping[str, str]:
    """Write ``traceparent`` (and ``tracestate``) for the active span into ``carrier``."""
    out: MutableMapping[str, str] = {} if carrier is None else carrier
    span = CURRENT.get()
    bridge = _state.bridge
    if bridge is not None:
        span = bridge.parent(span)
    if span is not None and span._outer is not None:
        span = _in_place_of(span)
    if span is None or span.trace_id == 0:
        return out
    flags = "01" if span.is_recording else "00"
    out["traceparent"] = f"00-{span.trace_id:032x}-{span.span_id:016x}-{flags}"
    if span.trace_state:
        out["tracestate"] = span.trace_state
    return out


def extract(carrier: Mapping[str, str]) -> SpanContext | None:
    """Read a W3C ``traceparent``/``tracestate`` pair; None when absent or malformed."""
    raw = None
    state = ""
    for key, value in carrier.items():
        low = key.lower()
        if low == "traceparent":
            raw = value
        elif low == "tracestate":
            state = value
    if raw is None:
        return None
    match = _TRACEPARENT.match(raw.strip().lower())
    if match is None:
        return None
    version, trace_hex, span_hex, flags_hex, rest = match.groups()
    # Version ff is forbidden; version 00 must have nothing after the flags.
    if version == "ff" or (version == "00" and rest):
        return None
    trace_id, span_id = int(trace_hex, 16), int(span_hex, 16)
    if trace_id == 0 or span_id == 0:
        return None
    return SpanContext(trace_id, span_id, bool(int(flags_hex, 16) & 1), state.strip(), True)
