"""Request bodies as a receiver takes them: ``Content-Encoding`` undone within a size limit,
and the errors a malformed or oversized request gets.

Every legal framing decodes: gzip of one member or several (RFC 1952: a body may be members
one after another), deflate as HTTP defines it (a zlib stream, RFC 9110; raw deflate without
the zlib wrapper is refused, as the OpenTelemetry Collector refuses it), zstd of one frame or
several (RFC 8878), and identity. Bytes after the last gzip member or after the deflate stream
that are not another member are refused, and so is a member or frame cut short.

Bounded time and memory: input is handed to the decompressor in slices of at most
``_IN_CHUNK``, so no call copies the rest of the body; gzip and deflate output is taken in
chunks of ``_CHUNK`` and stops one byte past ``max_size``; zstd, whose incremental decoder has
no output limit, gets slices short enough that its output stops at most ``_ZSTD_SLACK`` past
it. Each call consumes input or produces output, so the work is linear in the body and the
output. A zstd frame may ask for a window of at most 8 MiB (the most RFC 9659 lets a zstd
Content-Encoding use), so no frame makes the decoder allocate more.
"""

from __future__ import annotations

import zlib

from ._internals import BodyTooLarge as BodyTooLarge
from ._internals import DecodeError as DecodeError
from ._internals import TooManySpans as TooManySpans
from ._internals import compression as _compression

__all__ = ["DEFAULT_MAX_DECOMPRESSED", "BodyTooLarge", "DecodeError", "TooManySpans", "decompress"]

DEFAULT_MAX_DECOMPRESSED = 64 * 1024 * 1024


# Output is taken a chunk at a time, input given a slice at a time: a decompressor keeps the
# input it has not consumed as a copy (zlib's ``unconsumed_tail``), so handing it the whole
# rest of a large body on each call would copy that rest once per chunk of output.
_CHUNK = 256 * 1024
_IN_CHUNK = 64 * 1024
_GZIP, _ZLIB = 31, 15
# RFC 9659: a zstd Content-Encoding uses windows of at most 8 MiB, and a decoder may refuse
# larger ones (zstandard's own default limit is 128 MiB per decoder).
ZSTD_MAX_WINDOW = 8 * 1024 * 1024
# The most one zstd block decompresses to, and how far past the limit the output may go before
# it is refused (at least 64 blocks, so the slices of input stay at least ~190 bytes long).
_ZSTD_BLOCK = 128 * 1024
# gzip members or zstd frames in one body. Each costs a new decompressor (about 4 us): a
# 32 MiB body of empty members would otherwise hold a decoding thread for 7 s. Above the span
# cap, so a client that compresses each span on its own is still read.
MAX_MEMBERS = 100_000
_ZSTD_SLACK = 8 * 1024 * 1024


def decompress(body: bytes | bytearray, content_encoding: str | None, max_size: int) -> bytes:
    """Undo ``Content-Encoding`` (gzip, deflate, zstd, identity), refusing to produce more than
    ``max_size`` bytes (:class:`BodyTooLarge`): a small compressed body can expand without
    bound. The output is built a chunk at a time in one buffer, which is returned as it is (a
    ``bytearray`` for a compressed body): a body at the limit costs the limit, not twice it."""
    enc = (content_encoding or "identity").strip().lower()
    if enc in ("", "identity", "none"):
        if len(body) > max_size:
            raise BodyTooLarge(f"body exceeds {max_size} bytes")
        return body  # type: ignore[return-value]  # bytes-like: the decoders take either
    if enc in ("gzip", "x-gzip"):
        return _inflate(body, _GZIP, "gzip", max_size)  # type: ignore[return-value]
    if enc == "deflate":
        if len(body) >= 2 and not _zlib_header(body[0], body[1]):
            raise DecodeError(
                "invalid deflate body: not a zlib stream (HTTP's deflate is zlib-wrapped, "
                "RFC 9110; send gzip for raw deflate data)"
            )
        return _inflate(body, _ZLIB, "deflate", max_size)  # type: ignore[return-value]
    if enc == "zstd":
        return _unzstd(body, max_size)  # type: ignore[return-value]
    raise DecodeError(f"unsupported Content-Encoding {content_encoding!r}")


def _zlib_header(cmf: int, flg: int) -> bool:
    # RFC 1950: method 8 (deflate), and the two bytes as a big-endian number divisible by 31.
    return cmf & 0x0F == 8 and (cmf << 8 | flg) % 31 == 0


