"""The export stage: spans that end go to a buffer, a flusher batches them, an exporter sends
them (OTLP/HTTP, or the local store when no endpoint is set).

    capture --(_state.sink: on_start/on_end)--> Pipeline = Flusher (buffer, homes, retries)
                                                    --> Exporter (otlp_http, store, memory)

This module is where the stages are wired: capture never imports export; this module installs
itself as capture's sink (``STARTS_PIPELINE``: the first span starts a pipeline from the
configuration in force) and registers with ``_state`` what capture calls back. The functions
here (``configure``, ``flush``, ``shutdown``, ``statistics``...) act on the one pipeline
installed as ``_state.sink``.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import sys
import threading
from typing import TYPE_CHECKING, Any

from .. import _errors, _state
from .._config import Config
from . import flusher
from .buffer import DROP_REASONS
from .first_span import Deferred
from .lag_hook import (
    LagMonitorHook,
    _monitor_loop_ends,
    _wire_lag_monitor,
    register_lag_monitor,
)
from .pipeline import Pipeline
from .stats import FlushResult, OffloadStatistics, Statistics

if TYPE_CHECKING:
    from .._capture.spans import Span

logger = logging.getLogger("looptrace")

_lock = threading.RLock()
_pipeline: Pipeline | None = None
_atexit_registered = False


class StartsPipeline:
    """The sink until a pipeline runs: the first span starts one from the configuration in
    force, which then replaces this as the sink (or, when looptrace is disabled or its
    settings cannot be used, the sink that drops spans without a pipeline)."""

    def on_start(self, span: Span) -> None:
        _first_sink().on_start(span)

    def on_end(self, span: Span) -> None:
        _first_sink().on_end(span)


STARTS_PIPELINE = StartsPipeline()


class Misconfigured:
    """The sink while the settings in the environment cannot be used: one line says which
    variable and why, when the first span needs them; every span that ends is counted as
    dropped (``invalid_config``), so ``statistics()`` and ``flush()`` tell the truth. A later
    ``configure()`` with valid settings replaces it."""

    def __init__(self, error: _errors.ConfigurationError) -> None:
        self.error = str(error)
        self.dropped = 0
        logger.warning("looptrace: %s; no span is exported until it is fixed", self.error)

    def on_start(self, span: Span) -> None:
        pass

    def on_end(self, span: Span) -> None:
        self.dropped += 1

    def dropped_by_reason(self) -> dict[str, int]:
        return {**dict.fromkeys(DROP_REASONS, 0), "invalid_config": self.dropped}


def _first_sink(defer: bool = True) -> _state.Sink:
    """The sink for spans once the first one needs the settings (see StartsPipeline). On a
    running loop the span waits and the settings are read, and the pipeline built, on the
    loop's next turn (first_span.Deferred): the environment scan costs a first traced call as
    much as the rest of its span, and a callback of looptrace's own frames is charged to
    looptrace, not to the user's code."""
    with _lock:
        loop = asyncio._get_running_loop() if defer else None
        if (loop is None or _monitor_from_first_span) and _state.sink is STARTS_PIPELINE:
            # May install the disabled or the misconfigured sink. With the lag monitor on, the
            # settings it starts with are read now, so that it measures this very span.
            get_config()
        sink = _state.sink
        if sink is not STARTS_PIPELINE:
            return sink
        if loop is not None:
            deferred = _state.sink = Deferred(lambda: _start_deferred(deferred))
            loop.call_soon(deferred.run)
            return deferred
        return _get_or_create()


def _start_deferred(deferred: Deferred) -> _state.Sink:
    with _lock:
        if _state.sink is deferred:
            _state.sink = STARTS_PIPELINE
        return _first_sink(defer=False)


def _started() -> Pipeline | None:
    """The installed pipeline, built now if the first span's waits for the loop's next turn."""
    sink = _state.sink
    if isinstance(sink, Deferred):
        sink.run()
    return _pipeline


def _get_or_create() -> Pipeline:
    global _pipeline, _atexit_registered
    with _lock:
        pipeline = _pipeline
        if pipeline is None or pipeline.lifecycle.closed:
            # get_config() raises ConfigurationError when the environment cannot be used: the
            # caller (the first span's sink, or flush) decides what that means for it.
            pipeline = _pipeline = Pipeline(get_config())
            _state.sink = pipeline
            if not _atexit_registered:
                atexit.register(_at_exit)
                _atexit_registered = True
        return pipeline


