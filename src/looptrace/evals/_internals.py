"""The evaluations' one interface to looptrace's core, beyond its public API.

The rest of this package imports public names (``from looptrace import ...``) and this module;
what is here has no public equivalent:

- the pipeline, imported for its wiring: it installs the sink the experiment's spans end in;
- the attribute names the store and viewer read (``_semconv``);
- the capture switches (``_state``): whether inputs and outputs are kept, whether tracing is
  disabled, and the span-end hooks that sum a case's token usage;
- starting a root span whatever span is active, with the clock's ids (``_capture.start``, ``_clock``);
- the active-span variable, set across ``__aenter__``/``__aexit__`` (``_capture.context``);
- how a failure is described on a span (``_capture.spans``) and how an error inside looptrace is recorded
  without reaching user code (``_errors``);
- the ``looptrace.attributes`` values in force (``_capture.attributes``), which cases extend with
  the experiment's session and metadata, and a value worked out at export (``Deferred``);
- the evaluation span a score becomes (``_feedback``), which scorers' results share with
  ``looptrace.score``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from looptrace import NonRecordingSpan, Span

from .. import _clock, _state
from .. import _export as _export  # the wiring: spans need the sink it installs
from .. import _semconv as semconv
from .._capture.attributes import ATTRIBUTES, ContextAttributes
from .._capture.context import CURRENT
from .._capture.spans import Deferred
from .._capture.spans import _describe as describe
from .._capture.spans import _is_cancellation as is_cancellation
from .._capture.start import start_root
from .._errors import internal_error
from .._feedback import emit as emit_score
from .._feedback import evaluation_attributes

__all__ = [
    "ATTRIBUTES",
    "CURRENT",
    "ContextAttributes",
    "Deferred",
    "add_end_hook",
    "capture_inputs",
    "capture_outputs",
    "describe",
    "emit_score",
    "evaluation_attributes",
    "internal_error",
    "is_cancellation",
    "new_root",
    "new_time_ns",
    "new_trace_id",
    "remove_end_hook",
    "semconv",
]


# The switches are read when used: configure() may change them between experiments.
def capture_inputs() -> bool:
    return _state.capture_inputs


def capture_outputs() -> bool:
    return _state.capture_outputs


def add_end_hook(hook: Callable[[Span], None]) -> None:
    _state.add_hooks(end=hook)


def remove_end_hook(hook: Callable[[Span], None]) -> None:
    _state.remove_hooks(end=hook)


def new_trace_id() -> int:
    # Looked up at each call: looptrace.testing swaps in deterministic ids.
    return _clock.new_trace_id()


def new_time_ns() -> int:
    # Looked up at each call: looptrace.testing swaps in a deterministic clock.
    return _clock.now_ns()


def new_root(name: str, attributes: dict[str, Any]) -> Span:
    """A span that starts a new trace whatever span is active."""
    if _state.disabled:
        return NonRecordingSpan(_clock.new_trace_id(), _clock.new_span_id())
    return start_root(name, attributes)
