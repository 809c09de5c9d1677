"""Spans into one ``ExportTraceServiceRequest``: chunks spliced under their resource and
scope, never re-encoded."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .._wire import WireSpan
from .jsonenc import _dumps, _span_json_obj
from .pb import _encode_span_pb, _varint
from .resource import Resource

if TYPE_CHECKING:
    pass


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
    return b"".join(encode_request_pieces(chunks, resource, encoding))


def encode_request_pieces(
    chunks: Sequence[bytes], resource: Resource, encoding: str
) -> list[bytes]:
    """:func:`encode_request` in pieces, the chunks among them as they are: whoever needs the
    body whole (the compressor, in its thread) joins it, so a batch of megabytes is never
    copied on the loop."""
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
            return [piece for p in parts for piece in p]
        cut = len(_JSON_REQUEST_HEAD)
        inner = b",".join(b"".join(p)[cut:-2] for p in parts)
        return [_JSON_REQUEST_HEAD + inner + b"]}"]
    return _encode_one_scope(chunks, resource, encoding)


def _encode_one_scope(chunks: Sequence[bytes], resource: Resource, encoding: str) -> list[bytes]:
    if encoding == "json":
        out = [resource._json]
        for i, chunk in enumerate(chunks):
            if i:
                out.append(b",")
            out.append(chunk)
        out.append(b"]}]}]}")
        return out
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
    return pieces


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
