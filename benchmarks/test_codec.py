"""How fast the OTLP codec is, per span, against opentelemetry-proto's generated classes.

Run: ``.venv/bin/python -m pytest benchmarks/test_codec.py --benchmark-only -q``

The typical span: six short attributes, as ``@traced`` produces them (code.function,
code.namespace, input/output values as JSON text with their mime types). Input and output
differ on every span, as they do in real programs, so no cache can make them free.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource as PbResource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from looptrace._otlp import (
    Resource,
    compress,
    content_type,
    encode_request,
    encode_span,
)
from looptrace._wire import WireSpan
from looptrace.collector.decode import decode_request

POOL = 1024
START = 1_700_000_000_000_000_000


def typical_span(i: int) -> WireSpan:
    return WireSpan(
        trace_id=0x0AF7651916CD43DD8448EB211C80319C + i,
        span_id=0xB7AD6B7169203331 + i,
        parent_span_id=0x00F067AA0BA902B7,
        name="answer_question",
        kind=1,
        start_ns=START + i * 1000,
        end_ns=START + i * 1000 + 250_000,
        attributes=[
            ("code.function", "answer_question"),
            ("code.namespace", "app.agents"),
            ("input.value", f'{{"question":"what is {i} + {i}?","user":"u{i % 97}"}}'),
            ("input.mime_type", "application/json"),
            ("output.value", f'{{"answer":"{2 * i}","tokens":{i % 50}}}'),
            ("output.mime_type", "application/json"),
        ],
        events=[],
        links=[],
        status_code=0,
        status_message="",
    )


SPANS = [typical_span(i) for i in range(POOL)]
RESOURCE = Resource([("service.name", "bench")], "looptrace", "0.1.0")


def cycle(items: list[Any]) -> Iterator[Any]:
    return itertools.cycle(items)


def otel_proto_span(w: WireSpan) -> bytes:
    """The same span through opentelemetry-proto's generated classes, as the OTel SDK does."""
    attrs = [KeyValue(key=k, value=AnyValue(string_value=v)) for k, v in w.attributes]  # type: ignore[arg-type]
    return Span(
        trace_id=w.trace_id.to_bytes(16, "big"),
        span_id=w.span_id.to_bytes(8, "big"),
        parent_span_id=w.parent_span_id.to_bytes(8, "big"),
        name=w.name,
        kind=w.kind,  # type: ignore[arg-type]
        start_time_unix_nano=w.start_ns,
        end_time_unix_nano=w.end_ns,
        attributes=attrs,
        status=Status(code=w.status_code, message=w.status_message),  # type: ignore[arg-type]
        flags=0x101,
    ).SerializeToString()


def run_per_span(benchmark: Any, fn: Callable[[WireSpan], Any]) -> None:
    spans = cycle(SPANS)
    benchmark(lambda: fn(next(spans)))


def test_encode_span_protobuf(benchmark: Any) -> None:
    """looptrace's hand-written protobuf encoder, one typical span."""
    run_per_span(benchmark, lambda w: encode_span(w, "protobuf"))


def test_encode_span_otel_proto(benchmark: Any) -> None:
    """Baseline: opentelemetry-proto message classes + SerializeToString, same span."""
    run_per_span(benchmark, otel_proto_span)


def test_encode_span_json(benchmark: Any) -> None:
    """looptrace's OTLP/JSON encoder (orjson), one typical span."""
    run_per_span(benchmark, lambda w: encode_span(w, "json"))


@pytest.mark.parametrize("encoding", ["protobuf", "json"])
def test_batch_512_encode_request_gzip(benchmark: Any, encoding: str) -> None:
    """A full batch: 512 pre-encoded spans spliced into a request and gzipped."""
    chunks = [encode_span(w, encoding) for w in SPANS[:512]]
    benchmark(lambda: compress(encode_request(chunks, RESOURCE, encoding), "gzip"))


def test_batch_512_otel_proto_request(benchmark: Any) -> None:
    """Baseline: the same 512-span request built and serialized with the generated classes."""
    spans = [Span.FromString(otel_proto_span(w)) for w in SPANS[:512]]

    def build() -> bytes:
        return ExportTraceServiceRequest(
            resource_spans=[
                ResourceSpans(
                    resource=PbResource(
                        attributes=[
                            KeyValue(key="service.name", value=AnyValue(string_value="bench"))
                        ]
                    ),
                    scope_spans=[
                        ScopeSpans(
                            scope=InstrumentationScope(name="looptrace", version="0.1.0"),
                            spans=spans,
                        )
                    ],
                )
            ]
        ).SerializeToString()

    benchmark(build)


@pytest.mark.parametrize("encoding", ["protobuf", "json"])
def test_decode_request_512(benchmark: Any, encoding: str) -> None:
    """The receiving side: a gzipped 512-span request decoded to DecodedSpan objects."""
    body, ce = compress(
        encode_request([encode_span(w, encoding) for w in SPANS[:512]], RESOURCE, encoding), "gzip"
    )
    spans = benchmark(lambda: decode_request(body, content_type(encoding), ce))
    assert len(spans) == 512


def _decode_body(request: str, encoding: str) -> bytes:
    spans = SPANS[:512] if request == "512-small" else [_image_span(0)]
    return encode_request([encode_span(w, encoding) for w in spans], RESOURCE, encoding)


@pytest.mark.parametrize("encoding", ["protobuf", "json"])
@pytest.mark.parametrize("request_kind", ["512-small", "2.5mb-attribute"])
def test_decode_uncompressed(benchmark: Any, request_kind: str, encoding: str) -> None:
    """One uncompressed request body decoded to DecodedSpans by the collector: 512 typical
    spans, or one span with a 2.5 MB input."""
    body = _decode_body(request_kind, encoding)
    spans = benchmark(lambda: decode_request(body, content_type(encoding)))
    assert len(spans) == (512 if request_kind == "512-small" else 1)


def _image_span(n: int) -> WireSpan:
    """A span carrying a 2.5 MB base64 image as its input, a new string object each time (as
    every call's serialized input is): nothing about the string can be cached between spans."""
    import base64
    import random

    image = base64.b64encode(random.Random(n).randbytes(1_875_000)).decode()
    span = typical_span(n)
    span.attributes[2] = ("input.value", f'{{"image":"{image}"}}')
    return span


def test_encode_span_2_5mb_input(benchmark: Any) -> None:
    """One span with a 2.5 MB input, encoded to protobuf: inline on the loop when offload is
    off, and in the worker when it is on. Dominated by copying the payload once."""
    spans = [_image_span(n) for n in range(4)]
    fresh = cycle(spans)
    benchmark.pedantic(
        lambda w: encode_span(w, "protobuf"),
        setup=lambda: ((_fresh_copy(next(fresh)),), {}),
        rounds=20,
    )


def _fresh_copy(w: WireSpan) -> WireSpan:
    # A new str object with the same text: its hash is not yet computed, as in a real span.
    attrs = [(k, "".join((v[:1], v[1:])) if type(v) is str else v) for k, v in w.attributes]
    w.attributes = attrs
    return w


def test_compress_2_5mb_base64_request(benchmark: Any) -> None:
    """A 2.5 MB request body of base64 offered to gzip: the probe's sample says it will not
    shrink enough, so it goes out as it is. This is the probe's whole cost."""
    body = encode_request([encode_span(_image_span(0), "protobuf")], RESOURCE, "protobuf")
    benchmark(lambda: compress(body, "gzip"))
