"""Sending what a spool folder holds: the :class:`Replayer` thread of a pipeline's spool, and
``looptrace spool send`` (:func:`send_folder`). A file is claimed, read back, sent as it was
meant to go, and removed once the backend kept it (or refused it for good); a retryable answer
gives it back for later. Delivery is at least once: a process that dies between the backend's
answer and the file's removal leaves the file for another process to send again.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from .. import _errors
from .exporter import Outcome, Verdict
from .homes import PrivateLoop, wait_event
from .spool_dir import Corrupt, Record, SpoolDir, _quiet, read_file

if TYPE_CHECKING:
    from .._config import Config
    from .._transport import Transport
    from .spool import Spool

__all__ = ["IDLE_SECONDS", "Replayer", "send_folder", "send_record"]

logger = logging.getLogger("looptrace")

# The replayer looks for files (other processes' too) this often while it finds none.
IDLE_SECONDS = 2.0


async def send_record(transport: Transport, record: Record, compression: str) -> Outcome:
    """POST a spooled body as it was meant to go; the answer in the flusher's terms."""
    from .._otlp import compress_body, content_type
    from .otlp_http import outcome_of

    body, content_encoding = compress_body([record.body], compression)
    headers = {"Content-Type": content_type(record.encoding)}
    if content_encoding:
        headers["Content-Encoding"] = content_encoding
    try:
        response = await transport.send(body, headers)
    except (OSError, asyncio.TimeoutError) as exc:
        return Outcome(
            Verdict.RETRY, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        )
    except RuntimeError as exc:
        return Outcome(Verdict.RETRY, f"no request could be made ({exc})")
    return outcome_of(response)


class Replayer:
    """Sends what the spool holds, oldest first, on a thread and loop of its own: one request
    at a time, only while this process's own spans are not waiting (its queue under a batch,
    a request slot free), and under the pipeline's backoff (the health it shares)."""

    def __init__(self, spool: Spool) -> None:
        self.spool = spool
        self._stop = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._main, name="looptrace-spool", daemon=True)
        self._transport: Transport | None = None
        self._next_sweep = 0.0
        self._claimed: Path | None = None  # the file being sent

    def start(self) -> None:
        try:
            self._thread.start()
        except RuntimeError:  # interpreter exit: the next process sends the spool
            pass

    def stop(self, wait: bool = True) -> None:
        self._stop.set()
        loop, event = self._loop, self._event
        if loop is not None and event is not None:
            with _quiet(), _suppress_runtime():
                loop.call_soon_threadsafe(event.set)
        if wait and self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(1.0)
        claimed, self._claimed = self._claimed, None
        if claimed is not None:  # still sending: another process sends it again later
            self.spool.dir.unclaim(claimed)

    def _main(self) -> None:
        loop = PrivateLoop()
        self._loop = loop
        try:
            loop.run_until_complete(self._run())
        except Exception as exc:  # pragma: no cover - the thread must never die noisily
            _errors.report_internal("spool.replay", exc)
        finally:
            transport, self._transport = self._transport, None
            if transport is not None:
                with _suppress_runtime():
                    loop.run_until_complete(asyncio.wait_for(transport.aclose(), 1.0))
            loop.close()

    async def _run(self) -> None:
        from .._capture.context import suppress_tracing

        self._event = event = asyncio.Event()
        with suppress_tracing():
            while not self._stop.is_set():
                try:
                    wait = await self._step()
                except Exception as exc:
                    _errors.report_internal("spool.replay", exc)
                    wait = IDLE_SECONDS
                if wait > 0 and not self._stop.is_set():
                    await wait_event(event, wait)
                    event.clear()

    async def _step(self) -> float:
        """Send one file if this is the time; how long to wait before the next step."""
        spool = self.spool
        flusher, cfg, folder = spool.flusher, spool.cfg, spool.dir
        health = flusher.health
        now = time.monotonic()
        if health.retry_at > now:
            return health.retry_at - now
        buffer = flusher.buffer
        if not flusher.lifecycle.running:
            return IDLE_SECONDS
        if (
            buffer.queued_spans > cfg.max_batch_spans
            or buffer.in_flight_batches >= cfg.max_concurrent_requests
            or (health.failing and buffer.in_flight_batches)
        ):
            return cfg.flush_interval  # this process's own spans go first
        if now >= self._next_sweep:
            self._next_sweep = now + 60.0
            folder.sweep()
        claimed = self._claimed = folder.claim_oldest()
        if claimed is None:
            return IDLE_SECONDS
        try:
            return await self._send(claimed)
        finally:
            self._claimed = None

    async def _send(self, claimed: Path) -> float:
        spool = self.spool
        flusher, cfg, folder = spool.flusher, spool.cfg, spool.dir
        health = flusher.health
        try:
            record = read_file(claimed)
        except Corrupt as exc:
            folder.set_aside(claimed, str(exc))
            return 0.0
        except OSError:
            folder.unclaim(claimed)
            return IDLE_SECONDS
        if record.endpoint != cfg.endpoint:  # two URLs, one key: not ours to send
            folder.unclaim(claimed)
            return IDLE_SECONDS
        if self._transport is None:
            self._transport = spool.exporter._transport_factory()
        outcome = await send_record(self._transport, record, spool.exporter.compression)
        if outcome.verdict is Verdict.SENT:
            folder.remove(claimed)
            spool.replayed += record.spans
            health.sent()
            return 0.0
        if outcome.verdict is Verdict.RETRY:
            folder.unclaim(claimed)
            health.failed(outcome.describe(), outcome.retry_after, time.monotonic())
            return 0.0
        folder.remove(claimed)
        if health.rejected(outcome):
            logger.warning(
                "looptrace: %s rejected a spooled request with %s (%s); it is dropped",
                health.where,
                outcome.error,
                outcome.detail or "no detail",
            )
        folder._count("rejected", record.spans)
        return 0.0


class _suppress_runtime:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: object, tb: object) -> bool:
        return isinstance(exc, (RuntimeError, asyncio.TimeoutError))


async def send_folder(
    folder: SpoolDir, cfg: Config, progress: Callable[[int, int, int], None]
) -> tuple[int, int, str | None]:
    """Send every ready file of ``folder`` now, oldest first, one request at a time, with the
    settings of ``cfg`` (headers, TLS, compression); stop at the first failure. Returns the
    files and spans sent and the error that stopped it, if any; ``progress(files, spans,
    total files)`` after each file."""
    from .._transport import HttpTransport
    from .._transport.settings import HttpSettings, wire_compression

    folder.sweep()
    total = len(folder.entries()[0])
    settings = HttpSettings.from_config(cfg)
    compression = wire_compression(cfg.compression, settings.loopback)
    transport = HttpTransport(settings)
    files = spans = 0
    try:
        while True:
            claimed = folder.claim_oldest()
            if claimed is None:
                return files, spans, None
            try:
                record = read_file(claimed)
            except Corrupt as exc:
                folder.set_aside(claimed, str(exc))
                continue
            outcome = await send_record(transport, record, compression)
            if outcome.verdict is Verdict.RETRY:
                folder.unclaim(claimed)
                return files, spans, outcome.describe()
            folder.remove(claimed)
            if outcome.verdict is Verdict.SENT:
                files += 1
                spans += record.spans
            else:
                folder._count("rejected", record.spans)
                logger.warning(
                    "looptrace: %s rejected a spooled request with %s; it is dropped",
                    cfg.endpoint,
                    outcome.describe(),
                )
            progress(files, spans, total)
    finally:
        await transport.aclose()
