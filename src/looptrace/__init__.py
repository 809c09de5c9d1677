"""looptrace: asyncio tracing that never slows the program it watches.

The public API is exactly what this module exports; everything in ``looptrace._*`` is private.
"""

from __future__ import annotations

from ._capture import span, traced
from ._config import Config
from ._context import attach, bind_context, current_span, extract, inject, suppress_tracing
from ._errors import ConfigurationError, LoopTraceError
from ._pipeline import (
    FlushResult,
    Statistics,
    backpressure,
    configure,
    flush,
    flush_sync,
    get_config,
    shutdown,
    shutdown_sync,
    statistics,
)
from ._span import Event, Link, NonRecordingSpan, Span, SpanContext, SpanKind, StatusCode
from .evals import CaseResult, Experiment, ExperimentSummary, Score, experiment, run_experiment
from .monitor import Culprit, LagMonitor, LagSnapshot

__version__ = "0.1.0"

__all__ = [
    "CaseResult",
    "Config",
    "ConfigurationError",
    "Culprit",
    "Event",
    "Experiment",
    "ExperimentSummary",
    "FlushResult",
    "LagMonitor",
    "LagSnapshot",
    "Link",
    "LoopTraceError",
    "NonRecordingSpan",
    "Score",
    "Span",
    "SpanContext",
    "SpanKind",
    "Statistics",
    "StatusCode",
    "__version__",
    "attach",
    "backpressure",
    "bind_context",
    "configure",
    "current_span",
    "experiment",
    "extract",
    "flush",
    "flush_sync",
    "get_config",
    "inject",
    "run_experiment",
    "shutdown",
    "shutdown_sync",
    "span",
    "statistics",
    "suppress_tracing",
    "traced",
]
