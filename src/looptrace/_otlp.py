"""The OTLP/HTTP trace codec: spans to request bodies and back, protobuf and JSON.

Sending side, once per span and once per batch::

    encode_span(wire, encoding)              -> bytes   (one Span message body / JSON object)
    encode_request(chunks, resource, enc)    -> bytes   (ExportTraceServiceRequest, chunks spliced)
    compress(body, compression)              -> (bytes, Content-Encoding or None)

Receiving side (the collector and the local store)::

    decode_request(body, content_type, content_encoding, max_decompressed) -> list[DecodedSpan]

Protobuf is written and read by hand so the package needs no protobuf runtime; field numbers
follow ``opentelemetry/proto/trace/v1/trace.proto`` and the tests check every field against
``opentelemetry-proto``'s generated classes. Each span is encoded exactly once: a batch is the
concatenation of already-encoded spans, so the batcher can count exact bytes and split a batch
without re-serializing anything.

Errors: every malformed input raises :class:`DecodeError` (a ``ValueError``) with a message
that says what was wrong; encoding never raises for values a :class:`WireSpan` may hold.
"""

from __future__ import annotations

import base64
import binascii
import math
import os
import struct
import zlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import orjson

from ._semconv import INPUT_MIME_TYPE, INPUT_VALUE, JSON_MIME, OUTPUT_MIME_TYPE, OUTPUT_VALUE
from ._wire import Attributes, DecodedSpan, WireSpan

if TYPE_CHECKING:
    from ._config import Config

__all__ = [
    "DecodeError",
    "Resource",
    "ScopedChunk",
    "compress",
    "content_type",
    "decode_request",
    "decompress",
    "default_resource",
    "encode_request",
    "encode_span",
    "scoped",
]

EncodingName = Literal["protobuf", "json"]

PROTOBUF_CONTENT_TYPE = "application/x-protobuf"
JSON_CONTENT_TYPE = "application/json"
DEFAULT_MAX_DECOMPRESSED = 64 * 1024 * 1024

# SpanFlags (trace.proto): bits 0-7 are the W3C trace flags, then whether the parent is remote.
FLAG_SAMPLED = 0x01
FLAG_HAS_IS_REMOTE = 0x100
FLAG_IS_REMOTE = 0x200
_FLAGS_LOCAL = FLAG_SAMPLED | FLAG_HAS_IS_REMOTE
_FLAGS_REMOTE = FLAG_SAMPLED | FLAG_HAS_IS_REMOTE | FLAG_IS_REMOTE

_MASK64 = (1 << 64) - 1
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1


class DecodeError(ValueError):
    """A request body is not valid OTLP (bad protobuf, bad JSON, bad compression, too large)."""


class Resource:
    """What every span in a request shares: resource attributes and the instrumentation scope.

    Immutable; its protobuf and JSON encodings are computed once, at construction, because the
    same resource heads every request.
    """

    __slots__ = ("_json", "_pb_resource", "_pb_scope", "attributes", "scope_name", "scope_version")

    attributes: Attributes
    scope_name: str
    scope_version: str
    _json: bytes
    _pb_resource: bytes
    _pb_scope: bytes

    def __init__(
        self, attributes: Attributes, scope_name: str = "looptrace", scope_version: str = ""
    ) -> None:
        set_ = object.__setattr__
        set_(self, "attributes", list(attributes))
        set_(self, "scope_name", scope_name)
        set_(self, "scope_version", scope_version)
        # ResourceSpans.resource (field 1) and the ScopeSpans.scope (field 1), fully tagged.
        resource_body = b"".join(_tagged(0x0A, _kv_body(k, v)) for k, v in self.attributes)
        scope_body = b""
        if scope_name:
            scope_body += _tagged(0x0A, _utf8(scope_name))
        if scope_version:
            scope_body += _tagged(0x12, _utf8(scope_version))
        set_(self, "_pb_resource", _tagged(0x0A, resource_body))
        set_(self, "_pb_scope", _tagged(0x0A, scope_body))
        scope: dict[str, Any] = {"name": scope_name}
        if scope_version:
            scope["version"] = scope_version
        # The JSON request head up to the spans array, with the resource and scope in place.
        set_(
            self,
            "_json",
            b'{"resourceSpans":[{"resource":{"attributes":'
            + _dumps(_json_attrs(self.attributes))
            + b'},"scopeSpans":[{"scope":'
            + _dumps(scope)
            + b',"spans":[',
        )

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Resource is immutable")

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt from its fields: the default would set the slots one by one (and fail).
        return (Resource, (self.attributes, self.scope_name, self.scope_version))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Resource):
            return NotImplemented
        return (self.attributes, self.scope_name, self.scope_version) == (
            other.attributes,
            other.scope_name,
            other.scope_version,
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"Resource({self.attributes!r}, scope_name={self.scope_name!r}, "
            f"scope_version={self.scope_version!r})"
        )


