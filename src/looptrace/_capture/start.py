"""Starting and activating spans: the part of capture every span goes through.

``start_span`` is the hot path's: a span under the active one (or a new, sampled trace), with no
lock and no I/O. ``start_scoped_span`` is for spans made through another tracing API, under an
exact parent; ``start_root`` starts a new trace whatever is active.
"""

from __future__ import annotations

from contextvars import Token
from typing import Any

from .. import _clock, _state
from .._errors import internal_error
from .context import CURRENT, _in_place_of
from .spans import NO_OUTER, NonRecordingSpan, RemoteChildSpan, ScopedSpan, Span, SpanKind

_MASK64 = (1 << 64) - 1


def sampled_out(trace_id: int) -> bool:
    """Whether the local sample ratio drops a new trace with ``trace_id`` (its low 64 bits
    against the threshold; the starts below write the test out, as they run on every call)."""
    return (trace_id & _MASK64) >= _state.sample_threshold


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
        if parent._outer is not None:  # ended, still active where it could not be undone
            return _start_outside(name, attributes, parent, kind)
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
        _run_start_hooks(span)
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
        if parent._outer is not None:  # ended, still active where it could not be undone
            parent = _in_place_of(parent)
            if parent is None or not parent.is_recording:
                return start_scoped_span(name, attributes, parent, kind, scope, start_ns)
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
        _run_start_hooks(span)
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


def _release(span: Span, tokens: tuple[Any, Any, Any]) -> None:
    """Undo ``_activate(span)`` as ``span`` ends. Called in another context than the one that
    activated it (a framework that ends its runs in a copy of the caller's context, as
    LangChain does for async runs), it cannot be undone there: the span is marked instead with
    the span that was active before it, which spans started there later go under. Called
    before ``span.end()``."""
    try:
        _deactivate(tokens)
    except ValueError:
        # Before the span ends, so that whoever sees it ended sees the mark too.
        before = tokens[0].old_value
        outer = None if before is Token.MISSING else _in_place_of(before)
        span._outer = NO_OUTER if outer is None else outer


def _start_outside(name: str, attributes: dict[str, Any] | None, ended: Span, kind: int) -> Span:
    """:func:`start_span` where the active span ``ended`` was marked by :func:`_release`: the
    new span goes under the span that was active before it."""
    parent = _in_place_of(ended)
    if parent is None:
        return start_scoped_span(name, attributes, None, kind, None)
    return start_span(name, attributes, parent, kind)


def _report_start(root: Span) -> None:
    try:
        _state.sink.on_start(root)
    except Exception as exc:
        internal_error("span.start", exc)


def _bridge_exit(bridge: _state.ContextBridge, token: object) -> None:
    try:
        bridge.exit(token)
    except Exception as exc:
        internal_error("span.bridge_exit", exc)


def _run_start_hooks(span: Span) -> None:
    for hook in _state.start_hooks:
        try:
            hook(span)
        except Exception as exc:
            internal_error("span.start_hook", exc)
