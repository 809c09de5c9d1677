"""Retention: whole traces deleted, oldest first, past ``max_age_days`` or ``max_bytes``.

Checked at most once a minute, or when a tenth of ``max_bytes`` has been written since the
last check; never on every write. Deleting down to 90% of ``max_bytes`` leaves room for the
next writes; freed pages go back to the file system (``incremental_vacuum``).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from typing import Any

from . import search
from .connection import Connections

_PRUNE_INTERVAL_S = 60.0
_PRUNE_BATCH = 500


class Retention(Connections):
    """``Store.prune`` and the check the writer makes after each commit."""

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

    def delete_traces(self, trace_ids: Sequence[str]) -> int:
        """Delete these traces (every span, score, label and index row); returns how many
        existed. An experiment left without traces goes with them."""
        deleted = 0
        for start in range(0, len(trace_ids), _PRUNE_BATCH):
            chunk = list(trace_ids[start : start + _PRUNE_BATCH])
            with self._write_lock:
                deleted += self._delete_traces(self._writer_conn(), chunk)
        return deleted

    def delete_experiment(self, experiment_id: str) -> int | None:
        """Delete an experiment and every trace of it; returns how many traces went, or None
        when there is no such experiment."""
        with self._reader() as conn:
            known = conn.execute(
                "SELECT 1 FROM experiments WHERE id = ?", (experiment_id,)
            ).fetchone()
            ids = [
                r[0]
                for r in conn.execute(
                    "SELECT DISTINCT trace_id FROM spans WHERE experiment_id = ?",
                    (experiment_id,),
                )
            ]
        if known is None and not ids:
            return None
        deleted = self.delete_traces(ids)
        with self._write_lock:
            conn = self._writer_conn()
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute("DELETE FROM scores WHERE experiment_id = ?", (experiment_id,))
                conn.execute("DELETE FROM experiments WHERE id = ?", (experiment_id,))
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        return deleted

    def experiment_ids_named(self, name: str) -> list[str]:
        """The ids of the experiments (runs) called ``name``, oldest first."""
        with self._reader() as conn:
            return [
                r[0]
                for r in conn.execute(
                    "SELECT id FROM experiments WHERE name = ? ORDER BY created_ns", (name,)
                )
            ]

    def prune_traces(
        self,
        *,
        before_ns: int | None = None,
        service: str | None = None,
        experiment: str | None = None,
        dry_run: bool = False,
    ) -> dict[str, int]:
        """Delete the traces that started before ``before_ns``, of ``service`` (the root's
        service) and of ``experiment``: every filter given must hold. Deletes in batches of
        500 traces, each its own short transaction, so a collector writing to the same file
        waits at most one batch. With ``dry_run``, only counts. Returns ``traces`` and
        ``spans`` deleted (or that would be). Refuses (ValueError) without any filter."""
        if before_ns is None and service is None and experiment is None:
            raise ValueError("prune needs at least one of before_ns, service, experiment")
        where: list[str] = []
        params: list[Any] = []
        if before_ns is not None:
            where.append("start_ns < ?")
            params.append(before_ns)
        if service is not None:
            where.append("service_name = ?")
            params.append(service)
        if experiment is not None:
            where.append("experiment_id = ?")
            params.append(experiment)
        sql = (
            "SELECT trace_id, span_count FROM traces WHERE "
            + " AND ".join(where)
            + " ORDER BY start_ns LIMIT ?"
        )
        traces = spans = 0
        if dry_run:
            with self._reader() as conn:
                traces, spans = conn.execute(
                    "SELECT count(*), coalesce(sum(span_count), 0) FROM traces WHERE "
                    + " AND ".join(where),
                    params,
                ).fetchone()
            return {"traces": traces, "spans": spans}
        while True:
            with self._write_lock:
                conn = self._writer_conn()
                rows = conn.execute(sql, (*params, _PRUNE_BATCH)).fetchall()
                if not rows:
                    break
                self._delete_traces(conn, [r[0] for r in rows])
            traces += len(rows)
            spans += sum(r[1] for r in rows)
        if traces:
            with self._write_lock:
                self._writer_conn().execute("PRAGMA incremental_vacuum")
        return {"traces": traces, "spans": spans}

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
            search.forget_traces(conn, trace_ids)
            for table in ("spans", "scores", "trace_labels", "traces"):
                existed = conn.executemany(
                    f"DELETE FROM {table} WHERE trace_id = ?", [(t,) for t in trace_ids]
                ).rowcount
            conn.execute(
                "DELETE FROM experiments WHERE id NOT IN "
                "(SELECT experiment_id FROM traces WHERE experiment_id IS NOT NULL)"
            )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return int(existed)