def _new_instance_id() -> None:
    _instance[0] = os.urandom(16).hex()


# service.instance.id: one per process (a forked child gets its own), so what one run of a
# program sent (its lag summaries, say) can be told from another's.
_instance = [""]
_new_instance_id()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_instance_id)


def default_resource(cfg: Config) -> Resource:
    """The resource looptrace sends: service.name, ``cfg.resource_attributes``, then
    service.instance.id (unless configured) and the telemetry.sdk.* facts. ``service.name``
    from ``resource_attributes`` is used only when no service name was configured (the
    OpenTelemetry rule: OTEL_SERVICE_NAME wins)."""
    from . import __version__

    extra = dict(cfg.resource_attributes)
    service = cfg.service_name
    if service == "unknown_service" and extra.get("service.name"):
        service = extra["service.name"]
    extra.pop("service.name", None)
    attrs: Attributes = [("service.name", service)]
    attrs.extend(extra.items())
    if "service.instance.id" not in extra:
        attrs.append(("service.instance.id", _instance[0]))
    attrs.append(("telemetry.sdk.name", "looptrace"))
    attrs.append(("telemetry.sdk.language", "python"))
    attrs.append(("telemetry.sdk.version", __version__))
    return Resource(attrs, "looptrace", __version__)


def content_type(encoding: str) -> str:
    """The Content-Type header for a request body in ``encoding``."""
    return JSON_CONTENT_TYPE if encoding == "json" else PROTOBUF_CONTENT_TYPE


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


def span_attributes(attributes: Attributes, parts: list[bytes]) -> None:
    """Append each attribute as a ``Span.attributes`` field (9)."""
    append = parts.append
    cache = _ATTR_CACHE
    keys = _KEY_CACHE
    for k, v in attributes:
        if type(v) is str:
            # Only short values are cached, and looking a long one up would hash all of it: a
            # new 2.5 MB payload string costs 0.7 ms to hash, for a lookup that cannot hit.
            if len(v) < _SHORT:
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


# ---------------------------------------------------------------------------------------------
# JSON encoding (OTLP/JSON: hex ids, 64-bit integers as decimal strings, enums as integers)
# ---------------------------------------------------------------------------------------------


def _json_any(v: Any) -> dict[str, Any]:
    t = type(v)
    if t is str:
        return {"stringValue": v}
    if t is bool:
        return {"boolValue": v}
    if t is int:
        if _INT64_MIN <= v <= _INT64_MAX:
            return {"intValue": str(v)}
        return {"stringValue": str(v)}
    if t is float:
        if math.isfinite(v):
            return {"doubleValue": v}
        # The protobuf JSON mapping spells the special doubles as strings.
        return {"doubleValue": "NaN" if v != v else ("Infinity" if v > 0 else "-Infinity")}
    if t is bytes or t is bytearray or t is memoryview:
        return {"bytesValue": base64.b64encode(bytes(v)).decode("ascii")}
    if t is list or t is tuple:
        return {"arrayValue": {"values": [_json_any(x) for x in v]}}
    if isinstance(v, Mapping):
        return {
            "kvlistValue": {
                "values": [{"key": str(k), "value": _json_any(x)} for k, x in v.items()]
            }
        }
    if v is None:
        return {}
    return _json_any(_base_value(v))