def install(pipeline: Pipeline) -> Pipeline:
    """Make ``pipeline`` the process-wide one (tests use this to inject a transport)."""
    global _pipeline, _atexit_registered
    with _lock:
        old, _pipeline = _pipeline, pipeline
        _state.apply_config(pipeline.cfg)
        _state.sink = pipeline
        if not _atexit_registered:
            atexit.register(_at_exit)
            _atexit_registered = True
    if old is not None and old is not pipeline:
        old.close_soon()
    return pipeline


def current() -> Pipeline | None:
    """The installed pipeline, if one was created."""
    return _started()


def configure(**overrides: Any) -> Config:
    """Apply settings (environment first, then ``overrides``) and return them.

    A pipeline already running is replaced: it sends what it holds (within its shutdown
    timeout) in the background, and the next span starts the new one.
    """
    global _pipeline
    cfg = Config.from_env(**overrides)
    with _lock:
        _state.apply_config(cfg)
        old, _pipeline = _pipeline, None
        # Disabled: nothing is recorded or sent, and no pipeline is ever started.
        _state.sink = _state.NullSink() if cfg.disabled else STARTS_PIPELINE
    if old is not None:
        old.close_soon()
    if not cfg.disabled:
        _prepare(cfg)
    return cfg


def _prepare(cfg: Config) -> None:
    # A start-up step: import the export modules here, once, rather than in a worker thread
    # during the first drain, where an import holds the GIL against the application's loop
    # for tens of milliseconds.
    global _prepared_for
    if cfg is _prepared_for:
        # Config.from_env() returns the same settings while the variables are unchanged: the
        # first span's configure() would redo @traced's preparation (60 us for an endpoint).
        return
    from .. import _serialize
    from .._otlp import span_encoder  # noqa: F401

    _serialize.policy(cfg)  # compiles the redaction patterns, 3-4 ms
    if cfg.offload:
        from .._offload import parent  # noqa: F401
    if cfg.endpoint is not None:
        from .._transport import load_client
        from .._transport.settings import HttpSettings
        from . import otlp_http  # noqa: F401

        if cfg.spool:
            from . import spool  # noqa: F401
        load_client(HttpSettings.from_config(cfg))
    else:
        # The pipeline is built when the first span starts, on the caller's thread: importing
        # the exporter (sqlite3 with it) there cost the first traced call 6-7 ms.
        from . import store  # noqa: F401
    _prepared_for = cfg


_prepared = False
_prepared_for: Config | None = None
# The settings read as @traced decorated turn the lag monitor on (see _first_sink).
_monitor_from_first_span = False


def prepare_ahead() -> None:
    """Do the export path's start-up now (imports, the redaction patterns of the settings in
    the environment), without applying any settings: ``@traced`` calls it when it decorates,
    which is usually at import time, so that the first traced call, perhaps on a busy event
    loop, costs what every other call costs. Once per process; never raises."""
    global _prepared
    if _prepared or _state.config is not None:
        return
    _prepared = True
    try:
        cfg = Config.from_env()
    except Exception:
        return  # a bad setting is reported where the settings are applied, not here
    # The first spans are recorded with these switches (LOOPTRACE_DISABLED: none at all); the
    # settings themselves are applied, in full, when something asks for them, and the spans
    # that waited for the pipeline are held to them then (first_span.Deferred).
    global _monitor_from_first_span
    _state.apply_switches(cfg)
    _monitor_from_first_span = cfg.lag_monitor
    if not cfg.disabled:
        _prepare(cfg)
        _rehearse_first_span()


def _rehearse_first_span() -> None:
    """Run the first span's steps once, with a span no sink sees: the first run of each (C
    functions bound by the dynamic linker on first call, code and data touched for the first
    time) cost a first traced call ten times its own work; here no loop waits for it."""
    from .. import _clock
    from .._capture.spans import Span

    span = Span(
        "looptrace.rehearsal", _clock.new_trace_id(), _clock.new_span_id(), 0, _clock.now_ns()
    )
    span.end_ns = _clock.now_ns()
    rehearsal = Deferred(_state.NullSink)
    rehearsal.on_start(span)
    rehearsal.on_end(span)
    rehearsal.run()


