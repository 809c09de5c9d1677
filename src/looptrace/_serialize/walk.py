"""The careful path: one walk over a value that converts, redacts and cuts as it goes, and
the fast path that tries orjson first."""

from __future__ import annotations

import datetime
import enum
import uuid
from collections.abc import Generator, Mapping
from typing import TYPE_CHECKING, Any

import orjson

from ._common import (
    _INT64_MIN,
    _OPTS,
    _STEP_FROM_BYTES,
    _STR_KEY_OPTS,
    _UINT64_MAX,
    REDACTED,
    STEP_BYTES,
    TRUNCATED_KEY,
    stats,
)
from .convert import _bounded_repr, _convert, _cut_str, _type_name, placeholder
from .policy import Policy, policy

if TYPE_CHECKING:
    from .._config import Config


# --------------------------------------------------------------------------- careful walk

# Types orjson writes itself (with _OPTS) once any container around them is clean.
_NATIVE_LEAVES = (
    bool,
    float,
    type(None),
    datetime.datetime,
    datetime.date,
    datetime.time,
    uuid.UUID,
)
_NATIVE_KEYS = (bool, float, type(None), datetime.datetime, datetime.date, datetime.time, uuid.UUID)


class _Walker:
    """One careful pass: converts, redacts, cuts cycles, depth and long strings."""

    __slots__ = ("ancestors", "pol", "str_cap")

    def __init__(self, pol: Policy, str_cap: int) -> None:
        self.pol = pol
        self.str_cap = str_cap
        self.ancestors: set[int] = set()

    def walk(self, v: Any, depth: int) -> Any:
        try:
            return self._walk(v, depth)
        except Exception:
            # Contained at the node that failed: its siblings still serialize.
            return placeholder(v)

    def _walk(self, v: Any, depth: int) -> Any:
        cls = type(v)
        if cls is str:
            return self.text(v)
        if cls is int:
            return v if _INT64_MIN <= v <= _UINT64_MAX else _big_int(v)
        if cls in _NATIVE_LEAVES:
            return v
        if cls is dict:
            return self.mapping(v, depth)
        if cls is list or cls is tuple:
            return self.sequence(v, depth)
        if isinstance(v, str):
            return self.text(str.__str__(v))
        if isinstance(v, int) and not isinstance(v, enum.Enum):
            return self.walk(int(v), depth)
        if isinstance(v, float):
            return float(v)
        if isinstance(v, dict):
            return self.mapping(v, depth)
        if isinstance(v, list):
            return self.sequence(v, depth)
        if depth >= self.pol.max_depth:
            return _too_deep(v)
        key = id(v)
        if key in self.ancestors:
            return _cycle(v)
        converted = _convert(v, self.pol)
        if converted is v:
            return placeholder(v)
        self.ancestors.add(key)
        try:
            # The converted form stands at the object's own depth.
            return self.walk(converted, depth)
        finally:
            self.ancestors.discard(key)

    def text(self, s: str) -> str:
        s = _cut_str(s, self.str_cap)
        if not s.isascii():
            try:
                s.encode()
            except UnicodeEncodeError:
                s = s.encode("utf-8", "backslashreplace").decode("utf-8")
        return s

    def mapping(self, m: Mapping[Any, Any], depth: int) -> Any:
        if depth >= self.pol.max_depth:
            return _too_deep(m)
        key = id(m)
        if key in self.ancestors:
            return _cycle(m)
        self.ancestors.add(key)
        try:
            out: dict[Any, Any] = {}
            redact = self.pol.redact
            items = list(dict.items(m) if isinstance(m, dict) else m.items())
            for k, v in items:
                k = self.key(k)
                if redact and type(k) is str and self.pol.is_secret(k):
                    stats["redactions"] += 1
                    out[k] = REDACTED
                else:
                    out[k] = self.walk(v, depth + 1)
            return out
        finally:
            self.ancestors.discard(key)

    def key(self, k: Any) -> Any:
        cls = type(k)
        if cls is str:
            return self.text(k)
        if cls is int:
            return k if _INT64_MIN <= k <= _UINT64_MAX else _big_int(k)
        if cls in _NATIVE_KEYS:
            return k
        if isinstance(k, enum.Enum):
            return self.key(k.value)
        if isinstance(k, str):
            return self.text(str.__str__(k))
        return self.text(_bounded_repr(k) if not isinstance(k, (int, float)) else str(k))

    def sequence(self, seq: list[Any] | tuple[Any, ...], depth: int) -> Any:
        if depth >= self.pol.max_depth:
            return _too_deep(seq)
        key = id(seq)
        if key in self.ancestors:
            return _cycle(seq)
        self.ancestors.add(key)
        try:
            return [self.walk(x, depth + 1) for x in seq]
        finally:
            self.ancestors.discard(key)