def _json_attrs(attrs: Attributes) -> list[dict[str, Any]]:
    return [
        {"key": k, "value": {"stringValue": v} if type(v) is str else _json_any(v)}
        for k, v in attrs
    ]


def _span_json_obj(w: WireSpan) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "traceId": f"{w.trace_id:032x}",
        "spanId": f"{w.span_id:016x}",
        "flags": _FLAGS_REMOTE if w.parent_is_remote else _FLAGS_LOCAL,
        "name": w.name,
        "kind": w.kind,
        "startTimeUnixNano": str(w.start_ns),
        "endTimeUnixNano": str(w.end_ns),
        "attributes": [
            {"key": k, "value": {"stringValue": v} if type(v) is str else _json_any(v)}
            for k, v in w.attributes
        ],
    }
    if w.parent_span_id:
        obj["parentSpanId"] = f"{w.parent_span_id:016x}"
    if w.trace_state:
        obj["traceState"] = w.trace_state
    if w.dropped_attributes:
        obj["droppedAttributesCount"] = w.dropped_attributes
    if w.events:
        obj["events"] = [
            {
                "timeUnixNano": str(ev.time_ns),
                "name": ev.name,
                "attributes": _json_attrs(ev.attributes),
            }
            for ev in w.events
        ]
    if w.links:
        obj["links"] = [
            {
                "traceId": f"{link.trace_id:032x}",
                "spanId": f"{link.span_id:016x}",
                **({"traceState": link.trace_state} if link.trace_state else {}),
                "attributes": _json_attrs(link.attributes),
                "flags": FLAG_HAS_IS_REMOTE | (FLAG_IS_REMOTE if link.is_remote else 0),
            }
            for link in w.links
        ]
    status: dict[str, Any] = {}
    if w.status_message:
        status["message"] = w.status_message
    if w.status_code:
        status["code"] = w.status_code
    if status:
        obj["status"] = status
    return obj


def _dumps(obj: Any) -> bytes:
    try:
        return orjson.dumps(obj)
    except orjson.JSONEncodeError:
        # Only invalid text (lone surrogates) gets here: replace it and try once more.
        return orjson.dumps(_scrub(obj))


