"""Live pages: ``GET /api/changes``, which says whether the store changed since a cursor.

The viewer polls it (about once a second, never while its tab is hidden or its live toggle is
off) and re-reads what it shows only when the answer says something changed. The cursor is
SQLite's own change counter: ``PRAGMA data_version`` on one connection kept for this purpose
moves whenever *any* connection commits, this collector's writer or another process writing
the same file (a program that writes to the store directly). So:

- ingest pays nothing: the writer is not told, counted or queued for; with nobody watching,
  the connection is never even opened;
- viewers cost a bounded amount: no state per viewer, and the counter is read at most once per
  ``CHECK_INTERVAL`` whatever the number of viewers (the others get the last answer);
- a poll that finds nothing new is one PRAGMA (no read of the tables) and a 60-byte answer.

A cursor is ``<epoch>.<generation>``: the epoch changes when the collector restarts, so a
viewer's old cursor never matches by accident.
"""

from __future__ import annotations

import secrets
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from ._internals import Store

__all__ = ["CHECK_INTERVAL", "ChangeWatcher", "routes"]

# Seconds between two reads of the change counter, whatever the number of viewers.
CHECK_INTERVAL = 0.1


class ChangeWatcher:
    """The store's change counter, read through one connection of its own (opened on the first
    check, closed by ``close``). Thread-safe."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._version: int | None = None
        self._generation = 0
        self._checked = float("-inf")
        self._epoch = secrets.token_hex(4)
        self._closed = False

    def cursor(self) -> str:
        """The current cursor; it differs from an earlier one if the store changed in between
        (seen at most ``CHECK_INTERVAL`` late). Blocking: call it from a worker thread."""
        with self._lock:
            now = time.monotonic()
            if now - self._checked >= CHECK_INTERVAL and not self._closed:
                if self._conn is None:
                    self._conn = sqlite3.connect(
                        self.path, timeout=10.0, isolation_level=None, check_same_thread=False
                    )
                version = self._conn.execute("PRAGMA data_version").fetchone()[0]
                if version != self._version:
                    self._version = version
                    self._generation += 1
                self._checked = now
            return f"{self._epoch}.{self._generation}"

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._conn is not None:
                self._conn.close()
                self._conn = None


async def _api_changes(request: Request) -> Response:
    from .api import JSONResponse

    watcher: ChangeWatcher = request.app.state.changes
    store: Store = request.app.state.store
    since = request.query_params.get("cursor") or ""
    trace_id = (request.query_params.get("trace") or "").lower() or None

    def read() -> dict[str, Any]:
        cursor = watcher.cursor()
        changed = cursor != since
        out: dict[str, Any] = {"cursor": cursor, "changed": changed}
        # The open trace's summary, so that a page re-reads its spans only when they changed.
        if trace_id is not None and changed:
            out["trace"] = store.get_trace_summary(trace_id)
        return out

    return JSONResponse(await anyio.to_thread.run_sync(read))


def routes() -> list[BaseRoute]:
    """``/api/changes``; the app keeps its ``ChangeWatcher`` at ``app.state.changes``."""
    from .api import _api

    return [Route("/api/changes", _api(_api_changes), methods=["GET"])]
