"""The OTLP/HTTP exporter: each span encoded once (large ones in a worker process), each batch
one request, compressed, over a :class:`~looptrace._transport.Transport`.

    encode:  SpanEncoder.plan -> SpanEncoder.encode / .steps      (bytes; the common case)
                              -> Offloader.submit                 (bytes, from a worker)
    export:  OtlpHttpExporter.request(chunks)  -> body, headers   (pieces, compressed)
             Transport.send(body, headers)     -> outcome_of(response)

A large span encoded by a worker comes back as bytes and travels like any other, in a shared
request over this process's transport: a worker that sent the span itself, with an HTTP client
of its own, saved this process some CPU but none of the loop's lag (docs/performance.md).
"""

from __future__ import annotations

import asyncio
import functools
import sys
from collections.abc import Awaitable, Callable, Sequence, Sized
from typing import TYPE_CHECKING

from .. import _errors, _otlp, _serialize
from .._otlp.span_encoder import HOOKED, LARGE, OFFLOAD, SpanEncoder
from .._transport import (
    HttpTransport,
    Response,
    RetryPolicy,
    Transport,
    in_background,
    parse_retry_after,
)
from .._transport.settings import HttpSettings, wire_compression
from .exporter import SENT, Outcome, Slices, Verdict
from .stats import OffloadStatistics

if TYPE_CHECKING:
    from .._capture.spans import Span
    from .._config import Config
    from .._offload.parent import Offloader

__all__ = ["OtlpHttpExporter", "outcome_of"]

# Request bodies above this are put together, and compressed, in a worker thread: zlib and
# zstd release the GIL, and joining a batch of a few megabytes takes milliseconds.
BODY_IN_THREAD_BYTES = 64 * 1024


class OtlpHttpExporter:
    """OTLP over HTTP to ``cfg.endpoint``; ``transport_factory`` replaces the HTTP transport
    (one transport per flusher loop)."""

    def __init__(
        self, cfg: Config, transport_factory: Callable[[], Transport] | None = None
    ) -> None:
        self.cfg = cfg
        self._transport_factory = transport_factory or self._http_transport
        self._offloader: Offloader | None = None
        self.compression = wire_compression(cfg.compression, HttpSettings.from_config(cfg).loopback)
        self.content_type = _otlp.content_type(cfg.encoding)
        # Made by load(): the resource reads the environment, the encoder builds the policy.
        self.resource: _otlp.Resource | None = None
        self.span_encoder: SpanEncoder | None = None

    def __repr__(self) -> str:
        return f"OtlpHttpExporter({self.cfg.endpoint!r})"

    def _http_transport(self) -> Transport:
        return HttpTransport(HttpSettings.from_config(self.cfg))

    # ------------------------------------------------------------------ the codec
    def loaded_cheaply(self) -> bool:
        # configure() built the policy (see _export.prepare_ahead); the offloader's module
        # is imported there too when offload is on.
        if self.cfg.offload and "looptrace._offload.parent" not in sys.modules:
            return False
        return _serialize.has_policy(self.cfg)

    def load(self) -> None:
        cfg = self.cfg
        self.resource = _otlp.default_resource(cfg)
        self.span_encoder = SpanEncoder(cfg)
        if cfg.offload:
            # Started at the first large span; at interpreter exit, when no thread can start
            # it, large spans are serialized inline.
            from .._offload.parent import Offloader

            self._offloader = Offloader()

    def estimate(self, span: Span) -> int:
        return _serialize.estimate_size(span)

    async def encode(self, spans: Sequence[Span]) -> list[Sized | None]:
        """Encode each span, or hand it to a worker, in ~0.5 ms slices."""
        chunks, rest = await self.encode_begun(spans)
        if rest is not None:
            await rest()
        return chunks

    async def encode_begun(
        self, spans: Sequence[Span]
    ) -> tuple[list[Sized | None], Callable[[], Awaitable[None]] | None]:
        """:meth:`encode` in two steps: this one encodes the spans it can here (in slices)
        and hands the large ones to a worker; the second, returned when there is one, waits
        for the worker's chunks and puts them in the same list. The flusher takes its next
        batch between the two, so that a worker encodes one large span while the previous one
        is sent."""
        encoder = self._encoder()
        offloader = self._offloader
        chunks: list[Sized | None] = [None] * len(spans)
        offloaded: list[tuple[int, Span, asyncio.Future[bytes]]] = []
        slices = Slices()
        try:
            for i, span in enumerate(spans):
                try:
                    flags = encoder.plan(span)
                    if flags & OFFLOAD and offloader is not None and offloader.has_room():
                        await self._ready_to_offload(offloader, slices)
                        # The hooks run here, inside the time slice, so a drain of many large
                        # spans yields between them; the handoff (pickling) is a step of its own,
                        # started now, so that the worker begins while the rest is encoded.
                        handoff = offloader.submit(span, self.cfg, self.cfg.encoding)
                        offloaded.append((i, span, asyncio.ensure_future(handoff)))
                    elif flags & (LARGE | HOOKED | OFFLOAD):
                        # Many containers, a hook's value (which the walk has not seen), or
                        # large strings no worker takes (offload off, or each worker already
                        # has spans queued: one more would wait behind them, and so would its
                        # delivery): orjson's pass, the key scan, the masking and the
                        # encoding are steps of their own when the JSON is long, each judged
                        # against the slice like a span.
                        if flags & OFFLOAD and offloader is not None:
                            offloader.stats["workers_busy"] += 1
                        chunks[i] = await slices.run(encoder.steps(span, flags))
                    else:
                        chunks[i] = encoder.encode(span, flags)
                except Exception as exc:
                    _errors.report_internal("pipeline.encode", exc)
                if slices.due():
                    await slices.pause()
        except BaseException:
            # Cancelled mid-drain (the loop is ending): the spans go back to the buffer, and
            # the handoffs already started are dropped with them.
            for _, _, future in offloaded:
                future.cancel()
            raise
        if not offloaded:
            return chunks, None
        return chunks, functools.partial(self._collect, offloaded, chunks)

    def _encoder(self) -> SpanEncoder:
        encoder = self.span_encoder
        assert encoder is not None, "load() first"
        return encoder

    @staticmethod
    async def _ready_to_offload(offloader: Offloader, slices: Slices) -> None:
        """Start the pool before the first handoff, so that every handoff of this drain
        happens inside a time slice, not all at once after it."""
        from .._offload.parent import STARTABLE

        if offloader.state in STARTABLE:
            await offloader.ready()
            slices.restart()

    async def _collect(
        self,
        offloaded: list[tuple[int, Span, asyncio.Future[bytes]]],
        chunks: list[Sized | None],
    ) -> None:
        """The workers' bytes into ``chunks``, each under its span's scope."""
        encoder = self._encoder()
        try:
            results = await asyncio.gather(*(f for _, _, f in offloaded), return_exceptions=True)
        except asyncio.CancelledError:
            for _, _, future in offloaded:
                future.cancel()
            raise
        for (i, span, _), result in zip(offloaded, results, strict=True):
            if isinstance(result, bytes):
                chunks[i] = encoder.with_scope(result, span)
            elif isinstance(result, BaseException):
                _errors.report_internal("pipeline.offload", result)

    def encode_open(self, span: Span) -> Sized:
        return self._encoder().encode(span, 0)

    # ------------------------------------------------------------------ requests
    def request_pieces(self, chunks: Sequence[Sized]) -> list[bytes]:
        """One ExportTraceServiceRequest of ``chunks`` (encoded spans), in pieces: joined by
        the compressor, not copied here."""
        assert self.resource is not None, "load() first"
        return _otlp.encode_request_pieces(chunks, self.resource, self.cfg.encoding)  # type: ignore[arg-type]

    def compress(self, pieces: list[bytes]) -> tuple[bytes, str | None]:
        """The request body and its Content-Encoding (None: sent as it is)."""
        return _otlp.compress_body(pieces, self.compression)

    async def request(self, chunks: Sequence[Sized]) -> tuple[bytes, dict[str, str]]:
        """The body and headers of the request that sends ``chunks``."""
        pieces = self.request_pieces(chunks)
        if sum(map(len, pieces)) > BODY_IN_THREAD_BYTES:
            # Uncompressed bodies too: joined here, batches of 165 KB structures held the loop
            # for 4-5 ms each.
            body, content_encoding = await in_background(self.compress, pieces)
        elif self.compression != "none":
            body, content_encoding = self.compress([b"".join(pieces)])
        else:
            body, content_encoding = b"".join(pieces), None
        headers = {"Content-Type": self.content_type}
        if content_encoding:
            headers["Content-Encoding"] = content_encoding
        return body, headers

    def session(self) -> _Session:
        return _Session(self)

    def offload_statistics(self) -> OffloadStatistics:
        offloader = self._offloader
        if offloader is None:
            return OffloadStatistics()
        from .._offload.parent import FALLBACKS

        stats = offloader.stats
        return OffloadStatistics(
            offloaded=stats["offloaded"],
            fallbacks={reason: stats[reason] for reason in FALLBACKS},
            workers_alive=offloader.workers_alive(),
        )

    def shutdown(self) -> None:
        offloader, self._offloader = self._offloader, None
        if offloader is not None:
            offloader.shutdown(wait=False)


