"""The OTLP codec: what looptrace puts on the wire, checked against opentelemetry-proto, and what
it accepts from any OpenTelemetry SDK."""

from __future__ import annotations

import base64
import gzip
import itertools
import json
import math
import re
import struct
import tracemalloc
import zlib
from typing import Any

import orjson
import pytest
from google.protobuf import json_format
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.resource.v1 import resource_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from looptrace import _otlp
from looptrace._config import Config
from looptrace._otlp import (
    Resource,
    compress,
    content_type,
    default_resource,
    encode_request,
    encode_span,
)
from looptrace._otlp import compression as otlp_compression
from looptrace._otlp import pb as otlp_pb
from looptrace._wire import Attributes, DecodedSpan, WireEvent, WireLink, WireSpan
from looptrace.collector.bodies import DecodeError, TooManySpans, decompress
from looptrace.collector.decode import decode_request

ENCODINGS = ["protobuf", "json"]
TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C
SPAN_ID = 0xB7AD6B7169203331
PARENT_ID = 0x00F067AA0BA902B7
START = 1_700_000_000_123_456_789
END = START + 250_000_000

# One of every kind an attribute value can have, including the awkward corners.
EVERY_KIND: Attributes = [
    ("s", "hello"),
    ("s.empty", ""),
    ("s.unicode", "héllo ☃ 𝄞"),
    ("s.long", "x" * 20_000),
    ("b.true", True),
    ("b.false", False),
    ("i", 42),
    ("i.zero", 0),
    ("i.neg", -7),
    ("i.min", -(2**63)),
    ("i.max", 2**63 - 1),
    ("f", 1.25),
    ("f.neg", -0.5),
    ("f.zero", 0.0),
    ("bytes", b"\x00\xff\x10binary"),
    ("bytes.empty", b""),
    ("list.str", ["a", "b", ""]),
    ("list.int", [1, -2, 3]),
    ("list.float", [0.5, 1.5]),
    ("list.bool", [True, False]),
    ("list.empty", []),
    ("input.value", '{"q": "what is 2+2?"}'),
    ("input.mime_type", "application/json"),
]


def make_span(
    attributes: Attributes | None = None,
    *,
    end_ns: int = END,
    events: list[WireEvent] | None = None,
    links: list[WireLink] | None = None,
    parent: int = PARENT_ID,
    parent_is_remote: bool = False,
    status: tuple[int, str] = (0, ""),
    kind: int = 1,
    trace_state: str = "",
    dropped: int = 0,
    span_id: int = SPAN_ID,
) -> WireSpan:
    return WireSpan(
        trace_id=TRACE_ID,
        span_id=span_id,
        parent_span_id=parent,
        name="answer question",
        kind=kind,
        start_ns=START,
        end_ns=end_ns,
        attributes=list(EVERY_KIND if attributes is None else attributes),
        events=events or [],
        links=links or [],
        status_code=status[0],
        status_message=status[1],
        trace_state=trace_state,
        dropped_attributes=dropped,
        parent_is_remote=parent_is_remote,
    )


def full_span() -> WireSpan:
    """A span with every optional part present."""
    return make_span(
        events=[
            WireEvent("exception", START + 10, [("exception.type", "ValueError"), ("n", 3)]),
            WireEvent("retry", START + 20, []),
        ],
        links=[
            WireLink(0x1234, 0x5678, "vendor=1", [("link.kind", "follows")], is_remote=True),
            WireLink(TRACE_ID, 0x9ABC, "", []),
        ],
        status=(2, "ValueError: bad input"),
        kind=3,
        trace_state="rojo=00f067aa0ba902b7",
        dropped=2,
        parent_is_remote=True,
    )


RESOURCE = Resource(
    [("service.name", "checkout"), ("deployment.environment", "test"), ("host.cpus", 2)],
    "looptrace",
    "0.1.0",
)


def request(spans: list[WireSpan], encoding: str, resource: Resource = RESOURCE) -> bytes:
    return encode_request([encode_span(s, encoding) for s in spans], resource, encoding)


def roundtrip(spans: list[WireSpan], encoding: str) -> list[DecodedSpan]:
    return decode_request(request(spans, encoding), content_type(encoding))


