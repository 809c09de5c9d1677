"""Protobuf encoding, written by hand (the package needs no protobuf runtime): a span's
message body, in pieces the flusher and workers splice without re-encoding."""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .._semconv import INPUT_MIME_TYPE, INPUT_VALUE, JSON_MIME, OUTPUT_MIME_TYPE, OUTPUT_VALUE
from .._wire import Attributes, AttrValue, WireSpan
from ._common import (
    _FLAGS_LOCAL,
    _FLAGS_REMOTE,
    _INT64_MAX,
    _INT64_MIN,
    _MASK64,
    FLAG_HAS_IS_REMOTE,
    FLAG_IS_REMOTE,
)

if TYPE_CHECKING:
    pass


# ---------------------------------------------------------------------------------------------
# Protobuf encoding
# ---------------------------------------------------------------------------------------------

_BYTE = [bytes((i,)) for i in range(256)]
_pack_d = struct.Struct("<d").pack
# trace_id (1) and span_id (2) are fixed-size bytes fields; ids are big-endian on the wire.
_pack_ids = struct.Struct(">2sQQ2sQ").pack
_pack_ids_parent = struct.Struct(">2sQQ2sQ2sQ").pack
# start_time_unix_nano (7) and end_time_unix_nano (8) are fixed64, little-endian.
_pack_times = struct.Struct("<BQBQ").pack
_pack_fixed64 = struct.Struct("<Q").pack
_pack_fixed32 = struct.Struct("<I").pack
_unpack_d = struct.Struct("<d").unpack_from
_PARENT_TAG = b"\x22\x08"
_FLAGS_TAG = b"\x85\x01"  # field 16, wire type 5 (fixed32)
_LOW64 = (1 << 64) - 1


def _varint(n: int) -> bytes:
    if n < 0x80:
        return _BYTE[n]
    if n < 0x4000:
        return bytes(((n & 0x7F) | 0x80, n >> 7))
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _tagged(tag: int, body: bytes) -> bytes:
    """A length-delimited field: tag byte, length, body."""
    return _BYTE[tag] + _varint(len(body)) + body


def _utf8(s: str) -> bytes:
    try:
        return s.encode()
    except UnicodeEncodeError:
        # Lone surrogates cannot travel as UTF-8; keep the rest of the text.
        return s.encode("utf-8", "replace")


def _any_value(v: Any) -> bytes:
    """The body of an ``AnyValue`` message for one Python value."""
    t = type(v)
    if t is str:
        b = _utf8(v)
        return b"\x0a" + _varint(len(b)) + b
    if t is bool:
        return b"\x10\x01" if v else b"\x10\x00"
    if t is int:
        if _INT64_MIN <= v <= _INT64_MAX:
            return b"\x18" + _varint(v & _MASK64)
        # Beyond int64: OTLP has no wider integer, so the digits travel as text.
        return _any_value(str(v))
    if t is float:
        return b"\x21" + _pack_d(v)
    if t is bytes or t is bytearray or t is memoryview:
        b = bytes(v)
        return b"\x3a" + _varint(len(b)) + b
    if t is list or t is tuple:
        body = b"".join(_tagged(0x0A, _any_value(x)) for x in v)
        return b"\x2a" + _varint(len(body)) + body
    if isinstance(v, Mapping):
        body = b"".join(_tagged(0x0A, _kv_body(str(k), x)) for k, x in v.items())
        return b"\x32" + _varint(len(body)) + body
    if v is None:
        return b""  # an empty AnyValue: "no value"
    return _any_value(_base_value(v))


def _base_value(v: Any) -> Any:
    """A value of a type neither encoder knows, as one it does: subclasses (str enums, IntEnum,
    numpy scalars that subclass float...) take their base type, anything else its text."""
    if isinstance(v, str):
        return str(v)
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        return float(v)
    if isinstance(v, (list, tuple)):
        return list(v)
    return _fallback_text(v)


def _fallback_text(v: Any) -> str:
    try:
        return str(v)
    except Exception:
        return f"<unprintable {type(v).__name__}>"


def _kv_body(key: str, value: Any) -> bytes:
    """The body of a ``KeyValue`` message."""
    k = _utf8(key)
    av = _any_value(value)
    return b"\x0a" + _varint(len(k)) + k + b"\x12" + _varint(len(av)) + av


def _attrs_pb(attrs: Attributes, tag: bytes) -> list[bytes]:
    out = []
    for k, v in attrs:
        body = _kv_body(k, v)
        out.append(tag + _varint(len(body)) + body)
    return out


