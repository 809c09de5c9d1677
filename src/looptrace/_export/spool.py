"""The spool: OTLP request bodies that could not be delivered, kept on disk until a looptrace
process delivers them to the same endpoint (any process: this one later, or the next).

    <spool folder>/<endpoint key>/               one folder per endpoint (sha256 of its URL)
        00001764190000000000000-4242-000001-512.otlp    ready: created (ns), pid, counter, spans
        <ready name>.4243.claim                  claimed by process 4243 (sending it now, or a
                                                 durable batch still in flight there)
        .tmp-4242-000002                         being written
        corrupt/                                 files that did not read back, set aside

A file is ``b"LTSPOOL"``, a version byte, the length of a JSON header (4 bytes, big-endian),
the header (endpoint, encoding, spans, CRC32 and length of the body, creation time) and the
body: one OTLP request, uncompressed. It is written under a temporary name in the same folder,
fsynced, and renamed: a reader sees a whole file or none. Names sort oldest first. Processes
share a folder by renaming: a claim is an atomic rename to a name that carries the claimer's
pid, so two processes never send one file at once; a claim whose process is gone (or, where
processes cannot be asked, an hour old) is claimed again. Delivery is at least once: a
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
import hashlib
import itertools
import logging
import os
import struct
import sys
import threading
import time
import zlib
from collections.abc import Callable, Sequence, Sized
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import orjson

from .. import _errors
from .._transport import off_loop
from .buffer import Batch, part
from .exporter import Outcome, Verdict
from .homes import PrivateLoop, running_asyncio_loop, wait_event
from .stats import DropLog

if TYPE_CHECKING:
    from .._config import Config
    from .._transport import Transport
    from .otlp_http import OtlpHttpExporter
    from .pipeline import Pipeline

__all__ = ["SPOOL_DROP_REASONS", "Corrupt", "Entry", "Record", "Spool", "SpoolDir", "endpoint_key"]

logger = logging.getLogger("looptrace")

MAGIC = b"LTSPOOL"
VERSION = 1
_PREFIX = struct.Struct(">7sBI")
READY = ".otlp"
CLAIM = ".claim"
TEMP = ".tmp-"
CORRUPT = "corrupt"
SPOOL_DROP_REASONS = ("spool_full", "spool_expired", "corrupt", "rejected")
# A claim older than this is taken over even when its process cannot be asked whether it lives
# (Windows) or its pid may have been reused.
CLAIM_STALE_SECONDS = 3600.0
# A temporary file this old belongs to a writer that died mid-write (when its pid is gone).
TEMP_STALE_SECONDS = 60.0
# The replayer looks for files (other processes' too) this often while it finds none.
IDLE_SECONDS = 2.0
# What the spool does while an outage lasts: spill the oldest pending spans once the buffer
# holds more than this share of its budget.
SPILL_AT = 0.5


def endpoint_key(endpoint: str) -> str:
    """The name of an endpoint's folder: the URL itself may not be a valid file name."""
    return hashlib.sha256(endpoint.encode()).hexdigest()[:16]


class Corrupt(Exception):
    """A spool file that does not read back (cut short, bad header, wrong checksum)."""


class Record(NamedTuple):
    endpoint: str
    encoding: str
    spans: int
    created_ns: int
    body: bytes


class Entry(NamedTuple):
    """A file in an endpoint's folder, as its name and size describe it."""

    path: Path
    created_ns: int
    pid: int
    spans: int
    size: int
    claimer: int | None  # the pid that claimed it, if claimed


def parse_name(name: str) -> tuple[int, int, int] | None:
    """(created ns, pid, spans) from a ready file's name, or None."""
    if not name.endswith(READY):
        return None
    fields = name[: -len(READY)].split("-")
    if len(fields) != 4 or not all(f.isdigit() for f in fields):
        return None
    return int(fields[0]), int(fields[1]), int(fields[3])