def same_value(a: Any, b: Any) -> bool:
    """Equality that treats NaN as equal to NaN and lists/tuples alike."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def any_to_python(v: common_pb2.AnyValue) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [any_to_python(x) for x in v.array_value.values]
    if which == "kvlist_value":
        return {kv.key: any_to_python(kv.value) for kv in v.kvlist_value.values}
    return None if which is None else getattr(v, which)


def kvs(values: Any) -> list[tuple[str, Any]]:
    return [(kv.key, any_to_python(kv.value)) for kv in values]


def hex_ids_to_base64(obj: Any) -> Any:
    """OTLP/JSON writes ids as hex where the generic protobuf JSON mapping expects base64."""
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if k in ("traceId", "spanId", "parentSpanId") and isinstance(v, str):
                out[k] = base64.b64encode(bytes.fromhex(v)).decode()
            else:
                out[k] = hex_ids_to_base64(v)
        return out
    if isinstance(obj, list):
        return [hex_ids_to_base64(x) for x in obj]
    return obj


# -- round trips -------------------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_roundtrip_every_attribute_kind(encoding: str) -> None:
    """Every kind of attribute value comes back as the same Python value and type."""
    [decoded] = roundtrip([make_span()], encoding)
    assert list(decoded.attributes) == [k for k, _ in EVERY_KIND]
    for key, value in EVERY_KIND:
        assert same_value(decoded.attributes[key], value), key


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_roundtrip_every_span_field(encoding: str) -> None:
    """Ids, times, kind, status, trace state, events, links, resource and scope survive."""
    [d] = roundtrip([full_span()], encoding)
    assert d.trace_id == f"{TRACE_ID:032x}"
    assert d.span_id == f"{SPAN_ID:016x}"
    assert d.parent_span_id == f"{PARENT_ID:016x}"
    assert (d.name, d.kind, d.start_ns, d.end_ns) == ("answer question", 3, START, END)
    assert (d.status_code, d.status_message) == (2, "ValueError: bad input")
    assert d.trace_state == "rojo=00f067aa0ba902b7"
    assert d.events == [
        {
            "name": "exception",
            "time_ns": START + 10,
            "attributes": {"exception.type": "ValueError", "n": 3},
        },
        {"name": "retry", "time_ns": START + 20, "attributes": {}},
    ]
    assert d.links == [
        {
            "trace_id": f"{0x1234:032x}",
            "span_id": f"{0x5678:016x}",
            "trace_state": "vendor=1",
            "attributes": {"link.kind": "follows"},
        },
        {
            "trace_id": f"{TRACE_ID:032x}",
            "span_id": f"{0x9ABC:016x}",
            "trace_state": "",
            "attributes": {},
        },
    ]
    assert d.resource == {
        "service.name": "checkout",
        "deployment.environment": "test",
        "host.cpus": 2,
    }
    assert (d.scope_name, d.scope_version) == ("looptrace", "0.1.0")


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_root_span_and_in_progress_record(encoding: str) -> None:
    """A root decodes with parent None; an in-progress record keeps end time 0 and its marker."""
    span = make_span([("looptrace.in_progress", True)], parent=0, end_ns=0)
    [d] = roundtrip([span], encoding)
    assert d.parent_span_id is None
    assert d.end_ns == 0
    assert d.attributes == {"looptrace.in_progress": True}


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_special_floats_and_huge_ints(encoding: str) -> None:
    """NaN and infinities survive both encodings; ints beyond int64 travel as their digits."""
    attrs: Attributes = [
        ("nan", math.nan),
        ("inf", math.inf),
        ("ninf", -math.inf),
        ("huge", 2**70),
        ("tiny", -(2**64)),
    ]
    [d] = roundtrip([make_span(attrs)], encoding)
    assert math.isnan(d.attributes["nan"])
    assert d.attributes["inf"] == math.inf
    assert d.attributes["ninf"] == -math.inf
    assert d.attributes["huge"] == str(2**70)
    assert d.attributes["tiny"] == str(-(2**64))


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_many_spans_in_one_request_keep_order(encoding: str) -> None:
    """A batch of chunks decodes to the same spans, in order."""
    spans = [make_span([("i", i)], span_id=i + 1) for i in range(50)]
    decoded = roundtrip(spans, encoding)
    assert [d.span_id for d in decoded] == [f"{i + 1:016x}" for i in range(50)]
    assert [d.attributes["i"] for d in decoded] == list(range(50))


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_empty_request(encoding: str) -> None:
    """A request with no spans is valid and decodes to none."""
    body = encode_request([], RESOURCE, encoding)
    assert decode_request(body, content_type(encoding)) == []
    if encoding == "protobuf":
        msg = ExportTraceServiceRequest.FromString(body)
        assert len(msg.resource_spans[0].scope_spans[0].spans) == 0


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_lone_surrogates_do_not_break_encoding(encoding: str) -> None:
    """Text that cannot be UTF-8 (a lone surrogate) is replaced, not allowed to fail a batch."""
    [d] = roundtrip([make_span([("bad", "a\ud800b"), ("ok", "fine")])], encoding)
    assert d.attributes["bad"] == "a?b"
    assert d.attributes["ok"] == "fine"


def test_repeated_attributes_encode_identically_and_cache_is_bounded() -> None:
    """The attribute cache changes nothing in the bytes and never grows past its limit."""
    span = make_span([("code.function", "f"), ("k", "v")])
    first = encode_span(span, "protobuf")
    assert encode_span(span, "protobuf") == first
    limit = max(otlp_pb._ATTR_CACHE_MAX, otlp_pb._KEY_CACHE_MAX, otlp_pb._NAME_CACHE_MAX)
    for i in range(limit + 10):
        other = make_span([(f"key{i}", f"value{i}")])
        other.name = f"name{i}"
        encode_span(other, "protobuf")
    assert len(otlp_pb._ATTR_CACHE) <= otlp_pb._ATTR_CACHE_MAX
    assert len(otlp_pb._KEY_CACHE) <= otlp_pb._KEY_CACHE_MAX
    assert len(otlp_pb._NAME_CACHE) <= otlp_pb._NAME_CACHE_MAX
    [decoded] = decode_request(
        encode_request([encode_span(other, "protobuf")], RESOURCE, "protobuf"),
        "application/x-protobuf",
    )
    assert decoded.name == other.name
    assert decoded.attributes == {f"key{limit + 9}": f"value{limit + 9}"}
    assert encode_span(span, "protobuf") == first


# -- conformance with opentelemetry-proto -----------------------------------------------------


def check_message(msg: ExportTraceServiceRequest, spans: list[WireSpan]) -> None:
    """Every field of ``msg`` (parsed by the reference implementation) matches ``spans``."""
    [rs] = msg.resource_spans
    assert kvs(rs.resource.attributes) == RESOURCE.attributes
    [ss] = rs.scope_spans
    assert (ss.scope.name, ss.scope.version) == (RESOURCE.scope_name, RESOURCE.scope_version)
    assert len(ss.spans) == len(spans)
    for got, want in zip(ss.spans, spans, strict=True):
        assert got.trace_id == want.trace_id.to_bytes(16, "big")
        assert got.span_id == want.span_id.to_bytes(8, "big")
        want_parent = want.parent_span_id.to_bytes(8, "big") if want.parent_span_id else b""
        assert got.parent_span_id == want_parent
        assert got.trace_state == want.trace_state
        assert got.name == want.name
        assert got.kind == want.kind
        assert got.start_time_unix_nano == want.start_ns
        assert got.end_time_unix_nano == want.end_ns
        got_attrs = kvs(got.attributes)
        assert [k for k, _ in got_attrs] == [k for k, _ in want.attributes]
        for (_, gv), (key, wv) in zip(got_attrs, want.attributes, strict=True):
            assert same_value(gv, wv), key
        assert got.dropped_attributes_count == want.dropped_attributes
        assert len(got.events) == len(want.events)
        for ge, we in zip(got.events, want.events, strict=True):
            assert (ge.name, ge.time_unix_nano) == (we.name, we.time_ns)
            assert kvs(ge.attributes) == we.attributes
        assert len(got.links) == len(want.links)
        for gl, wl in zip(got.links, want.links, strict=True):
            assert gl.trace_id == wl.trace_id.to_bytes(16, "big")
            assert gl.span_id == wl.span_id.to_bytes(8, "big")
            assert gl.trace_state == wl.trace_state
            assert kvs(gl.attributes) == wl.attributes
            remote = trace_pb2.SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK if wl.is_remote else 0
            assert gl.flags == trace_pb2.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK | remote
        assert got.status.code == want.status_code
        assert got.status.message == want.status_message
        remote = trace_pb2.SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK if want.parent_is_remote else 0
        assert got.flags == 0x01 | trace_pb2.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK | remote


def conformance_spans() -> list[WireSpan]:
    return [
        full_span(),
        make_span(parent=0, end_ns=0),
        make_span([("only", 1)], status=(1, ""), kind=2),
    ]


def test_protobuf_conformance_with_opentelemetry_proto() -> None:
    """The reference protobuf parser reads every field of our protobuf requests as intended."""
    spans = conformance_spans()
    msg = ExportTraceServiceRequest.FromString(request(spans, "protobuf"))
    check_message(msg, spans)
    # Nothing we wrote was unknown to the reference schema.
    assert msg.SerializeToString() == request(spans, "protobuf")


def test_json_conformance_with_protobuf_json_mapping() -> None:
    """Our OTLP/JSON parses (ids converted from hex) into exactly the protobuf request."""
    spans = conformance_spans()
    doc = hex_ids_to_base64(orjson.loads(request(spans, "json")))
    msg = json_format.Parse(orjson.dumps(doc), ExportTraceServiceRequest())
    check_message(msg, spans)
    assert msg == ExportTraceServiceRequest.FromString(request(spans, "protobuf"))


def test_json_uses_otlp_spelling() -> None:
    """OTLP/JSON: hex ids, 64-bit integers as strings, enums as integers, camelCase names."""
    doc = orjson.loads(request([full_span()], "json"))
    span = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert span["traceId"] == f"{TRACE_ID:032x}"
    assert span["parentSpanId"] == f"{PARENT_ID:016x}"
    assert span["startTimeUnixNano"] == str(START)
    assert span["kind"] == 3
    assert span["status"] == {"code": 2, "message": "ValueError: bad input"}
    values = {kv["key"]: kv["value"] for kv in span["attributes"]}
    assert values["i"] == {"intValue": "42"}
    assert values["bytes"] == {"bytesValue": base64.b64encode(b"\x00\xff\x10binary").decode()}
    assert values["list.bool"] == {
        "arrayValue": {"values": [{"boolValue": True}, {"boolValue": False}]}
    }


# -- decoding what other SDKs send ------------------------------------------------------------


def sdk_request() -> ExportTraceServiceRequest:
    """A request from the OpenTelemetry SDK's own tracer and OTLP encoder."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource as SdkResource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import Link, SpanKind, Status, StatusCode

    spans = []
    for service, scope in (("svc-a", "lib.one"), ("svc-b", "lib.two")):
        exporter = InMemorySpanExporter()
        provider = TracerProvider(resource=SdkResource.create({"service.name": service}))
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        tracer = provider.get_tracer(scope, "9.9")
        with tracer.start_as_current_span("outer", kind=SpanKind.SERVER) as outer:
            outer.set_attribute("flag", True)
            outer.set_attribute("tags", ["x", "y"])
            with tracer.start_as_current_span(
                "inner", links=[Link(outer.get_span_context(), {"why": "test"})]
            ) as inner:
                inner.add_event("tick", {"n": 1})
                inner.set_attribute("ratio", 0.25)
                inner.set_status(Status(StatusCode.ERROR, "nope"))
        spans.extend(exporter.get_finished_spans())
        provider.shutdown()
    return encode_spans(spans)


