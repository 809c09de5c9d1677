"""The local store: spans in one SQLite file (WAL mode), written by the client and the collector.

With no endpoint configured, the pipeline sends through ``StoreTransport``; ``looptrace serve``
writes the spans it receives over OTLP/HTTP into the same file. Both go through
``Store.write``, which applies one batch in one ``BEGIN IMMEDIATE`` transaction with
``synchronous=FULL``: once it returns, the batch survives a crash of the process *and* of the
machine, which is what the collector promises when it answers 200.

Tables (``SCHEMA_VERSION`` in ``meta``; ``_MIGRATIONS`` moves older files forward):

    spans        one row per span; a final record replaces an in-progress one, never the reverse
    traces       one summary row per trace, kept up to date on write (listing is an index scan)
    resources    resource attribute sets, stored once and referenced by spans
    experiments  one row per experiment seen in span attributes
    scores       one row per (span, score name) from ``looptrace.score.*`` attributes

Retention (``max_age_days``, ``max_bytes``) deletes whole traces, oldest first, at most once a
minute or when a lot has been written since the last check; never on every write.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import orjson

from . import _semconv as sc
from . import _state
from ._wire import DecodedSpan

if TYPE_CHECKING:
    from ._config import Config

__all__ = ["SCHEMA_VERSION", "Store", "StoreError", "StoreTransport", "span_from_row"]

LAG_SPAN_NAME = "looptrace.loop.lag"
LAG_PREFIX = "looptrace.loop.lag."

_STATUS_NAMES = {0: "unset", 1: "ok", 2: "error"}
_PRUNE_INTERVAL_S = 60.0
_PRUNE_BATCH = 500
_BYTES_TAG = "$bytes"


class StoreError(Exception):
    """The store file cannot be used (written by a newer looptrace, not a looptrace store...)."""


# --------------------------------------------------------------------------------------------
# schema and migrations

_SCHEMA_V1 = """
CREATE TABLE IF NOT EXISTS resources (
    id INTEGER PRIMARY KEY,
    attributes TEXT NOT NULL UNIQUE
);
CREATE TABLE IF NOT EXISTS spans (
    trace_id TEXT NOT NULL,
    span_id TEXT NOT NULL,
    parent_span_id TEXT,
    name TEXT NOT NULL,
    kind INTEGER NOT NULL,
    start_ns INTEGER NOT NULL,
    end_ns INTEGER NOT NULL,
    duration_ns INTEGER,
    status_code INTEGER NOT NULL,
    status_message TEXT NOT NULL,
    attributes TEXT NOT NULL,
    events TEXT NOT NULL,
    links TEXT NOT NULL,
    resource_id INTEGER REFERENCES resources(id),
    scope_name TEXT NOT NULL,
    scope_version TEXT NOT NULL,
    trace_state TEXT NOT NULL,
    input TEXT,
    output TEXT,
    lag_max_ms REAL,
    in_progress INTEGER NOT NULL,
    experiment_id TEXT,
    case_index INTEGER,
    size INTEGER NOT NULL,
    PRIMARY KEY (trace_id, span_id)
);
CREATE INDEX IF NOT EXISTS spans_by_name ON spans (name, start_ns);
CREATE INDEX IF NOT EXISTS spans_roots ON spans (trace_id, start_ns) WHERE parent_span_id IS NULL;
CREATE INDEX IF NOT EXISTS spans_by_case ON spans (experiment_id, case_index)
    WHERE experiment_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS spans_by_lag ON spans (lag_max_ms) WHERE lag_max_ms IS NOT NULL;
