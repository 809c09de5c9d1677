"""What every part of the codec shares: media types and span flags."""

from __future__ import annotations

from typing import Literal

EncodingName = Literal["protobuf", "json"]

PROTOBUF_CONTENT_TYPE = "application/x-protobuf"
JSON_CONTENT_TYPE = "application/json"

# SpanFlags (trace.proto): bits 0-7 are the W3C trace flags, then whether the parent is remote.
FLAG_SAMPLED = 0x01
FLAG_HAS_IS_REMOTE = 0x100
FLAG_IS_REMOTE = 0x200
_FLAGS_LOCAL = FLAG_SAMPLED | FLAG_HAS_IS_REMOTE
_FLAGS_REMOTE = FLAG_SAMPLED | FLAG_HAS_IS_REMOTE | FLAG_IS_REMOTE

_MASK64 = (1 << 64) - 1
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