def get_config() -> Config:
    """The settings in force (read from the environment on first use).

    Never raises: when the environment holds a value looptrace cannot use, one line on the
    ``looptrace`` logger names the variable and its value, the defaults stand in for the
    callers that read settings, and every span is counted as dropped (``invalid_config``)
    until a ``configure()`` with usable settings. ``configure()`` itself raises
    :class:`~looptrace.ConfigurationError`: whoever calls it can act on it."""
    cfg = _state.config
    if cfg is not None:
        return cfg
    try:
        return configure()
    except _errors.ConfigurationError as exc:
        with _lock:
            cfg = _state.config
            if cfg is None:
                cfg = Config()
                _state.apply_config(cfg)
                _state.sink = Misconfigured(exc)
        return cfg


def _no_pipeline() -> FlushResult:
    """What a flush achieves with no pipeline: nothing pending, and, with settings that cannot
    be used, every span dropped so far (so ``ok`` is False)."""
    sink = _state.sink
    if isinstance(sink, Misconfigured):
        return FlushResult(0, sink.dropped_by_reason(), 0)
    return FlushResult(0, dict.fromkeys(DROP_REASONS, 0), 0)


async def flush(timeout: float | None = None) -> FlushResult:
    """Wait until every span ended before this call is sent (or dropped), at most ``timeout``
    seconds; never blocks the event loop. Returns what happened and what is still pending."""
    pipeline = _started()
    if pipeline is None:
        return _no_pipeline()
    return await pipeline.flush(timeout)


def flush_sync(timeout: float | None = None) -> FlushResult:
    """:func:`flush` for synchronous code (blocks the calling thread, never deadlocks)."""
    pipeline = _started()
    if pipeline is None:
        return _no_pipeline()
    return pipeline.flush_sync(timeout)


async def shutdown(timeout: float | None = None) -> FlushResult:
    """Flush, then stop the pipeline, all within ``timeout`` (default: LOOPTRACE_SHUTDOWN_TIMEOUT).
    Spans still unsent at the deadline are dropped and counted as ``shutdown``."""
    pipeline = _detach()
    if pipeline is None:
        return FlushResult(0, dict.fromkeys(DROP_REASONS, 0), 0)
    return await pipeline.shutdown(timeout)


def shutdown_sync(timeout: float | None = None) -> FlushResult:
    """:func:`shutdown` for synchronous code."""
    pipeline = _detach()
    if pipeline is None:
        return FlushResult(0, dict.fromkeys(DROP_REASONS, 0), 0)
    return pipeline.shutdown_sync(timeout)


def _detach() -> Pipeline | None:
    """Take the installed pipeline out of service (the next span starts a new one) and keep it
    as the source of ``statistics()`` until then."""
    global _pipeline
    _started()  # before the lock: Deferred.run takes its own, then this one
    with _lock:
        pipeline, _pipeline = _pipeline, None
        if pipeline is not None:
            _state.sink = STARTS_PIPELINE
    if pipeline is not None:
        _last_stats[0] = pipeline
    return pipeline


# After shutdown, statistics() still describes the pipeline that was stopped.
_last_stats: list[Pipeline | None] = [None]


async def backpressure() -> None:
    """Wait while the bytes queued plus in flight exceed LOOPTRACE_FLUSH_BACKPRESSURE_BYTES."""
    pipeline = _pipeline
    if pipeline is not None:
        await pipeline.backpressure()


def statistics() -> Statistics:
    """A typed snapshot of the pipeline: queued, in flight, sent, retried, dropped by reason."""
    pipeline = _started() or _last_stats[0]
    if pipeline is None:
        sink = _state.sink
        if isinstance(sink, Misconfigured):
            return Statistics(
                dropped=sink.dropped_by_reason(),
                last_error=sink.error,
                internal_errors=dict(_errors.counts),
            )
        return Statistics(internal_errors=dict(_errors.counts))
    return pipeline.statistics()


class _AfterExit:
    """The sink once the exit flush has run: a span that ends later (a generator suspended
    until the interpreter tears it down) cannot be sent, so it is counted as dropped
    (``shutdown``) and said once on standard error."""

    def __init__(self, pipeline: Pipeline) -> None:
        self._pipeline = pipeline
        self._told = False

    def on_start(self, span: Span) -> None:
        pass

    def on_end(self, span: Span) -> None:
        dropped = self._pipeline.buffer.dropped
        dropped["shutdown"] = dropped.get("shutdown", 0) + 1
        if self._told:
            return
        self._told = True
        try:
            stream = sys.stderr
            if stream is not None:
                stream.write(
                    f"looptrace: span {span.name!r} ended after the final flush at exit and "
                    "was not sent (a generator left suspended?)\n"
                )
        except Exception:
            pass


