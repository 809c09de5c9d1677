"""Process-wide state that the hot path reads: the sink, the hooks, and the capture switches.

Kept as plain module attributes so a capture reads each with one attribute lookup. Only
``_export.configure`` (and ``looptrace.testing``) write them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ._capture.spans import Span
    from ._config import Config


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


class ContextBridge(Protocol):
    """Keeps looptrace's active span and another tracing API's in agreement (the
    OpenTelemetry API, through ``looptrace.otel``). Installed only when asked for."""

    def parent(self, current: Span | None) -> Span | None:
        """The innermost active span: ``current`` (looptrace's) or the other API's."""

    def enter(self, span: Span) -> object:
        """``span`` became looptrace's active span: make it the other API's too."""

    def exit(self, token: object) -> None:
        """Undo :meth:`enter`."""


# The export pipeline puts its starting sink here when it is imported (the capture API imports
# it, so it is in place before any span can end): capture never imports export.
sink: Sink = NullSink()
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


def _nothing_to_prepare() -> None:
    pass


# What ``@traced`` calls as it decorates: the pipeline puts its start-up here (imports, the
# redaction patterns), so the first traced call costs what every other call costs.
prepare_ahead: Callable[[], None] = _nothing_to_prepare

# Told of each configuration applied, after the capture switches: how the stages above capture
# (the pipeline wires the lag monitor this way) follow it without capture importing them.
config_listeners: list[Callable[[Config], None]] = []


def apply_config(cfg: Config) -> None:
    """Copy the capture switches out of ``cfg`` (the pipeline installs the sink itself)."""
    global config
    config = cfg
    apply_switches(cfg)
    for listener in config_listeners:
        listener(cfg)


def apply_switches(cfg: Config) -> None:
    """Only the capture switches of ``cfg``: what the spans of a process's first moments are
    recorded with, from the settings read as ``@traced`` decorated, until the settings in force
    are read (on the loop's next turn, off the first traced call)."""
    global disabled, capture_inputs, capture_outputs, max_generator_items, sample_threshold
    disabled = cfg.disabled
    capture_inputs = cfg.capture_inputs
    capture_outputs = cfg.capture_outputs
    max_generator_items = cfg.max_generator_items
    sample_threshold = int(cfg.sample_rate * (1 << 64))