def check_against_reference(msg: ExportTraceServiceRequest, decoded: list[DecodedSpan]) -> None:
    expected = []
    for rs in msg.resource_spans:
        for ss in rs.scope_spans:
            for sp in ss.spans:
                expected.append((rs, ss, sp))
    assert len(decoded) == len(expected)
    for d, (rs, ss, sp) in zip(decoded, expected, strict=True):
        assert d.resource == dict(kvs(rs.resource.attributes))
        assert (d.scope_name, d.scope_version) == (ss.scope.name, ss.scope.version)
        assert d.trace_id == sp.trace_id.hex()
        assert d.span_id == sp.span_id.hex()
        assert d.parent_span_id == (sp.parent_span_id.hex() or None)
        assert (d.name, d.kind) == (sp.name, sp.kind)
        assert (d.start_ns, d.end_ns) == (sp.start_time_unix_nano, sp.end_time_unix_nano)
        assert d.attributes == dict(kvs(sp.attributes))
        assert (d.status_code, d.status_message) == (sp.status.code, sp.status.message)
        assert d.trace_state == sp.trace_state
        assert d.events == [
            {"name": e.name, "time_ns": e.time_unix_nano, "attributes": dict(kvs(e.attributes))}
            for e in sp.events
        ]
        assert d.links == [
            {
                "trace_id": link.trace_id.hex(),
                "span_id": link.span_id.hex(),
                "trace_state": link.trace_state,
                "attributes": dict(kvs(link.attributes)),
            }
            for link in sp.links
        ]


def test_decodes_opentelemetry_sdk_protobuf() -> None:
    """A protobuf request from the OpenTelemetry SDK (several resources and scopes) decodes."""
    msg = sdk_request()
    assert len(msg.resource_spans) == 2
    decoded = decode_request(msg.SerializeToString(), "application/x-protobuf")
    check_against_reference(msg, decoded)
    assert {d.resource["service.name"] for d in decoded} == {"svc-a", "svc-b"}
    assert any(d.links and d.events and d.status_code == 2 for d in decoded)


def test_decodes_generic_protobuf_json_mapping_leniently() -> None:
    """JSON from the generic protobuf mapping (base64 ids, enum names, snake_case) decodes."""
    msg = sdk_request()
    camel = json_format.MessageToJson(msg)
    snake = json_format.MessageToJson(msg, preserving_proto_field_name=True)
    for text in (camel, snake):
        decoded = decode_request(text.encode(), "application/json; charset=utf-8")
        check_against_reference(msg, decoded)


