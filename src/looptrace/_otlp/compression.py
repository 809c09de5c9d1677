"""Compression of request bodies (gzip, zstd), skipped when it would not pay, and bounded
decompression for the receivers."""

from __future__ import annotations

import bisect
import itertools
import zlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass


# ---------------------------------------------------------------------------------------------
# Compression
# ---------------------------------------------------------------------------------------------

# Level 1: request bodies are repetitive text; level 6 buys a few percent at several times the
# CPU, and the flusher shares the process with the application.
GZIP_LEVEL = 1
ZSTD_LEVEL = 3


def _zstd() -> Any:
    try:
        import zstandard
    except ImportError:
        return None
    return zstandard


# A body at least this big is first sampled: if the samples barely compress (base64 images,
# audio, already-compressed data), the body goes out as it is.
PROBE_FROM_BYTES = 1024 * 1024
# 16 KiB in all, from eight places. On bodies of one kind (base64, random bytes, JSON, prose)
# the sample's ratio is within 0.02 of the whole body's; eight places rather than four follow a
# body that mixes kinds more closely (tests/_otlp/test_otlp.py). It costs a sixth of the CPU of the
# 64 KiB sample it replaces: 0.4 ms against 2.1 ms on base64, which deflate finds hardest, paid
# by the worker that sends a large span.
_PROBE_SLICES = 8
_PROBE_SLICE_BYTES = 2 * 1024
# Compressed samples above this fraction of their size: not worth it. Text and JSON come out
# at 0.1-0.3 at level 1; base64 of random bytes at 0.75.
_WORTH_IT = 0.6


def _worth_compressing(pieces: Sequence[bytes], total: int, ends: list[int] | None = None) -> bool:
    """Whether the body that ``pieces`` (``total`` bytes; ``ends``, their running sum) make
    is worth compressing, from the same samples whether it comes whole or in pieces."""
    if ends is None:
        ends = list(itertools.accumulate(map(len, pieces)))
    step = total // _PROBE_SLICES
    sample = bytearray()
    for i in range(_PROBE_SLICES):
        pos = i * step
        end = min(pos + _PROBE_SLICE_BYTES, total)
        j = bisect.bisect_right(ends, pos)  # the piece that holds byte ``pos``
        while pos < end:
            piece = pieces[j]
            at = ends[j] - len(piece)
            got = memoryview(piece)[pos - at : min(end - at, len(piece))]
            sample += got
            pos += len(got)
            j += 1
    return len(zlib.compress(sample, GZIP_LEVEL)) < _WORTH_IT * len(sample)


def compress_body(pieces: list[bytes], compression: str) -> tuple[bytes, str | None]:
    """:func:`compress` of the body that ``pieces`` make, whole: deflate reads the pieces in
    turn, so nothing but the compressed output is copied (the GIL is let go of while it reads;
    an uncompressed body is joined)."""
    out, content_encoding = compress_pieces(pieces, compression)
    return (out[0] if len(out) == 1 else b"".join(out)), content_encoding


def compress(body: bytes, compression: str) -> tuple[bytes, str | None]:
    """Compress a request body; returns it with the Content-Encoding to send (None: as is).

    ``"zstd"`` needs the optional ``zstandard`` package; without it the body is gzipped and the
    returned encoding says ``"gzip"``. A body of a megabyte or more that samples say will not
    shrink by 40% is sent uncompressed: gzip would spend 70-80 ms of CPU on 2.5 MB of base64
    here to save a quarter of it, and the large allocations it makes are what stalls the
    application's loop (docs/performance.md).
    """
    if compression == "none":
        return body, None
    if len(body) >= PROBE_FROM_BYTES and not _worth_compressing((body,), len(body)):
        return body, None
    return _compressed(body, compression)


def compress_pieces(pieces: list[bytes], compression: str) -> tuple[list[bytes], str | None]:
    """:func:`compress` for a body in pieces: the same decision, a body that decompresses to
    the same bytes, and the pieces left as they are when it goes out uncompressed."""
    if compression == "none":
        return pieces, None
    if len(pieces) == 1:
        body, encoding = compress(pieces[0], compression)
        return [body], encoding
    ends = list(itertools.accumulate(map(len, pieces)))
    total = ends[-1] if ends else 0
    if total >= PROBE_FROM_BYTES and not _worth_compressing(pieces, total, ends):
        return pieces, None
    return [_streamed(pieces, ends, compression)], _encoding(compression)


def _compressed(body: bytes, compression: str) -> tuple[bytes, str]:
    if compression == "zstd":
        zstd = _zstd()
        if zstd is not None:
            return zstd.ZstdCompressor(level=ZSTD_LEVEL).compress(body), "zstd"
    c = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31)
    return c.compress(body) + c.flush(), "gzip"


def _encoding(compression: str) -> str:
    return "zstd" if compression == "zstd" and _zstd() is not None else "gzip"


def _streamed(pieces: Sequence[bytes], ends: list[int], compression: str) -> bytes:
    c: Any
    if _encoding(compression) == "zstd":
        c = _zstd().ZstdCompressor(level=ZSTD_LEVEL).compressobj()
    else:
        c = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31)
    out = [c.compress(run) for run in _runs(pieces, ends)]
    out.append(c.flush())
    return b"".join(out)


# Small pieces are fed to the compressor joined in runs of about this size: one call per
# span's framing and body cost 2 us a span on a batch of small spans. A run's copy holds the
# GIL for tens of microseconds; the compression that follows lets it go.
_RUN_BYTES = 256 * 1024


def _runs(pieces: Sequence[bytes], ends: list[int]) -> Iterator[bytes]:
    """``pieces`` joined in runs of about ``_RUN_BYTES`` (the piece that crosses the mark
    ends its run), found by bisection: no Python step per piece."""
    start, n = 0, len(pieces)
    while start < n:
        base = ends[start - 1] if start else 0
        stop = min(bisect.bisect_left(ends, base + _RUN_BYTES, start) + 1, n)
        yield pieces[start] if stop == start + 1 else b"".join(pieces[start:stop])
        start = stop