CREATE TABLE IF NOT EXISTS traces (
    trace_id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    root_span_id TEXT,
    service_name TEXT,
    start_ns INTEGER NOT NULL,
    end_ns INTEGER NOT NULL,
    status_code INTEGER NOT NULL,
    span_count INTEGER NOT NULL,
    error_count INTEGER NOT NULL,
    in_progress INTEGER NOT NULL,
    experiment_id TEXT,
    bytes INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS traces_by_start ON traces (start_ns);
CREATE INDEX IF NOT EXISTS traces_by_service ON traces (service_name, start_ns);
CREATE INDEX IF NOT EXISTS traces_by_experiment ON traces (experiment_id, start_ns)
    WHERE experiment_id IS NOT NULL;
CREATE TABLE IF NOT EXISTS experiments (
    id TEXT PRIMARY KEY,
    name TEXT,
    created_ns INTEGER NOT NULL,
    metadata TEXT,
    tags TEXT
);
CREATE INDEX IF NOT EXISTS experiments_by_created ON experiments (created_ns);
CREATE TABLE IF NOT EXISTS scores (
    trace_id TEXT NOT NULL,
    span_id TEXT NOT NULL,
    name TEXT NOT NULL,
    experiment_id TEXT,
    case_index INTEGER,
    value REAL,
    comment TEXT,
    PRIMARY KEY (trace_id, span_id, name)
);
CREATE INDEX IF NOT EXISTS scores_by_experiment ON scores (experiment_id, name)
    WHERE experiment_id IS NOT NULL;
"""


def _migrate_to_1(conn: sqlite3.Connection) -> None:
    _run_script(conn, _SCHEMA_V1)


def _run_script(conn: sqlite3.Connection, script: str) -> None:
    # executescript() would COMMIT our open transaction; run the statements one by one instead.
    for statement in script.split(";"):
        if statement.strip():
            conn.execute(statement)


# _MIGRATIONS[i] takes a file at schema version i to version i + 1. Append, never edit.
_MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [_migrate_to_1]
SCHEMA_VERSION = len(_MIGRATIONS)


# --------------------------------------------------------------------------------------------
# JSON columns


def _default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {_BYTES_TAG: base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"cannot store {type(value).__name__}")


def _dumps(value: Any) -> str:
    return orjson.dumps(value, default=_default).decode()


def _untag(value: Any) -> Any:
    if isinstance(value, dict):
        if len(value) == 1 and _BYTES_TAG in value:
            return base64.b64decode(value[_BYTES_TAG])
        return {k: _untag(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_untag(v) for v in value]
    return value


def _loads(text: str | None) -> Any:
    if text is None:
        return None
    value = orjson.loads(text)
    # Only bytes attributes are tagged, and they are rare: skip the walk unless one is there.
    return _untag(value) if _BYTES_TAG in text else value


# --------------------------------------------------------------------------------------------
# the store


class _Prepared(NamedTuple):
    params: tuple[Any, ...]
    trace_id: str
    span_id: str
    experiment: tuple[str, str | None, int, str | None, str | None] | None
    scores: list[tuple[str, float, str | None]]
    experiment_id: str | None
    case_index: int | None


_SPAN_COLUMNS = (
    "trace_id, span_id, parent_span_id, name, kind, start_ns, end_ns, duration_ns, status_code, "
    "status_message, attributes, events, links, resource_id, scope_name, scope_version, "
    "trace_state, input, output, lag_max_ms, in_progress, experiment_id, case_index, size"
)
_UPSERT_SPAN = (
    f"INSERT INTO spans ({_SPAN_COLUMNS}) VALUES ({', '.join('?' * 24)}) "
    "ON CONFLICT (trace_id, span_id) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in _SPAN_COLUMNS.replace(" ", "").split(",")[2:])
    # An in-progress snapshot must never overwrite the final record of the same span.
    + " WHERE NOT (excluded.in_progress = 1 AND spans.in_progress = 0)"
)

_UPDATE_TRACES = """
WITH
touched AS (SELECT value AS trace_id FROM json_each(?)),
agg AS (
    SELECT trace_id, count(*) AS n, min(start_ns) AS start_ns, max(end_ns) AS end_ns,
        coalesce(sum(status_code = 2), 0) AS errors, max(experiment_id) AS experiment_id,
        sum(size) AS bytes
    FROM spans WHERE trace_id IN (SELECT trace_id FROM touched) GROUP BY trace_id
),
pick AS (
    SELECT agg.*, coalesce(
        (SELECT rowid FROM spans s WHERE s.trace_id = agg.trace_id AND s.parent_span_id IS NULL
            ORDER BY s.start_ns LIMIT 1),
        (SELECT rowid FROM spans s WHERE s.trace_id = agg.trace_id ORDER BY s.start_ns LIMIT 1)
    ) AS root_rowid
    FROM agg
)
INSERT INTO traces (trace_id, name, root_span_id, service_name, start_ns, end_ns, status_code,
    span_count, error_count, in_progress, experiment_id, bytes)
SELECT pick.trace_id, root.name, root.span_id, json_extract(r.attributes, '$."service.name"'),
    pick.start_ns, pick.end_ns, root.status_code, pick.n, pick.errors, root.in_progress,
    pick.experiment_id, pick.bytes
FROM pick JOIN spans root ON root.rowid = pick.root_rowid
LEFT JOIN resources r ON r.id = root.resource_id
WHERE true
ON CONFLICT (trace_id) DO UPDATE SET
    name = excluded.name, root_span_id = excluded.root_span_id,
    service_name = excluded.service_name, start_ns = excluded.start_ns,
    end_ns = excluded.end_ns, status_code = excluded.status_code,
    span_count = excluded.span_count, error_count = excluded.error_count,
    in_progress = excluded.in_progress, experiment_id = excluded.experiment_id,
    bytes = excluded.bytes
"""


@dataclasses.dataclass
class _Counters:
    writes: int = 0
    spans_written: int = 0
    bytes_since_prune: int = 0
    last_prune: float = float("-inf")


class Store:
    """One SQLite store file. Thread-safe: any thread may read or write; writes are serialized.

    ``Store(path)`` opens lazily: nothing touches the disk until the first call. Readers use
    their own connections (WAL lets them read while a batch is being written).
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
        self.counters = _Counters()

    @classmethod
    def from_config(cls, cfg: Config) -> Store:
        """A store at ``cfg.store_path`` with the configured retention."""
        return cls(
            cfg.store_path, max_age_days=cfg.store_max_age_days, max_bytes=cfg.store_max_bytes
        )

    # -- connections --------------------------------------------------------------------------

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
        self._migrate(conn)
        self._opened = True

    def _migrate(self, conn: sqlite3.Connection) -> None:
        version = self._read_version(conn)
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path} was written by a newer looptrace (schema version {version}; "
                f"this one understands up to {SCHEMA_VERSION}): upgrade looptrace"
            )
        if version == SCHEMA_VERSION:
            return
        conn.execute("BEGIN IMMEDIATE")
        try:
            # Another process may have migrated while we waited for the write lock.
            version = self._read_version(conn)
            for step in range(version, len(_MIGRATIONS)):
                _MIGRATIONS[step](conn)
            conn.execute(
                "INSERT INTO meta (key, value) VALUES ('schema_version', ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (str(len(_MIGRATIONS)),),
            )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    @staticmethod
    def _read_version(conn: sqlite3.Connection) -> int:
        conn.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
        # Both reads in one snapshot: another process may commit a migration between them.
        own = not conn.in_transaction
        if own:
            conn.execute("BEGIN")
        try:
            row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            tables = {
                r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            }
        finally:
            if own:
                conn.execute("COMMIT")
        if row is None:
            if tables - {"meta"}:
                raise StoreError(f"{conn_path(conn)} is an SQLite file but not a looptrace store")
            return 0
        return int(row[0])

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

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def schema_version(self) -> int:
        """The schema version of the file (opening it migrates it to ``SCHEMA_VERSION``)."""
        with self._reader() as conn:
            return self._read_version(conn)

    # -- writing ------------------------------------------------------------------------------

    def write(self, spans: Sequence[DecodedSpan]) -> None:
        """Store ``spans`` in one transaction; durable when this returns. Blocking: call it
        from a worker thread, never on an event loop."""
        if not spans:
            return
        prepared = [_prepare(s) for s in spans]
        with self._write_lock:
            conn = self._writer_conn()
            conn.execute("BEGIN IMMEDIATE")
            try:
                self._write_locked(conn, spans, prepared)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                # The resource cache may name rows the rollback removed.
                self._resource_ids.clear()
                raise
            self.counters.writes += 1
            self.counters.spans_written += len(spans)
            self.counters.bytes_since_prune += sum(p.params[-1] for p in prepared)
            if self._prune_due():
                self._prune_locked(conn)

    def _write_locked(
        self, conn: sqlite3.Connection, spans: Sequence[DecodedSpan], prepared: list[_Prepared]
    ) -> None:
        rows = []
        for span, prep in zip(spans, prepared, strict=True):
            rows.append(
                (*prep.params[:13], self._resource_id(conn, span.resource), *prep.params[13:])
            )
        conn.executemany(_UPSERT_SPAN, rows)
        self._update_traces(conn, list(dict.fromkeys(p.trace_id for p in prepared)))
        for prep in prepared:
            if prep.experiment is not None:
                conn.execute(
                    "INSERT INTO experiments (id, name, created_ns, metadata, tags) "
                    "VALUES (?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET "
                    "name = coalesce(excluded.name, name), "
                    "created_ns = min(created_ns, excluded.created_ns), "
                    "metadata = coalesce(excluded.metadata, metadata), "
                    "tags = coalesce(excluded.tags, tags)",
                    prep.experiment,
                )
            if prep.scores:
                experiment_id = prep.experiment_id
                if experiment_id is None:
                    row = conn.execute(
                        "SELECT experiment_id FROM traces WHERE trace_id = ?", (prep.trace_id,)
                    ).fetchone()
                    experiment_id = row[0] if row else None
                conn.executemany(
                    "INSERT INTO scores (trace_id, span_id, name, experiment_id, case_index, "
                    "value, comment) VALUES (?, ?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT (trace_id, span_id, name) DO UPDATE SET "
                    "experiment_id = excluded.experiment_id, case_index = excluded.case_index, "
                    "value = excluded.value, comment = excluded.comment",
                    [
                        (prep.trace_id, prep.span_id, name, experiment_id, prep.case_index, v, c)
                        for name, v, c in prep.scores
                    ],
                )

    def _resource_id(self, conn: sqlite3.Connection, resource: Mapping[str, Any]) -> int:
        text = _dumps(dict(sorted(resource.items())))
        rid = self._resource_ids.get(text)
        if rid is None:
            conn.execute("INSERT OR IGNORE INTO resources (attributes) VALUES (?)", (text,))
            rid = conn.execute("SELECT id FROM resources WHERE attributes = ?", (text,)).fetchone()[
                0
            ]
            if len(self._resource_ids) > 1000:
                self._resource_ids.clear()
            self._resource_ids[text] = rid
        return int(rid)

    def _update_traces(self, conn: sqlite3.Connection, trace_ids: list[str]) -> None:
        # Recomputed from the spans of the touched traces (index ranges on the primary key), in
        # one statement per batch, so replacing an in-progress record or receiving a span twice
        # cannot skew the counts. The root is the parentless span that started first (or, while
        # the root has not arrived, the first span).
        conn.execute(_UPDATE_TRACES, (orjson.dumps(trace_ids).decode(),))

    # -- retention ----------------------------------------------------------------------------

    def _prune_due(self) -> bool:
        if self.max_age_days is None and self.max_bytes is None:
            return False
        c = self.counters
        if time.monotonic() - c.last_prune >= _PRUNE_INTERVAL_S:
            return True
        return self.max_bytes is not None and c.bytes_since_prune > self.max_bytes // 10

    def prune(self) -> int:
        """Apply the retention settings now; returns how many traces were deleted."""
        with self._write_lock:
            return self._prune_locked(self._writer_conn())

    def _prune_locked(self, conn: sqlite3.Connection) -> int:
        self.counters.last_prune = time.monotonic()
        self.counters.bytes_since_prune = 0
        deleted = 0
        if self.max_age_days is not None:
            cutoff = time.time_ns() - int(self.max_age_days * 86400e9)
            while True:
                ids = [
                    r[0]
                    for r in conn.execute(
                        "SELECT trace_id FROM traces WHERE start_ns < ? ORDER BY start_ns LIMIT ?",
                        (cutoff, _PRUNE_BATCH),
                    )
                ]
                if not ids:
                    break
                deleted += self._delete_traces(conn, ids)
        if self.max_bytes is not None:
            for _ in range(100):
                used = self._used_bytes(conn)
                if used <= self.max_bytes:
                    break
                # Delete down to 90% so the next few writes do not trigger another prune. The
                # per-trace byte counts leave out indexes and page slack: scale them up.
                total = conn.execute("SELECT coalesce(sum(bytes), 0) FROM traces").fetchone()[0]
                if total == 0:
                    break
                need = (used - int(self.max_bytes * 0.9)) * total / used
                ids, freed = [], 0
                for trace_id, size in conn.execute(
                    "SELECT trace_id, bytes FROM traces ORDER BY start_ns LIMIT ?", (_PRUNE_BATCH,)
                ):
                    ids.append(trace_id)
                    freed += size
                    if freed >= need:
                        break
                deleted += self._delete_traces(conn, ids)
        if deleted:
            conn.execute("PRAGMA incremental_vacuum")
        return deleted

    @staticmethod
    def _used_bytes(conn: sqlite3.Connection) -> int:
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        free = conn.execute("PRAGMA freelist_count").fetchone()[0]
        size = conn.execute("PRAGMA page_size").fetchone()[0]
        return int((pages - free) * size)

    @staticmethod
    def _delete_traces(conn: sqlite3.Connection, trace_ids: list[str]) -> int:
        conn.execute("BEGIN IMMEDIATE")
        try:
            for table in ("spans", "scores", "traces"):
                conn.executemany(
                    f"DELETE FROM {table} WHERE trace_id = ?", [(t,) for t in trace_ids]
                )
            conn.execute(
                "DELETE FROM experiments WHERE id NOT IN "
                "(SELECT experiment_id FROM traces WHERE experiment_id IS NOT NULL)"
            )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return len(trace_ids)

    # -- reading ------------------------------------------------------------------------------

    def list_traces(
        self,
        limit: int = 50,
        offset: int = 0,
        name: str | None = None,
        status: str | None = None,
        experiment: str | None = None,
        include_lag: bool = False,
        *,
        service: str | None = None,
        min_duration_ns: int | None = None,
        since_ns: int | None = None,
        until_ns: int | None = None,
    ) -> list[dict[str, Any]]:
        """Trace summaries, newest first. ``name`` matches a substring of the root's name;
        ``status`` is ``ok`` (no span failed), ``error`` (the root or any span failed) or
        ``in_progress``; ``service`` is the root's service, exactly; ``min_duration_ns`` keeps
        finished traces at least that long; ``since_ns``/``until_ns`` bound the start time.
        The lag monitor's summary traces (``looptrace.loop.lag``) are left out unless
        ``include_lag``: ``lag_summaries`` is their view."""
        where: list[str] = []
        params: list[Any] = []
        if service:
            where.append("service_name = ?")
            params.append(service)
        if min_duration_ns is not None:
            where.append("in_progress = 0 AND end_ns - start_ns >= ?")
            params.append(min_duration_ns)
        if since_ns is not None:
            where.append("start_ns >= ?")
            params.append(since_ns)
        if until_ns is not None:
            where.append("start_ns <= ?")
            params.append(until_ns)
        if not include_lag:
            where.append("name != ?")
            params.append(LAG_SPAN_NAME)
        if name:
            where.append("instr(name, ?) > 0")
            params.append(name)
        if status == "error":
            where.append("(status_code = 2 OR error_count > 0)")
        elif status == "in_progress":
            where.append("in_progress = 1")
        elif status == "ok":
            where.append("status_code != 2 AND error_count = 0 AND in_progress = 0")
        elif status == "unset":
            # The exact OpenTelemetry status of the root (ok also includes roots set to OK).
            where.append("status_code = 0 AND error_count = 0 AND in_progress = 0")
        elif status is not None:
            raise ValueError(f"status must be ok, error, unset or in_progress, got {status!r}")
        if experiment:
            where.append("experiment_id = ?")
            params.append(experiment)
        sql = _TRACE_SELECT
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY start_ns DESC LIMIT ? OFFSET ?"
        with self._reader() as conn:
            return [_trace_dict(r) for r in conn.execute(sql, (*params, limit, offset))]

    def services(self) -> list[str]:
        """The services that have traces, by name (what the trace list's filter offers)."""
        with self._reader() as conn:
            rows = conn.execute(
                "SELECT DISTINCT service_name FROM traces WHERE service_name IS NOT NULL "
                "ORDER BY service_name LIMIT 1000"
            )
            return [r[0] for r in rows]

    def get_trace_summary(self, trace_id: str) -> dict[str, Any] | None:
        """The summary row of one trace, or None."""
        with self._reader() as conn:
            row = conn.execute(_TRACE_SELECT + " WHERE trace_id = ?", (trace_id,)).fetchone()
        return None if row is None else _trace_dict(row)

    def find_trace_ids(self, prefix: str, limit: int = 2) -> list[str]:
        """Trace ids starting with ``prefix`` (so the CLI accepts a short id)."""
        prefix = prefix.lower()
        with self._reader() as conn:
            return [
                r[0]
                for r in conn.execute(
                    "SELECT trace_id FROM traces WHERE trace_id >= ? AND trace_id < ? LIMIT ?",
                    (prefix, prefix + "g", limit),
                )
            ]

    def get_trace(
        self,
        trace_id: str,
        preview: int | None = None,
        *,
        span_id: str | None = None,
        limit: int | None = None,
    ) -> list[dict[str, Any]]:
        """Every span of a trace (the first ``limit``, with one), ordered by start time (empty
        if unknown).

        With ``preview=None`` each row is complete: ``attributes`` includes ``input.value`` and
        ``output.value``. With ``preview=N`` the payloads are left out of ``attributes`` and
        ``input``/``output`` hold their first N characters (``input_size``/``output_size`` say
        how long they are), which is what listing a 10,000-span trace needs.
        """
        if preview is None:
            payload = "s.input, s.output"
        else:
            n = int(preview)
            payload = f"substr(s.input, 1, {n}), substr(s.output, 1, {n})"
        sql = (
            "SELECT s.trace_id, s.span_id, s.parent_span_id, s.name, s.kind, s.start_ns, s.end_ns, "
            "s.duration_ns, s.status_code, s.status_message, s.attributes, s.events, s.links, "
            "r.attributes, s.scope_name, s.scope_version, s.trace_state, "
            f"{payload}, length(s.input), length(s.output), s.lag_max_ms, s.in_progress, "
            "s.experiment_id, s.case_index FROM spans s LEFT JOIN resources r ON r.id = s.resource_id "
            "WHERE s.trace_id = ?"
            + (" AND s.span_id = ?" if span_id is not None else "")
            + " ORDER BY s.start_ns, s.span_id"
            + (f" LIMIT {int(limit)}" if limit is not None else "")
        )
        resources: dict[str, Any] = {}
        out = []
        with self._reader() as conn:
            args = (trace_id,) if span_id is None else (trace_id, span_id)
            for row in conn.execute(sql, args):
                attributes = _loads(row[10])
                if preview is None:
                    if row[17] is not None:
                        attributes[sc.INPUT_VALUE] = row[17]
                    if row[18] is not None:
                        attributes[sc.OUTPUT_VALUE] = row[18]
                resource_text = row[13] or "{}"
                resource = resources.get(resource_text)
                if resource is None:
                    resource = resources[resource_text] = _loads(resource_text)
                out.append(
                    {
                        "trace_id": row[0],
                        "span_id": row[1],
                        "parent_span_id": row[2],
                        "name": row[3],
                        "kind": row[4],
                        "start_ns": row[5],
                        "end_ns": row[6],
                        "duration_ns": row[7],
                        "status_code": row[8],
                        "status": _STATUS_NAMES.get(row[8], "unset"),
                        "status_message": row[9],
                        "attributes": attributes,
                        "events": _loads(row[11]),
                        "links": _loads(row[12]),
                        "resource": resource,
                        "scope_name": row[14],
                        "scope_version": row[15],
                        "trace_state": row[16],
                        "input": row[17],
                        "output": row[18],
                        "input_size": row[19],
                        "output_size": row[20],
                        "lag_max_ms": row[21],
                        "in_progress": bool(row[22]),
                        "experiment_id": row[23],
                        "case_index": row[24],
                    }
                )
        return out

    def get_tree(self, trace_id: str, preview: int = 200) -> list[dict[str, Any]]:
        """What a span tree shows, and nothing more (no JSON columns are parsed): per span,
        ``span_id``, ``parent_span_id``, ``name``, ``start_ns``, ``duration_ns``, ``status``,
        ``status_message``, ``lag_max_ms``, ``in_progress``, ``input``/``output`` previews and
        ``events`` (parsed only for the spans that have any), and ``attributes`` for LLM calls
        only (spans with GenAI attributes; others get an empty dict), ordered by start time.
        ``looptrace show`` on 10,000 spans reads this."""
        n = int(preview)
        sql = (
            "SELECT span_id, parent_span_id, name, start_ns, duration_ns, status_code, "
            f"status_message, lag_max_ms, in_progress, substr(input, 1, {n}), "
            f"substr(output, 1, {n}), CASE WHEN events = '[]' THEN NULL ELSE events END, "
            "CASE WHEN instr(attributes, '\"gen_ai.operation.name\"') > 0 THEN attributes END "
            "FROM spans WHERE trace_id = ? ORDER BY start_ns, span_id"
        )
        with self._reader() as conn:
            return [
                {
                    "span_id": r[0],
                    "parent_span_id": r[1],
                    "name": r[2],
                    "start_ns": r[3],
                    "duration_ns": r[4],
                    "status": _STATUS_NAMES.get(r[5], "unset"),
                    "status_message": r[6],
                    "lag_max_ms": r[7],
                    "in_progress": bool(r[8]),
                    "input": r[9],
                    "output": r[10],
                    "events": _loads(r[11]) if r[11] is not None else [],
                    "attributes": _loads(r[12]) if r[12] is not None else {},
                }
                for r in conn.execute(sql, (trace_id,))
            ]

    def get_span(self, trace_id: str, span_id: str) -> dict[str, Any] | None:
        """One complete span row (payloads included), or None."""
        rows = self.get_trace(trace_id, span_id=span_id)
        return rows[0] if rows else None

    def find_experiment_ids(self, prefix: str, limit: int = 2) -> list[str]:
        """Experiment ids starting with ``prefix`` (so the CLI accepts a short id)."""
        with self._reader() as conn:
            return [
                r[0]
                for r in conn.execute(
                    "SELECT id FROM experiments WHERE substr(id, 1, ?) = ? LIMIT ?",
                    (len(prefix), prefix, limit),
                )
            ]

    def list_experiments(self, limit: int = 50, offset: int = 0) -> list[dict[str, Any]]:
        """Experiments, newest first, each with case/error counts and the mean of each score."""
        with self._reader() as conn:
            rows = conn.execute(
                "SELECT id, name, created_ns, metadata, tags FROM experiments "
                "ORDER BY created_ns DESC LIMIT ? OFFSET ?",
                (limit, offset),
            ).fetchall()
            return [self._experiment_head(conn, row) for row in rows]

    def _experiment_head(self, conn: sqlite3.Connection, row: Sequence[Any]) -> dict[str, Any]:
        exp_id = row[0]
        cases, errors = conn.execute(
            "SELECT count(*), coalesce(sum(status_code = 2), 0) FROM ("
            "SELECT min(start_ns), status_code FROM spans "
            "WHERE experiment_id = ? AND case_index IS NOT NULL GROUP BY trace_id, case_index)",
            (exp_id,),
        ).fetchone()
        tokens_in, tokens_out = conn.execute(
            "SELECT coalesce(sum(i), 0), coalesce(sum(o), 0) FROM ("
            "SELECT min(start_ns), json_extract(attributes, ?) AS i, "
            "json_extract(attributes, ?) AS o FROM spans "
            "WHERE experiment_id = ? AND case_index IS NOT NULL GROUP BY trace_id, case_index)",
            (f'$."{sc.CASE_INPUT_TOKENS}"', f'$."{sc.CASE_OUTPUT_TOKENS}"', exp_id),
        ).fetchone()
        scores = {
            name: {"mean": mean, "min": lo, "max": hi, "count": n}
            for name, mean, lo, hi, n in conn.execute(
                "SELECT name, avg(value), min(value), max(value), count(value) FROM scores "
                "WHERE experiment_id = ? GROUP BY name ORDER BY name",
                (exp_id,),
            )
        }
        return {
            "id": exp_id,
            "name": row[1],
            "created_ns": row[2],
            "metadata": _loads(row[3]),
            "tags": _loads(row[4]),
            "case_count": cases,
            "error_count": errors,
            "input_tokens": tokens_in,
            "output_tokens": tokens_out,
            "scores": scores,
        }

    def get_experiment(self, experiment_id: str, preview: int = 200) -> dict[str, Any] | None:
        """One experiment with its cases (in case order) and score aggregates, or None."""
        with self._reader() as conn:
            row = conn.execute(
                "SELECT id, name, created_ns, metadata, tags FROM experiments WHERE id = ?",
                (experiment_id,),
            ).fetchone()
            if row is None:
                return None
            head = self._experiment_head(conn, row)
            n = int(preview)
            case_rows = conn.execute(
                "SELECT min(start_ns), trace_id, span_id, case_index, name, end_ns, duration_ns, "
                f"status_code, status_message, substr(input, 1, {n}), substr(output, 1, {n}), "
                "json_extract(attributes, ?), in_progress, json_extract(attributes, ?), "
                "json_extract(attributes, ?), json_extract(attributes, ?), "
                "json_extract(attributes, ?) FROM spans "
                "WHERE experiment_id = ? AND case_index IS NOT NULL "
                "GROUP BY trace_id, case_index ORDER BY case_index, min(start_ns)",
                (
                    f'$."{sc.EXPECTED_VALUE}"',
                    f'$."{sc.CASE_REPETITION}"',
                    f'$."{sc.CASE_ERROR}"',
                    f'$."{sc.CASE_INPUT_TOKENS}"',
                    f'$."{sc.CASE_OUTPUT_TOKENS}"',
                    experiment_id,
                ),
            ).fetchall()
            scores: dict[tuple[str, int | None], dict[str, float]] = {}
            comments: dict[tuple[str, int | None], dict[str, str]] = {}
            for trace_id, case_index, name, value, comment in conn.execute(
                "SELECT trace_id, case_index, name, value, comment FROM scores "
                "WHERE experiment_id = ? ORDER BY name",
                (experiment_id,),
            ):
                scores.setdefault((trace_id, case_index), {})[name] = value
                if comment is not None:
                    comments.setdefault((trace_id, case_index), {})[name] = comment
            summary = conn.execute(
                _TRACE_SELECT + " WHERE trace_id = ?", (experiment_id,)
            ).fetchone()
        head["cases"] = [
            {
                "case_index": r[3],
                "trace_id": r[1],
                "span_id": r[2],
                "name": r[4],
                "start_ns": r[0],
                "end_ns": r[5],
                "duration_ns": r[6],
                "status": "error" if r[7] == 2 else "ok",
                "error": r[14] if r[14] is not None else (r[8] if r[7] == 2 else None),
                "repetition": r[13],
                "input": r[9],
                "output": r[10],
                "expected": r[11],
                "in_progress": bool(r[12]),
                "scores": scores.get((r[1], r[3]), {}),
                "comments": comments.get((r[1], r[3]), {}),
                "input_tokens": r[15],
                "output_tokens": r[16],
            }
            for r in case_rows
        ]
        # The experiment's own span is the root of the trace whose id is the experiment id.
        head["trace"] = None if summary is None else _trace_dict(summary)
        return head

    def lag_summaries(
        self, limit: int = 100, since_ns: int | None = None, worst: int = 20
    ) -> dict[str, Any]:
        """Loop-lag facts: the ``looptrace.loop.lag`` summary spans (newest first, their
        ``looptrace.loop.lag.*`` attributes without the prefix) and the ``worst`` spans by
        ``looptrace.loop.lag_max_ms``."""
        summaries = []
        with self._reader() as conn:
            for trace_id, span_id, start, end, attrs, service, instance in conn.execute(
                "SELECT s.trace_id, s.span_id, s.start_ns, s.end_ns, s.attributes, "
                "json_extract(r.attributes, '$.\"service.name\"'), "
                "json_extract(r.attributes, '$.\"service.instance.id\"') FROM spans s "
                "LEFT JOIN resources r ON r.id = s.resource_id "
                "WHERE s.name = ? AND s.start_ns >= ? ORDER BY s.start_ns DESC LIMIT ?",
                (LAG_SPAN_NAME, since_ns or 0, limit),
            ):
                values = {
                    k[len(LAG_PREFIX) :]: v
                    for k, v in _loads(attrs).items()
                    if k.startswith(LAG_PREFIX)
                }
                summaries.append(
                    {
                        "trace_id": trace_id,
                        "span_id": span_id,
                        "start_ns": start,
                        "end_ns": end,
                        "service_name": service,
                        "instance": instance,
                        "values": values,
                    }
                )
            worst_spans = [
                {
                    "trace_id": r[0],
                    "span_id": r[1],
                    "name": r[2],
                    "start_ns": r[3],
                    "duration_ns": r[4],
                    "lag_max_ms": r[5],
                }
                # The monitor's own summary spans carry a window's lag, not a stall they
                # suffered: they are the chart, not the list of victims.
                for r in conn.execute(
                    "SELECT trace_id, span_id, name, start_ns, duration_ns, lag_max_ms FROM spans "
                    "WHERE lag_max_ms IS NOT NULL AND start_ns >= ? AND name != ? "
                    "ORDER BY lag_max_ms DESC LIMIT ?",
                    (since_ns or 0, LAG_SPAN_NAME, worst),
                )
            ]
            culprits = _culprits(
                conn.execute(
                    "SELECT trace_id, span_id, name, start_ns, end_ns, lag_max_ms, events "
                    "FROM spans WHERE lag_max_ms IS NOT NULL AND start_ns >= ? AND name != ? "
                    "ORDER BY lag_max_ms DESC LIMIT ?",
                    (since_ns or 0, LAG_SPAN_NAME, _CULPRIT_SCAN),
                ),
                worst,
            )
        return {"summaries": summaries, "worst_spans": worst_spans, "culprits": culprits}

    def stats(self) -> dict[str, Any]:
        """Counts and sizes, for ``looptrace`` commands and the viewer."""
        with self._reader() as conn:
            traces, spans = conn.execute(
                "SELECT count(*), coalesce(sum(span_count), 0) FROM traces"
            ).fetchone()
            experiments = conn.execute("SELECT count(*) FROM experiments").fetchone()[0]
            used = self._used_bytes(conn)
        return {
            "path": str(self.path),
            "schema_version": SCHEMA_VERSION,
            "traces": traces,
            "spans": spans,
            "experiments": experiments,
            "bytes": used,
        }