def read_file(path: Path) -> Record:
    """The record in ``path``; :class:`Corrupt` when it does not read back whole."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < _PREFIX.size:
        raise Corrupt("cut short")
    magic, version, head_len = _PREFIX.unpack_from(data)
    if magic != MAGIC:
        raise Corrupt("not a looptrace spool file")
    if version != VERSION:
        raise Corrupt(f"version {version}, this looptrace reads {VERSION}")
    start = _PREFIX.size + head_len
    try:
        head = orjson.loads(data[_PREFIX.size : start])
        body = data[start:]
        if len(body) != head["bytes"]:
            raise Corrupt(f"body of {len(body)} bytes, the header says {head['bytes']}")
        if zlib.crc32(body) != head["crc32"]:
            raise Corrupt("checksum mismatch")
        return Record(
            str(head["endpoint"]),
            str(head["encoding"]),
            int(head["spans"]),
            int(head["created_ns"]),
            body,
        )
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise Corrupt(f"bad header ({type(exc).__name__})") from None


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    if sys.platform == "win32":
        # os.kill there terminates the process: never ask. The claim's age decides instead.
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's process: alive
    return True


class SpoolDir:
    """One endpoint's folder. Blocking file operations (call them off the event loop), safe
    against other processes doing the same in the same folder."""

    def __init__(
        self,
        root: Path,
        endpoint: str,
        max_bytes: int = 256 * 1024 * 1024,
        max_age: float = 72 * 3600.0,
        on_drop: Callable[[str, int], None] | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.path = root / endpoint_key(endpoint)
        self.max_bytes = max_bytes
        self.max_age = max_age
        self._on_drop = on_drop
        self._counter = itertools.count(1)
        self._lock = threading.Lock()
        self._held: set[str] = set()  # names of the claims this process holds
        self.dropped: dict[str, int] = dict.fromkeys(SPOOL_DROP_REASONS, 0)

    def _count(self, reason: str, spans: int) -> None:
        with self._lock:
            self.dropped[reason] += spans
        if spans and self._on_drop is not None:
            self._on_drop(reason, spans)

    # -- writing --
    def write(
        self, pieces: Sequence[bytes], encoding: str, spans: int, claimed: bool = False
    ) -> Path | None:
        """Write one request body (in pieces) atomically; None when it alone is over the
        folder's bound. With ``claimed`` the file is this process's (a durable batch in
        flight) until :meth:`unclaim`. Raises OSError."""
        body_len = sum(map(len, pieces))
        crc = 0
        for piece in pieces:
            crc = zlib.crc32(piece, crc)
        created = time.time_ns()
        head = orjson.dumps(
            {
                "endpoint": self.endpoint,
                "encoding": encoding,
                "spans": spans,
                "crc32": crc,
                "bytes": body_len,
                "created_ns": created,
            }
        )
        size = _PREFIX.size + len(head) + body_len
        if size > self.max_bytes:
            return None
        self.path.mkdir(parents=True, exist_ok=True)
        self._make_room(size)
        pid = os.getpid()
        n = next(self._counter)
        tmp = self.path / f"{TEMP}{pid}-{n:06d}"
        name = f"{created:023d}-{pid}-{n:06d}-{spans}{READY}"
        if claimed:
            name += f".{pid}{CLAIM}"
        try:
            with open(tmp, "wb") as f:
                f.write(_PREFIX.pack(MAGIC, VERSION, len(head)) + head)
                for piece in pieces:
                    f.write(piece)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path / name)
        except BaseException:
            with _quiet():
                os.unlink(tmp)
            raise
        if claimed:
            with self._lock:
                self._held.add(name)
        return self.path / name

    # -- reading the folder --
    def entries(self) -> tuple[list[Entry], list[Entry], list[Path]]:
        """Ready files (oldest first), claimed files, temporary files."""
        ready: list[Entry] = []
        claims: list[Entry] = []
        temps: list[Path] = []
        try:
            listing = list(os.scandir(self.path))
        except FileNotFoundError:
            return ready, claims, temps
        for item in listing:
            name = item.name
            if name.startswith(TEMP):
                temps.append(Path(item.path))
                continue
            claimer = None
            base = name
            if name.endswith(CLAIM):
                base, _, pid = name[: -len(CLAIM)].rpartition(".")
                if not pid.isdigit():
                    continue
                claimer = int(pid)
            parsed = parse_name(base)
            if parsed is None:
                continue
            try:
                size = item.stat().st_size
            except FileNotFoundError:
                continue  # claimed or removed by another process meanwhile
            entry = Entry(Path(item.path), parsed[0], parsed[1], parsed[2], size, claimer)
            (claims if claimer is not None else ready).append(entry)
        ready.sort(key=lambda e: e.path.name)
        claims.sort(key=lambda e: e.path.name)
        return ready, claims, temps

    def _make_room(self, incoming: int) -> None:
        ready, claims, _ = self.entries()
        self._expire(ready)
        total = sum(e.size for e in ready) + sum(e.size for e in claims)
        for entry in list(ready):
            if total + incoming <= self.max_bytes:
                break
            if self._remove_entry(entry):
                self._count("spool_full", entry.spans)
            total -= entry.size
            ready.remove(entry)

    def _expire(self, ready: list[Entry]) -> None:
        oldest = time.time_ns() - int(self.max_age * 1e9)
        for entry in list(ready):
            if entry.created_ns >= oldest:
                break
            if self._remove_entry(entry):
                self._count("spool_expired", entry.spans)
            ready.remove(entry)

    def _remove_entry(self, entry: Entry) -> bool:
        try:
            os.unlink(entry.path)
        except FileNotFoundError:
            return False  # another process claimed or removed it first
        return True

    def sweep(self) -> None:
        """Apply the age bound; give back claims whose process is gone; set aside files
        their writer left half-written."""
        ready, claims, temps = self.entries()
        self._expire(ready)
        now = time.time()
        for entry in claims:
            claimer = entry.claimer
            assert claimer is not None
            with self._lock:
                held = entry.path.name in self._held
            if held:
                continue
            try:
                age = now - entry.path.stat().st_mtime
            except FileNotFoundError:
                continue
            # Our own pid on a claim we do not hold: a process before us had it (a container
            # restarted with the same pid).
            if claimer == os.getpid() or not _alive(claimer) or age > CLAIM_STALE_SECONDS:
                self.unclaim(entry.path)
        for path in temps:
            pid = path.name[len(TEMP) :].split("-")[0]
            try:
                age = now - path.stat().st_mtime
            except FileNotFoundError:
                continue
            if age > TEMP_STALE_SECONDS and (not pid.isdigit() or not _alive(int(pid))):
                self.set_aside(path, "half-written (its writer stopped mid-write)")

    # -- claiming --
    def claim_oldest(self) -> Path | None:
        """Claim the oldest ready file for this process; None when there is none."""
        ready, _, _ = self.entries()
        pid = os.getpid()
        for entry in ready:
            claimed = entry.path.with_name(f"{entry.path.name}.{pid}{CLAIM}")
            try:
                os.rename(entry.path, claimed)
            except (FileNotFoundError, FileExistsError, PermissionError):
                continue  # another process took it first
            with self._lock:
                self._held.add(claimed.name)
            with _quiet():
                os.utime(claimed)  # the claim's age is its file's mtime
            return claimed
        return None

    def unclaim(self, path: Path | str) -> None:
        """Give a claimed file back (ready for any process)."""
        path = Path(path)
        base = path.name[: -len(CLAIM)].rpartition(".")[0]
        with self._lock:
            self._held.discard(path.name)
        with _quiet():
            os.replace(path, path.with_name(base))

    def remove(self, path: Path | str) -> None:
        path = Path(path)
        with self._lock:
            self._held.discard(path.name)
        with _quiet():
            os.unlink(path)

    def set_aside(self, path: Path, why: str) -> None:
        """Move a file that does not read back to ``corrupt/``, in one line, counted."""
        name = path.name
        base = name[: -len(CLAIM)].rpartition(".")[0] if name.endswith(CLAIM) else name
        parsed = parse_name(base)
        with self._lock:
            self._held.discard(name)
        target = self.path / CORRUPT / name
        try:
            target.parent.mkdir(exist_ok=True)
            os.replace(path, target)
        except OSError:
            with _quiet():
                os.unlink(path)
            target = path
        logger.warning(
            "looptrace: spool file %s is unreadable (%s); set aside in %s", path, why, target.parent
        )
        self._count("corrupt", parsed[2] if parsed else 0)


class _quiet:
    """Ignore a file operation's OSError (another process got there first)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: object, tb: object) -> bool:
        return isinstance(exc, OSError)


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


