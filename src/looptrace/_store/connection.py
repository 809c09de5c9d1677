"""The store's file and connections: opening (WAL, migrations), the writer and the readers,
closing. ``Store`` is this plus its writer, reads and retention (``store.py``)."""

from __future__ import annotations

import contextlib
import dataclasses
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

from .schema import StoreError, migrate, read_version
from .search import TermIndex

_Self = TypeVar("_Self", bound="Connections")


@dataclasses.dataclass
class Counters:
    writes: int = 0
    spans_written: int = 0
    bytes_since_prune: int = 0
    last_prune: float = float("-inf")


class Connections:
    """What every part of the ``Store`` shares: the file, its connections (one writer, a pool
    of readers, WAL so they read while a batch is written), the locks, the counters.

    Nothing touches the disk until the first call; the first connection switches the file to
    WAL and migrates it.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        max_age_days: float | None = None,
        max_bytes: int | None = None,
        busy_timeout: float = 10.0,
    ) -> None:
        self.path = Path(path)
        self.max_age_days = max_age_days
        self.max_bytes = max_bytes
        self._busy_ms = int(busy_timeout * 1000)
        self._lock = threading.Lock()  # guards _writer, _readers, _closed
        self._write_lock = threading.Lock()
        self._writer: sqlite3.Connection | None = None
        self._readers: list[sqlite3.Connection] = []
        self._all: list[sqlite3.Connection] = []
        self._closed = False
        self._opened = False
        self._resource_ids: dict[str, int] = {}
        self._terms = TermIndex()
        # Batches waiting for the writer (``Writer.write``'s group commit), under their lock.
        self._queue_lock = threading.Lock()
        self._queue: list[Any] = []
        self.counters = Counters()

    def _connect(self) -> sqlite3.Connection:
        if self._closed:
            raise StoreError("the store is closed")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(
            self.path, timeout=self._busy_ms / 1000, isolation_level=None, check_same_thread=False
        )
        conn.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
        if not self._opened:
            # Switching a new file to WAL and creating its tables can meet another connection
            # doing the same (two processes opening one store): SQLite then answers "locked"
            # at once, without its busy handler. Retried within the busy timeout.
            deadline = time.monotonic() + self._busy_ms / 1000
            while True:
                try:
                    self._open(conn)
                    break
                except sqlite3.OperationalError as exc:
                    if "locked" not in str(exc) or time.monotonic() > deadline:
                        raise
                    time.sleep(0.01)
        # FULL: in WAL mode, NORMAL may lose the last commits on power loss, and the collector
        # answers 200 only for what is durable. One fsync per batch, not per span.
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA foreign_keys = OFF")
        self._all.append(conn)
        return conn

    def _open(self, conn: sqlite3.Connection) -> None:
        # auto_vacuum must be chosen before the first table exists, so pruning can give pages
        # back to the file system (incremental_vacuum) without a full VACUUM.
        if conn.execute("PRAGMA page_count").fetchone()[0] == 0:
            conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise StoreError(f"{self.path}: cannot switch the store to WAL mode (got {mode!r})")
        migrate(conn, self.path)
        self._opened = True

    @contextlib.contextmanager
    def _reader(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            conn = self._readers.pop() if self._readers else None
        if conn is None:
            with self._lock:
                conn = self._connect()
        try:
            yield conn
        finally:
            with self._lock:
                if self._closed:
                    conn.close()
                else:
                    self._readers.append(conn)

    def _writer_conn(self) -> sqlite3.Connection:
        # Only called with _write_lock held, so one writer connection per Store.
        if self._writer is None:
            with self._lock:
                self._writer = self._connect()
        return self._writer

    def close(self) -> None:
        """Close every connection (waits for a write in progress)."""
        with self._write_lock, self._lock:
            self._closed = True
            for conn in self._all:
                conn.close()
            self._all.clear()
            self._readers.clear()
            self._writer = None

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def schema_version(self) -> int:
        """The schema version of the file (opening it migrates it to ``SCHEMA_VERSION``)."""
        with self._reader() as conn:
            return read_version(conn)
