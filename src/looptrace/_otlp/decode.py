"""Decoding OTLP/HTTP trace requests from any SDK (the collector and the local store), with
the receivers' limits: every malformed input is a :class:`DecodeError`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._wire import DecodedSpan
from ._common import (
    DEFAULT_MAX_DECOMPRESSED,
    JSON_CONTENT_TYPE,
    PROTOBUF_CONTENT_TYPE,
    DecodeError,
    _Spans,
)
from .compression import decompress
from .jsonread import _decode_json_request
from .pbread import _decode_pb_request

if TYPE_CHECKING:
    pass


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