# Whole encoded span attributes (tag included) for string values that repeat from span to span
# (code.function, mime types, span types...). Bounded: cleared when it grows past the limit.
_ATTR_CACHE: dict[tuple[str, str], bytes] = {}
_ATTR_CACHE_MAX = 4096
# Payloads differ on every call: caching them would only churn the cache.
_UNCACHED_KEYS = frozenset((INPUT_VALUE, OUTPUT_VALUE))
# The tag and one-byte length of a span attribute (KeyValue, field 9) of each short size, and
# the head of a short string AnyValue: its length, the string_value tag, the string's length.
_KV_HEAD = [b"\x4a" + _BYTE[i] for i in range(128)]
# A string value shorter than this (in UTF-8 bytes) has a one-byte AnyValue length: its head
# comes from _STR_HEAD, and it may be cached whole. A str of as many characters never is.
_SHORT = 126
_STR_HEAD = [bytes((i + 2, 0x0A, i)) for i in range(_SHORT)]
# Span names (with kind) repeat: the encoded name and kind fields for each, bounded.
_NAME_CACHE: dict[tuple[str, int], bytes] = {}
_NAME_CACHE_MAX = 4096
_SPAN_FLAGS_LOCAL = _FLAGS_TAG + _pack_fixed32(_FLAGS_LOCAL)
_SPAN_FLAGS_REMOTE = _FLAGS_TAG + _pack_fixed32(_FLAGS_REMOTE)
# "\x0a <len> key \x12" for each attribute name seen: names repeat far more than values.
_KEY_CACHE: dict[str, bytes] = {}
_KEY_CACHE_MAX = 4096


def _key_prefix(key: str) -> bytes:
    k = _utf8(key)
    prefix = b"\x0a" + _varint(len(k)) + k + b"\x12"
    if len(_KEY_CACHE) >= _KEY_CACHE_MAX:
        _KEY_CACHE.clear()
    _KEY_CACHE[key] = prefix
    return prefix


def _name_and_kind(name: str, kind: int) -> bytes:
    b = _utf8(name)
    piece = b"\x2a" + _varint(len(b)) + b
    if kind:
        piece += b"\x30" + _varint(kind)
    if len(_NAME_CACHE) >= _NAME_CACHE_MAX:
        _NAME_CACHE.clear()
    _NAME_CACHE[(name, kind)] = piece
    return piece


def span_head(
    trace_id: int,
    span_id: int,
    parent_span_id: int,
    trace_state: str,
    name: str,
    kind: int,
    start_ns: int,
    end_ns: int,
) -> list[bytes]:
    """The pieces of a ``Span`` message before its attributes (fields 1 to 8), in a list the
    caller appends the rest to."""
    # Fields in number order, as the reference encoder writes them: 1, 2, (3), 4, 5, 6...
    if trace_state:
        parts = [
            _pack_ids(b"\x0a\x10", trace_id >> 64, trace_id & _LOW64, b"\x12\x08", span_id),
            _tagged(0x1A, _utf8(trace_state)),
        ]
        if parent_span_id:
            parts.append(_PARENT_TAG + parent_span_id.to_bytes(8, "big"))
    elif parent_span_id:
        parts = [
            _pack_ids_parent(
                b"\x0a\x10",
                trace_id >> 64,
                trace_id & _LOW64,
                b"\x12\x08",
                span_id,
                _PARENT_TAG,
                parent_span_id,
            )
        ]
    else:
        parts = [_pack_ids(b"\x0a\x10", trace_id >> 64, trace_id & _LOW64, b"\x12\x08", span_id)]
    parts.append(_NAME_CACHE.get((name, kind)) or _name_and_kind(name, kind))
    if end_ns:
        parts.append(_pack_times(0x39, start_ns, 0x41, end_ns))
    else:
        # An in-progress record: end time 0 is the proto3 default, so it is left out.
        parts.append(b"\x39" + _pack_fixed64(start_ns))
    return parts


def span_attributes(attributes: Iterable[tuple[str, AttrValue]], parts: list[bytes]) -> int:
    """Append each attribute as a ``Span.attributes`` field (9); return the length of their
    string values (what the span's size cap counts)."""
    append = parts.append
    cache = _ATTR_CACHE
    keys = _KEY_CACHE
    text = 0
    for k, v in attributes:
        if type(v) is str:
            n = len(v)
            text += n
            # Only short values are cached, and looking a long one up would hash all of it: a
            # new 2.5 MB payload string costs 0.7 ms to hash, for a lookup that cannot hit.
            if n < _SHORT:
                piece = cache.get((k, v))
                if piece is not None:
                    append(piece)
                    continue
            try:
                vb = v.encode()
            except UnicodeEncodeError:
                vb = v.encode("utf-8", "replace")
            if k in _UNCACHED_KEYS or len(vb) >= _SHORT:
                parts += string_attribute(k, vb)
                continue
            piece = b"".join(string_attribute(k, vb))
            if len(cache) >= _ATTR_CACHE_MAX:
                cache.clear()
            cache[(k, v)] = piece
            append(piece)
        else:
            kp = keys.get(k) or _key_prefix(k)
            av = _any_value(v)
            nav = _varint(len(av))
            append(b"\x4a" + _varint(len(kp) + len(nav) + len(av)) + kp + nav + av)
    return text