def conn_path(conn: sqlite3.Connection) -> str:
    row = conn.execute("PRAGMA database_list").fetchone()
    return str(row[2]) if row else "the store"


# The lag page's culprits come from the stall events on this many of the most lagged spans.
_CULPRIT_SCAN = 2000
_STALL_EVENT = "looptrace.loop.stall"
_VICTIMS_SHOWN = 5


def _culprits(rows: Iterable[Sequence[Any]], limit: int) -> list[dict[str, Any]]:
    """Stall events grouped by the code that blocked the loop (function, file, line), worst
    first: how often, how long, the stack of the worst stall, the spans it happened in, and
    the other spans that were running (so waited) while it blocked."""
    spans = [tuple(r) for r in rows]
    groups: dict[tuple[Any, Any, Any], dict[str, Any]] = {}
    for trace_id, span_id, name, _start, _end, _lag, events in spans:
        for event in _loads(events) if events and events != "[]" else ():
            if event.get("name") != _STALL_EVENT:
                continue
            attrs = event.get("attributes") or {}
            key = (attrs.get("code.function"), attrs.get("code.filepath"), attrs.get("code.lineno"))
            ms = float(attrs.get("looptrace.loop.stall.duration_ms") or 0.0)
            group = groups.get(key)
            if group is None:
                group = groups[key] = {
                    "function": key[0],
                    "filepath": key[1],
                    "lineno": key[2],
                    "stalls": 0,
                    "total_ms": 0.0,
                    "max_ms": 0.0,
                    "stack": "",
                    "task": None,
                    "in_spans": [],
                    "waiting_spans": [],
                    "_windows": [],
                    "_seen": set(),
                }
            group["stalls"] += 1
            group["total_ms"] += ms
            if ms >= group["max_ms"]:
                group["max_ms"] = ms
                group["stack"] = attrs.get("looptrace.loop.stall.stack", "")
                group["task"] = attrs.get("looptrace.task.name")
            at = int(event.get("time_ns") or 0)
            group["_windows"].append((at, at + int(ms * 1e6)))
            group["_seen"].add((trace_id, span_id))
            if len(group["in_spans"]) < _VICTIMS_SHOWN and all(
                (v["trace_id"], v["span_id"]) != (trace_id, span_id) for v in group["in_spans"]
            ):
                group["in_spans"].append({"trace_id": trace_id, "span_id": span_id, "name": name})
    ranked = sorted(groups.values(), key=lambda g: g["max_ms"], reverse=True)[:limit]
    for group in ranked:
        windows, seen = group.pop("_windows"), group.pop("_seen")
        waiting = 0
        for trace_id, span_id, name, start, end, _lag, _events in spans:
            if (trace_id, span_id) in seen:
                continue
            stop = end or start
            if any(start <= w_end and w_start <= stop for w_start, w_end in windows):
                waiting += 1
                if len(group["waiting_spans"]) < _VICTIMS_SHOWN:
                    group["waiting_spans"].append(
                        {"trace_id": trace_id, "span_id": span_id, "name": name}
                    )
        group["waiting"] = waiting
        group["total_ms"] = round(group["total_ms"], 3)
    return ranked


