"""The typed snapshots the export stage reports: ``looptrace.statistics()`` and what a flush
achieved."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Mapping

from .buffer import DROP_REASONS

__all__ = ["DropLog", "FlushResult", "OffloadStatistics", "SpoolStatistics", "Statistics"]

logger = logging.getLogger("looptrace")

# Drops are logged at most this often (per reason), with the count since the last line.
DROP_LOG_INTERVAL = 10.0


@dataclasses.dataclass(frozen=True)
class OffloadStatistics:
    """What the worker processes did (``looptrace.statistics().offload``).

    ``offloaded`` counts spans a worker serialized (and sent, over OTLP/HTTP); ``fallbacks``
    counts, by reason, large spans serialized in the application's process instead:
    ``unpicklable``, ``worker_error``, ``broken_pool``, ``pool_retired``, ``unavailable``,
    ``shutdown``, ``workers_busy`` (the workers already had their share queued).
    ``workers_alive`` is how many worker processes are running now."""

    offloaded: int = 0
    fallbacks: Mapping[str, int] = dataclasses.field(default_factory=dict)
    workers_alive: int = 0


@dataclasses.dataclass(frozen=True)
class SpoolStatistics:
    """The spool on disk (``looptrace.statistics().spool``): where it is (None: no spool, as
    for the local store or with ``LOOPTRACE_SPOOL=false``), what this process wrote to it and
    sent from it, and what it removed from it unsent, by reason: ``spool_full`` (past
    ``LOOPTRACE_SPOOL_MAX_BYTES``, oldest first), ``spool_expired`` (older than
    ``LOOPTRACE_SPOOL_MAX_AGE_HOURS``), ``corrupt`` (set aside in ``corrupt/``), ``rejected``
    (the backend refused a replayed request for good). Spans of other processes' files count
    in the process that removed them."""

    directory: str | None = None
    spooled: int = 0
    replayed: int = 0
    dropped: Mapping[str, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Statistics:
    """A snapshot of the pipeline's counters (``looptrace.statistics()``)."""

    queued_spans: int = 0
    queued_bytes: int = 0
    in_flight_spans: int = 0
    in_flight_bytes: int = 0
    requests_sent: int = 0
    requests_failed: int = 0
    retries: int = 0
    spans_sent: int = 0
    dropped: Mapping[str, int] = dataclasses.field(
        default_factory=lambda: dict.fromkeys(DROP_REASONS, 0)
    )
    last_error: str | None = None
    internal_errors: Mapping[str, int] = dataclasses.field(default_factory=dict)
    offload: OffloadStatistics = dataclasses.field(default_factory=OffloadStatistics)
    # Written to the spool instead of being dropped (not sent, not lost), and sent from it.
    spooled: int = 0
    replayed: int = 0
    spool: SpoolStatistics = dataclasses.field(default_factory=SpoolStatistics)

    @property
    def dropped_total(self) -> int:
        return sum(self.dropped.values())


@dataclasses.dataclass(frozen=True)
class FlushResult:
    """What a flush achieved for the spans that had ended before it was called.

    ``sent``, ``dropped``, ``spooled`` and ``replayed`` count what happened while the call
    waited (spans of other batches included); ``pending`` is how many of the awaited spans
    were still unsent at return. A spooled span is neither sent nor lost: it waits on disk
    for a later delivery.
    """

    sent: int
    dropped: Mapping[str, int]
    pending: int
    spooled: int = 0
    replayed: int = 0

    @property
    def ok(self) -> bool:
        """True when every awaited span was delivered: none pending, none dropped and none
        spooled meanwhile (a spooled span is kept, but not delivered yet)."""
        return self.pending == 0 and self.spooled == 0 and not any(self.dropped.values())

    @property
    def lost(self) -> int:
        """Spans dropped meanwhile: gone for good (spooled ones are not)."""
        return sum(self.dropped.values())


class DropLog:
    """Says on the ``looptrace`` logger that spans were dropped, at most every
    :data:`DROP_LOG_INTERVAL` per reason, with the count since the last line; whatever is left
    unsaid is said at shutdown."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._log: dict[str, tuple[float, int]] = {}
        self._muted = False

    def mute(self) -> None:
        """From now on count only: the caller says what was lost in a line of its own (the
        exit's)."""
        self._muted = True

    def dropped(self, reason: str, count: int) -> None:
        if self._muted:
            return
        now = time.monotonic()
        with self._lock:
            last, unreported = self._log.get(reason, (0.0, 0))
            unreported += count
            if now - last >= DROP_LOG_INTERVAL:
                self._log[reason] = (now, 0)
                report = unreported
            else:
                self._log[reason] = (last, unreported)
                report = 0
        if report:
            logger.warning(
                "looptrace dropped %d span(s): %s (see looptrace.statistics(); logged at most "
                "every %gs)",
                report,
                reason.replace("_", " "),
                DROP_LOG_INTERVAL,
            )

    def close(self) -> None:
        with self._lock:
            unreported = {r: n for r, (_, n) in self._log.items() if n and not self._muted}
            self._log.clear()
        for reason, count in unreported.items():
            logger.warning(
                "looptrace dropped %d more span(s): %s (since the last report)",
                count,
                reason.replace("_", " "),
            )