def test_decodes_otlp_json_with_hex_ids() -> None:
    """OTLP/JSON as other SDKs write it (hex ids, integer enums) decodes."""
    msg = sdk_request()
    doc = json_format.MessageToDict(msg, use_integers_for_enums=True)
    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for sp in ss["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in sp:
                        sp[key] = base64.b64decode(sp[key]).hex()
    decoded = decode_request(orjson.dumps(doc), "application/json")
    check_against_reference(msg, decoded)


def test_json_leniency() -> None:
    """Numbers where strings are expected, upper-case hex, enum names and NaN strings decode."""
    doc = {
        "resourceSpans": [
            {
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "traceId": "0AF7651916CD43DD8448EB211C80319C",
                                "spanId": base64.b64encode(b"\x01" * 8).decode(),
                                "parentSpanId": "",
                                "name": "lenient",
                                "kind": "SPAN_KIND_CLIENT",
                                "startTimeUnixNano": 5,
                                "endTimeUnixNano": 6.0,
                                "status": {"code": "STATUS_CODE_OK"},
                                "attributes": [
                                    {"key": "n", "value": {"intValue": 7}},
                                    {"key": "d", "value": {"doubleValue": "NaN"}},
                                    {"key": "e", "value": {"doubleValue": 3}},
                                    {"key": "none", "value": {}},
                                ],
                            }
                        ]
                    }
                ]
            }
        ]
    }
    [d] = decode_request(orjson.dumps(doc), "application/json")
    assert d.trace_id == f"{TRACE_ID:032x}"
    assert d.span_id == "01" * 8
    assert d.parent_span_id is None
    assert (d.kind, d.start_ns, d.end_ns, d.status_code) == (3, 5, 6, 1)
    assert d.attributes["n"] == 7
    assert math.isnan(d.attributes["d"])
    assert d.attributes["e"] == 3.0
    assert d.attributes["none"] is None
    assert (d.resource, d.scope_name) == ({}, "")


def test_decodes_kvlist_values_and_fields_in_any_order() -> None:
    """kvlist values become dicts; a scope or resource sent after its spans still applies."""
    span = trace_pb2.Span(
        trace_id=b"\x01" * 16,
        span_id=b"\x02" * 8,
        name="s",
        attributes=[
            common_pb2.KeyValue(
                key="map",
                value=common_pb2.AnyValue(
                    kvlist_value=common_pb2.KeyValueList(
                        values=[
                            common_pb2.KeyValue(key="a", value=common_pb2.AnyValue(int_value=1)),
                            common_pb2.KeyValue(
                                key="b",
                                value=common_pb2.AnyValue(
                                    array_value=common_pb2.ArrayValue(
                                        values=[common_pb2.AnyValue(string_value="z")]
                                    )
                                ),
                            ),
                        ]
                    )
                ),
            ),
            common_pb2.KeyValue(key="empty"),
        ],
    )
    # Concatenated messages merge: this puts the scope after the spans, the resource last.
    scope_spans = (
        trace_pb2.ScopeSpans(spans=[span]).SerializeToString()
        + trace_pb2.ScopeSpans(
            scope=common_pb2.InstrumentationScope(name="late")
        ).SerializeToString()
    )
    rs = trace_pb2.ResourceSpans.FromString(
        _field(2, scope_spans)
        + trace_pb2.ResourceSpans(
            resource=resource_pb2.Resource(
                attributes=[
                    common_pb2.KeyValue(key="r", value=common_pb2.AnyValue(string_value="v"))
                ]
            )
        ).SerializeToString()
    )
    body = ExportTraceServiceRequest(resource_spans=[rs]).SerializeToString()
    [d] = decode_request(body, "application/x-protobuf")
    assert d.attributes == {"map": {"a": 1, "b": ["z"]}, "empty": None}
    assert d.scope_name == "late"
    assert d.resource == {"r": "v"}
    # And the same through the generic JSON mapping.
    [j] = decode_request(
        json_format.MessageToJson(ExportTraceServiceRequest(resource_spans=[rs])).encode(),
        "application/json",
    )
    assert j.attributes == d.attributes


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_subclassed_and_unknown_values_travel_as_their_base(encoding: str) -> None:
    """Values of types the encoders do not list (an IntEnum, a str subclass, a float subclass,
    a NamedTuple, any other object) go out as their base type or their text, in both
    encodings."""
    import enum
    from typing import NamedTuple

    class Level(enum.IntEnum):
        HIGH = 3

    class Tag(str):
        pass

    class Ratio(float):
        pass

    class Pair(NamedTuple):
        a: int
        b: int

    class Thing:
        def __str__(self) -> str:
            return "a thing"

    attrs: Any = [
        ("level", Level.HIGH),
        ("tag", Tag("t")),
        ("ratio", Ratio(0.5)),
        ("pair", Pair(1, 2)),
        ("thing", Thing()),
    ]
    (span,) = decode_request(request([make_span(attrs)], encoding), content_type(encoding))
    assert span.attributes == {
        "level": 3,
        "tag": "t",
        "ratio": 0.5,
        "pair": [1, 2],
        "thing": "a thing",
    }


# -- malformed input ---------------------------------------------------------------------------


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(number: int, body: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(body)) + body


def _wrap_span(span_body: bytes) -> bytes:
    """A request holding one span with the given (raw) body."""
    return _field(1, _field(2, _field(2, span_body)))


def test_unknown_fields_of_every_wire_type_are_skipped() -> None:
    """Fields we do not know (varint, fixed64, bytes, group, fixed32) are skipped, anywhere."""
    unknown = (
        _varint(100 << 3 | 0)
        + _varint(2**63)
        + _varint(101 << 3 | 1)
        + b"\x00" * 8
        + _field(102, b"whatever")
        + _varint(103 << 3 | 3)
        + _varint(1 << 3 | 0)
        + b"\x05"
        + _varint(104 << 3 | 3)
        + _varint(104 << 3 | 4)
        + _varint(103 << 3 | 4)
        + _varint(105 << 3 | 5)
        + b"\x00" * 4
    )
    span = encode_span(make_span([("k", "v")]), "protobuf")
    plain = decode_request(_wrap_span(span), "application/x-protobuf")
    noisy = decode_request(unknown + _wrap_span(unknown + span + unknown), "application/x-protobuf")
    assert noisy == plain
    assert noisy[0].attributes == {"k": "v"}


