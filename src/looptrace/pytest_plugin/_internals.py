"""The plugin's one interface to looptrace's core, beyond its public API.

Imported only inside functions, once a test is traced: loading the plugin must import nothing
of looptrace. The rest of the plugin uses public names (``looptrace.get_config``,
``looptrace.monitor``, ``looptrace.testing``...) and this module; what is here has no public
equivalent:

- the pipeline, imported for its wiring: it installs the sink the test spans end in;
- the attribute names the store and viewer read (``_semconv``);
- starting a root span whatever span is active, unless tracing is disabled (``_capture.start``,
  ``_state``);
- the active-span variable, set around each test's setup, call and teardown (``_capture.context``);
- where the local store lives by default, to print the command that opens it (``_config``).
"""

from __future__ import annotations

from typing import Any

from looptrace import NonRecordingSpan, Span

from .. import _export as _export  # the wiring: spans need the sink it installs
from .. import _semconv as semconv
from .. import _state
from .._capture.context import CURRENT
from .._capture.start import start_root
from .._config import default_store_path

__all__ = ["CURRENT", "default_store_path", "new_root", "semconv"]


def new_root(name: str, attributes: dict[str, Any]) -> Span:
    """A span that starts a new trace whatever is active (nothing recorded while disabled)."""
    if _state.disabled:
        return NonRecordingSpan()
    return start_root(name, attributes)
