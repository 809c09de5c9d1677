"""Time and id sources, swappable as a whole so tests get deterministic values.

Capture reads these module attributes on every span; replacing them (see
``looptrace.testing``) is the one supported way to make ids and times predictable.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

# random.getrandbits on the shared Random instance is reseeded by CPython after fork, so a child
# never repeats its parent's ids.
new_trace_id: Callable[[], int] = lambda: random.getrandbits(128) or 1  # noqa: E731
new_span_id: Callable[[], int] = lambda: random.getrandbits(64) or 1  # noqa: E731
now_ns: Callable[[], int] = time.time_ns


def reset() -> None:
    """Restore the real clock and random ids."""
    global new_trace_id, new_span_id, now_ns
    new_trace_id = lambda: random.getrandbits(128) or 1  # noqa: E731
    new_span_id = lambda: random.getrandbits(64) or 1  # noqa: E731
    now_ns = time.time_ns
