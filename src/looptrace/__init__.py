"""looptrace: asyncio tracing that never slows the program it watches.

The public API is exactly what this module exports; everything in ``looptrace._*`` is private.

Names are imported on first use (PEP 562): ``import looptrace`` loads nothing else, so a
worker process, which imports one private module of the package, does not pay for the rest of
it (httpx, asyncio, the evaluation and monitor code), and neither does a program that only
uses part of the API.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._capture.attributes import attributes
    from ._capture.context import (
        attach,
        bind_context,
        current_span,
        extract,
        inject,
        suppress_tracing,
    )
    from ._capture.decorators import span, traced
    from ._capture.spans import (
        Event,
        Link,
        NonRecordingSpan,
        Span,
        SpanContext,
        SpanKind,
        StatusCode,
    )
    from ._config import Config
    from ._errors import ConfigurationError, LoopTraceError
    from ._export import (
        FlushResult,
        OffloadStatistics,
        Statistics,
        backpressure,
        configure,
        flush,
        flush_sync,
        get_config,
        shutdown,
        shutdown_on_signal,
        shutdown_sync,
        statistics,
    )
    from ._feedback import score
    from ._genai import (
        instrument_anthropic,
        instrument_openai,
        uninstrument_anthropic,
        uninstrument_openai,
    )
    from .evals import CaseResult, Experiment, ExperimentSummary, Score, experiment, run_experiment
    from .monitor import Culprit, LagMonitor, LagSnapshot
    from .otel import instrument_opentelemetry, uninstrument_opentelemetry

__version__ = "0.1.0"

# Each public name and the module that defines it. The imports above are the same list for
# type checkers; tests/test_public_api.py checks that the two agree.
_ORIGIN = {
    "attributes": "_capture.attributes",
    "score": "_feedback",
    "span": "_capture.decorators",
    "traced": "_capture.decorators",
    "Config": "_config",
    "attach": "_capture.context",
    "bind_context": "_capture.context",
    "current_span": "_capture.context",
    "extract": "_capture.context",
    "inject": "_capture.context",
    "suppress_tracing": "_capture.context",
    "ConfigurationError": "_errors",
    "LoopTraceError": "_errors",
    "instrument_anthropic": "_genai",
    "instrument_openai": "_genai",
    "uninstrument_anthropic": "_genai",
    "uninstrument_openai": "_genai",
    "FlushResult": "_export",
    "OffloadStatistics": "_export",
    "Statistics": "_export",
    "backpressure": "_export",
    "configure": "_export",
    "flush": "_export",
    "flush_sync": "_export",
    "get_config": "_export",
    "shutdown": "_export",
    "shutdown_on_signal": "_export",
    "shutdown_sync": "_export",
    "statistics": "_export",
    "Event": "_capture.spans",
    "Link": "_capture.spans",
    "NonRecordingSpan": "_capture.spans",
    "Span": "_capture.spans",
    "SpanContext": "_capture.spans",
    "SpanKind": "_capture.spans",
    "StatusCode": "_capture.spans",
    "CaseResult": "evals",
    "Experiment": "evals",
    "ExperimentSummary": "evals",
    "Score": "evals",
    "experiment": "evals",
    "run_experiment": "evals",
    "Culprit": "monitor",
    "LagMonitor": "monitor",
    "LagSnapshot": "monitor",
    "instrument_opentelemetry": "otel",
    "uninstrument_opentelemetry": "otel",
}


# Public modules: ``looptrace.monitor.LagMonitor`` works after a plain ``import looptrace``,
# loading the module on first use like every other name here.
_SUBMODULES = frozenset(("evals", "integrations", "monitor", "otel", "testing"))


# Names whose modules send spans: loading one loads the export stage, wired to what sits above
# it (``_wiring``).
_WIRED = frozenset(("_capture.decorators", "_feedback", "_export", "_genai", "evals", "otel"))


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        if name in _WIRED:
            importlib.import_module(f"{__name__}._wiring").wire()
        return importlib.import_module(f"{__name__}.{name}")
    module = _ORIGIN.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if module in _WIRED:
        # The wiring: capture never imports export, so the capture API brings the pipeline
        # with it here, and not with the first span (which may start on the user's event
        # loop: the export modules take a tenth of a second to import).
        importlib.import_module(f"{__name__}._wiring").wire()
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


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
    "OffloadStatistics",
    "Score",
    "Span",
    "SpanContext",
    "SpanKind",
    "Statistics",
    "StatusCode",
    "__version__",
    "attach",
    "attributes",
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
    "instrument_anthropic",
    "instrument_openai",
    "instrument_opentelemetry",
    "run_experiment",
    "score",
    "shutdown",
    "shutdown_on_signal",
    "shutdown_sync",
    "span",
    "statistics",
    "suppress_tracing",
    "traced",
    "uninstrument_anthropic",
    "uninstrument_openai",
    "uninstrument_opentelemetry",
]
