"""Retention: whole traces deleted, oldest first, past ``max_age_days`` or ``max_bytes``.

Checked at most once a minute, or when a tenth of ``max_bytes`` has been written since the
last check; never on every write. Deleting down to 90% of ``max_bytes`` leaves room for the
next writes; freed pages go back to the file system (``incremental_vacuum``).
"""

from __future__ import annotations

import sqlite3
import time

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
            for table in ("spans", "scores", "trace_labels", "traces"):
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