class Spool:
    """A pipeline's spool: where its spans go instead of being dropped, and the thread
    (``looptrace-spool``) that sends what the folder holds."""

    def __init__(self, cfg: Config, exporter: OtlpHttpExporter, flusher: Pipeline) -> None:
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
            pieces = self.exporter.request_pieces(
                [chunk_bytes(c) for c in batch.chunks], self.exporter.resource, self.cfg.encoding
            )
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
            self.flusher._notify()
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

    async def relieve(self) -> None:
        """At each drain: while the backend fails, spill the oldest pending spans, down to
        half the buffer's budget; all of them when shutting down or in durable mode."""
        if self._replayer is None and not self._closed:
            self._replayer = Replayer(self)
            self._replayer.start()
        flusher = self.flusher
        if not flusher.health.failing:
            return
        closing = flusher._closing is not None or flusher.shutting_down
        if closing:
            flusher.health.closing()  # the rest gives up at once: it goes here
        everything = closing or self.durable
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
                    parts = await flusher._encode(batch)
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
            if not self.flusher._codec_loaded:
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
        if flusher.shutting_down or flusher._closing is not None:
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


# ---------------------------------------------------------------------- the command line's
class Summary(NamedTuple):
    """What one endpoint's folder holds (``looptrace spool``)."""

    path: Path
    endpoint: str | None  # None: no file in it reads back
    files: int
    spans: int
    bytes: int
    oldest_ns: int | None
    claimed: int
    corrupt: int


def summaries(root: Path) -> list[Summary]:
    """One :class:`Summary` per endpoint folder under ``root``."""
    out: list[Summary] = []
    try:
        folders = sorted(p for p in root.iterdir() if p.is_dir())
    except FileNotFoundError:
        return out
    for path in folders:
        spool = SpoolDir(path.parent, "")
        spool.path = path
        ready, claims, _ = spool.entries()
        endpoint = None
        for entry in ready + claims:
            try:
                endpoint = read_file(entry.path).endpoint
                break
            except (Corrupt, OSError):
                continue
        corrupt_dir = path / CORRUPT
        corrupt = len(list(corrupt_dir.iterdir())) if corrupt_dir.is_dir() else 0
        everything = ready + claims
        out.append(
            Summary(
                path,
                endpoint,
                len(everything),
                sum(e.spans for e in everything),
                sum(e.size for e in everything),
                min((e.created_ns for e in everything), default=None),
                len(claims),
                corrupt,
            )
        )
    return out


def folder_for(root: Path, summary: Summary, cfg: Config) -> SpoolDir:
    assert summary.endpoint is not None
    return SpoolDir(
        root,
        summary.endpoint,
        cfg.spool_max_bytes,
        cfg.spool_max_age_hours * 3600.0,
    )


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