SPAN_OK = encode_span(make_span([("k", "v")]), "protobuf")


CORRUPT = "not a valid protobuf ExportTraceServiceRequest: Wire format was corrupt"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        # protobuf says the wire format is corrupt, not where: a truncated varint, one of more
        # than 10 bytes, lengths past the end, truncated fixed64/fixed32, wire type 6, field
        # number 0, an end-group without a start, a group never ended.
        (b"\x0a", CORRUPT),
        (b"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", CORRUPT),
        (b"\x0a\x05\x12\x03", CORRUPT),
        (b"\x0a\x7f" + b"\x00" * 10, CORRUPT),
        (_wrap_span(b"\x0a\x03abc" + SPAN_OK[18:]), "trace_id must be 16 bytes, got 3"),
        (_wrap_span(SPAN_OK[18:]), "span without a trace_id"),
        (_wrap_span(b"\x39\x00\x00"), CORRUPT),
        (_wrap_span(b"\x85\x01\x00"), CORRUPT),
        (b"\x0e", CORRUPT),
        (b"\x02\x00", CORRUPT),
        (b"\x0c", CORRUPT),
        (b"\x0b\x08\x01", CORRUPT),
        (_wrap_span(b"\x2a\x02\xff\xfe" + SPAN_OK), "String field had bad UTF-8"),
        (_wrap_span(SPAN_OK + b"\x22\x03abc"), "parent_span_id must be 8 bytes, got 3"),
    ],
)
def test_malformed_protobuf_raises_decode_error(body: bytes, message: str) -> None:
    """Each kind of broken protobuf gives a DecodeError that says what is wrong."""
    with pytest.raises(DecodeError, match=re.escape(message)):
        decode_request(body, "application/x-protobuf")


def test_a_known_field_with_another_wire_type_is_an_unknown_field() -> None:
    """A field number the schema knows, sent with another wire type, is skipped as an
    unknown field, as every protobuf parser does: the request and the span decode as
    without it."""
    assert decode_request(b"\x08\x01", "application/x-protobuf") == []
    assert decode_request(
        _wrap_span(b"\x08\x05" + SPAN_OK), "application/x-protobuf"
    ) == decode_request(_wrap_span(SPAN_OK), "application/x-protobuf")


def test_attribute_edge_cases_at_the_end_of_the_body() -> None:
    """A KeyValue cut after its tag is an error; an empty AnyValue at the very end is None."""
    with pytest.raises(DecodeError):
        decode_request(_wrap_span(SPAN_OK + b"\x4a\x01\x0a"), "application/x-protobuf")
    with pytest.raises(DecodeError):
        decode_request(_wrap_span(SPAN_OK + b"\x4a\x01\x12"), "application/x-protobuf")
    [d] = decode_request(
        _wrap_span(SPAN_OK + b"\x4a\x05\x0a\x01e\x12\x00"), "application/x-protobuf"
    )
    assert d.attributes == {"k": "v", "e": None}


def test_every_truncation_of_a_request_is_decode_error_or_fewer_spans() -> None:
    """Cutting a request anywhere never raises anything but DecodeError."""
    body = request([full_span(), make_span()], "protobuf")
    for cut in range(len(body)):
        try:
            decode_request(body[:cut], "application/x-protobuf")
        except DecodeError:
            pass


@settings(max_examples=200, deadline=None, database=None)
@given(st.binary(max_size=200))
def test_random_bytes_never_raise_anything_but_decode_error(body: bytes) -> None:
    """Garbage in gives DecodeError (or spans), never IndexError, struct.error and the like."""
    for data in (body, SPAN_OK[: len(body) % len(SPAN_OK)] + body):
        try:
            decode_request(_wrap_span(data), "application/x-protobuf")
            decode_request(data, "application/x-protobuf")
        except DecodeError:
            pass


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (b"{not json", "invalid JSON"),
        (b"[]", "request must be a JSON object"),
        (b'{"resourceSpans": {}}', "resourceSpans must be a JSON array"),
        (b'{"resourceSpans": [{"scopeSpans": [{"spans": [7]}]}]}', "span must be a JSON object"),
        (
            b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"spanId": "0102030405060708"}]}]}]}',
            "traceId is missing",
        ),
        (
            b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz", "spanId": "0102030405060708"}]}]}]}',
            "traceId must be 32 hex digits",
        ),
        (
            b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "0102030405060708090a0b0c0d0e0f10", "spanId": "0102030405060708", "startTimeUnixNano": "soon"}]}]}]}',
            "spans.startTimeUnixNano: invalid literal for int",
        ),
        (
            b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "0102030405060708090a0b0c0d0e0f10", "spanId": "0102030405060708", "attributes": [{"key": "k", "value": {"intValue": "x"}}]}]}]}]}',
            "intValue: invalid literal for int",
        ),
        (
            b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "0102030405060708090a0b0c0d0e0f10", "spanId": "0102030405060708", "attributes": [{"key": "k", "value": {"bytesValue": "a"}}]}]}]}]}',
            "bytesValue: Invalid base64",
        ),
        (
            b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "0102030405060708090a0b0c0d0e0f10", "spanId": "0102030405060708", "attributes": {"k": 1}}]}]}]}',
            "repeated field attributes must be in \\[\\]",
        ),
        (
            b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "0102030405060708090a0b0c0d0e0f10", "spanId": "0102030405060708", "endTimeUnixNano": "-1"}]}]}]}',
            "endTimeUnixNano: Value out of range: -1",
        ),
    ],
)
def test_malformed_json_raises_decode_error(doc: bytes, message: str) -> None:
    """Each kind of broken OTLP/JSON gives a DecodeError that says what is wrong."""
    with pytest.raises(DecodeError, match=message):
        decode_request(doc, "application/json")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=3), children, max_size=3)
    ),
    max_leaves=12,
)


