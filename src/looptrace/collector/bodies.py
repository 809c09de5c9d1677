"""Request bodies as a receiver takes them: ``Content-Encoding`` undone within a size limit,
and the errors a malformed or oversized request gets."""

from __future__ import annotations

import zlib

from ._internals import compression as _compression

__all__ = ["DEFAULT_MAX_DECOMPRESSED", "DecodeError", "TooManySpans", "decompress"]

DEFAULT_MAX_DECOMPRESSED = 64 * 1024 * 1024


class DecodeError(ValueError):
    """A request body is not valid OTLP (bad protobuf, bad JSON, bad compression, too large)."""


class TooManySpans(DecodeError):
    """A request holds more spans than the receiver takes in one request."""


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
    zstd = _compression._zstd()  # looked up on each call: tests take the package away
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
