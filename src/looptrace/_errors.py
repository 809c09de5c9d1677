"""looptrace's exceptions, all of them, and how it treats its own failures.

Tracing never raises into the code it watches: a failure inside looptrace is logged once and
counted (:func:`internal_error`), never raised. The exceptions below are either raised on
purpose to code that asked looptrace for something (``configure()``, the CLI, the collector's
``serve``) or carried inside looptrace, from where a failure happens to where it is counted
under a reason (a drop reason in ``statistics()``, an HTTP status the collector answers).

What user code can catch::

    LoopTraceError                  raised on purpose; ``looptrace.LoopTraceError``
    ├── ConfigurationError          (also ValueError) a setting's value cannot be used; names
    │                               the variable and the value
    ├── StoreError                  the local store's file cannot be used (newer schema, not a
    │                               looptrace store)
    ├── CannotListen                (also OSError) ``looptrace serve``: the address is taken,
    │                               not this machine's, or not permitted
    └── MissingServerExtra          (also ImportError) the collector's packages are missing

What never leaves looptrace (each ends as a counted reason, a status, or a retry)::

    OSError
    ├── RequestHeadersError         a headers provider raised or gave an unsendable header
    └── ConnectionError
        ├── ProtocolError           the answer was not HTTP/1.1 this client reads, or passed
        │                           a bound
        └── Unanswered              the connection ended before a byte of the answer (a
                                    reused connection the server had closed: retried once)
    ValueError
    ├── DecodeError                 the collector got a body that is not OTLP: 400
    │   ├── TooManySpans            more spans than one request may hold: 413
    │   └── BodyTooLarge            decompresses past the bound: 413
    └── BadRequest                  the viewer's API got a parameter it cannot use: 400
    Exception
    ├── WorkerGone                  an encoding worker died or its pool closed: encode here
    ├── WorkerError                 the work raised inside a worker (which lives on)
    └── SpoolCorrupt                a spool file that does not read back whole: set aside

The internal-error path is separate from all of these: :func:`internal_error` and
:func:`report_internal` count a failure that is looptrace's own bug (by where it happened) and
log it once with its traceback; ``statistics().internal_errors`` shows the counts. Under the
project's own tests (``LOOPTRACE_RAISE_INTERNAL_ERRORS``) they are re-raised, so a bug cannot
pass unnoticed.
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


class StoreError(LoopTraceError):
    """The store file cannot be used (written by a newer looptrace, not a looptrace store...)."""


class CannotListen(LoopTraceError, OSError):
    """The collector's address cannot be listened on (taken, not this machine's, no permission)."""


class MissingServerExtra(LoopTraceError, ImportError):
    """starlette, uvicorn or opentelemetry-proto is not installed."""


# -- carried inside looptrace, never raised into user code -----------------------------------


class RequestHeadersError(OSError):
    """The settings' ``headers_provider`` raised, or returned a header that cannot go in a
    request head: the request is not made, and counts as failed (an OSError, as every failure
    to get an answer is)."""


class ProtocolError(ConnectionError):
    """The server's answer was not HTTP/1.1 this client reads, or passed one of its bounds
    (an OSError, as every failure to get an answer is)."""


class Unanswered(ConnectionError):
    """The connection ended before the first byte of an answer."""


class DecodeError(ValueError):
    """A request body is not valid OTLP (bad protobuf, bad JSON, bad compression, too large)."""


class TooManySpans(DecodeError):
    """A request holds more spans than the receiver takes in one request."""


class BodyTooLarge(DecodeError):
    """A request body decompresses to more than the receiver takes."""


class BadRequest(ValueError):
    """A parameter of the viewer's API that cannot be used (answered 400 with the message)."""


class WorkerGone(Exception):
    """The answer will not come: a worker died (``reason == "broken"``) or the pool was closed
    (``"shutdown"``)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class WorkerError(Exception):
    """The call raised inside the worker, which lives on. The message names the error."""


class SpoolCorrupt(Exception):
    """A spool file that does not read back (cut short, bad header, wrong checksum)."""


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