@settings(max_examples=100, deadline=None, database=None)
@given(json_values)
def test_arbitrary_json_never_raises_anything_but_decode_error(value: Any) -> None:
    """Any JSON document, including ones shaped almost like OTLP, gives spans or DecodeError."""
    docs = [
        value,
        {"resourceSpans": value},
        {"resourceSpans": [{"scopeSpans": [{"spans": [value]}]}]},
        {
            "resourceSpans": [
                {
                    "scopeSpans": [
                        {
                            "spans": [
                                {
                                    "traceId": "01" * 16,
                                    "spanId": "02" * 8,
                                    "attributes": value,
                                    "events": [value],
                                }
                            ]
                        }
                    ]
                }
            ]
        },
        {"resourceSpans": [{"resource": value, "scopeSpans": value}]},
    ]
    for doc in docs:
        try:
            # The stdlib writes what orjson will not (huge integers, NaN): all must be handled.
            decode_request(json.dumps(doc).encode(), "application/json")
        except DecodeError:
            pass


def test_unsupported_content_type_and_encoding() -> None:
    """Unknown media types and content encodings are refused with DecodeError."""
    with pytest.raises(DecodeError, match="unsupported Content-Type"):
        decode_request(b"", "text/plain")
    with pytest.raises(DecodeError, match="unsupported Content-Encoding"):
        decode_request(b"", "application/json", "br")


# -- compression -------------------------------------------------------------------------------


@pytest.mark.parametrize("compression", ["gzip", "zstd", "none"])
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_compressed_roundtrip(compression: str, encoding: str) -> None:
    """Bodies compressed with gzip, zstd or nothing decode to the same spans."""
    body = request([full_span()] * 5, encoding)
    packed, content_encoding = compress(body, compression)
    assert content_encoding == (None if compression == "none" else compression)
    if compression != "none":
        assert len(packed) < len(body)
    decoded = decode_request(packed, content_type(encoding), content_encoding)
    assert decoded == decode_request(body, content_type(encoding))


@pytest.mark.parametrize("compression", ["gzip", "zstd", "none"])
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_a_request_in_pieces_compresses_to_the_same_body(compression: str, encoding: str) -> None:
    """The exporter hands a batch to the compressor in pieces (it is joined in the
    compressor's thread): the pieces make the request ``encode_request`` makes, and what the
    receiver decompresses is that request, spans of a foreign scope included."""
    other = full_span()
    other.scope = ("other.lib", "1.0")
    chunks = [_otlp.encode_span(w, encoding) for w in [full_span()] * 40 + [other]]
    for batch in (chunks[:-1], chunks):
        pieces = _otlp.encode_request_pieces(batch, RESOURCE, encoding)
        whole = _otlp.encode_request(batch, RESOURCE, encoding)
        assert b"".join(pieces) == whole
        packed, content_encoding = _otlp.compress_body(pieces, compression)
        assert content_encoding == (None if compression == "none" else compression)
        assert decompress(packed, content_encoding, 1 << 30) == whole
    # One scope: every span is a piece of its own, never copied into a joined body.
    assert len(_otlp.encode_request_pieces(chunks[:-1], RESOURCE, encoding)) > 40


def test_big_incompressible_body_is_sent_as_is() -> None:
    """From a megabyte up, a body whose samples would not shrink by 40% is not compressed
    (base64 of random bytes: 25% at best); compressible bodies of any size are."""
    import base64
    import random

    noise = base64.b64encode(random.Random(3).randbytes(1_000_000))
    assert compress(noise, "gzip") == (noise, None)
    assert compress(noise, "zstd") == (noise, None)
    assert compress(noise[:500_000], "gzip")[1] == "gzip"  # under a megabyte: always
    text = b"the quick brown fox jumps over the lazy dog " * 40_000
    packed, enc = compress(text, "gzip")
    assert enc == "gzip"
    assert gzip.decompress(packed) == text


def _bodies() -> dict[str, bytes]:
    import base64
    import random

    rng = random.Random(11)
    words = ["the", "model", "said", "token", "prompt", "image", "of", "a", "cat", "and", "is"]
    rows = [
        {"id": i, "name": f"item-{i}", "score": rng.random(), "ok": True} for i in range(30_000)
    ]
    image = base64.b64encode(rng.randbytes(900_000)).decode()
    return {
        "base64": base64.b64encode(rng.randbytes(1_500_000)),
        "random bytes": rng.randbytes(1_500_000),
        "json rows": orjson.dumps(rows),
        "prose": " ".join(rng.choice(words) for _ in range(300_000)).encode(),
        "rows around an image": orjson.dumps(
            {"a": rows[:20_000], "img": image, "b": rows[10_000:]}
        ),
    }


@pytest.mark.parametrize("kind", list(_bodies()))
def test_compression_probe_decides_as_the_whole_body_would(kind: str) -> None:
    """The probe compresses a small sample of a large body; its verdict is the one compressing
    all of it would give: gzip only where the whole body shrinks by 40% or more."""
    body = _bodies()[kind]
    assert len(body) >= _otlp.PROBE_FROM_BYTES
    whole = len(zlib.compress(body, _otlp.GZIP_LEVEL)) / len(body)
    assert abs(whole - otlp_compression._WORTH_IT) > 0.05, (
        "a body this close to the line proves nothing"
    )
    packed, enc = compress(body, "gzip")
    if whole < otlp_compression._WORTH_IT:
        assert enc == "gzip"
        assert gzip.decompress(packed) == body
    else:
        assert (packed, enc) == (body, None)


@pytest.mark.parametrize("sizes", [(0, 0), (40, 0), (0, 200_000), (90_000, 300_000)])
def test_span_in_pieces_is_the_joined_encoding(sizes: tuple[int, int]) -> None:
    """A worker writes a span's payload JSON into the request as it is: the pieces join to
    exactly the request the general route builds (``finish``, then ``encode_span``), events,
    links and status included, and a large payload is one of the pieces, not a copy."""
    from looptrace import _serialize

    cfg = Config()
    pol = _serialize.policy(cfg)
    n_in, n_out = sizes
    inputs = (n_in > 0, {"prompt": "é" + "p" * n_in, "api_key": "sk-1"})
    output = (n_out > 0, ["q" * n_out, 3])
    payloads = _serialize.finish_payloads(full_span(), inputs, output, pol, 10**9)
    pieces = _otlp.request_pieces(_otlp.span_pieces(full_span(), payloads), RESOURCE)
    wire = _serialize.finish(full_span(), inputs, output, pol, 10**9)
    assert b"".join(pieces) == request([wire], "protobuf")
    for _, _, body in payloads:
        assert (len(body) >= 64 * 1024) == any(p is body for p in pieces)
    small = [len(p) < 64 * 1024 for p in pieces]
    assert not any(a and b for a, b in itertools.pairwise(small))  # runs of small ones are joined


