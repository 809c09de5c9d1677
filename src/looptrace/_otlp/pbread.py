"""Reading protobuf trace requests, by hand, field by field."""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .._wire import DecodedSpan
from ._common import _MASK64, DecodeError
from .pb import _unpack_d

if TYPE_CHECKING:
    pass


# -- protobuf --------------------------------------------------------------------------------

_WIRE_NAMES = {0: "varint", 1: "fixed64", 2: "length-delimited", 5: "fixed32"}


def _read_varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= end:
            raise DecodeError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise DecodeError("varint longer than 10 bytes")


def _next_field(buf: bytes, pos: int, end: int) -> tuple[int, int, Any, int]:
    """Read one field at ``pos``: (field number, wire type, value, next position). A
    length-delimited value is returned as its (start, end) span within ``buf``."""
    key, pos = _read_varint(buf, pos, end)
    field = key >> 3
    wt = key & 7
    if field == 0:
        raise DecodeError("field number 0 is invalid")
    if wt == 0:
        val, pos = _read_varint(buf, pos, end)
        return field, 0, val, pos
    if wt == 2:
        n, pos = _read_varint(buf, pos, end)
        stop = pos + n
        if stop > end:
            raise DecodeError(f"field {field}: length {n} runs past the end of its message")
        return field, 2, (pos, stop), stop
    if wt == 1:
        if pos + 8 > end:
            raise DecodeError(f"field {field}: truncated fixed64")
        return field, 1, int.from_bytes(buf[pos : pos + 8], "little"), pos + 8
    if wt == 5:
        if pos + 4 > end:
            raise DecodeError(f"field {field}: truncated fixed32")
        return field, 5, int.from_bytes(buf[pos : pos + 4], "little"), pos + 4
    if wt == 3:
        return field, 3, None, _skip_group(buf, pos, end, field)
    if wt == 4:
        raise DecodeError(f"field {field}: end-group without a start-group")
    raise DecodeError(f"field {field}: invalid wire type {wt}")


def _skip_group(buf: bytes, pos: int, end: int, group: int) -> int:
    # Deprecated proto2 groups may still appear as unknown fields; skip up to the matching end.
    depth = 0
    while pos < end:
        key, pos = _read_varint(buf, pos, end)
        field, wt = key >> 3, key & 7
        if wt == 4:
            if depth == 0:
                if field != group:
                    raise DecodeError(f"end-group {field} does not match start-group {group}")
                return pos
            depth -= 1
        elif wt == 3:
            depth += 1
            if depth > 64:
                raise DecodeError("groups nested too deeply")
        elif wt == 0:
            _, pos = _read_varint(buf, pos, end)
        elif wt == 1:
            pos += 8
        elif wt == 5:
            pos += 4
        elif wt == 2:
            n, pos = _read_varint(buf, pos, end)
            pos += n
        else:
            raise DecodeError(f"field {field}: invalid wire type {wt}")
        if pos > end:
            raise DecodeError(f"group {group} runs past the end of its message")
    raise DecodeError(f"group {group} is not terminated")


def _want(msg: str, field: int, wt: int, expected: int) -> None:
    if wt != expected:
        raise DecodeError(
            f"{msg} field {field}: wire type {_WIRE_NAMES.get(wt, wt)}, "
            f"expected {_WIRE_NAMES[expected]}"
        )


def _str(buf: bytes, span: tuple[int, int], what: str) -> str:
    try:
        return buf[span[0] : span[1]].decode()
    except UnicodeDecodeError:
        raise DecodeError(f"{what} is not valid UTF-8") from None


def _signed64(n: int) -> int:
    n &= _MASK64
    return n - (1 << 64) if n >> 63 else n


def _pb_other(
    buf: bytes, pos: int, end: int, msg: str, wire_types: Mapping[int, int]
) -> tuple[int, Any, int]:
    """The slow path of the message readers below: any field their fast path did not take.
    Returns (field, value, next position); a known field with the wrong wire type raises."""
    f, wt, v, pos = _next_field(buf, pos, end)
    expected = wire_types.get(f)
    if expected is not None:
        _want(msg, f, wt, expected)
    return f, v, pos