def _at_exit() -> None:
    pipeline = _started()
    if pipeline is None:
        return
    _state.sink = _AfterExit(pipeline)
    if pipeline.buffer.idle():
        pipeline.flusher.close_down()  # nothing to send; reports drops not yet logged
        return
    # One line says what could not be sent (the drop log and the deadline stay quiet).
    _report_lost(pipeline, pipeline.shutdown_sync(pipeline.cfg.shutdown_timeout, quiet=True))


def _report_lost(pipeline: Pipeline, result: FlushResult) -> None:
    lost = result.lost
    if not lost and not result.spooled:
        return
    # logging's last-resort handler prints this to stderr even when logging is not set up.
    # Where to and why, never the headers (they carry API keys).
    where = pipeline.cfg.endpoint or f"the local store {pipeline.cfg.store_path}"
    reasons = ", ".join(f"{k}={v}" for k, v in result.dropped.items() if v)
    said = f"({reasons})"
    if result.spooled:
        assert pipeline.spool is not None
        said = (
            f"({reasons}, spooled={result.spooled})" if lost else f"(spooled={result.spooled})"
        ) + (
            f"; kept in the spool at {pipeline.spool.where} for the next looptrace process "
            "that exports there (or `looptrace spool send`)"
        )
    logger.warning(
        "looptrace: %d span(s) could not be sent to %s before exit %s%s",
        lost + result.spooled,
        where,
        said,
        f"; last error: {pipeline.last_error}" if pipeline.last_error else "",
    )


def shutdown_on_signal(*signals: int) -> None:
    """Flush and report, within the shutdown deadline, when the process is told to stop.

    By default SIGTERM ends a Python process at once: no ``atexit`` handler runs, so spans not
    yet sent are lost without a word. After ``looptrace.shutdown_on_signal()`` (SIGTERM when
    no signal is named) the signal first runs the same final flush as a normal exit
    (``shutdown_timeout``), reporting on standard error what could not be sent, then does what
    it did before: calls the handler that was installed, or, for the default action, ends the
    process by the same signal (so its exit status still says which). Call it from the main
    thread, as Python requires of signal handlers. Python runs the handler when the main thread
    next runs Python code: a main thread blocked in one long call handles it when that returns."""
    import signal

    for signum in signals or (signal.SIGTERM,):
        previous = signal.getsignal(signum)

        def handler(received: int, frame: Any, previous: Any = previous) -> None:
            pipeline = _pipeline
            if pipeline is not None:
                # Detached: if the program goes on after all, its next span starts anew.
                _report_lost(pipeline, shutdown_sync(pipeline.cfg.shutdown_timeout))
            if callable(previous):
                previous(received, frame)
            elif previous != signal.SIG_IGN:
                signal.signal(received, signal.SIG_DFL)
                signal.raise_signal(received)

        signal.signal(signum, handler)


def _after_fork_in_child() -> None:
    # The child starts empty: the parent's spans are the parent's to send, and the parent's
    # flusher thread and locks do not exist (or are in an unknown state) here.
    global _pipeline, _lock
    _lock = threading.RLock()
    if _pipeline is not None:
        _pipeline = None
        _state.sink = STARTS_PIPELINE
    _last_stats[0] = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

__all__ = [
    "STARTS_PIPELINE",
    "FlushResult",
    "LagMonitorHook",
    "Misconfigured",
    "OffloadStatistics",
    "Pipeline",
    "StartsPipeline",
    "Statistics",
    "backpressure",
    "configure",
    "current",
    "flush",
    "flush_sync",
    "get_config",
    "install",
    "prepare_ahead",
    "register_lag_monitor",
    "shutdown",
    "shutdown_on_signal",
    "shutdown_sync",
    "statistics",
]


# The wiring from capture up: capture never imports this module's stage, it is told.
if isinstance(_state.sink, _state.NullSink) and not (_state.config and _state.config.disabled):
    _state.sink = STARTS_PIPELINE
_state.config_listeners.append(_wire_lag_monitor)
flusher.ON_LOOP_END.append(_monitor_loop_ends)
_state.prepare_ahead = prepare_ahead
if _state.config is not None:
    _wire_lag_monitor(_state.config)
