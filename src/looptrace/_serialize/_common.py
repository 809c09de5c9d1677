"""What the serializer's parts share: the counters of what it had to do, the markers it
writes, and its limits."""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import Generator, Iterator
from typing import TYPE_CHECKING, TypeVar

import orjson

if TYPE_CHECKING:
    pass


logger = logging.getLogger("looptrace")

# What the serializer had to do to values, for ``looptrace.statistics()``.
stats: Counter[str] = Counter()


@contextlib.contextmanager
def counted() -> Iterator[Counter[str]]:
    """Collect what the serialization inside the block adds to :data:`stats` into the yielded
    Counter (filled when the block ends; the additions also stay in ``stats``)."""
    before = Counter(stats)
    delta: Counter[str] = Counter()
    try:
        yield delta
    finally:
        delta.update(stats)
        delta.subtract(before)
        for key in [k for k, v in delta.items() if v <= 0]:
            del delta[key]


_T = TypeVar("_T")

# A serialization in steps (``dumps_or_steps``, ``to_wire_or_steps``) scans long JSON for secret
# keys in steps of about this much text: 64 KiB take 0.1-0.2 ms.
STEP_BYTES = 64 * 1024
# Below this much JSON the scan that follows orjson is short enough to share orjson's step.
_STEP_FROM_BYTES = 8 * 1024


def complete(steps: Generator[None, None, _T]) -> _T:
    """Run a serialization that can pause between steps (a generator that returns its
    result) to the end, without pausing."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


REDACTED = "<redacted>"
TRUNCATED_KEY = "looptrace.truncated"

_OPTS = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY
# The same output when every key is a str (the usual case), 1.3-1.9x faster on key-heavy
# values: with OPT_NON_STR_KEYS orjson leaves its fast path for str keys.
_STR_KEY_OPTS = orjson.OPT_SERIALIZE_NUMPY
_INT64_MIN = -(1 << 63)
_UINT64_MAX = (1 << 64) - 1
# The careful walk recurses; stay far below Python's recursion limit whatever max_depth says.
_HARD_DEPTH = 100
_REPR_MAX = 2000
_STACKTRACE_MAX = 64 * 1024
_CACHE_MAX = 4096
_MARKER_ROOM = 48
# Up to this many quotes in a value's JSON, each key is read back and checked exactly.
_FEW_QUOTES = 256
# Quotes are counted this far into a value's JSON to choose how to look for secret keys.
_QUOTE_PROBE_BYTES = 8192
# JSON this short is ruled out by one regex pass when no redaction word appears anywhere. The
# regex engine tests every position (about 15 ns a byte here), so longer text is searched
# word by word with bytes.find instead.
_REGEX_GATE_BYTES = 2048
_PRIMITIVES = (str, bool, int, float)