@settings(max_examples=60, deadline=None)
@given(cuts=st.lists(st.integers(0, 1_200_000), max_size=6), noise=st.booleans())
def test_compression_of_pieces_decides_and_packs_as_the_whole_body(
    cuts: list[int], noise: bool
) -> None:
    """However a body is cut into pieces, compressing them takes the probe's same samples to
    the same verdict, and gives the bytes compressing the whole would."""
    import random

    rng = random.Random(len(cuts))
    text = base64.b64encode(rng.randbytes(900_000)) if noise else b"abcd efgh " * 90_000
    body = text + b"}" * 300_000
    bounds = sorted({0, len(body), *(c for c in cuts if c < len(body))})
    pieces = [body[a:b] for a, b in itertools.pairwise(bounds)] + [b""]
    assert otlp_compression._worth_compressing(
        pieces, len(body)
    ) == otlp_compression._worth_compressing([body], len(body))
    packed, enc = _otlp.compress_pieces(pieces, "gzip")
    assert (b"".join(packed), enc) == compress(body, "gzip")


def test_gzip_output_is_standard_gzip() -> None:
    """Our gzip is plain RFC 1952 that the stdlib (and any server) can read."""
    packed, _ = compress(b"hello " * 1000, "gzip")
    assert gzip.decompress(packed) == b"hello " * 1000


def test_zstd_falls_back_to_gzip_without_zstandard(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the zstandard package, zstd requests are gzipped and the encoding says so."""
    from looptrace._otlp import compression

    monkeypatch.setattr(compression, "_zstd", lambda: None)
    packed, content_encoding = compress(b"x" * 1000, "zstd")
    assert content_encoding == "gzip"
    assert gzip.decompress(packed) == b"x" * 1000
    with pytest.raises(DecodeError, match="zstandard"):
        decompress(b"\x28\xb5\x2f\xfd", "zstd", 1000)


@pytest.mark.parametrize("compression", ["gzip", "zstd"])
def test_decompression_bomb_is_refused(compression: str) -> None:
    """A small body that would expand past the limit is refused without expanding it all."""
    bomb, content_encoding = compress(b"\x00" * (16 * 1024 * 1024), compression)
    assert len(bomb) < 128 * 1024
    tracemalloc.start()
    try:
        with pytest.raises(DecodeError, match="decompressed body exceeds 1048576 bytes"):
            decode_request(
                bomb, "application/x-protobuf", content_encoding, max_decompressed=1 << 20
            )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # Expanding the whole bomb would allocate 16 MiB at least.
    assert peak < 4 * 1024 * 1024


def test_size_limit_is_exact() -> None:
    """A body exactly at the limit passes; one byte more is refused (identity too)."""
    data = b"a" * 5000
    for encoding in ("gzip", "zstd"):
        packed, ce = compress(data, encoding)
        assert decompress(packed, ce, 5000) == data
        with pytest.raises(DecodeError):
            decompress(packed, ce, 4999)
    assert decompress(data, None, 5000) == data
    with pytest.raises(DecodeError, match="exceeds 4999"):
        decompress(data, "identity", 4999)


def test_concatenated_gzip_members_and_deflate() -> None:
    """Several gzip members are one body; deflate (zlib) bodies are accepted too."""
    assert decompress(gzip.compress(b"ab") + gzip.compress(b"cd"), "gzip", 100) == b"abcd"
    assert decompress(zlib.compress(b"abc"), "deflate", 100) == b"abc"


@pytest.mark.parametrize("encoding", ["gzip", "zstd", "deflate"])
def test_corrupt_compressed_body(encoding: str) -> None:
    """Corrupt or truncated compressed bodies give DecodeError."""
    with pytest.raises(DecodeError):
        decompress(b"definitely not compressed", encoding, 1000)
    if encoding == "gzip":
        with pytest.raises(DecodeError, match="truncated"):
            decompress(gzip.compress(b"x" * 1000)[:-10], "gzip", 10_000)


# -- resource ---------------------------------------------------------------------------------


def test_default_resource() -> None:
    """service.name, configured resource attributes, this process's service.instance.id, then
    the telemetry.sdk facts; a configured service.instance.id is kept."""
    from looptrace import __version__

    res = default_resource(Config(service_name="api", resource_attributes={"team": "core"}))
    instance = dict(res.attributes)["service.instance.id"]
    assert isinstance(instance, str) and len(instance) == 32
    assert res.attributes == [
        ("service.name", "api"),
        ("team", "core"),
        ("service.instance.id", instance),
        ("telemetry.sdk.name", "looptrace"),
        ("telemetry.sdk.language", "python"),
        ("telemetry.sdk.version", __version__),
    ]
    assert (res.scope_name, res.scope_version) == ("looptrace", __version__)
    mine = default_resource(Config(resource_attributes={"service.instance.id": "pod-7"}))
    assert [v for k, v in mine.attributes if k == "service.instance.id"] == ["pod-7"]
    # service.name from resource attributes counts only when no service name was configured.
    res = default_resource(Config(resource_attributes={"service.name": "from-attrs"}))
    assert dict(res.attributes)["service.name"] == "from-attrs"
    res = default_resource(
        Config(service_name="explicit", resource_attributes={"service.name": "x"})
    )
    assert dict(res.attributes)["service.name"] == "explicit"


def test_resource_is_immutable() -> None:
    """A Resource cannot be changed after it is built (its encodings are cached)."""
    with pytest.raises(AttributeError):
        RESOURCE.scope_name = "other"  # type: ignore[misc]
    assert Resource([("a", 1)], "s", "1") == Resource([("a", 1)], "s", "1")


def test_content_type() -> None:
    """Each encoding names its media type."""
    assert content_type("protobuf") == "application/x-protobuf"
    assert content_type("json") == "application/json"


# -- property ---------------------------------------------------------------------------------

primitive = (
    st.text(max_size=40)
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False)
    | st.binary(max_size=20)
)
attr_value = primitive | st.lists(
    st.text(max_size=10)
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False),
    max_size=5,
)
attr_sets = st.dictionaries(st.text(min_size=1, max_size=20), attr_value, max_size=12)


@settings(
    max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(attr_sets, st.sampled_from(ENCODINGS))
def test_random_attribute_sets_roundtrip(attrs: dict[str, Any], encoding: str) -> None:
    """Any set of attribute values comes back equal, and the reference parser agrees."""
    # Text is sent as UTF-8, so what comes back is the text's UTF-8 round trip.
    attrs = {
        k: v
        for k, v in attrs.items()
        if k.encode("utf-8", "surrogatepass") == k.encode("utf-8", "replace")
    }
    clean = {
        k: v
        for k, v in attrs.items()
        if not (isinstance(v, str) and v.encode("utf-8", "replace").decode() != v)
        and not (
            isinstance(v, list)
            and any(isinstance(x, str) and x.encode("utf-8", "replace").decode() != x for x in v)
        )
    }
    span = make_span(list(clean.items()))
    [d] = roundtrip([span], encoding)
    assert list(d.attributes) == list(clean)
    for key, value in clean.items():
        assert same_value(d.attributes[key], value), key
    if encoding == "protobuf":
        msg = ExportTraceServiceRequest.FromString(request([span], "protobuf"))
        got = kvs(msg.resource_spans[0].scope_spans[0].spans[0].attributes)
        assert all(same_value(g, w) for (_, g), w in zip(got, clean.values(), strict=True))


def test_double_encoding_is_ieee_little_endian() -> None:
    """double_value goes out as 8 little-endian IEEE-754 bytes (field 4, wire type 1)."""
    body = encode_span(make_span([("f", 1.5)]), "protobuf")
    kv = b"\x0a\x01f\x12\x09\x21" + struct.pack("<d", 1.5)
    assert b"\x4a" + bytes([len(kv)]) + kv in body


# -- limits ------------------------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_more_spans_than_allowed_is_too_many_spans(encoding: str) -> None:
    """A request holding more than ``max_spans`` spans is refused with TooManySpans (a
    DecodeError), at the limit it decodes; the body size that triggers the protobuf count
    (more than two bytes per allowed span) is crossed on both sides."""
    spans = [make_span([("i", i)], span_id=i + 1) for i in range(40)]
    body = request(spans, encoding)
    for limit in (39, 3):
        with pytest.raises(TooManySpans, match=f"more than {limit} spans"):
            decode_request(body, content_type(encoding), max_spans=limit)
    assert len(decode_request(body, content_type(encoding), max_spans=40)) == 40
    assert len(decode_request(body, content_type(encoding), max_spans=len(body))) == 40


def test_empty_protobuf_spans_are_counted_before_they_are_parsed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A body of empty spans (two bytes each on the wire, far more once parsed) is refused by
    the count, without parsing the request whole."""
    from looptrace.collector import decode

    class NeverParsed:
        @staticmethod
        def FromString(body: bytes) -> None:
            raise AssertionError("the request was parsed whole")

    body = _field(1, _field(2, b"\x12\x00" * 200_000))
    monkeypatch.setattr(decode, "ExportTraceServiceRequest", NeverParsed)
    with pytest.raises(TooManySpans, match="more than 1000 spans"):
        decode_request(body, "application/x-protobuf", max_spans=1000)
    with pytest.raises(AssertionError, match="parsed whole"):
        decode_request(body, "application/x-protobuf", max_spans=200_000)


def test_json_errors_name_the_field_once_and_stay_short() -> None:
    """The JSON mapping's nested messages become one path; a huge offending value is cut."""
    doc = {
        "resourceSpans": [
            {
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "traceId": "01" * 16,
                                "spanId": "02" * 8,
                                "attributes": {"k": "x" * 100_000},
                            }
                        ]
                    }
                ]
            }
        ]
    }
    with pytest.raises(DecodeError) as caught:
        decode_request(orjson.dumps(doc), "application/json")
    message = str(caught.value)
    assert message.startswith(
        "invalid OTLP/JSON: resourceSpans.scopeSpans.spans.attributes: repeated field"
    )
    assert len(message) <= 300