def _too_big(max_size: int) -> BodyTooLarge:
    return BodyTooLarge(f"decompressed body exceeds {max_size} bytes")


def _too_many_members(name: str) -> BodyTooLarge:
    unit = "frames" if name == "zstd" else "members"
    return BodyTooLarge(f"{name} body of more than {MAX_MEMBERS} {unit}: compress it as one")


def _inflate(body: bytes | bytearray, wbits: int, name: str, max_size: int) -> bytearray:
    """gzip (every member in turn) or a zlib stream, into one buffer of at most ``max_size``."""
    out = bytearray()
    view = memoryview(body)
    start = 0  # where the current member begins in the body
    members = 0
    try:
        while True:
            start = _inflate_one(view, start, zlib.decompressobj(wbits), out, max_size, name)
            members += 1
            if start == len(view):
                return out
            if members == MAX_MEMBERS:
                raise _too_many_members(name)
            if wbits != _GZIP:
                raise DecodeError(f"invalid {name} body: data after the end of the stream")
    except zlib.error as exc:
        if members:
            raise DecodeError(
                f"invalid {name} body: the data after member {members} is not a gzip member ({exc})"
            ) from None
        raise DecodeError(f"invalid {name} body: {exc}") from None
    finally:
        view.release()


def _inflate_one(
    view: memoryview, start: int, d: zlib._Decompress, out: bytearray, max_size: int, name: str
) -> int:
    """Inflate the one gzip member or zlib stream that begins at ``start`` into ``out``;
    returns where it ends. Stops at the member's end (``d.eof``), never at the input's: once a
    member has ended, zlib may keep its last ``unconsumed_tail`` instead of emptying it, and a
    loop that waited for the input to run out would call it for ever."""
    pos = start  # the end of the input handed to ``d`` so far
    pending: bytes | memoryview = b""
    while not d.eof:
        if not pending and pos < len(view):
            pending = view[pos : pos + _IN_CHUNK]
            pos += len(pending)
        # With all input given, a call with none drains what zlib still holds.
        given = len(pending)
        chunk = d.decompress(pending, min(_CHUNK, max_size + 1 - len(out)))
        out += chunk
        if len(out) > max_size:
            raise _too_big(max_size)
        pending = d.unconsumed_tail
        if not chunk and len(pending) == given and not d.eof:
            if not given:
                raise DecodeError(f"truncated {name} body")
            # zlib consumes input or produces output on every call; should it ever do
            # neither, refusing the body beats calling it again for ever.
            raise DecodeError(f"invalid {name} body: the decompressor made no progress")
    # ``unused_data`` is what followed the member's end in the last input handed over.
    return pos - len(d.unused_data)


def _unzstd(body: bytes | bytearray, max_size: int) -> bytearray:
    """Every zstd frame in turn (skippable frames included), into one buffer of at most
    ``max_size``. zstandard's incremental decompressor has no output limit per call, so the
    input is handed over in slices short enough that no call can produce much more than what
    is left under the limit: a zstd block takes at least 3 bytes and makes at most 128 KiB."""
    zstd = _compression._zstd()  # looked up on each call: tests take the package away
    if zstd is None:
        raise DecodeError("zstd body but the zstandard package is not installed")
    out = bytearray()
    view = memoryview(body)
    pos = 0
    frames = 0
    dctx = zstd.ZstdDecompressor(max_window_size=ZSTD_MAX_WINDOW)
    # Past the limit by at most the limit itself (8 MiB at most): a small limit keeps its
    # memory small, at the price of shorter slices of input.
    slack = min(_ZSTD_SLACK, max(max_size, 16 * _ZSTD_BLOCK))
    try:
        while True:
            d = dctx.decompressobj(write_size=_CHUNK)
            while not d.eof:
                if pos == len(view):
                    raise DecodeError("truncated zstd body")
                blocks = (max_size + slack - len(out)) // _ZSTD_BLOCK
                piece = view[pos : pos + min(_IN_CHUNK, 3 * (blocks - 1))]
                pos += len(piece)
                out += d.decompress(piece)
                if len(out) > max_size:
                    raise _too_big(max_size)
            pos -= len(d.unused_data)
            if pos == len(view):
                return out
            frames += 1
            if frames == MAX_MEMBERS:
                raise _too_many_members("zstd")
    except zstd.ZstdError as exc:
        raise DecodeError(f"invalid zstd body: {exc}") from None
    finally:
        view.release()
