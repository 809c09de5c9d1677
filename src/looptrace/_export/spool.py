"""The spool: OTLP request bodies that could not be delivered, kept on disk until a looptrace
process delivers them to the same endpoint (any process: this one later, or the next). The
folder and its files are :mod:`.spool_dir`'s; sending them, :mod:`.replay`'s.

Files are written whole and claimed by renaming, so processes share a folder (the layout
and the file format are in :mod:`.spool_dir`'s docstring). Delivery is at least once: a
process that dies between the backend's answer and the file's removal leaves the file for
another process to send again.

Where spans come from (the pipeline's hooks, see ``docs/pipeline.md``): a batch given up at
shutdown or past the retry budget (:meth:`Spool.store`); the pending spans over half the
buffer's budget during an outage, all of them once shutting down or in durable mode
(:meth:`Spool.relieve`); what is still held when shutdown ends (:meth:`Spool.close`); and, in
durable mode, every batch before it is sent (:meth:`Spool.before_send`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sized
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import _errors
from .._transport import off_loop
from .batch import Batch, part
from .exporter import Outcome, Verdict
from .homes import PrivateLoop, running_asyncio_loop
from .replay import Replayer, send_folder
from .spool_dir import SpoolDir, folder_for, summaries
from .stats import DropLog

if TYPE_CHECKING:
    from .._config import Config
    from .flusher import Flusher
    from .otlp_http import OtlpHttpExporter

__all__ = ["Spool", "chunk_bytes", "folder_for", "send_folder", "summaries"]

logger = logging.getLogger("looptrace")

# What the spool does while an outage lasts: spill the oldest pending spans once the buffer
# holds more than this share of its budget.
SPILL_AT = 0.5


def chunk_bytes(chunk: Sized) -> bytes:
    """A chunk as the bytes of one span: a large span a worker would have sent (a prepared
    job) is encoded here."""
    if isinstance(chunk, bytes):
        return chunk
    prepared: Any = getattr(chunk, "prepared", None)
    if prepared is None:
        raise TypeError(f"cannot spool a {type(chunk).__name__}")
    from .. import _otlp, _serialize

    wire, inputs, output, pol, max_span = prepared
    encoding: str = getattr(chunk, "encoding", "protobuf")
    return _otlp.encode_span(_serialize.finish(wire, inputs, output, pol, max_span), encoding)


class Spool:
    """A pipeline's spool: where its spans go instead of being dropped, and the thread
    (``looptrace-spool``) that sends what the folder holds."""

    def __init__(self, cfg: Config, exporter: OtlpHttpExporter, flusher: Flusher) -> None:
        assert cfg.endpoint is not None
        self.cfg = cfg
        self.exporter = exporter
        self.flusher = flusher
        self.durable = cfg.spool_durable
        self._drops = DropLog()
        self.dir = SpoolDir(
            cfg.spool_path,
            cfg.endpoint,
            cfg.spool_max_bytes,
            cfg.spool_max_age_hours * 3600.0,
            self._drops.dropped,
        )
        self.replayed = 0
        self._writes = 0  # writes in progress in other threads
        self._cond = threading.Condition()
        self._failed_write = False
        self._replayer: Replayer | None = None
        self._closed = False
        self._close_lock = threading.Lock()

    @property
    def where(self) -> str:
        return str(self.dir.path)

    # ------------------------------------------------------------------ writing
    def write(self, batch: Batch) -> bool:
        """Blocking: ``batch`` (encoded) is in the spool when this returns True. A durable
        batch's own file is given back (ready) rather than written again."""
        if batch.file is not None:
            file, batch.file = batch.file, None
            self.dir.unclaim(file)
            return True
        return self._write(batch, claimed=False) is not None

    def _write(self, batch: Batch, claimed: bool) -> Path | None:
        try:
            pieces = self.exporter.request_pieces([chunk_bytes(c) for c in batch.chunks])
            path = self.dir.write(pieces, self.cfg.encoding, batch.span_count, claimed)
        except Exception as exc:
            if not self._failed_write:
                self._failed_write = True
                logger.warning(
                    "looptrace: cannot write the spool at %s (%s: %s); spans that cannot be "
                    "sent are dropped and counted instead",
                    self.dir.path,
                    type(exc).__name__,
                    exc,
                )
            return None
        if path is None and not self._failed_write:
            self._failed_write = True
            logger.warning(
                "looptrace: a batch of %d bytes is over LOOPTRACE_SPOOL_MAX_BYTES; it is "
                "dropped and counted",
                batch.nbytes,
            )
        return path

    def _resolve(self, batch: Batch, ok: bool, reason: str) -> None:
        if ok:
            self.flusher.buffer.spooled(batch)
            self.flusher.notify()
        else:
            self.flusher.buffer.drop(batch, reason)

    def store(self, batch: Batch, reason: str) -> bool:
        """The flusher gives ``batch`` up (``reason``): True when it goes to the spool instead
        (written in a thread; it stays in flight until then)."""
        if self._closed or reason not in ("shutdown", "retries_exhausted") or not batch.span_count:
            return False

        def work() -> None:
            try:
                self._resolve(batch, self.write(batch), reason)
            finally:
                with self._cond:
                    self._writes -= 1
                    self._cond.notify_all()

        with self._cond:
            self._writes += 1
        loop = running_asyncio_loop()
        if loop is None or isinstance(loop, PrivateLoop):
            work()  # looptrace's own thread: blocking it holds up no one
            return True
        try:
            loop.run_in_executor(None, work)
        except RuntimeError:
            work()
        return True

    async def relieve(self, saturated: bool = False) -> None:
        """At each drain: while the backend fails, spill the oldest pending spans, down to
        half the buffer's budget; all of them when shutting down or in durable mode. With
        ``saturated`` (every request slot taken: a backend that answers, but slower than
        spans come) the same spill down to half the budget, so that what the buffer's budget
        cannot hold goes here rather than being dropped."""
        if self._replayer is None and not self._closed:
            self._replayer = Replayer(self)
            self._replayer.start()
        flusher = self.flusher
        if not flusher.health.failing and not saturated:
            return
        closing = flusher.health.failing and not flusher.lifecycle.running
        if closing:
            flusher.health.closing()  # the rest gives up at once: it goes here
        everything = closing or (self.durable and flusher.health.failing)
        buffer, cfg = flusher.buffer, self.cfg
        while buffer.has_pending() and (
            everything
            or buffer.queued_spans > cfg.max_buffer_spans * SPILL_AT
            or buffer.queued_bytes > cfg.max_buffer_bytes * SPILL_AT
        ):
            batch = buffer.take_retry() or buffer.take(cfg.max_batch_spans, cfg.max_batch_bytes)
            if batch is None:
                break
            parts = [batch]
            if batch.spans is not None:
                try:
                    parts = await flusher.encode(batch)
                except BaseException:
                    buffer.returned(batch)
                    raise
            failed = False
            for piece in parts:
                if not failed and await off_loop(self.write, piece):
                    self._resolve(piece, True, "")
                else:
                    # Not written (said once): it stays in memory, under the buffer's bounds.
                    failed = True
                    buffer.returned(piece)
            if failed:
                return

    # ------------------------------------------------------------------ durable mode
    async def before_send(self, batch: Batch) -> None:
        """Durable mode: the batch is on disk (claimed by this process) before it is sent."""
        if self.durable and batch.file is None and batch.span_count and not self._closed:
            path = await off_loop(self._write, batch, True)
            batch.file = str(path) if path is not None else None

    async def settled(self, batch: Batch, outcome: Outcome) -> None:
        """Durable mode: a batch the backend kept (or refused for good) leaves the disk."""
        if batch.file is not None and outcome.verdict is not Verdict.RETRY:
            file, batch.file = batch.file, None
            await off_loop(self.dir.remove, file)

    # ------------------------------------------------------------------ shutdown
    def close(self) -> None:
        """Shutdown ends: what is still held goes to the spool (raw spans encoded here), and
        the replayer stops; its claim, if any, is given back."""
        self._closed = True
        replayer, self._replayer = self._replayer, None
        if replayer is not None:
            loop = running_asyncio_loop()
            # Waited for on looptrace's own threads only: an application's loop never blocks.
            replayer.stop(wait=loop is None or isinstance(loop, PrivateLoop))
        with self._cond:
            self._cond.wait_for(lambda: self._writes == 0, 5.0)
        # The last flusher to stop and the caller of shutdown may both get here: one spills.
        with self._close_lock:
            try:
                self._spill_rest()
            except Exception as exc:  # what is left is dropped and counted by the caller
                _errors.report_internal("spool.close", exc)

    def _spill_rest(self) -> None:
        buffer = self.flusher.buffer
        spans, batches = buffer.take_everything()
        raw = [b for b in batches if b.spans is not None]
        for batch in raw:  # taken by a drain that did not get to encode it
            spans.extend(batch.spans or [])
            buffer.replace(batch, [])
        encoded = [b for b in batches if b.spans is None]
        if spans:
            if not self.flusher.codec_loaded:
                self.exporter.load()
            chunks = _run(self.exporter.encode(spans))
            kept = [c for c in chunks if c is not None]
            if len(kept) < len(chunks):
                buffer.count_drop("rejected", len(chunks) - len(kept))
            step = self.cfg.max_batch_spans
            for i in range(0, len(kept), step):
                piece = part(0, len(kept[i : i + step]), kept[i : i + step], 0)
                buffer.track(piece)
                encoded.append(piece)
        for batch in encoded:
            if batch.span_count:
                self._resolve(batch, self.write(batch), "shutdown")

    # ------------------------------------------------------------------ reading
    def dropped(self) -> dict[str, int]:
        with self.dir._lock:
            return dict(self.dir.dropped)


def _run(coro: Any) -> Any:
    """Run ``coro`` to completion from synchronous code: on a new loop in this thread, or in
    a thread of its own when this thread runs a loop."""
    if running_asyncio_loop() is None:
        loop = asyncio.new_event_loop()
        try:
            return loop.run_until_complete(coro)
        finally:
            loop.close()
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(_run(coro)), name="looptrace-spool")
    thread.start()
    thread.join()
    return result[0]
