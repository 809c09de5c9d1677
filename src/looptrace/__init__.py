"""looptrace: asyncio tracing that never slows the program it watches.

The public API is exactly what this module exports; everything in ``looptrace._*`` is private.
"""

from __future__ import annotations

from ._capture import span, traced
from ._config import Config
from ._context import attach, bind_context, current_span, extract, inject, suppress_tracing
from ._errors import ConfigurationError, LoopTraceError
from ._pipeline import configure, get_config
from ._span import Event, Link, NonRecordingSpan, Span, SpanContext, SpanKind, StatusCode

__version__ = "0.1.0"

__all__ = [
    "Config",
    "ConfigurationError",
    "Event",
    "Link",
    "LoopTraceError",
    "NonRecordingSpan",
    "Span",
    "SpanContext",
    "SpanKind",
    "StatusCode",
    "__version__",
    "attach",
    "bind_context",
    "configure",
    "current_span",
    "extract",
    "get_config",
    "inject",
    "span",
    "suppress_tracing",
    "traced",
]
