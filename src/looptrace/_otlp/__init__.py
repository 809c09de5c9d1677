"""The OTLP/HTTP trace codec: spans to request bodies and back, protobuf and JSON.

Sending side, once per span and once per batch::

    encode_span(wire, encoding)              -> bytes   (one Span message body / JSON object)
    encode_request(chunks, resource, enc)    -> bytes   (ExportTraceServiceRequest, chunks spliced)
    compress(body, compression)              -> (bytes, Content-Encoding or None)

Receiving side (the collector and the local store)::

    decode_request(body, content_type, content_encoding, max_decompressed) -> list[DecodedSpan]

The parts: ``resource`` (what a request's spans share), ``pb`` and ``jsonenc`` (a span's
encoding), ``request`` (spans into a request), ``compression``, and ``decode`` with its readers
``pbread`` and ``jsonread``. Protobuf is written and read by hand so the client needs no
protobuf runtime; field numbers follow ``opentelemetry/proto/trace/v1/trace.proto`` and the
tests check every field against ``opentelemetry-proto``'s generated classes. Each span is
encoded exactly once: a batch is the concatenation of already-encoded spans, so the batcher can
count exact bytes and split a batch without re-serializing anything.

Errors: every malformed input raises :class:`DecodeError` (a ``ValueError``) with a message
that says what was wrong; encoding never raises for values a :class:`WireSpan` may hold.
"""

from __future__ import annotations

from ._common import (
    DEFAULT_MAX_DECOMPRESSED,
    FLAG_HAS_IS_REMOTE,
    FLAG_IS_REMOTE,
    FLAG_SAMPLED,
    JSON_CONTENT_TYPE,
    PROTOBUF_CONTENT_TYPE,
    DecodeError,
    EncodingName,
    TooManySpans,
)
from .compression import (
    _WORTH_IT,
    GZIP_LEVEL,
    PROBE_FROM_BYTES,
    ZSTD_LEVEL,
    _worth_compressing,
    compress,
    compress_pieces,
    decompress,
)
from .decode import decode_request
from .pb import (
    _ATTR_CACHE,
    _ATTR_CACHE_MAX,
    _KEY_CACHE,
    _KEY_CACHE_MAX,
    _NAME_CACHE,
    _NAME_CACHE_MAX,
    MIME_PIECE,
    payload_attributes,
    span_attributes,
    span_head,
    span_pieces,
    span_tail,
    string_attribute,
)
from .request import ScopedChunk, encode_request, encode_span, request_pieces, scoped
from .resource import Resource, content_type, default_resource

__all__ = [
    "DEFAULT_MAX_DECOMPRESSED",
    "FLAG_HAS_IS_REMOTE",
    "FLAG_IS_REMOTE",
    "FLAG_SAMPLED",
    "GZIP_LEVEL",
    "JSON_CONTENT_TYPE",
    "MIME_PIECE",
    "PROBE_FROM_BYTES",
    "PROTOBUF_CONTENT_TYPE",
    "ZSTD_LEVEL",
    "_ATTR_CACHE",
    "_ATTR_CACHE_MAX",
    "_KEY_CACHE",
    "_KEY_CACHE_MAX",
    "_NAME_CACHE",
    "_NAME_CACHE_MAX",
    "_WORTH_IT",
    "DecodeError",
    "EncodingName",
    "Resource",
    "ScopedChunk",
    "TooManySpans",
    "_worth_compressing",
    "compress",
    "compress_pieces",
    "content_type",
    "decode_request",
    "decompress",
    "default_resource",
    "encode_request",
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
