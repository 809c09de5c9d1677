"""``Store``: one SQLite store file, its writer, its reads and its retention in one class."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .experiments import ExperimentReads
from .lag import LagReads
from .schema import SCHEMA_VERSION
from .sessions import SessionReads
from .traces import TraceReads
from .write import Writer

if TYPE_CHECKING:
    from .._config import Config


class Store(Writer, TraceReads, SessionReads, ExperimentReads, LagReads):
    """One SQLite store file. Thread-safe: any thread may read or write; writes are serialized.

    ``Store(path)`` opens lazily: nothing touches the disk until the first call. Readers use
    their own connections (WAL lets them read while a batch is being written).
    """

    @classmethod
    def from_config(cls, cfg: Config) -> Store:
        """A store at ``cfg.store_path`` with the configured retention."""
        return cls(
            cfg.store_path, max_age_days=cfg.store_max_age_days, max_bytes=cfg.store_max_bytes
        )

    def stats(self) -> dict[str, Any]:
        """Counts and sizes, for ``looptrace`` commands and the viewer."""
        with self._reader() as conn:
            traces, spans = conn.execute(
                "SELECT count(*), coalesce(sum(span_count), 0) FROM traces"
            ).fetchone()
            experiments = conn.execute("SELECT count(*) FROM experiments").fetchone()[0]
            sessions = conn.execute(
                "SELECT count(DISTINCT session_id) FROM traces WHERE session_id IS NOT NULL"
            ).fetchone()[0]
            used = self._used_bytes(conn)
        return {
            "path": str(self.path),
            "schema_version": SCHEMA_VERSION,
            "traces": traces,
            "spans": spans,
            "experiments": experiments,
            "sessions": sessions,
            "bytes": used,
        }
