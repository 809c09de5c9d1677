"""How looptrace treats its own failures: never raise into user code, but never hide them.

Each distinct failure site is logged once (with its traceback) and counted; the counts are part
of ``looptrace.statistics()``. Under the project's own tests (``LOOPTRACE_RAISE_INTERNAL_ERRORS``)
they are re-raised so a bug cannot pass unnoticed.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import Counter

logger = logging.getLogger("looptrace")

_lock = threading.Lock()
_seen: set[str] = set()
counts: Counter[str] = Counter()
raise_internal_errors = os.environ.get("LOOPTRACE_RAISE_INTERNAL_ERRORS", "").lower() in {
    "1",
    "true",
    "yes",
}


def internal_error(where: str, exc: BaseException | None = None) -> None:
    """Record a failure inside looptrace; log it the first time ``where`` fails."""
    with _lock:
        counts[where] += 1
        first = where not in _seen
        _seen.add(where)
    if first:
        logger.warning("looptrace internal error in %s (logged once)", where, exc_info=exc)
    if raise_internal_errors and exc is not None:
        raise exc


class LoopTraceError(Exception):
    """Base class of the errors looptrace raises on purpose (bad configuration, misuse)."""


class ConfigurationError(LoopTraceError, ValueError):
    """A setting, from code or from the environment, has an invalid value."""


def report_internal(where: str, exc: BaseException) -> None:
    """:func:`internal_error` for background work (the flusher, its exporter): re-raising there
    under looptrace's own tests would only end a task, so the error is logged and counted."""
    try:
        internal_error(where, exc)
    except Exception:
        pass
