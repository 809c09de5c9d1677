"""The store's tables, and the migrations that bring an older file forward.

``SCHEMA_VERSION`` is kept in the ``meta`` table; ``_MIGRATIONS[i]`` takes a file at version
``i`` to ``i + 1``. Opening a store runs the missing steps in one transaction, and refuses a
file written by a newer looptrace or an SQLite file that is not a store.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

from .._errors import StoreError as StoreError

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


# Version 2: who and what a trace is for, and what it cost. Per span, the facts a trace sums
# or groups by, picked out of the attributes on write (``write._prepare``) so that keeping the
# trace row up to date never parses JSON; per trace, their summary; and the tags and metadata
# the list filters by, one row per (trace, key, value).
_SCHEMA_V2 = """
ALTER TABLE spans ADD COLUMN session_id TEXT;
ALTER TABLE spans ADD COLUMN user_id TEXT;
ALTER TABLE spans ADD COLUMN span_type TEXT;
ALTER TABLE spans ADD COLUMN input_tokens INTEGER;
ALTER TABLE spans ADD COLUMN output_tokens INTEGER;
ALTER TABLE spans ADD COLUMN cost_usd REAL;
ALTER TABLE traces ADD COLUMN session_id TEXT;
ALTER TABLE traces ADD COLUMN user_id TEXT;
ALTER TABLE traces ADD COLUMN input_tokens INTEGER;
ALTER TABLE traces ADD COLUMN output_tokens INTEGER;
ALTER TABLE traces ADD COLUMN cost_usd REAL;
ALTER TABLE traces ADD COLUMN uncosted_calls INTEGER NOT NULL DEFAULT 0;
ALTER TABLE traces ADD COLUMN score_count INTEGER NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS traces_by_session ON traces (session_id, start_ns)
    WHERE session_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS traces_by_user ON traces (user_id, start_ns)
    WHERE user_id IS NOT NULL;
CREATE TABLE IF NOT EXISTS trace_labels (
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    trace_id TEXT NOT NULL,
    PRIMARY KEY (key, value, trace_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS trace_labels_by_trace ON trace_labels (trace_id)
"""


def _migrate_to_2(conn: sqlite3.Connection) -> None:
    _run_script(conn, _SCHEMA_V2)
    # Spans stored before version 2 get their columns from their attributes, once; the labels
    # and the trace rows are then rebuilt from them by the writer's own statements.
    from .write import backfill_v2

    backfill_v2(conn)


# Version 3: the search index (``search``): each distinct term once, and one row per (term,
# trace), a term being a span attribute's key and value or a word of a name, a value or an
# error message; a trace is named by its row in ``traces`` (appends, not splits).
_SCHEMA_V3 = """
CREATE TABLE IF NOT EXISTS search_terms (
    id INTEGER PRIMARY KEY,
    term TEXT NOT NULL UNIQUE
);
CREATE TABLE IF NOT EXISTS trace_terms (
    term_id INTEGER NOT NULL,
    trace_key INTEGER NOT NULL,
    PRIMARY KEY (term_id, trace_key)
) WITHOUT ROWID
"""


def _migrate_to_3(conn: sqlite3.Connection) -> None:
    _run_script(conn, _SCHEMA_V3)
    # The spans stored before version 3 are indexed once, here.
    from .write import backfill_v3

    backfill_v3(conn)


# Version 4: an experiment's cases (the roots that carry a case index) in case order, so its
# counts and a page of its cases far down read the cases alone, not their children's rows.
def _migrate_to_4(conn: sqlite3.Connection) -> None:
    conn.execute(
        "CREATE INDEX IF NOT EXISTS spans_case_roots ON spans (experiment_id, case_index, "
        "start_ns) WHERE parent_span_id IS NULL AND case_index IS NOT NULL"
    )


# Version 5: the lag monitor's summary spans by start (the lag page reads them by name), in
# place of an index of every span by name that no other read used and every insert paid for.
LAG_SPAN_NAME = "looptrace.loop.lag"


def _migrate_to_5(conn: sqlite3.Connection) -> None:
    conn.execute("DROP INDEX IF EXISTS spans_by_name")
    conn.execute(
        "CREATE INDEX IF NOT EXISTS spans_lag_summaries ON spans (start_ns) "
        f"WHERE name = '{LAG_SPAN_NAME}'"
    )


# _MIGRATIONS[i] takes a file at schema version i to version i + 1. Append, never edit.
_MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [
    _migrate_to_1,
    _migrate_to_2,
    _migrate_to_3,
    _migrate_to_4,
    _migrate_to_5,
]
SCHEMA_VERSION = len(_MIGRATIONS)


def migrate(conn: sqlite3.Connection, path: Path) -> None:
    """Bring the file on ``conn`` to ``SCHEMA_VERSION`` (or refuse it)."""
    version = read_version(conn)
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"{path} was written by a newer looptrace (schema version {version}; "
            f"this one understands up to {SCHEMA_VERSION}): upgrade looptrace"
        )
    if version == SCHEMA_VERSION:
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        # Another process may have migrated while we waited for the write lock.
        version = read_version(conn)
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


def read_version(conn: sqlite3.Connection) -> int:
    """The schema version of the file on ``conn`` (0: a new, empty file)."""
    conn.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
    # Both reads in one snapshot: another process may commit a migration between them.
    own = not conn.in_transaction
    if own:
        conn.execute("BEGIN")
    try:
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    finally:
        if own:
            conn.execute("COMMIT")
    if row is None:
        if tables - {"meta"}:
            raise StoreError(f"{conn_path(conn)} is an SQLite file but not a looptrace store")
        return 0
    return int(row[0])


def conn_path(conn: sqlite3.Connection) -> str:
    row = conn.execute("PRAGMA database_list").fetchone()
    return str(row[2]) if row else "the store"
