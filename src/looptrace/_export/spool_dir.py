"""The spool's folder on disk: one endpoint's files, written atomically and shared by processes.

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
processes cannot be asked, an hour old) is claimed again.

What the pipeline does with a folder is in ``.spool``; sending its files, in ``.replay``.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import struct
import sys
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import orjson

from .._errors import SpoolCorrupt as Corrupt

if TYPE_CHECKING:
    from .._config import Config

__all__ = [
    "CLAIM",
    "READY",
    "SPOOL_DROP_REASONS",
    "Corrupt",
    "Entry",
    "Record",
    "SpoolDir",
    "Summary",
    "endpoint_key",
    "folder_for",
    "read_file",
    "summaries",
]

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


def endpoint_key(endpoint: str) -> str:
    """The name of an endpoint's folder: the URL itself may not be a valid file name."""
    return hashlib.sha256(endpoint.encode()).hexdigest()[:16]


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