def _scrub(obj: Any) -> Any:
    if isinstance(obj, str):
        return obj.encode("utf-8", "replace").decode("utf-8")
    if isinstance(obj, dict):
        return {_scrub(k): _scrub(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_scrub(x) for x in obj]
    return obj


class ScopedChunk(bytes):
    """An encoded span that belongs under another instrumentation scope than looptrace's
    (a span made through the OpenTelemetry API): :func:`encode_request` groups by it."""

    scope: tuple[str, str]


def encode_span(wire: WireSpan, encoding: str) -> bytes:
    """One span, encoded: the body of an OTLP ``Span`` message (protobuf, without the field
    tag that :func:`encode_request` adds) or one OTLP/JSON span object."""
    body = _dumps(_span_json_obj(wire)) if encoding == "json" else _encode_span_pb(wire)
    if wire.scope is None:
        return body
    chunk = ScopedChunk(body)
    chunk.scope = wire.scope
    return chunk


def scoped(resource: Resource, scope: tuple[str, str] | None) -> Resource:
    """``resource`` with its instrumentation scope replaced by ``scope`` (None: as it is)."""
    if scope is None:
        return resource
    key = (id(resource), scope)
    hit = _scoped_resources.get(key)
    if hit is None or hit[0] is not resource:
        if len(_scoped_resources) >= 256:
            _scoped_resources.clear()
        hit = _scoped_resources[key] = (resource, Resource(resource.attributes, *scope))
    return hit[1]


# Keyed by the base resource's id, which the value keeps alive, so an id is never reused.
_scoped_resources: dict[tuple[int, tuple[str, str]], tuple[Resource, Resource]] = {}
_JSON_REQUEST_HEAD = b'{"resourceSpans":['


def encode_request(chunks: Sequence[bytes], resource: Resource, encoding: str) -> bytes:
    """An ``ExportTraceServiceRequest`` holding ``chunks`` (from :func:`encode_span`, same
    encoding) under one resource and scope. The chunks are spliced in, never re-encoded.

    Chunks of other scopes (:class:`ScopedChunk`) go under a resource-spans entry of their
    own scope, with the same resource."""
    if set(map(type, chunks)) - {bytes}:
        groups: dict[tuple[str, str] | None, list[bytes]] = {}
        for chunk in chunks:
            groups.setdefault(getattr(chunk, "scope", None), []).append(chunk)
        parts = [
            _encode_one_scope(group, scoped(resource, scope), encoding)
            for scope, group in groups.items()
        ]
        if encoding != "json":
            # Repeated ``resource_spans`` fields: the requests concatenate.
            return b"".join(parts)
        cut = len(_JSON_REQUEST_HEAD)
        return _JSON_REQUEST_HEAD + b",".join(p[cut:-2] for p in parts) + b"]}"
    return _encode_one_scope(chunks, resource, encoding)


def _encode_one_scope(chunks: Sequence[bytes], resource: Resource, encoding: str) -> bytes:
    if encoding == "json":
        return resource._json + b",".join(chunks) + b"]}]}]}"
    pieces: list[bytes] = [b"", b"", resource._pb_resource, b"", b"", resource._pb_scope]
    append = pieces.append
    fields = _SPAN_FIELD
    for chunk in chunks:
        n = len(chunk)
        head = fields.get(n)
        if head is None:
            head = b"\x12" + _varint(n)  # ScopeSpans.spans
            if n < _SPAN_FIELD_CACHED:
                fields[n] = head
        append(head)
        append(chunk)
    scope_spans_len = sum(map(len, pieces)) - len(resource._pb_resource)
    pieces[4] = _varint(scope_spans_len)
    pieces[3] = b"\x12"  # ResourceSpans.scope_spans
    resource_spans_len = len(resource._pb_resource) + 1 + len(pieces[4]) + scope_spans_len
    pieces[0] = b"\x0a"  # ExportTraceServiceRequest.resource_spans
    pieces[1] = _varint(resource_spans_len)
    return b"".join(pieces)


def request_pieces(span: Sequence[bytes], resource: Resource) -> list[bytes]:
    """A protobuf ``ExportTraceServiceRequest`` of one span, given as :func:`span_pieces`,
    in pieces: ``b"".join`` of them is :func:`encode_request` of the joined span. Runs of
    small pieces are joined (one send each, not dozens); pieces of 64 KiB or more are kept
    as they are."""
    n = sum(map(len, span))
    head = b"\x12" + _varint(n)  # ScopeSpans.spans
    scope_spans_len = len(resource._pb_scope) + len(head) + n
    nss = _varint(scope_spans_len)
    resource_spans_len = len(resource._pb_resource) + 1 + len(nss) + scope_spans_len
    small = [
        b"\x0a" + _varint(resource_spans_len),  # ExportTraceServiceRequest.resource_spans
        resource._pb_resource,
        b"\x12" + nss,  # ResourceSpans.scope_spans
        resource._pb_scope,
        head,
    ]
    out: list[bytes] = []
    for piece in span:
        if len(piece) < _KEEP_WHOLE:
            small.append(piece)
            continue
        if small:
            out.append(b"".join(small))
            small = []
        out.append(piece)
    if small:
        out.append(b"".join(small))
    return out


_KEEP_WHOLE = 64 * 1024


# The tag and length that put one encoded span in a request, for each span size met under
# 16 KiB (a 2-byte length): sizes repeat, and this loop runs for every span sent.
_SPAN_FIELD: dict[int, bytes] = {}
_SPAN_FIELD_CACHED = 1 << 14


# ---------------------------------------------------------------------------------------------
# Compression
# ---------------------------------------------------------------------------------------------

# Level 1: request bodies are repetitive text; level 6 buys a few percent at several times the
# CPU, and the flusher shares the process with the application.
GZIP_LEVEL = 1
ZSTD_LEVEL = 3


def _zstd() -> Any:
    try:
        import zstandard
    except ImportError:
        return None
    return zstandard


# A body at least this big is first sampled: if the samples barely compress (base64 images,
# audio, already-compressed data), the body goes out as it is.
PROBE_FROM_BYTES = 1024 * 1024
# 16 KiB in all, from eight places. On bodies of one kind (base64, random bytes, JSON, prose)
# the sample's ratio is within 0.02 of the whole body's; eight places rather than four follow a
# body that mixes kinds more closely (tests/test_otlp.py). It costs a sixth of the CPU of the
# 64 KiB sample it replaces: 0.4 ms against 2.1 ms on base64, which deflate finds hardest, paid
# by the worker that sends a large span.
_PROBE_SLICES = 8
_PROBE_SLICE_BYTES = 2 * 1024
# Compressed samples above this fraction of their size: not worth it. Text and JSON come out
# at 0.1-0.3 at level 1; base64 of random bytes at 0.75.
_WORTH_IT = 0.6


def _worth_compressing(pieces: Sequence[bytes], total: int) -> bool:
    """Whether the body that ``pieces`` (``total`` bytes) make is worth compressing, from
    the same samples whether it comes whole or in pieces."""
    step = total // _PROBE_SLICES
    sample = bytearray()
    k = base = 0  # the piece the next sample starts in, and that piece's offset in the body
    for i in range(_PROBE_SLICES):
        pos = i * step
        end = min(pos + _PROBE_SLICE_BYTES, total)
        while base + len(pieces[k]) <= pos:
            base += len(pieces[k])
            k += 1
        j, at = k, base
        while pos < end:
            piece = pieces[j]
            got = memoryview(piece)[pos - at : min(end - at, len(piece))]
            sample += got
            pos += len(got)
            at += len(piece)
            j += 1
    return len(zlib.compress(sample, GZIP_LEVEL)) < _WORTH_IT * len(sample)


def compress(body: bytes, compression: str) -> tuple[bytes, str | None]:
    """Compress a request body; returns it with the Content-Encoding to send (None: as is).

    ``"zstd"`` needs the optional ``zstandard`` package; without it the body is gzipped and the
    returned encoding says ``"gzip"``. A body of a megabyte or more that samples say will not
    shrink by 40% is sent uncompressed: gzip would spend 70-80 ms of CPU on 2.5 MB of base64
    here to save a quarter of it, and the large allocations it makes are what stalls the
    application's loop (docs/performance.md).
    """
    if compression == "none":
        return body, None
    if len(body) >= PROBE_FROM_BYTES and not _worth_compressing((body,), len(body)):
        return body, None
    return _compressed(body, compression)


def compress_pieces(pieces: list[bytes], compression: str) -> tuple[list[bytes], str | None]:
    """:func:`compress` for a body in pieces: the same decision and the same bytes, and the
    pieces left as they are when the body goes out uncompressed."""
    if compression == "none":
        return pieces, None
    total = sum(map(len, pieces))
    if total >= PROBE_FROM_BYTES and not _worth_compressing(pieces, total):
        return pieces, None
    body, encoding = _compressed(b"".join(pieces), compression)
    return [body], encoding


def _compressed(body: bytes, compression: str) -> tuple[bytes, str]:
    if compression == "zstd":
        zstd = _zstd()
        if zstd is not None:
            return zstd.ZstdCompressor(level=ZSTD_LEVEL).compress(body), "zstd"
    c = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31)
    return c.compress(body) + c.flush(), "gzip"


