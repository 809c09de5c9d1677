"""Decoding OTLP/HTTP trace requests from any OpenTelemetry SDK, with ``opentelemetry-proto``.

    decode_request(body, content_type, content_encoding, max_decompressed, max_spans)
        -> list[DecodedSpan]

The body is decompressed within ``max_decompressed`` bytes (``bodies.decompress``), then parsed
into the generated ``ExportTraceServiceRequest`` by protobuf itself: ``FromString`` (upb, in
C) for protobuf, orjson and ``json_format.ParseDict`` for OTLP/JSON. Nothing here reads the
protobuf wire format by hand. The message is then turned into ``DecodedSpan`` objects.

OTLP/JSON differs from protobuf's JSON mapping in one way: trace and span ids are hex, not
base64 (the OTLP/HTTP specification), so they are converted before the mapping sees them;
base64 ids, as the generic mapping writes them, are accepted too. Enums as integers or names,
64-bit integers as strings or numbers, field names in lowerCamelCase or snake_case, bytes in
base64 are the mapping's own rules; unknown fields are ignored. String attributes, most of a
request, are set on the message directly; every other attribute value goes through the
mapping on its own (see ``_attach``).

Limits: the decompressed size (``DecodeError`` past it), and ``max_spans`` spans in one
request (``TooManySpans``), checked before the request is parsed whole: a protobuf body that
could hold more first goes through a message type that keeps each span as its bytes and only
counts them. Every malformed input is a ``DecodeError`` with a message that says what was
wrong, as far as the library tells; nothing else is raised. A field number the schema knows,
sent with another wire type, is an unknown field and skipped, as in every protobuf parser.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable
from typing import Any

import orjson
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from google.protobuf.message import DecodeError as ProtobufDecodeError
from google.protobuf.message import Message
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from ._internals import JSON_CONTENT_TYPE, PROTOBUF_CONTENT_TYPE, DecodedSpan
from .bodies import DEFAULT_MAX_DECOMPRESSED, DecodeError, TooManySpans, decompress

__all__ = ["DecodeError", "TooManySpans", "decode_request"]

PROTOBUF_MEDIA_TYPES = frozenset(
    (PROTOBUF_CONTENT_TYPE, "application/protobuf", "application/octet-stream")
)
# A library's message can quote the offending value whole: keep what goes back to a client short.
_MAX_MESSAGE = 300
_NESTED = re.compile(r"((?:Failed to parse \w+ field: )+)(.*)", re.DOTALL)
_FIELD = re.compile(r"Failed to parse (\w+) field: ")
_END = object()


def decode_request(
    body: bytes | bytearray,
    content_type: str | None,
    content_encoding: str | None = None,
    max_decompressed: int = DEFAULT_MAX_DECOMPRESSED,
    max_spans: int | None = None,
) -> list[DecodedSpan]:
    """Every span in an OTLP/HTTP trace request, in request order.

    ``content_type`` picks the encoding (``application/json`` or ``application/x-protobuf``;
    parameters such as ``; charset=utf-8`` are ignored). Raises :class:`DecodeError`, and
    :class:`TooManySpans` past ``max_spans``.
    """
    raw = decompress(body, content_encoding, max_decompressed)
    media = (content_type or PROTOBUF_CONTENT_TYPE).split(";", 1)[0].strip().lower()
    if media == JSON_CONTENT_TYPE:
        request = _parse_json(raw, max_spans)
    elif media in PROTOBUF_MEDIA_TYPES:
        request = _parse_protobuf(raw, max_spans)
    else:
        raise DecodeError(f"unsupported Content-Type {content_type!r}")
    return _decoded(request)


def _json_error(exc: json_format.ParseError, where: str = "") -> DecodeError:
    # The mapping nests "Failed to parse <field> field: " once per level: say the path once.
    text = str(exc)
    nested = _NESTED.match(text)
    if nested is not None:
        path = ".".join([where, *_FIELD.findall(nested[1])] if where else _FIELD.findall(nested[1]))
        text = f"{path}: {nested[2].rstrip('.')}"
    elif where:
        text = f"{where}: {text}"
    text = f"invalid OTLP/JSON: {text}"
    if len(text) > _MAX_MESSAGE:
        text = text[: _MAX_MESSAGE - 3] + "..."
    return DecodeError(text)


def _too_many(max_spans: int) -> TooManySpans:
    return TooManySpans(f"request holds more than {max_spans} spans: send smaller batches")


# -- protobuf ----------------------------------------------------------------------------------


def _parse_protobuf(raw: bytes, max_spans: int | None) -> ExportTraceServiceRequest:
    # An empty span takes two bytes on the wire and far more once parsed: count first when
    # the body is big enough to hold more spans than allowed.
    if max_spans is not None and len(raw) > 2 * max_spans:
        try:
            shallow: Any = _SpanCount.FromString(raw)
        except ProtobufDecodeError as exc:
            raise _pb_error(exc) from None
        count = sum(len(ss.spans) for rs in shallow.resource_spans for ss in rs.scope_spans)
        del shallow
        if count > max_spans:
            raise _too_many(max_spans)
    try:
        return ExportTraceServiceRequest.FromString(raw)
    except ProtobufDecodeError as exc:
        raise _pb_error(exc) from None


def _pb_error(exc: ProtobufDecodeError) -> DecodeError:
    # upb says "Error parsing message with type '...': <reason>"; the reason is what helps.
    reason = str(exc).rpartition("': ")[2] or str(exc)
    return DecodeError(f"not a valid protobuf ExportTraceServiceRequest: {reason}")


def _span_count_type() -> type[Message]:
    """``ExportTraceServiceRequest`` with each span kept as its bytes, unparsed: the same
    wire format (an embedded message and ``bytes`` are both length-delimited), parsed by
    protobuf. Counting costs a copy of the spans' bytes and a few dozen bytes per span, where
    parsing them costs a few hundred: 90 MB against 200 MB for a million 58-byte spans."""
    field = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(
        name="looptrace/span_count.proto", package="looptrace.span_count", syntax="proto3"
    )
    for name, (field_name, number, kind, of) in {
        "ScopeSpans": ("spans", 2, field.TYPE_BYTES, ""),
        "ResourceSpans": ("scope_spans", 2, field.TYPE_MESSAGE, "ScopeSpans"),
        "Request": ("resource_spans", 1, field.TYPE_MESSAGE, "ResourceSpans"),
    }.items():
        message = proto.message_type.add(name=name)
        entry = message.field.add(
            name=field_name, number=number, label=field.LABEL_REPEATED, type=kind
        )
        if of:
            entry.type_name = f".looptrace.span_count.{of}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(
        pool.FindMessageTypeByName("looptrace.span_count.Request")
    )


_SpanCount = _span_count_type()


# -- OTLP/JSON ---------------------------------------------------------------------------------


def _parse_json(raw: bytes, max_spans: int | None) -> ExportTraceServiceRequest:
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise DecodeError(f"invalid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise DecodeError(f"request must be a JSON object, got {type(doc).__name__}")
    count = 0
    # Attribute lists are taken out of the document and added to the message once the mapping
    # has read the rest (``_attach``), in the order both are walked: resource, then per span
    # its attributes, each event's, each link's.
    taken: list[list[Any] | None] = []
    for rs in _objects(_either(doc, "resourceSpans", "resource_spans"), "resourceSpans"):
        taken.append(_take_attributes(rs.get("resource")))
        for ss in _objects(_either(rs, "scopeSpans", "scope_spans"), "scopeSpans"):
            for span in _objects(ss.get("spans"), "spans", "span"):
                count += 1
                if max_spans is not None and count > max_spans:
                    raise _too_many(max_spans)
                _hex_id(span, "traceId", "trace_id", 16, "traceId")
                _hex_id(span, "spanId", "span_id", 8, "spanId")
                _hex_id(span, "parentSpanId", "parent_span_id", 8, "parentSpanId", True)
                taken.append(_take_attributes(span))
                events = span.get("events")
                if isinstance(events, list):
                    taken.extend(_take_attributes(event) for event in events)
                for link in _objects(span.get("links"), "links", "link"):
                    _hex_id(link, "traceId", "trace_id", 16, "link traceId")
                    _hex_id(link, "spanId", "span_id", 8, "link spanId")
                    taken.append(_take_attributes(link))
    try:
        request = json_format.ParseDict(
            doc, ExportTraceServiceRequest(), ignore_unknown_fields=True
        )
    except json_format.ParseError as exc:
        raise _json_error(exc) from None
    _attach(request, taken)
    return request


def _either(obj: dict[str, Any], camel: str, snake: str) -> Any:
    # OTLP/JSON uses lowerCamelCase; the protobuf JSON mapping also accepts the proto names.
    if camel in obj and snake in obj:
        raise DecodeError(f"{camel} and {snake} are the same field: send one")
    value = obj.get(camel)
    return obj.get(snake) if value is None else value


def _take_attributes(holder: Any) -> list[Any] | None:
    if isinstance(holder, dict):
        attributes = holder.get("attributes")
        # Anything but a list stays, for the mapping to say what is wrong with it.
        if isinstance(attributes, list):
            del holder["attributes"]
            return attributes
    return None


def _attach(request: ExportTraceServiceRequest, taken: list[list[Any] | None]) -> None:
    """Add the attributes taken out of the document to the message the mapping made.

    A string attribute, most of them, is set directly (protobuf checks its UTF-8); any other
    goes through the JSON mapping on its own. The mapping's per-field work would otherwise
    dominate, and it scans every string for lone surrogates with a regular expression, about
    27 ms per MB holding the GIL, which orjson has already ruled out.
    """
    at = iter(taken)
    try:
        for rs in request.resource_spans:
            _add_attributes(rs.resource, next(at), "resource.attributes")
            for ss in rs.scope_spans:
                for span in ss.spans:
                    _add_attributes(span, next(at), "attributes")
                    for event in span.events:
                        _add_attributes(event, next(at), "events.attributes")
                    for link in span.links:
                        _add_attributes(link, next(at), "links.attributes")
    except StopIteration:
        pass
    else:
        if next(at, _END) is _END:
            return
    # The document and the message disagree on where attributes go: refuse, never guess.
    raise DecodeError("invalid OTLP/JSON: attributes do not match the request's structure")


def _add_attributes(holder: Any, items: list[Any] | None, what: str) -> None:
    if items is None:
        return
    attributes = holder.attributes
    for kv in items:
        if type(kv) is not dict:
            raise DecodeError(
                f"invalid OTLP/JSON: {what}: an attribute must be a JSON object, "
                f"got {type(kv).__name__}"
            )
        key = kv.get("key")
        value = kv.get("value")
        if type(key) is str and type(value) is dict and len(value) == 1:
            text = value.get("stringValue")
            if type(text) is str:
                entry = attributes.add()
                entry.key = key
                entry.value.string_value = text
                continue
        try:
            json_format.ParseDict(kv, attributes.add(), ignore_unknown_fields=True)
        except json_format.ParseError as exc:
            raise _json_error(exc, what) from None


def _objects(value: Any, what: str, item: str | None = None) -> Iterable[dict[str, Any]]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise DecodeError(f"{what} must be a JSON array, got {type(value).__name__}")
    for v in value:
        if not isinstance(v, dict):
            raise DecodeError(
                f"{item or what + '[]'} must be a JSON object, got {type(v).__name__}"
            )
    return value


def _hex_id(
    obj: dict[str, Any], camel: str, snake: str, size: int, what: str, optional: bool = False
) -> None:
    """Rewrite one hex id as the base64 the protobuf JSON mapping reads; a base64 id of the
    right size is left as it is; anything else is refused."""
    key = camel if camel in obj else snake
    value = obj.get(key)
    if value is None or value == "":
        if optional:
            return
        raise DecodeError(f"{what} is missing")
    if not isinstance(value, str):
        return  # the mapping says what is wrong with it
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        raw = b""
    if len(raw) == size and len(value) == 2 * size:
        obj[key] = base64.b64encode(raw).decode("ascii")
        return
    try:
        if len(base64.b64decode(value, validate=True)) == size:
            return
    except (binascii.Error, ValueError):
        pass
    raise DecodeError(f"{what} must be {size * 2} hex digits, got {value[:40]!r}")


# -- the message as DecodedSpans ---------------------------------------------------------------


def _decoded(request: ExportTraceServiceRequest) -> list[DecodedSpan]:
    spans: list[DecodedSpan] = []
    for rs in request.resource_spans:
        resource = _attributes(rs.resource.attributes)
        for ss in rs.scope_spans:
            scope_name = ss.scope.name
            scope_version = ss.scope.version
            for span in ss.spans:
                spans.append(_span(span, resource, scope_name, scope_version))
    return spans


def _span(span: Span, resource: dict[str, Any], scope_name: str, scope_version: str) -> DecodedSpan:
    trace_id = span.trace_id
    span_id = span.span_id
    parent = span.parent_span_id
    if len(trace_id) != 16:
        raise DecodeError(
            f"trace_id must be 16 bytes, got {len(trace_id)}"
            if trace_id
            else "span without a trace_id"
        )
    if len(span_id) != 8:
        raise DecodeError(
            f"span_id must be 8 bytes, got {len(span_id)}" if span_id else "span without a span_id"
        )
    if parent and len(parent) != 8:
        raise DecodeError(f"parent_span_id must be 8 bytes, got {len(parent)}")
    status = span.status
    return DecodedSpan(
        trace_id=trace_id.hex(),
        span_id=span_id.hex(),
        parent_span_id=parent.hex() if parent else None,
        name=span.name,
        kind=span.kind,
        start_ns=span.start_time_unix_nano,
        end_ns=span.end_time_unix_nano,
        attributes=_attributes(span.attributes),
        events=[
            {"name": e.name, "time_ns": e.time_unix_nano, "attributes": _attributes(e.attributes)}
            for e in span.events
        ],
        links=[_link(link) for link in span.links],
        status_code=status.code,
        status_message=status.message,
        trace_state=span.trace_state,
        resource=resource,
        scope_name=scope_name,
        scope_version=scope_version,
    )


def _link(link: Span.Link) -> dict[str, Any]:
    trace_id = link.trace_id
    span_id = link.span_id
    if not trace_id or not span_id:
        raise DecodeError("link without a trace_id or span_id")
    if len(trace_id) != 16:
        raise DecodeError(f"link trace_id must be 16 bytes, got {len(trace_id)}")
    if len(span_id) != 8:
        raise DecodeError(f"link span_id must be 8 bytes, got {len(span_id)}")
    return {
        "trace_id": trace_id.hex(),
        "span_id": span_id.hex(),
        "trace_state": link.trace_state,
        "attributes": _attributes(link.attributes),
    }


def _attributes(kvs: Iterable[KeyValue]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in kvs:
        value = kv.value
        # Most attributes are strings: one oneof lookup, no call.
        if value.WhichOneof("value") == "string_value":
            out[kv.key] = value.string_value
        else:
            out[kv.key] = _value(value)
    return out


def _value(value: AnyValue) -> Any:
    """An AnyValue as Python: str, bool, int, float, bytes, a list (array), a dict (kvlist), or
    None when no value is set. Nesting is bounded by protobuf's recursion limit."""
    which = value.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [_value(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, which)