def _len_at(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """Read the length of a length-delimited field at ``pos``: (start, stop) of its body."""
    if pos >= end:
        raise DecodeError("truncated length")
    n = buf[pos]
    if n < 0x80:
        pos += 1
    else:
        n, pos = _read_varint(buf, pos, end)
    stop = pos + n
    if stop > end:
        raise DecodeError(f"length {n} runs past the end of its message")
    return pos, stop


_ANY_WIRE = {1: 2, 2: 0, 3: 0, 4: 1, 5: 2, 6: 2, 7: 2}


def _pb_any(buf: bytes, pos: int, end: int, depth: int) -> Any:
    if depth > 32:
        raise DecodeError("AnyValue nested too deeply")
    value: Any = None
    while pos < end:
        tag = buf[pos]
        # Fast path: the one-byte tags of the common cases.
        if tag == 0x0A:
            start, pos = _len_at(buf, pos + 1, end)
            try:
                value = buf[start:pos].decode()
            except UnicodeDecodeError:
                raise DecodeError("string_value is not valid UTF-8") from None
            continue
        if tag == 0x18 or tag == 0x10:
            v, pos = _read_varint(buf, pos + 1, end)
            value = _signed64(v) if tag == 0x18 else v != 0
            continue
        if tag == 0x21:
            if pos + 9 > end:
                raise DecodeError("AnyValue field 4: truncated fixed64")
            value = _unpack_d(buf, pos + 1)[0]
            pos += 9
            continue
        f, v, pos = _pb_other(buf, pos, end, "AnyValue", _ANY_WIRE)
        if f == 1:
            value = _str(buf, v, "string_value")
        elif f == 2:
            value = v != 0
        elif f == 3:
            value = _signed64(v)
        elif f == 4:
            value = _unpack_d(v.to_bytes(8, "little"))[0]
        elif f == 5:
            value = _pb_array(buf, v[0], v[1], depth + 1)
        elif f == 6:
            value = dict(_pb_kvlist(buf, v[0], v[1], depth + 1))
        elif f == 7:
            value = bytes(buf[v[0] : v[1]])
    return value


def _pb_array(buf: bytes, pos: int, end: int, depth: int) -> list[Any]:
    out = []
    while pos < end:
        f, wt, v, pos = _next_field(buf, pos, end)
        if f == 1:
            _want("ArrayValue", f, wt, 2)
            out.append(_pb_any(buf, v[0], v[1], depth))
    return out


def _pb_kvlist(buf: bytes, pos: int, end: int, depth: int) -> list[tuple[str, Any]]:
    out = []
    while pos < end:
        f, wt, v, pos = _next_field(buf, pos, end)
        if f == 1:
            _want("KeyValueList", f, wt, 2)
            out.append(_pb_kv(buf, v[0], v[1], depth))
    return out


_KV_WIRE = {1: 2, 2: 2}


def _pb_kv(buf: bytes, pos: int, end: int, depth: int = 0) -> tuple[str, Any]:
    key = ""
    value: Any = None
    while pos < end:
        tag = buf[pos]
        if tag == 0x0A or tag == 0x12:
            # Inline one-byte lengths (reading one byte past ``end`` is caught by the check).
            n = buf[pos + 1]
            if n < 0x80:
                start = pos + 2
                pos = start + n
            else:
                start, pos = _len_at(buf, pos + 1, end)
            if pos > end:
                raise DecodeError(f"KeyValue field {tag >> 3}: length runs past the end")
            if tag == 0x0A:
                try:
                    key = buf[start:pos].decode()
                except UnicodeDecodeError:
                    raise DecodeError("attribute key is not valid UTF-8") from None
            elif pos - start >= 2 and buf[start] == 0x0A and buf[start + 1] == pos - start - 2:
                # The common case, a short string value: "\x0a <n> text" filling the AnyValue.
                try:
                    value = buf[start + 2 : pos].decode()
                except UnicodeDecodeError:
                    raise DecodeError("string_value is not valid UTF-8") from None
            else:
                value = _pb_any(buf, start, pos, depth)
        else:
            _, _, pos = _pb_other(buf, pos, end, "KeyValue", _KV_WIRE)
    return key, value


def _pb_attrs_into(out: dict[str, Any], buf: bytes, v: tuple[int, int]) -> None:
    key, value = _pb_kv(buf, v[0], v[1])
    out[key] = value


def _pb_id(buf: bytes, v: tuple[int, int], size: int, what: str, optional: bool = False) -> str:
    n = v[1] - v[0]
    if n != size and not (optional and n == 0):
        raise DecodeError(f"{what} must be {size} bytes, got {n}")
    return buf[v[0] : v[1]].hex()


def _decode_pb_request(buf: bytes, spans: list[DecodedSpan] | None = None) -> list[DecodedSpan]:
    try:
        return _decode_pb_request_unchecked(buf, [] if spans is None else spans)
    except IndexError:
        # A fast path read past the very end of the body: only a truncated body does that.
        raise DecodeError("truncated message") from None


def _decode_pb_request_unchecked(buf: bytes, spans: list[DecodedSpan]) -> list[DecodedSpan]:
    pos, end = 0, len(buf)
    while pos < end:
        f, wt, v, pos = _next_field(buf, pos, end)
        if f == 1:
            _want("ExportTraceServiceRequest", f, wt, 2)
            _pb_resource_spans(buf, v[0], v[1], spans)
    return spans


def _pb_resource_spans(buf: bytes, pos: int, end: int, spans: list[DecodedSpan]) -> None:
    resource: dict[str, Any] = {}
    scope_spans: list[tuple[int, int]] = []
    while pos < end:
        f, wt, v, pos = _next_field(buf, pos, end)
        if f == 1:
            _want("ResourceSpans", f, wt, 2)
            rpos, rend = v
            while rpos < rend:
                rf, rwt, rv, rpos = _next_field(buf, rpos, rend)
                if rf == 1:
                    _want("Resource", rf, rwt, 2)
                    _pb_attrs_into(resource, buf, rv)
        elif f == 2:
            _want("ResourceSpans", f, wt, 2)
            # The resource may come after its scope spans: read them once it is known.
            scope_spans.append(v)
    for spos, send in scope_spans:
        _pb_scope_spans(buf, spos, send, resource, spans)


def _pb_scope_spans(
    buf: bytes, pos: int, end: int, resource: dict[str, Any], spans: list[DecodedSpan]
) -> None:
    scope_name = scope_version = ""
    first = len(spans)
    while pos < end:
        f, wt, v, pos = _next_field(buf, pos, end)
        if f == 1:
            _want("ScopeSpans", f, wt, 2)
            spos, send = v
            while spos < send:
                sf, swt, sv, spos = _next_field(buf, spos, send)
                if sf == 1:
                    _want("InstrumentationScope", sf, swt, 2)
                    scope_name = _str(buf, sv, "scope name")
                elif sf == 2:
                    _want("InstrumentationScope", sf, swt, 2)
                    scope_version = _str(buf, sv, "scope version")
        elif f == 2:
            _want("ScopeSpans", f, wt, 2)
            spans.append(_pb_span(buf, v[0], v[1], resource))
    # The scope may come after the spans.
    for span in spans[first:]:
        span.scope_name = scope_name
        span.scope_version = scope_version


_SPAN_LEN_TAGS = frozenset((0x0A, 0x12, 0x1A, 0x22, 0x2A, 0x4A, 0x5A, 0x6A, 0x7A))
_SPAN_WIRE = {1: 2, 2: 2, 3: 2, 4: 2, 5: 2, 6: 0, 7: 1, 8: 1, 9: 2, 11: 2, 13: 2, 15: 2}
_STATUS_WIRE = {2: 2, 3: 0}
_unpack_q = struct.Struct("<Q").unpack_from


def _pb_span(buf: bytes, pos: int, end: int, resource: dict[str, Any]) -> DecodedSpan:
    trace_id = span_id = ""
    parent: str | None = None
    name = trace_state = status_message = ""
    kind = start = stop = status_code = 0
    attributes: dict[str, Any] = {}
    events: list[dict[str, Any]] = []
    links: list[dict[str, Any]] = []
    while pos < end:
        tag = buf[pos]
        # Fast path for the one-byte tags a canonical encoder writes; anything else (unknown
        # fields, odd encodings, wrong wire types) goes through the checked slow path.
        if tag in _SPAN_LEN_TAGS:
            f = tag >> 3
            v0, pos = _len_at(buf, pos + 1, end)
            v: Any = (v0, pos)
        elif tag == 0x39 or tag == 0x41:
            f = tag >> 3
            if pos + 9 > end:
                raise DecodeError(f"Span field {f}: truncated fixed64")
            v = _unpack_q(buf, pos + 1)[0]
            pos += 9
        elif tag == 0x85 and pos + 6 <= end and buf[pos + 1] == 0x01:
            # flags (field 16, fixed32): not part of DecodedSpan.
            pos += 6
            continue
        else:
            f, v, pos = _pb_other(buf, pos, end, "Span", _SPAN_WIRE)
        if f == 9:
            key, value = _pb_kv(buf, v[0], v[1])
            attributes[key] = value
        elif f == 7:
            start = v
        elif f == 8:
            stop = v
        elif f == 1:
            trace_id = _pb_id(buf, v, 16, "trace_id")
        elif f == 2:
            span_id = _pb_id(buf, v, 8, "span_id")
        elif f == 4:
            parent = _pb_id(buf, v, 8, "parent_span_id", optional=True) or None
        elif f == 5:
            name = _str(buf, v, "span name")
        elif f == 6:
            kind = v
        elif f == 3:
            trace_state = _str(buf, v, "trace_state")
        elif f == 11:
            events.append(_pb_event(buf, v[0], v[1]))
        elif f == 13:
            links.append(_pb_link(buf, v[0], v[1]))
        elif f == 15:
            spos, send = v
            while spos < send:
                sf, sv, spos = _pb_other(buf, spos, send, "Status", _STATUS_WIRE)
                if sf == 2:
                    status_message = _str(buf, sv, "status message")
                elif sf == 3:
                    status_code = _signed64(sv)
    if not trace_id:
        raise DecodeError("span without a trace_id")
    if not span_id:
        raise DecodeError("span without a span_id")
    return DecodedSpan(
        trace_id=trace_id,
        span_id=span_id,
        parent_span_id=parent,
        name=name,
        kind=kind,
        start_ns=start,
        end_ns=stop,
        attributes=attributes,
        events=events,
        links=links,
        status_code=status_code,
        status_message=status_message,
        trace_state=trace_state,
        resource=resource,
        scope_name="",
        scope_version="",
    )


def _pb_event(buf: bytes, pos: int, end: int) -> dict[str, Any]:
    time_ns = 0
    name = ""
    attributes: dict[str, Any] = {}
    while pos < end:
        f, wt, v, pos = _next_field(buf, pos, end)
        if f == 1:
            _want("Event", f, wt, 1)
            time_ns = v
        elif f == 2:
            _want("Event", f, wt, 2)
            name = _str(buf, v, "event name")
        elif f == 3:
            _want("Event", f, wt, 2)
            _pb_attrs_into(attributes, buf, v)
    return {"name": name, "time_ns": time_ns, "attributes": attributes}


def _pb_link(buf: bytes, pos: int, end: int) -> dict[str, Any]:
    trace_id = span_id = trace_state = ""
    attributes: dict[str, Any] = {}
    while pos < end:
        f, wt, v, pos = _next_field(buf, pos, end)
        if f == 1:
            _want("Link", f, wt, 2)
            trace_id = _pb_id(buf, v, 16, "link trace_id")
        elif f == 2:
            _want("Link", f, wt, 2)
            span_id = _pb_id(buf, v, 8, "link span_id")
        elif f == 3:
            _want("Link", f, wt, 2)
            trace_state = _str(buf, v, "link trace_state")
        elif f == 4:
            _want("Link", f, wt, 2)
            _pb_attrs_into(attributes, buf, v)
    if not trace_id or not span_id:
        raise DecodeError("link without a trace_id or span_id")
    return {
        "trace_id": trace_id,
        "span_id": span_id,
        "trace_state": trace_state,
        "attributes": attributes,
    }