def string_attribute(key: str, value: bytes) -> tuple[bytes, ...]:
    """The pieces of one ``Span.attributes`` field whose value is a string, given as UTF-8."""
    kp = _KEY_CACHE.get(key) or _key_prefix(key)
    n = len(value)
    if n < _SHORT:
        # AnyValue is "\x0a <n> value": n + 2 bytes, itself under 128, so 1-byte length.
        kv_len = len(kp) + n + 3
        head = _KV_HEAD[kv_len] if kv_len < 128 else b"\x4a" + _varint(kv_len)
        return (head, kp, _STR_HEAD[n], value)
    nv = _varint(n)
    av_len = 1 + len(nv) + n
    nav = _varint(av_len)
    return (b"\x4a" + _varint(len(kp) + len(nav) + av_len) + kp + nav + b"\x0a" + nv, value)


# The whole span attribute that says a payload is JSON, for the input and for the output.
MIME_PIECE = {
    key: b"".join(string_attribute(key, JSON_MIME.encode()))
    for key in (INPUT_MIME_TYPE, OUTPUT_MIME_TYPE)
}


def payload_attributes(payloads: Sequence[tuple[str, str, bytes]], parts: list[bytes]) -> None:
    """Append each payload, (key, mime-type key, JSON), as its string attribute followed by
    its mime type: what ``finish`` adds to a span's attributes, from the JSON as it is."""
    for key, mime, body in payloads:
        parts += string_attribute(key, body)
        parts.append(MIME_PIECE[mime])


def span_tail(status_code: int, status_message: str, parent_is_remote: bool) -> bytes:
    """The ``Span`` fields after events and links: status (15) and flags (16)."""
    # Every exported span was sampled; whether its parent is remote is known, so say so.
    flags = _SPAN_FLAGS_REMOTE if parent_is_remote else _SPAN_FLAGS_LOCAL
    if not (status_code or status_message):
        return flags
    status = b""
    if status_message:
        status = _tagged(0x12, _utf8(status_message))
    if status_code:
        status += b"\x18" + _varint(status_code)
    return b"\x7a" + _varint(len(status)) + status + flags


def _encode_span_pb(w: WireSpan) -> bytes:
    return b"".join(span_pieces(w))


def span_pieces(w: WireSpan, payloads: Sequence[tuple[str, str, bytes]] = ()) -> list[bytes]:
    """The body of the protobuf ``Span`` message for ``w``, in pieces, joined by no one.

    ``payloads`` are (key, mime-type key, JSON) as :func:`looptrace._serialize.finish_payloads`
    gives them: written as the string attribute ``finish`` would have added after ``w``'s own,
    each followed by its mime type, byte for byte, but from the JSON as it is. A worker sending
    a 2.5 MB payload so skips decoding it to a str, encoding it back, and two joins: four
    copies, about 1 ms of its time per span."""
    parts = span_head(
        w.trace_id,
        w.span_id,
        w.parent_span_id,
        w.trace_state,
        w.name,
        w.kind,
        w.start_ns,
        w.end_ns,
    )
    span_attributes(w.attributes, parts)
    payload_attributes(payloads, parts)
    append = parts.append
    if w.dropped_attributes:
        append(b"\x50" + _varint(w.dropped_attributes))
    if w.events:
        for ev in w.events:
            ename = _utf8(ev.name)
            body = b"".join(
                [
                    b"\x09" + _pack_fixed64(ev.time_ns),
                    b"\x12" + _varint(len(ename)) + ename,
                    *_attrs_pb(ev.attributes, b"\x1a"),
                ]
            )
            append(b"\x5a" + _varint(len(body)) + body)
    if w.links:
        for link in w.links:
            ltid = link.trace_id
            lparts = [_pack_ids(b"\x0a\x10", ltid >> 64, ltid & _LOW64, b"\x12\x08", link.span_id)]
            if link.trace_state:
                lparts.append(_tagged(0x1A, _utf8(link.trace_state)))
            lparts.extend(_attrs_pb(link.attributes, b"\x22"))
            # A link's own trace flags are not kept; only its remoteness is known.
            lflags = FLAG_HAS_IS_REMOTE | (FLAG_IS_REMOTE if link.is_remote else 0)
            lparts.append(b"\x35" + _pack_fixed32(lflags))
            body = b"".join(lparts)
            append(b"\x6a" + _varint(len(body)) + body)
    append(span_tail(w.status_code, w.status_message, w.parent_is_remote))
    return parts
