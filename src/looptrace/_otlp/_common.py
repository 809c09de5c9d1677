"""What every part of the codec shares: media types, span flags, limits, the decode error."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from .._wire import DecodedSpan

if TYPE_CHECKING:
    pass


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