def _too_deep(v: Any) -> str:
    stats["truncations"] += 1
    return f"<max depth: {_type_name(v)}>"


def _cycle(v: Any) -> str:
    return f"<cycle: {_type_name(v)}>"


def _big_int(v: int) -> str:
    try:
        return str(v)
    except ValueError:
        # More digits than int->str allows (sys.set_int_max_str_digits).
        return f"<int: {v.bit_length()} bits>"


# --------------------------------------------------------------------------- values


def _native(obj: Any) -> Any:
    # The first try writes only what orjson knows: a conversion (which may count in
    # ``stats``) waits for the second, so it runs once.
    raise TypeError


def _dumps(value: Any, pol: Policy, keys_clean: bool = False) -> bytes:
    """JSON bytes for ``value`` under ``pol``; never raises, never exceeds the value cap.

    ``keys_clean``: a walk of ``value`` already showed it holds no secret key (see
    :func:`plan`), so the output is not scanned for one (and every key is a str). A flat
    value's keys settle it without a walk (:func:`flat_clean`)."""
    out = _fast(value, pol, keys_clean)
    if out is None or len(out) > pol.max_value_bytes:
        return _careful(value, pol, out)
    if keys_clean or not pol.redact or flat_clean(value, pol):
        return out
    return _masked_if_secret(value, pol, out)


# The values that cannot hold a key, by exact type (a subclass may serialize otherwise).
_FLAT = frozenset((str, int, float, bool, type(None)))
# Past this many keys the values' loop would run long on the caller's loop in one piece; the
# scan of the JSON, in C and in steps, decides instead.
_FLAT_MAX_KEYS = 64


def flat_clean(value: Any, pol: Policy) -> bool:
    """Whether ``value``'s JSON is known to hold no secret key without reading it: a scalar,
    or a dict of at most a few dozen scalars whose keys are all strings the redaction rule
    passes (a traced function's arguments, most often): what :func:`_dumps` and
    :func:`dumps_or_steps` check before scanning the JSON of a value no planning walk has
    seen. False when unsure."""
    cls = type(value)
    if cls is dict:
        if len(value) > _FLAT_MAX_KEYS or not (
            value.keys() <= pol._plain_keys or pol.plain_keys(value)
        ):
            return False
        return _FLAT.issuperset(map(type, value.values()))
    return cls in _FLAT


def dumps_or_steps(
    value: Any, pol: Policy, keys_clean: bool = False, step_bytes: int = STEP_BYTES
) -> bytes | Generator[None, None, bytes]:
    """:func:`_dumps`'s bytes; or, when the JSON is long enough to scan for secret keys in
    steps, a generator that returns them, yielding first (orjson's pass was a step) and then
    between steps of about ``step_bytes`` of the scan, so that an event loop runs other tasks
    in between. Short JSON, the common case, costs no generator."""
    out = _fast(value, pol, keys_clean)
    if out is None or len(out) > pol.max_value_bytes:
        return _careful(value, pol, out)
    if keys_clean or not pol.redact or flat_clean(value, pol):
        return out
    if len(out) >= _STEP_FROM_BYTES:
        return _scanned_in_steps(value, pol, out, step_bytes)
    return _masked_if_secret(value, pol, out)


