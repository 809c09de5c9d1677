"""The lag monitor's one door to looptrace's core: everything it needs that the public API
does not offer, named in one place.

- the clock and the capture state (``_clock``, ``_state``): tick times, the end hook it adds;
- the export stage (``_export``): the settings in force, and the sink its summary spans need;
- the active span (``_capture.context``), the span types and starting a span
  (``_capture.spans``, ``_capture.start``), for stall events and summary spans;
- how an error inside looptrace is recorded (``_errors``), and the lag attribute's name.
"""

from __future__ import annotations

from .. import _clock as _clock
from .. import _export as _export
from .. import _state as _state
from .._capture.context import CURRENT as CURRENT
from .._capture.spans import Event as Event
from .._capture.spans import Span as Span
from .._capture.start import start_span as start_span
from .._config import Config as Config
from .._errors import internal_error as internal_error
from .._semconv import LOOP_LAG_MAX_MS as LOOP_LAG_MAX_MS