_CHUNK = 256 * 1024


def decompress(body: bytes | bytearray, content_encoding: str | None, max_size: int) -> bytes:
    """Undo ``Content-Encoding`` (gzip, deflate, zstd, identity), refusing to produce more than
    ``max_size`` bytes: a small compressed body can expand without bound. The output is built
    a chunk at a time in one buffer, which is returned as it is (a ``bytearray`` for a
    compressed body): a body at the limit costs the limit, not twice it."""
    enc = (content_encoding or "identity").strip().lower()
    if enc in ("", "identity", "none"):
        if len(body) > max_size:
            raise DecodeError(f"body exceeds {max_size} bytes")
        return body  # type: ignore[return-value]  # bytes-like: the decoders take either
    if enc in ("gzip", "x-gzip", "deflate"):
        return _inflate(body, 31 if enc != "deflate" else 15, enc, max_size)
    if enc == "zstd":
        return _unzstd(body, max_size)
    raise DecodeError(f"unsupported Content-Encoding {content_encoding!r}")


def _too_big(max_size: int) -> DecodeError:
    return DecodeError(f"decompressed body exceeds {max_size} bytes")


def _inflate(body: bytes | bytearray, wbits: int, name: str, max_size: int) -> bytes:
    out = bytearray()
    data = body
    try:
        while True:
            d = zlib.decompressobj(wbits)
            while data:
                out += d.decompress(data, min(_CHUNK, max_size + 1 - len(out)))
                if len(out) > max_size:
                    raise _too_big(max_size)
                data = d.unconsumed_tail
            out += d.flush(_CHUNK)
            if len(out) > max_size:
                raise _too_big(max_size)
            if not d.eof:
                raise DecodeError(f"truncated {name} body")
            # Concatenated gzip members are one body (RFC 1952).
            data = d.unused_data
            if not data or wbits != 31:
                break
    except zlib.error as exc:
        raise DecodeError(f"invalid {name} body: {exc}") from None
    return out  # type: ignore[return-value]  # bytes-like: the decoders take either