def test_json_attributes_that_are_not_objects_and_doubled_fields_are_refused() -> None:
    """An attribute that is not an object, wherever it is (resource, span, event, link), and
    a field sent under both its names are DecodeErrors, not guesses."""
    span = {"traceId": "01" * 16, "spanId": "02" * 8}
    cases = [
        ({"resource": {"attributes": [7]}, "scopeSpans": []}, "resource.attributes: an attribute"),
        ({"scopeSpans": [{"spans": [{**span, "attributes": ["k"]}]}]}, "attributes: an attribute"),
        (
            {"scopeSpans": [{"spans": [{**span, "events": [{"attributes": [None]}]}]}]},
            "events.attributes: an attribute",
        ),
        (
            {"scopeSpans": [{"spans": [{**span, "links": [{**span, "attributes": [1.5]}]}]}]},
            "links.attributes: an attribute",
        ),
        ({"scopeSpans": [], "scope_spans": []}, "scopeSpans and scope_spans are the same field"),
    ]
    for rs, message in cases:
        with pytest.raises(DecodeError, match=message):
            decode_request(orjson.dumps({"resourceSpans": [rs]}), "application/json")


def test_json_attribute_errors_say_where() -> None:
    """A bad attribute value names its place: span, event or link attributes."""
    bad = [{"key": "k", "value": {"intValue": "x"}}]
    span = {"traceId": "01" * 16, "spanId": "02" * 8}
    for extra, where in [
        ({"attributes": bad}, "attributes.value.intValue"),
        ({"events": [{"name": "e", "attributes": bad}]}, "events.attributes.value.intValue"),
        ({"links": [{**span, "attributes": bad}]}, "links.attributes.value.intValue"),
    ]:
        doc = {"resourceSpans": [{"scopeSpans": [{"spans": [{**span, **extra}]}]}]}
        with pytest.raises(DecodeError, match=f"invalid OTLP/JSON: {re.escape(where)}: "):
            decode_request(orjson.dumps(doc), "application/json")