_TRACE_SELECT = (
    "SELECT trace_id, name, root_span_id, service_name, start_ns, end_ns, status_code, "
    "span_count, error_count, in_progress, experiment_id, bytes FROM traces"
)


def _trace_dict(row: Sequence[Any]) -> dict[str, Any]:
    (trace_id, name, root, service, start, end, status, count, errors, in_progress, exp, size) = row
    return {
        "trace_id": trace_id,
        "name": name,
        "root_span_id": root,
        "service_name": service,
        "start_ns": start,
        "end_ns": end,
        "duration_ns": None if in_progress or end == 0 else end - start,
        # For people: the root failed, is still running, or not (OpenTelemetry's UNSET means
        # "no error"); status_code keeps the exact value.
        "status": "in_progress" if in_progress else ("error" if status == 2 else "ok"),
        "status_code": status,
        "span_count": count,
        "error_count": errors,
        "in_progress": bool(in_progress),
        "experiment_id": exp,
        "bytes": size,
    }


def _prepare(span: DecodedSpan) -> _Prepared:
    attributes = dict(span.attributes)
    raw_input = attributes.pop(sc.INPUT_VALUE, None)
    raw_output = attributes.pop(sc.OUTPUT_VALUE, None)
    # Payloads live in their own columns (so a trace can be listed without reading them); a
    # non-string payload from a foreign SDK stays an attribute.
    if raw_input is not None and not isinstance(raw_input, str):
        attributes[sc.INPUT_VALUE] = raw_input
        raw_input = None
    if raw_output is not None and not isinstance(raw_output, str):
        attributes[sc.OUTPUT_VALUE] = raw_output
        raw_output = None
    in_progress = span.end_ns == 0 or attributes.get(sc.IN_PROGRESS) is True
    lag = attributes.get(sc.LOOP_LAG_MAX_MS)
    lag_max = float(lag) if isinstance(lag, (int, float)) and not isinstance(lag, bool) else None
    experiment_id = attributes.get(sc.EXPERIMENT_ID)
    experiment_id = str(experiment_id) if experiment_id is not None else None
    case = attributes.get(sc.CASE_INDEX)
    case_index = case if isinstance(case, int) and not isinstance(case, bool) else None
    attributes_text = _dumps(attributes)
    events_text = _dumps(span.events)
    links_text = _dumps(span.links)
    size = (
        len(attributes_text)
        + len(events_text)
        + len(links_text)
        + len(raw_input or "")
        + len(raw_output or "")
        + len(span.name)
        + 160
    )
    experiment = None
    if experiment_id is not None:
        name = attributes.get(sc.EXPERIMENT_NAME)
        metadata = attributes.get(sc.EXPERIMENT_METADATA)
        tags = attributes.get(sc.EXPERIMENT_TAGS)
        experiment = (
            experiment_id,
            str(name) if name is not None else None,
            span.start_ns,
            _json_column(metadata),
            _json_column(tags),
        )
    scores: list[tuple[str, float, str | None]] = []
    comments: dict[str, str] = {}
    for key, value in attributes.items():
        if key.startswith(sc.SCORE_PREFIX):
            name = key[len(sc.SCORE_PREFIX) :]
            # Scores are numbers; a string at "<name>.comment" is that score's comment.
            if isinstance(value, (bool, int, float)):
                scores.append((name, float(value), None))
            elif isinstance(value, str) and name.endswith(sc.SCORE_COMMENT_SUFFIX):
                comments[name[: -len(sc.SCORE_COMMENT_SUFFIX)]] = value
    if comments:
        scores = [(name, v, comments.get(name)) for name, v, _ in scores]
    duration = span.end_ns - span.start_ns if not in_progress else None
    params = (
        span.trace_id,
        span.span_id,
        span.parent_span_id or None,
        span.name,
        span.kind,
        span.start_ns,
        0 if in_progress and span.end_ns == 0 else span.end_ns,
        duration,
        span.status_code,
        span.status_message,
        attributes_text,
        events_text,
        links_text,
        # resource_id is spliced in here by the writer
        span.scope_name,
        span.scope_version,
        span.trace_state,
        raw_input,
        raw_output,
        lag_max,
        int(in_progress),
        experiment_id,
        case_index,
        size,
    )
    return _Prepared(
        params, span.trace_id, span.span_id, experiment, scores, experiment_id, case_index
    )


