"""A cheap guess at a span's size, for buffer accounting before serialization."""

from __future__ import annotations

from collections.abc import Sequence, Sized
from typing import TYPE_CHECKING, Any

from .._capture.spans import UNSET, Span

if TYPE_CHECKING:
    pass


# --------------------------------------------------------------------------- sizing

_SPAN_OVERHEAD = 320
_VALUE_OVERHEAD = 48


_TEXT = frozenset((str, bytes, bytearray))

# The encoded size of the last large span of each name. The estimate sees only top-level
# values, so an image inside a chat request is one dict to it, 48 bytes; without this, the
# buffer would count a backlog of such spans as a few kilobytes, its byte budget would not
# bound their memory, and a batch's worth of bytes would not wake the flusher. Spans of one
# name tend to carry payloads of one shape, so the last one's size is the guess for the next.
# Only names whose spans were large are kept (an empty dict costs the estimate one check),
# and at most _MAX_NAMES of them.
LARGE_SPAN_BYTES = 64 * 1024
_MAX_NAMES = 256
_large: dict[str, int] = {}


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
    if _large:
        seen = _large.get(span.name)
        if seen is not None and seen > n:
            return seen
    return n


def learn_sizes(spans: Sequence[Span], chunks: Sequence[Sized | None]) -> None:
    """Remember the encoded size of each large span by name, for :func:`estimate_size`; a
    name whose span came out small is forgotten. Runs where a batch has been encoded."""
    large = _large
    for span, chunk in zip(spans, chunks, strict=False):
        if chunk is None:
            continue
        size = len(chunk)
        if size >= LARGE_SPAN_BYTES:
            if len(large) >= _MAX_NAMES and span.name not in large:
                large.clear()
            large[span.name] = size
        elif large:
            large.pop(span.name, None)


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