def _unzstd(body: bytes | bytearray, max_size: int) -> bytes:
    zstd = _zstd()
    if zstd is None:
        raise DecodeError("zstd body but the zstandard package is not installed")
    import io

    out = bytearray()
    try:
        reader = zstd.ZstdDecompressor().stream_reader(io.BytesIO(body), read_across_frames=True)
        while True:
            chunk = reader.read(min(_CHUNK, max_size + 1 - len(out)))
            if not chunk:
                break
            out += chunk
            if len(out) > max_size:
                raise _too_big(max_size)
    except zstd.ZstdError as exc:
        raise DecodeError(f"invalid zstd body: {exc}") from None
    return out  # type: ignore[return-value]  # bytes-like; the decoders take either


# ---------------------------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------------------------


class TooManySpans(DecodeError):
    """A request holds more spans than the receiver takes in one request."""


class _Spans(list):  # type: ignore[type-arg]
    """The decoded spans of one request, refusing to grow past ``limit``: decoding memory is
    a multiple of the span count, so a request of millions of tiny spans stops early."""

    def __init__(self, limit: int | None) -> None:
        super().__init__()
        self.limit = limit

    def append(self, span: DecodedSpan) -> None:
        if self.limit is not None and len(self) >= self.limit:
            raise TooManySpans(f"request holds more than {self.limit} spans: send smaller batches")
        super().append(span)


def decode_request(
    body: bytes | bytearray,
    content_type: str | None,
    content_encoding: str | None = None,
    max_decompressed: int = DEFAULT_MAX_DECOMPRESSED,
    max_spans: int | None = None,
) -> list[DecodedSpan]:
    """Every span in an OTLP/HTTP trace request, from any OpenTelemetry SDK.

    ``content_type`` picks the encoding (``application/json`` or ``application/x-protobuf``;
    parameters such as ``; charset=utf-8`` are ignored). Raises :class:`DecodeError`, and
    :class:`TooManySpans` past ``max_spans``.
    """
    raw = decompress(body, content_encoding, max_decompressed)
    media = (content_type or PROTOBUF_CONTENT_TYPE).split(";", 1)[0].strip().lower()
    if media == JSON_CONTENT_TYPE:
        return _decode_json_request(raw, _Spans(max_spans))
    if media in (PROTOBUF_CONTENT_TYPE, "application/protobuf", "application/octet-stream"):
        return _decode_pb_request(raw, _Spans(max_spans))
    raise DecodeError(f"unsupported Content-Type {content_type!r}")


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


# -- JSON ------------------------------------------------------------------------------------