def _json_column(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        # Metadata arrives as a JSON string (the serializer's form for dicts); keep it if valid.
        try:
            orjson.loads(value)
        except orjson.JSONDecodeError:
            return _dumps(value)
        return value
    return _dumps(value)


def span_from_row(row: Mapping[str, Any]) -> DecodedSpan:
    """Turn a complete ``get_trace`` row back into the DecodedSpan that was written."""
    return DecodedSpan(
        trace_id=row["trace_id"],
        span_id=row["span_id"],
        parent_span_id=row["parent_span_id"],
        name=row["name"],
        kind=row["kind"],
        start_ns=row["start_ns"],
        end_ns=row["end_ns"],
        attributes=row["attributes"],
        events=row["events"],
        links=row["links"],
        status_code=row["status_code"],
        status_message=row["status_message"],
        trace_state=row["trace_state"],
        resource=row["resource"],
        scope_name=row["scope_name"],
        scope_version=row["scope_version"],
    )


# --------------------------------------------------------------------------------------------
# the transport the pipeline uses when no endpoint is configured


class _Default:
    """Marks "take it from the configuration"."""


_DEFAULT = _Default()


def _header(headers: Mapping[str, str], name: str) -> str | None:
    for key, value in headers.items():
        if key.lower() == name:
            return value
    return None


class StoreTransport:
    """A Transport (see ``_transport.py``) that writes to the local store instead of a network.

    ``send`` decodes the request body and writes the spans in a worker thread, and returns 200
    only after the batch is committed; a body that does not decode gets a 400 (the pipeline
    counts it as rejected); a store that is busy or failing gets a 503, so the pipeline retries.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        max_age_days: float | _Default | None = _DEFAULT,
        max_bytes: int | _Default | None = _DEFAULT,
        max_decompressed_bytes: int = 1 << 30,
    ) -> None:
        self.path = Path(path)
        # Retention follows the configuration in force unless the caller says otherwise.
        cfg = _state.config
        if cfg is None and (isinstance(max_age_days, _Default) or isinstance(max_bytes, _Default)):
            from ._config import Config

            cfg = Config.from_env()
        self._max_age_days: float | None = (
            cfg.store_max_age_days
            if isinstance(max_age_days, _Default) and cfg is not None
            else (None if isinstance(max_age_days, _Default) else max_age_days)
        )
        self._max_bytes: int | None = (
            cfg.store_max_bytes
            if isinstance(max_bytes, _Default) and cfg is not None
            else (None if isinstance(max_bytes, _Default) else max_bytes)
        )
        self._max_decompressed = max_decompressed_bytes
        self._store: Store | None = None
        self._pid = os.getpid()
        self._init_lock = threading.Lock()

    @property
    def store(self) -> Store:
        """The Store, opened on first use (never on the event loop: ``send`` calls it in a
        worker thread)."""
        with self._init_lock:
            if self._pid != os.getpid():
                # Forked: SQLite connections must not cross a fork; open our own (the parent's
                # are left alone, not closed, since closing them here would touch its locks).
                self._store, self._pid = None, os.getpid()
            if self._store is None:
                self._store = Store(
                    self.path, max_age_days=self._max_age_days, max_bytes=self._max_bytes
                )
            return self._store

    def _send_sync(self, body: bytes, content_type: str, content_encoding: str | None) -> Any:
        from . import _otlp
        from ._transport import Response

        try:
            spans = _otlp.decode_request(
                body, content_type, content_encoding, self._max_decompressed
            )
        except _otlp.DecodeError as exc:
            return Response(400, {}, str(exc).encode())
        try:
            self.store.write(spans)
        except (sqlite3.OperationalError, StoreError) as exc:
            # Locked past the busy timeout, disk full, read-only: worth retrying later.
            return Response(503, {}, f"local store unavailable: {exc}".encode())
        return Response(200, {}, b"")

    async def send(self, body: bytes, headers: Mapping[str, str]) -> Any:
        """Decode and store one OTLP request; the Response comes after the commit."""
        from ._transport import off_loop

        content_type = _header(headers, "content-type") or "application/x-protobuf"
        content_encoding = _header(headers, "content-encoding")
        # off_loop writes inline when no thread can start any more (interpreter exit: Python
        # 3.12 refuses new threads before the exit flush runs).
        return await off_loop(self._send_sync, body, content_type, content_encoding)

    async def aclose(self) -> None:
        """Close the store's connections."""
        from ._transport import off_loop

        store, self._store = self._store, None
        if store is not None:
            await off_loop(store.close)
