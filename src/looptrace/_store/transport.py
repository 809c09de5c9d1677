"""The transport the pipeline uses when no endpoint is configured: requests into the store."""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .. import _state
from .schema import StoreError
from .store import Store


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
            from .._config import Config

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
        from .. import _otlp
        from .._transport import Response

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
        from .._transport import off_loop

        content_type = _header(headers, "content-type") or "application/x-protobuf"
        content_encoding = _header(headers, "content-encoding")
        # off_loop writes inline when no thread can start any more (interpreter exit: Python
        # 3.12 refuses new threads before the exit flush runs).
        return await off_loop(self._send_sync, body, content_type, content_encoding)

    async def aclose(self) -> None:
        """Close the store's connections."""
        from .._transport import off_loop

        store, self._store = self._store, None
        if store is not None:
            await off_loop(store.close)
