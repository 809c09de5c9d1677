"""The shapes spans take between stages, after capture.

    Span (raw Python values, ``_capture/spans.py``)
      -> WireSpan    (``_serialize.to_wire``: attributes are OTLP-ready primitives / JSON strings)
      -> bytes       (``_otlp.encode_span``: one encoded OTLP ``Span`` message or JSON object)
      -> request     (``_otlp.encode_request``: spans grouped under resource and scope, compressed)
    request body -> DecodedSpan (``collector.decode.decode_request``: what the store keeps)
    WireSpan -> DecodedSpan     (``_export.store.decoded``: the local store, no bytes between)

Encoding each span once lets the batcher count exact bytes and split a batch without
re-serializing anything.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Union

# An OTLP AnyValue as Python: primitives, homogeneous lists of them. Anything else was turned
# into a JSON string by the serializer.
AttrValue = Union[str, bool, int, float, bytes, Sequence[Union[str, bool, int, float]]]
Attributes = list[tuple[str, AttrValue]]


class WireEvent:
    __slots__ = ("attributes", "name", "time_ns")

    def __init__(self, name: str, time_ns: int, attributes: Attributes) -> None:
        self.name = name
        self.time_ns = time_ns
        self.attributes = attributes


class WireLink:
    __slots__ = ("attributes", "is_remote", "span_id", "trace_id", "trace_state")

    def __init__(
        self,
        trace_id: int,
        span_id: int,
        trace_state: str,
        attributes: Attributes,
        is_remote: bool = False,
    ) -> None:
        self.trace_id = trace_id
        self.span_id = span_id
        self.trace_state = trace_state
        self.attributes = attributes
        # Goes into the OTLP link flags (SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK).
        self.is_remote = is_remote


class WireSpan:
    """A span ready to encode. ``end_ns == 0`` marks an in-progress record (see _semconv)."""

    __slots__ = (
        "attributes",
        "dropped_attributes",
        "end_ns",
        "events",
        "kind",
        "links",
        "name",
        "parent_is_remote",
        "parent_span_id",
        "scope",
        "span_id",
        "start_ns",
        "status_code",
        "status_message",
        "trace_id",
        "trace_state",
    )

    def __init__(
        self,
        trace_id: int,
        span_id: int,
        parent_span_id: int,
        name: str,
        kind: int,
        start_ns: int,
        end_ns: int,
        attributes: Attributes,
        events: list[WireEvent],
        links: list[WireLink],
        status_code: int,
        status_message: str,
        trace_state: str = "",
        dropped_attributes: int = 0,
        parent_is_remote: bool = False,
        scope: tuple[str, str] | None = None,
    ) -> None:
        self.trace_id = trace_id
        self.span_id = span_id
        self.parent_span_id = parent_span_id  # 0: a root
        self.name = name
        self.kind = kind
        self.start_ns = start_ns
        self.end_ns = end_ns
        self.attributes = attributes
        self.events = events
        self.links = links
        self.status_code = status_code
        self.status_message = status_message
        self.trace_state = trace_state
        self.dropped_attributes = dropped_attributes
        # The parent came from another process (``looptrace.extract``): OTLP span flags say so.
        self.parent_is_remote = parent_is_remote
        # The instrumentation scope, when not looptrace's own (see _otlp.ScopedChunk).
        self.scope = scope

    def weight(self) -> int:
        """About what the span takes once written out: its strings and bytes, a few bytes for
        each other value, and a fixed cost per span and per event or link."""
        n = _SPAN_BYTES + len(self.name) + _values_bytes(self.attributes)
        for e in self.events:
            n += _ITEM_BYTES + len(e.name) + _values_bytes(e.attributes)
        for link in self.links:
            n += _ITEM_BYTES + _values_bytes(link.attributes)
        return n

    def __reduce__(self) -> tuple[Any, ...]:
        # Positional, not copyreg's slot-by-slot state: a large span crosses to a worker as a
        # pickle made on the loop, and this halves that pickle's cost.
        return (
            WireSpan,
            (
                self.trace_id,
                self.span_id,
                self.parent_span_id,
                self.name,
                self.kind,
                self.start_ns,
                self.end_ns,
                self.attributes,
                self.events,
                self.links,
                self.status_code,
                self.status_message,
                self.trace_state,
                self.dropped_attributes,
                self.parent_is_remote,
                self.scope,
            ),
        )


_SPAN_BYTES = 160  # ids, times, kind, status, and the row or message around them
_ITEM_BYTES = 32


def _values_bytes(attributes: Attributes) -> int:
    # A loop, not sum() over a generator: a quarter of the cost, on the loop, once per span.
    n = 0
    for _, v in attributes:
        n += len(v) if isinstance(v, _TEXT) else 8
    return n


_TEXT = (str, bytes)


@dataclasses.dataclass
class DecodedSpan:
    """One span as a receiver sees it, whichever encoding it arrived in. Ids are lowercase hex."""

    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: list[dict[str, Any]]  # {"name", "time_ns", "attributes"}
    links: list[dict[str, Any]]  # {"trace_id", "span_id", "trace_state", "attributes"}
    status_code: int
    status_message: str
    trace_state: str
    resource: dict[str, Any]
    scope_name: str
    scope_version: str