def _masked_if_secret(value: Any, pol: Policy, out: bytes) -> bytes:
    """``out``, or ``out`` masked when it holds a secret key: the check's one pass over the
    text finds every secret key, and the masking takes them from it."""
    found: list[int] = []
    return _redacted(value, pol, out, found) if pol.maybe_secret(out, found) else out


def _redacted(value: Any, pol: Policy, out: bytes, found: list[int] | None = None) -> bytes:
    """``out`` with the values of its secret keys masked in the text (see
    :meth:`Policy.mask`, which takes ``found`` from a key scan already done); the careful
    walk where the text cannot be masked that way."""
    try:
        masked = pol.mask(out, found)
    except Exception:
        masked = None
    if masked is None or len(masked[0]) > pol.max_value_bytes:
        return _careful(value, pol, out)
    if masked[1]:
        stats["redactions"] += masked[1]
    return masked[0]


def _scanned_in_steps(
    value: Any, pol: Policy, out: bytes, step_bytes: int
) -> Generator[None, None, bytes]:
    yield
    found: list[int] = []
    if (yield from pol.maybe_secret_steps(out, step_bytes, found)):
        yield  # masking is a step of its own
        return _redacted(value, pol, out, found)
    return out


def _fast(value: Any, pol: Policy, keys_clean: bool) -> bytes | None:
    """orjson's bytes for ``value``, the fast path's first try; None when it refuses."""
    try:
        if keys_clean:
            return orjson.dumps(value, default=pol.default, option=_STR_KEY_OPTS)
        # Str keys and nothing to convert, the usual value: the faster options. Another
        # key or type raises where orjson meets it, and the value is written again.
        try:
            return orjson.dumps(value, default=_native, option=_STR_KEY_OPTS)
        except Exception:
            return orjson.dumps(value, default=pol.default, option=_OPTS)
    except Exception:
        return None


def _careful(value: Any, pol: Policy, first: bytes | None) -> bytes:
    stats["slow_paths"] += 1
    size = len(first) if first is not None else 0
    cap = pol.max_value_bytes
    # Each pass cuts long strings harder; a value still too big becomes a preview.
    for str_cap in (cap, cap // 8, cap // 64):
        try:
            out = orjson.dumps(_Walker(pol, max(str_cap, 64)).walk(value, 0), option=_OPTS)
        except Exception:
            return orjson.dumps(placeholder(value))
        size = max(size, len(out))
        if len(out) <= cap:
            return out
    return _preview(out, size, cap)


def _preview(out: bytes, size: int, cap: int) -> bytes:
    stats["truncations"] += 1
    room = max(cap - 160, 0)
    text = out[:room].decode("utf-8", "ignore")
    marker = {TRUNCATED_KEY: True, "original_bytes": size, "preview": text}
    result = orjson.dumps(marker)
    while len(result) > cap and text:
        # Escapes can make the preview longer than the bytes it came from.
        text = text[: len(text) // 2]
        marker["preview"] = text
        result = orjson.dumps(marker)
    return result


def to_json(value: Any, cfg: Config) -> str:
    """``value`` as JSON text: total (never raises), bounded by ``cfg``, secrets redacted."""
    try:
        return _dumps(value, policy(cfg)).decode("utf-8")
    except Exception:
        return '"' + placeholder(value).replace('"', "'") + '"'


def snapshot(inputs: dict[str, Any]) -> dict[str, Any]:
    """A copy of bound arguments that later in-place changes by the caller do not reach.

    Only top-level lists, dicts, sets and bytearrays of at most 256 items are copied (shallow):
    the common case (a caller appending to a message list it passed in) costs well under a
    microsecond; deeper mutation still shows (documented in docs/serialization.md)."""
    out = inputs
    for k, v in inputs.items():
        cls = type(v)
        if (cls is list or cls is dict or cls is set or cls is bytearray) and len(v) <= 256:
            if out is inputs:
                out = dict(inputs)
            out[k] = v.copy()
    return out