_HEX = frozenset("0123456789abcdefABCDEF")
_SPAN_KINDS = {
    "SPAN_KIND_UNSPECIFIED": 0,
    "SPAN_KIND_INTERNAL": 1,
    "SPAN_KIND_SERVER": 2,
    "SPAN_KIND_CLIENT": 3,
    "SPAN_KIND_PRODUCER": 4,
    "SPAN_KIND_CONSUMER": 5,
}
_STATUS_CODES = {"STATUS_CODE_UNSET": 0, "STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}


def _get(obj: dict[str, Any], camel: str, snake: str, default: Any = None) -> Any:
    # OTLP/JSON uses lowerCamelCase; the protobuf JSON mapping also accepts the proto names.
    v = obj.get(camel)
    if v is None:
        v = obj.get(snake)
    return default if v is None else v


def _obj(v: Any, what: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise DecodeError(f"{what} must be a JSON object, got {type(v).__name__}")
    return v


def _arr(v: Any, what: str) -> list[Any]:
    if v is None:
        return []
    if not isinstance(v, list):
        raise DecodeError(f"{what} must be a JSON array, got {type(v).__name__}")
    return v


def _jstr(v: Any, what: str) -> str:
    if v is None:
        return ""
    if not isinstance(v, str):
        raise DecodeError(f"{what} must be a string, got {type(v).__name__}")
    return v


def _jint(v: Any, what: str, signed: bool = True) -> int:
    # 64-bit integers are decimal strings in OTLP/JSON; accept numbers too.
    if type(v) is str:
        try:
            n = int(v)
        except ValueError:
            raise DecodeError(f"{what} must be an integer, got {v[:40]!r}") from None
    elif v is None:
        return 0
    elif isinstance(v, bool):
        raise DecodeError(f"{what} must be an integer, got a boolean")
    elif isinstance(v, int):
        n = v
    elif isinstance(v, float) and v.is_integer():
        n = int(v)
    else:
        raise DecodeError(f"{what} must be an integer, got {type(v).__name__}")
    lo, hi = (_INT64_MIN, _INT64_MAX) if signed else (0, _MASK64)
    if not lo <= n <= hi:
        raise DecodeError(f"{what} is out of range: {n}")
    return n


def _jenum(v: Any, names: dict[str, int], what: str) -> int:
    if isinstance(v, str) and v in names:
        return names[v]
    return _jint(v, what)


def _jid(v: Any, size: int, what: str, optional: bool = False) -> str:
    """OTLP/JSON ids are hex; the generic protobuf JSON mapping would make them base64, which
    some encoders still send, so both are accepted."""
    s = _jstr(v, what)
    if len(s) == size * 2 and _HEX.issuperset(s):
        return s.lower()
    if not s:
        if optional:
            return ""
        raise DecodeError(f"{what} is missing")
    try:
        raw = base64.b64decode(s, validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) == size:
        return raw.hex()
    raise DecodeError(f"{what} must be {size * 2} hex digits, got {s[:40]!r}")


def _jdouble(v: Any, what: str) -> float:
    if isinstance(v, bool):
        raise DecodeError(f"{what} must be a number, got a boolean")
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            pass
    raise DecodeError(f"{what} must be a number, got {v!r:.40}")


def _json_value(v: Any, depth: int = 0) -> Any:
    if depth > 32:
        raise DecodeError("AnyValue nested too deeply")
    if v is None:
        return None
    v = _obj(v, "AnyValue")
    for key, val in v.items():
        if key in ("stringValue", "string_value"):
            return _jstr(val, "stringValue")
        if key in ("boolValue", "bool_value"):
            if not isinstance(val, bool):
                raise DecodeError(f"boolValue must be true or false, got {val!r:.40}")
            return val
        if key in ("intValue", "int_value"):
            return _jint(val, "intValue")
        if key in ("doubleValue", "double_value"):
            return _jdouble(val, "doubleValue")
        if key in ("bytesValue", "bytes_value"):
            try:
                return base64.b64decode(_jstr(val, "bytesValue"), validate=True)
            except (binascii.Error, ValueError):
                raise DecodeError("bytesValue is not valid base64") from None
        if key in ("arrayValue", "array_value"):
            values = _arr(_obj(val, "arrayValue").get("values"), "arrayValue.values")
            return [_json_value(x, depth + 1) for x in values]
        if key in ("kvlistValue", "kvlist_value"):
            values = _arr(_obj(val, "kvlistValue").get("values"), "kvlistValue.values")
            return dict(_json_kv(x, depth + 1) for x in values)
    return None


def _json_kv(kv: Any, depth: int = 0) -> tuple[str, Any]:
    kv = _obj(kv, "attribute")
    return _jstr(kv.get("key"), "attribute key"), _json_value(kv.get("value"), depth)


def _json_attrs_dict(v: Any, what: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in _arr(v, what):
        if type(kv) is dict:
            key = kv.get("key")
            value = kv.get("value")
            # The common case, a string attribute, without the general walk.
            if type(key) is str and type(value) is dict and len(value) == 1:
                s = value.get("stringValue")
                if type(s) is str:
                    out[key] = s
                    continue
        key, out_value = _json_kv(kv)
        out[key] = out_value
    return out


def _decode_json_request(raw: bytes, spans: list[DecodedSpan] | None = None) -> list[DecodedSpan]:
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise DecodeError(f"invalid JSON: {exc}") from None
    doc = _obj(doc, "request")
    if spans is None:
        spans = []
    for rs in _arr(_get(doc, "resourceSpans", "resource_spans"), "resourceSpans"):
        rs = _obj(rs, "resourceSpans[]")
        res = _obj(rs.get("resource") or {}, "resource")
        resource = _json_attrs_dict(res.get("attributes"), "resource.attributes")
        for ss in _arr(_get(rs, "scopeSpans", "scope_spans"), "scopeSpans"):
            ss = _obj(ss, "scopeSpans[]")
            scope = _obj(ss.get("scope") or {}, "scope")
            scope_name = _jstr(scope.get("name"), "scope.name")
            scope_version = _jstr(scope.get("version"), "scope.version")
            for sp in _arr(ss.get("spans"), "spans"):
                spans.append(_json_span(_obj(sp, "span"), resource, scope_name, scope_version))
    return spans


def _json_span(
    sp: dict[str, Any], resource: dict[str, Any], scope_name: str, scope_version: str
) -> DecodedSpan:
    status = _obj(sp.get("status") or {}, "status")
    events = []
    for ev in _arr(sp.get("events"), "events"):
        ev = _obj(ev, "event")
        events.append(
            {
                "name": _jstr(ev.get("name"), "event name"),
                "time_ns": _jint(
                    _get(ev, "timeUnixNano", "time_unix_nano"), "timeUnixNano", signed=False
                ),
                "attributes": _json_attrs_dict(ev.get("attributes"), "event attributes"),
            }
        )
    links = []
    for link in _arr(sp.get("links"), "links"):
        link = _obj(link, "link")
        links.append(
            {
                "trace_id": _jid(_get(link, "traceId", "trace_id"), 16, "link traceId"),
                "span_id": _jid(_get(link, "spanId", "span_id"), 8, "link spanId"),
                "trace_state": _jstr(_get(link, "traceState", "trace_state"), "traceState"),
                "attributes": _json_attrs_dict(link.get("attributes"), "link attributes"),
            }
        )
    parent = _jid(_get(sp, "parentSpanId", "parent_span_id"), 8, "parentSpanId", optional=True)
    return DecodedSpan(
        trace_id=_jid(_get(sp, "traceId", "trace_id"), 16, "traceId"),
        span_id=_jid(_get(sp, "spanId", "span_id"), 8, "spanId"),
        parent_span_id=parent or None,
        name=_jstr(sp.get("name"), "span name"),
        kind=_jenum(sp.get("kind"), _SPAN_KINDS, "kind"),
        start_ns=_jint(
            _get(sp, "startTimeUnixNano", "start_time_unix_nano"), "startTimeUnixNano", False
        ),
        end_ns=_jint(_get(sp, "endTimeUnixNano", "end_time_unix_nano"), "endTimeUnixNano", False),
        attributes=_json_attrs_dict(sp.get("attributes"), "attributes"),
        events=events,
        links=links,
        status_code=_jenum(status.get("code"), _STATUS_CODES, "status code"),
        status_message=_jstr(status.get("message"), "status message"),
        trace_state=_jstr(_get(sp, "traceState", "trace_state"), "traceState"),
        resource=resource,
        scope_name=scope_name,
        scope_version=scope_version,
    )
