"""How looptrace treats its own failures: never raise into user code, but never hide them.

Each distinct failure site is logged once (with its traceback) and counted; the counts are part
of ``looptrace.statistics()``. Under the project's own tests (``LOOPTRACE_RAISE_INTERNAL_ERRORS``)
they are re-raised so a bug cannot pass unnoticed.
"""

from __future__ import annotations

import logging
import os
import threading
import traceback
import types
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
        # Formatted here rather than by logging's exc_info, which draws the ^^^ markers
        # (see format_exception).
        trace = f"\n{format_exception(exc)}" if exc is not None else ""
        logger.warning("looptrace internal error in %s (logged once)%s", where, trace.rstrip())
    if raise_internal_errors and exc is not None:
        raise exc


class LoopTraceError(Exception):
    """Base class of the errors looptrace raises on purpose (bad configuration, misuse)."""


class ConfigurationError(LoopTraceError, ValueError):
    """A setting, from code or from the environment, has an invalid value. The message names
    the variable and the value the user set; ``field`` is the :class:`~looptrace.Config`
    field concerned, where there is one."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


def report_internal(where: str, exc: BaseException) -> None:
    """:func:`internal_error` for background work (the flusher, its exporter): re-raising there
    under looptrace's own tests would only end a task, so the error is logged and counted."""
    try:
        internal_error(where, exc)
    except Exception:
        pass


def format_exception(exc: BaseException, tb: types.TracebackType | None = None) -> str:
    """``traceback.format_exception`` without the ``^^^^`` markers under each line.

    The markers come from parsing the line's source with ``ast``. CPython 3.11 keeps that
    parser's recursion counter per interpreter, not per thread: a parse on looptrace's
    thread while another thread parses (pytest's report, ``logging.exception``, assertion
    rewriting) makes one of them fail with ``SystemError: AST constructor recursion depth
    mismatch``. Frames without column positions are formatted without parsing anything, on
    every Python; the file, line, function and source line are all still there."""
    te = traceback.TracebackException(
        type(exc), exc, tb if tb is not None else exc.__traceback__, compact=True
    )
    seen: set[int] = set()
    todo = [te]
    while todo:
        t = todo.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        for frame in t.stack:
            if hasattr(frame, "colno"):  # 3.11 and later
                frame.colno = None
                setattr(frame, "end_colno", None)  # noqa: B010 - typeshed lacks it on 3.10
        todo.extend(x for x in (t.__cause__, t.__context__) if x is not None)
        todo.extend(getattr(t, "exceptions", None) or ())  # exception groups (3.11)
    return "".join(te.format())
