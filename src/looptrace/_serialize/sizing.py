"""A cheap guess at a span's size, for buffer accounting before serialization."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._capture.spans import UNSET, Span

if TYPE_CHECKING:
    pass


# --------------------------------------------------------------------------- sizing

_SPAN_OVERHEAD = 320
_VALUE_OVERHEAD = 48


_TEXT = frozenset((str, bytes, bytearray))


def _top_size(v: Any) -> int:
    return len(v) + 2 if type(v) in _TEXT else _VALUE_OVERHEAD


def estimate_size(span: Span) -> int:
    """A cheap guess at a span's encoded size, for buffer accounting before serialization.

    Looks only at top-level values (``len`` of strings and bytes, a fixed amount for anything
    else): O(number of arguments), never a walk. It runs on the caller's thread for every
    span, so the per-value rule is written out in the loops rather than called."""
    n = _SPAN_OVERHEAD + len(span.name)
    attrs = span.attributes
    if attrs:
        for v in attrs.values():
            n += 26 + len(v) if type(v) in _TEXT else 24 + _VALUE_OVERHEAD
    inputs = span.inputs
    if type(inputs) is dict:
        for v in inputs.values():
            n += 18 + len(v) if type(v) in _TEXT else 16 + _VALUE_OVERHEAD
    elif inputs is not UNSET:
        n += _top_size(inputs)
    if span.output is not UNSET:
        n += _top_size(span.output)
    if span.events:
        n += 256 * len(span.events)
    return n


def leaf_size(v: Any) -> int:
    """What a non-container value adds to the offload decision: arrays and memoryviews by
    their buffer, str subclasses by length, anything else nothing."""
    if type(v) is memoryview:
        return int(v.nbytes)
    if isinstance(v, str):
        return len(v)
    if hasattr(v, "__array_interface__"):
        nbytes = getattr(v, "nbytes", None)
        if type(nbytes) is int:
            return nbytes
    return 0
