"""The OTLP/HTTP trace encoder: spans to request bodies, protobuf and JSON.

Once per span and once per batch::

    encode_span(wire, encoding)              -> bytes   (one Span message body / JSON object)
    encode_request(chunks, resource, enc)    -> bytes   (ExportTraceServiceRequest, chunks spliced)
    compress(body, compression)              -> (bytes, Content-Encoding or None)

and the same two in pieces (``encode_request_pieces``, ``compress_body``), so that a large
batch is joined by the compressor in its thread, not copied on the loop.

The parts: ``resource`` (what a request's spans share), ``pb`` and ``jsonenc`` (a span's
encoding), ``request`` (spans into a request) and ``compression``. Protobuf is written by hand
so the client needs no protobuf runtime and encodes each span in one pass; field numbers follow
``opentelemetry/proto/trace/v1/trace.proto`` and the tests check the bytes against
``opentelemetry-proto``'s generated classes. Each span is encoded exactly once: a batch is the
concatenation of already-encoded spans, so the batcher can count exact bytes and split a batch
without re-serializing anything. Encoding never raises for values a :class:`WireSpan` may
hold. The client decodes nothing: receiving is the collector's (``looptrace.collector.decode``).

``span_encoder`` (the exporter's per-span step, straight from a span) is not imported here: it
reads capture's spans, which a worker process, encoding with this package, has none of.
"""

from __future__ import annotations

from ._common import (
    FLAG_HAS_IS_REMOTE,
    FLAG_IS_REMOTE,
    FLAG_SAMPLED,
    JSON_CONTENT_TYPE,
    PROTOBUF_CONTENT_TYPE,
    EncodingName,
)
from .compression import (
    GZIP_LEVEL,
    PROBE_FROM_BYTES,
    ZSTD_LEVEL,
    compress,
    compress_body,
    compress_pieces,
)
from .pb import (
    MIME_PIECE,
    payload_attributes,
    span_attributes,
    span_head,
    span_pieces,
    span_tail,
    string_attribute,
)
from .request import (
    ScopedChunk,
    encode_request,
    encode_request_pieces,
    encode_span,
    request_pieces,
    scoped,
)
from .resource import Resource, content_type, default_resource

__all__ = [
    "FLAG_HAS_IS_REMOTE",
    "FLAG_IS_REMOTE",
    "FLAG_SAMPLED",
    "GZIP_LEVEL",
    "JSON_CONTENT_TYPE",
    "MIME_PIECE",
    "PROBE_FROM_BYTES",
    "PROTOBUF_CONTENT_TYPE",
    "ZSTD_LEVEL",
    "EncodingName",
    "Resource",
    "ScopedChunk",
    "compress",
    "compress_body",
    "compress_pieces",
    "content_type",
    "default_resource",
    "encode_request",
    "encode_request_pieces",
    "encode_span",
    "payload_attributes",
    "request_pieces",
    "scoped",
    "span_attributes",
    "span_head",
    "span_pieces",
    "span_tail",
    "string_attribute",
]