class _Session:
    """The exporter on one flusher's loop: its own transport, made on first use."""

    def __init__(self, exporter: OtlpHttpExporter) -> None:
        self._exporter = exporter
        self._transport: Transport | None = None

    async def export(self, chunks: Sequence[Sized]) -> Outcome:
        body, headers = await self._exporter.request(chunks)
        if self._transport is None:
            self._transport = self._exporter._transport_factory()
        try:
            response = await self._transport.send(body, headers)
        except (OSError, asyncio.TimeoutError) as exc:
            return Outcome(Verdict.RETRY, _describe(exc))
        except RuntimeError as exc:
            # At interpreter exit an executor refuses new work ("cannot schedule new futures
            # after interpreter shutdown"): a request that could not go, not a bug to report.
            return Outcome(Verdict.RETRY, f"no request could be made at exit ({exc})")
        return outcome_of(response)

    async def aclose(self) -> None:
        transport, self._transport = self._transport, None
        if transport is not None:
            await transport.aclose()


def outcome_of(response: Response) -> Outcome:
    """An HTTP answer in the flusher's terms (the OTLP/HTTP spec's retryable statuses)."""
    status = response.status
    verdict = RetryPolicy.classify(status)
    if verdict == "ok":
        return SENT
    error = f"HTTP {status}"
    if verdict == "retry":
        return Outcome(
            Verdict.RETRY, error, retry_after=parse_retry_after(_header(response, "retry-after"))
        )
    detail = bytes(response.body[:200]).decode("utf-8", "replace")
    return Outcome(Verdict.TOO_LARGE if verdict == "split" else Verdict.REJECTED, error, detail)


def _header(response: Response, name: str) -> str | None:
    headers = response.headers
    value = headers.get(name)
    if value is not None:
        return value
    for key, value in headers.items():
        if key.lower() == name:
            return value
    return None


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
