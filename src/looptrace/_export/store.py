"""The local store's exporter (no endpoint configured): spans go into SQLite as the rows the
collector would have made of them, with no OTLP encoding, compression or decoding between.

    encode:  to_wire(span) -> WireSpan              on the flusher's loop, in ~0.5 ms slices
    export:  decoded(wire) -> Store.write(rows)     in a worker thread; SENT after the commit

The loop does only what must happen there (reading the span's values, which the application
may still hold); the decoded form the store reads is made in the writer's thread.

A store that is locked past its busy timeout, full or read-only answers RETRY, so the flusher
backs off and tries again, as for a backend that is down.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import threading
from collections.abc import Sequence, Sized
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._transport import off_loop
from .._wire import DecodedSpan, WireSpan
from .exporter import SENT, Outcome, Verdict, encode_each
from .stats import OffloadStatistics

if TYPE_CHECKING:
    from .._capture.spans import Span
    from .._config import Config
    from .._store import Store

__all__ = ["StoreExporter", "decoded"]


class Row:
    """A span on its way to the store, and what it weighs in a batch."""

    __slots__ = ("nbytes", "wire")

    def __init__(self, wire: WireSpan, nbytes: int) -> None:
        self.wire = wire
        self.nbytes = nbytes

    def __len__(self) -> int:
        return self.nbytes


class StoreExporter:
    """Writes to the SQLite store at ``cfg.store_path``, with the retention the configuration
    sets (``store_max_age_days``, ``store_max_bytes``)."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.path = Path(cfg.store_path)
        self._estimate: Any = None
        self._to_wire: Any = None
        self._to_wire_or_steps: Any = None

    def __repr__(self) -> str:
        return f"StoreExporter({str(self.path)!r})"

    def loaded_cheaply(self) -> bool:
        serialize = sys.modules.get("looptrace._serialize")
        return serialize is not None and bool(serialize.has_policy(self.cfg))

    def load(self) -> None:
        from .. import _otlp, _serialize

        resource = _otlp.default_resource(self.cfg)
        self._resource = dict(resource.attributes)
        self._scope = (resource.scope_name, resource.scope_version)
        self._estimate = _serialize.estimate_size
        self._to_wire = _serialize.to_wire
        self._to_wire_or_steps = _serialize.to_wire_or_steps

    def estimate(self, span: Span) -> int:
        return int(self._estimate(span))

    async def encode(self, spans: Sequence[Span]) -> list[Sized | None]:
        cfg, wire = self.cfg, self._to_wire_or_steps
        return await encode_each(spans, lambda span: wire(span, cfg), self._row)

    def encode_open(self, span: Span) -> Sized:
        return self._row(self._to_wire(span, self.cfg))

    def _row(self, wire: WireSpan) -> Row:
        # Weighed from the wire shape just made: the estimate made when the span was queued
        # walked the same values once already.
        return Row(wire, wire.weight())

    def session(self) -> _Session:
        return _Session(self)

    def offload_statistics(self) -> OffloadStatistics:
        return OffloadStatistics()

    def shutdown(self) -> None:
        pass


class _Session:
    """One connection set to the store per flusher, opened in a worker thread at first use."""

    def __init__(self, exporter: StoreExporter) -> None:
        self._exporter = exporter
        self._store: Store | None = None
        self._pid = os.getpid()
        self._lock = threading.Lock()

    @property
    def store(self) -> Store:
        from .._store import Store

        with self._lock:
            if self._pid != os.getpid():
                # Forked: SQLite connections must not cross a fork; open our own (the parent's
                # are left alone, not closed, since closing them here would touch its locks).
                self._store, self._pid = None, os.getpid()
            if self._store is None:
                cfg = self._exporter.cfg
                self._store = Store(
                    self._exporter.path,
                    max_age_days=cfg.store_max_age_days,
                    max_bytes=cfg.store_max_bytes,
                )
            return self._store

    def _write(self, wires: list[WireSpan]) -> Outcome:
        from .._store import StoreError

        exporter = self._exporter
        resource, scope = exporter._resource, exporter._scope
        try:
            self.store.write([decoded(w, resource, scope) for w in wires])
        except (sqlite3.OperationalError, StoreError) as exc:
            # Locked past the busy timeout, disk full, read-only: worth retrying later.
            return Outcome(Verdict.RETRY, "local store unavailable", str(exc))
        return SENT

    async def export(self, chunks: Sequence[Sized]) -> Outcome:
        rows = [c.wire for c in chunks if isinstance(c, Row)]
        # off_loop writes inline when no thread can start any more (interpreter exit: Python
        # 3.12 refuses new threads before the exit flush runs).
        return await off_loop(self._write, rows)

    async def aclose(self) -> None:
        store, self._store = self._store, None
        if store is not None:
            await off_loop(store.close)


def decoded(wire: WireSpan, resource: dict[str, Any], scope: tuple[str, str]) -> DecodedSpan:
    """``wire`` as a receiver decodes it from OTLP: what the store keeps."""
    scope_name, scope_version = wire.scope or scope
    parent = wire.parent_span_id
    # Ids as lowercase hex, zero-padded: bytes.hex() does it at half the cost of a format spec.
    return DecodedSpan(
        trace_id=wire.trace_id.to_bytes(16, "big").hex(),
        span_id=wire.span_id.to_bytes(8, "big").hex(),
        parent_span_id=parent.to_bytes(8, "big").hex() if parent else None,
        name=wire.name,
        kind=wire.kind,
        start_ns=wire.start_ns,
        end_ns=wire.end_ns,
        attributes=_attributes(wire.attributes),
        events=[
            {"name": e.name, "time_ns": e.time_ns, "attributes": _attributes(e.attributes)}
            for e in wire.events
        ]
        if wire.events
        else [],
        links=[
            {
                "trace_id": f"{link.trace_id:032x}",
                "span_id": f"{link.span_id:016x}",
                "trace_state": link.trace_state,
                "attributes": _attributes(link.attributes),
            }
            for link in wire.links
        ]
        if wire.links
        else [],
        status_code=wire.status_code,
        status_message=wire.status_message,
        trace_state=wire.trace_state,
        resource=resource,
        scope_name=scope_name,
        scope_version=scope_version,
    )


def _attributes(attributes: Sequence[tuple[str, Any]]) -> dict[str, Any]:
    # Arrays arrive as lists, as a decoder makes them; a later key wins, as in a decoder.
    return {k: list(v) if isinstance(v, tuple) else v for k, v in attributes}
