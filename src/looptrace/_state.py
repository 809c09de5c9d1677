"""Process-wide state that the hot path reads: the sink, the hooks, and the capture switches.

Kept as plain module attributes so a capture reads each with one attribute lookup. Only
``_pipeline.configure`` (and ``looptrace.testing``) write them.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ._config import Config
    from ._span import Span


class Sink(Protocol):
    """Where ended spans go. Both calls must be O(1), never block, and never raise."""

    def on_start(self, span: Span) -> None:
        """A root span started (called for roots only, so the pipeline can track long ones)."""

    def on_end(self, span: Span) -> None:
        """A span ended; from now on the sink owns it."""


class NullSink:
    """Drops everything: what capture uses while looptrace is disabled."""

    def on_start(self, span: Span) -> None:
        pass

    def on_end(self, span: Span) -> None:
        pass


class StartsPipeline:
    """The sink until a pipeline runs: the first span starts one from the configuration in
    force, which then replaces this as the sink."""

    def on_start(self, span: Span) -> None:
        _start_pipeline().on_start(span)

    def on_end(self, span: Span) -> None:
        _start_pipeline().on_end(span)


def _start_pipeline() -> Sink:
    # Imported here because the pipeline module imports this one. The capture API imports the
    # pipeline module itself, so this import is already done and the first span pays nothing.
    from ._pipeline import _get_or_create

    return _get_or_create()


class ContextBridge(Protocol):
    """Keeps looptrace's active span and another tracing API's in agreement (the
    OpenTelemetry API, through ``looptrace.otel``). Installed only when asked for."""

    def parent(self, current: Span | None) -> Span | None:
        """The innermost active span: ``current`` (looptrace's) or the other API's."""

    def enter(self, span: Span) -> object:
        """``span`` became looptrace's active span: make it the other API's too."""

    def exit(self, token: object) -> None:
        """Undo :meth:`enter`."""


STARTS_PIPELINE = StartsPipeline()
sink: Sink = STARTS_PIPELINE
config: Config | None = None

# Capture switches, derived from the config so the hot path tests a bool, not an object.
disabled: bool = False
capture_inputs: bool = True
capture_outputs: bool = True
max_generator_items: int = 100
# Traces are sampled when the low 64 bits of the trace id fall below this (as OpenTelemetry's
# TraceIdRatioBased does), so a whole trace is kept or dropped, everywhere, consistently.
sample_threshold: int = 1 << 64

# The other tracing API whose context is kept in step with looptrace's (None: no bridge, and
# the hot path pays one attribute test for it).
bridge: ContextBridge | None = None

# Called with every recording span at start / end (the lag monitor uses these). Tuples, so
# iterating an empty one is all the hot path pays when nothing is installed.
start_hooks: tuple[Callable[[Span], None], ...] = ()
end_hooks: tuple[Callable[[Span], None], ...] = ()


def add_hooks(
    start: Callable[[Span], None] | None = None, end: Callable[[Span], None] | None = None
) -> None:
    global start_hooks, end_hooks
    if start is not None and start not in start_hooks:
        start_hooks = (*start_hooks, start)
    if end is not None and end not in end_hooks:
        end_hooks = (*end_hooks, end)


def remove_hooks(
    start: Callable[[Span], None] | None = None, end: Callable[[Span], None] | None = None
) -> None:
    global start_hooks, end_hooks
    start_hooks = tuple(h for h in start_hooks if h != start)
    end_hooks = tuple(h for h in end_hooks if h != end)


def _start_lag_monitor(span: Span) -> None:
    """With ``lag_monitor`` on, start the monitor on a loop when the first span starts there,
    so a stall inside that very span is measured (once per loop: one lookup per span after)."""
    asyncio = sys.modules.get("asyncio")  # no asyncio loaded: no loop to watch
    loop = asyncio._get_running_loop() if asyncio is not None else None
    if loop is None or loop in _monitored:
        return
    try:
        _monitored.add(loop)
    except TypeError:  # pragma: no cover - a loop without weakref support
        return
    from .monitor import ensure_from_config

    ensure_from_config(config)


_monitored: weakref.WeakSet[Any] = weakref.WeakSet()


def apply_config(cfg: Config) -> None:
    """Copy the capture switches out of ``cfg`` (the pipeline installs the sink itself)."""
    global config, disabled, capture_inputs, capture_outputs, max_generator_items
    global sample_threshold
    config = cfg
    disabled = cfg.disabled
    capture_inputs = cfg.capture_inputs
    capture_outputs = cfg.capture_outputs
    max_generator_items = cfg.max_generator_items
    sample_threshold = int(cfg.sample_rate * (1 << 64))
    if cfg.lag_monitor and not cfg.disabled:
        add_hooks(start=_start_lag_monitor)
    else:
        remove_hooks(start=_start_lag_monitor)
