"""Turn whatever user code recorded into OTLP-ready attributes: total, bounded, redacted.

    to_json(value, cfg)   -> str       one value as JSON text; never raises
    to_wire(span, cfg)    -> WireSpan  a whole span (attributes, payloads, events, links)
    estimate_size(span)   -> int       O(top-level arguments) guess for buffer accounting

Two paths. The fast path is one ``orjson.dumps`` call with a ``default`` hook for the types
orjson does not know; it covers almost every value. When orjson refuses (a cycle, nesting past
its limit, a lone surrogate, an integer wider than 64 bits, a key it cannot write), when the
output holds something that looks like a secret key, or when the output is over the size cap,
the careful path walks the value once, converting, redacting and cutting as it goes, and then
dumps the result. A value that defeats both becomes a placeholder naming its type, and
``stats["placeholders"]`` counts it. See docs/serialization.md for every rule.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import datetime
import decimal
import enum
import ipaddress
import logging
import re
import traceback
import types
import uuid
from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from pathlib import PurePath
from typing import TYPE_CHECKING, Any

import orjson

from ._semconv import (
    CODE_FUNCTION,
    CODE_NAMESPACE,
    EXCEPTION_EVENT,
    EXCEPTION_MESSAGE,
    EXCEPTION_STACKTRACE,
    EXCEPTION_TYPE,
    IN_PROGRESS,
    INPUT_MIME_TYPE,
    INPUT_VALUE,
    JSON_MIME,
    OUTPUT_MIME_TYPE,
    OUTPUT_VALUE,
)
from ._span import UNSET, CallSite, Span
from ._wire import Attributes, AttrValue, WireEvent, WireLink, WireSpan

if TYPE_CHECKING:
    from ._config import Config

__all__ = [
    "Policy",
    "capped",
    "counted",
    "estimate_size",
    "leaf_size",
    "policy",
    "snapshot",
    "stats",
    "to_json",
    "to_wire",
]

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


REDACTED = "<redacted>"
TRUNCATED_KEY = "looptrace.truncated"

_OPTS = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY
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


# --------------------------------------------------------------------------- secret keys


def _segments(text: str) -> tuple[str, ...]:
    # Words of a key: runs of ASCII letters, split where a lowercase letter meets an uppercase
    # one (camelCase). "X-Api-Key" -> x, api, key; "accessToken" -> access, token.
    return tuple(m.lower() for m in re.findall(r"[A-Z]+[a-z]*|[a-z]+", text))


def _letters(segment: str) -> bytes:
    return b"".join(b"[" + c.encode() + c.upper().encode() + b"]" for c in segment)


# In orjson's output a separator between words is any non-letter, or an escape such as \n.
_SEP = rb"(?:(?:[^A-Za-z]|\\[bfnrt]|\\u00[0-9a-fA-F]{2})+|(?<=[a-z])(?=[A-Z]))"
_AFTER = rb"(?:(?![A-Za-z])|(?<=[a-z])(?=[A-Z]))"


class _Word:
    __slots__ = ("first", "pattern", "segments")

    def __init__(self, word: str) -> None:
        self.segments = _segments(word)
        self.first = self.segments[0].encode()
        self.pattern = re.compile(_SEP.join(_letters(s) for s in self.segments) + _AFTER)


class Policy:
    """The limits and redaction rules one serialization follows (picklable, for the worker)."""

    __slots__ = (
        "_any_first",
        "_key_cache",
        "_plain_keys",
        "_raw_cache",
        "_words",
        "default",
        "max_depth",
        "max_value_bytes",
        "redact",
        "redact_keys",
    )

    def __init__(
        self, max_value_bytes: int, max_depth: int, redact: bool, redact_keys: tuple[str, ...]
    ) -> None:
        self.max_value_bytes = max_value_bytes
        self.max_depth = min(max_depth, _HARD_DEPTH)
        self.redact_keys = redact_keys
        self._words = tuple(_Word(k) for k in redact_keys if _segments(k))
        self.redact = redact and bool(self._words)
        firsts = sorted({w.first for w in self._words}, key=len, reverse=True)
        self._any_first = re.compile(b"|".join(re.escape(f) for f in firsts) or b"(?!)")
        self._key_cache: dict[str, bool] = {}
        self._plain_keys: set[str] = set()
        self._raw_cache: dict[bytes, bool] = {}
        self.default: Callable[[Any], Any] = self._default

    def __reduce__(self) -> tuple[Any, ...]:
        return (Policy, (self.max_value_bytes, self.max_depth, self.redact, self.redact_keys))

    def is_secret(self, key: str) -> bool:
        """Whether ``key`` contains one of the redaction words as whole words."""
        hit = self._key_cache.get(key)
        if hit is None:
            segs = _segments(key)
            hit = any(_contains(segs, w.segments) for w in self._words)
            if len(self._key_cache) >= _CACHE_MAX:
                self._key_cache.clear()
            self._key_cache[key] = hit
        return hit

    def plain_keys(self, d: dict[Any, Any]) -> bool:
        """Whether every key of ``d`` is a string that is not secret. Keys found plain are
        remembered, so a dict with familiar keys is checked by one set comparison, in C."""
        plain = self._plain_keys
        for k in d:
            if k in plain:
                continue
            if type(k) is not str or self.is_secret(k):
                return False
            if len(plain) >= _CACHE_MAX:
                plain.clear()
            plain.add(k)
        return True

    def maybe_secret(self, out: bytes) -> bool:
        """Cheap check on orjson output: could any object key in it be secret?

        Never says no when a key is secret (a false yes only costs the careful walk)."""
        # Every object key in orjson's output ends in '":'; no such pair means no keys at all.
        if b'":' not in out:
            return False
        if len(out) < _REGEX_GATE_BYTES and self._any_first.search(out.lower()) is None:
            return False
        # Many strings (rows of records, chat messages): look for the redaction words
        # themselves. Listing the keys with a regex cost 50-100 ns per byte of every string,
        # keys and values alike: 3.5 ms for 64 KB of base64, 0.6 ms for 6 KB of chat messages.
        if out.count(b'"', 0, _QUOTE_PROBE_BYTES) > _FEW_QUOTES:
            return self._scan_words(out)
        # Few strings (the usual shape of a big payload: a handful of keys, huge values):
        # read each key back from the text and apply the exact rule. Quotes are found with
        # memchr speed; unescaped ones alternate open/close, and only a key's close is
        # followed by ':'.
        q = out.find(b'"')
        seen = 0
        start = -1
        while q != -1:
            seen += 1
            if seen > _FEW_QUOTES:
                return self._scan_words(out)
            if not _escaped(out, q):
                if start < 0:
                    start = q
                else:
                    if out[q + 1 : q + 2] == b":" and self._secret_raw(out[start + 1 : q]):
                        return True
                    start = -1
            q = out.find(b'"', q + 1)
        return False

    def _secret_raw(self, raw: bytes) -> bool:
        hit = self._raw_cache.get(raw)
        if hit is not None:
            return hit
        try:
            key = orjson.loads(b'"' + raw + b'"') if b"\\" in raw else raw.decode()
        except Exception:
            return True
        hit = self.is_secret(key)
        if len(self._raw_cache) >= _CACHE_MAX:
            self._raw_cache.clear()
        self._raw_cache[raw] = hit
        return hit

    def _scan_words(self, out: bytes) -> bool:
        # Many keys: look for the redaction words themselves, then confirm each hit is inside
        # a key, at word boundaries (so max_tokens does not send every LLM payload down the
        # careful path).
        low = out.lower()
        find = low.find
        for w in self._words:
            p = find(w.first, 0)
            while p != -1:
                m = w.pattern.match(out, p) if _boundary_before(out, p) else None
                if m is not None and _is_key_end(out, m.end()):
                    return True
                p = find(w.first, p + 1)
        return False

    def _default(self, obj: Any) -> Any:
        return _convert(obj, self)


def _contains(segs: tuple[str, ...], word: tuple[str, ...]) -> bool:
    n = len(word)
    return any(segs[i : i + n] == word for i in range(len(segs) - n + 1))


def _is_letter(c: int) -> bool:
    return 65 <= c <= 90 or 97 <= c <= 122


def _boundary_before(out: bytes, p: int) -> bool:
    c = out[p - 1]
    if not _is_letter(c):
        return True
    if 97 <= c <= 122 and 65 <= out[p] <= 90:
        return True
    # Preceded by an escape (\n, \u00e9...): the key had a separator there.
    return out[p - 2] == 92 or (p >= 6 and out[p - 6 : p - 4] == b"\\u")


def _escaped(out: bytes, q: int) -> bool:
    """Whether the quote at ``q`` is preceded by an odd number of backslashes."""
    slashes = 0
    while q - 1 - slashes >= 0 and out[q - 1 - slashes] == 92:
        slashes += 1
    return slashes % 2 == 1


def _is_key_end(out: bytes, pos: int) -> bool:
    # Object keys are the only strings orjson follows with ':'.
    q = out.find(b'"', pos)
    while q != -1:
        if not _escaped(out, q):
            return out[q + 1 : q + 2] == b":"
        q = out.find(b'"', q + 1)
    return False


_policies: dict[tuple[Any, ...], Policy] = {}
_last: tuple[Any, Policy] | None = None


def has_policy(cfg: Config) -> bool:
    """Whether :func:`policy` has ``cfg``'s policy built already."""
    return (cfg.max_value_bytes, cfg.max_depth, cfg.redact, cfg.redact_keys) in _policies


def policy(cfg: Config) -> Policy:
    """The :class:`Policy` for a config (cached: configs are immutable)."""
    global _last
    last = _last
    if last is not None and last[0] is cfg:
        return last[1]
    key = (cfg.max_value_bytes, cfg.max_depth, cfg.redact, cfg.redact_keys)
    pol = _policies.get(key)
    if pol is None:
        if len(_policies) > 64:
            _policies.clear()
        pol = _policies[key] = Policy(*key)
    _last = (cfg, pol)
    return pol


# --------------------------------------------------------------------------- conversions


def _type_name(obj: Any) -> str:
    try:
        return type(obj).__name__
    except Exception:
        return "object"


def placeholder(obj: Any, why: str = "unserializable") -> str:
    """The text that stands in for a value nothing else could serialize (and counts it)."""
    stats["placeholders"] += 1
    return f"<{why}: {_type_name(obj)}>"


def _cut_str(s: str, cap: int) -> str:
    if len(s) <= cap:
        return s
    stats["truncations"] += 1
    # Room for the marker and the quotes, so a lone cut string still fits the cap.
    return f"{s[: max(cap - _MARKER_ROOM, 0)]}...<truncated: {len(s)} chars>"


def _bytes_b64(obj: bytes | bytearray | memoryview, pol: Policy) -> str:
    size = obj.nbytes if isinstance(obj, memoryview) else len(obj)
    cap = max(pol.max_value_bytes - _MARKER_ROOM, 0) * 3 // 4
    if size <= cap:
        return base64.b64encode(obj).decode("ascii")
    stats["truncations"] += 1
    head = obj[:cap] if not isinstance(obj, memoryview) else obj.cast("B")[:cap]
    return f"{base64.b64encode(head).decode('ascii')}...<truncated: {size} bytes>"


def _bounded_repr(obj: Any) -> str:
    try:
        text = repr(obj)
    except Exception:
        return placeholder(obj, "repr failed")
    if type(text) is not str:
        return placeholder(obj, "repr failed")
    if len(text) > _REPR_MAX:
        return f"{text[:_REPR_MAX]}...<truncated: {len(text)} chars>"
    return text


def _safe_str(obj: Any) -> str:
    try:
        text = str(obj)
        if type(text) is not str:
            raise TypeError("__str__ returned a non-string")
        return text
    except Exception:
        return _bounded_repr(obj)


def _exception(obj: BaseException) -> dict[str, Any]:
    return {"type": _qualified_type(obj), "message": _safe_str(obj)}


def _qualified_type(obj: Any) -> str:
    cls = type(obj)
    module = getattr(cls, "__module__", "") or ""
    name = getattr(cls, "__qualname__", None) or cls.__name__
    return name if module in ("builtins", "__main__") else f"{module}.{name}"


def _ndarray(obj: Any, pol: Policy) -> Any:
    if obj.nbytes > pol.max_value_bytes:
        stats["truncations"] += 1
        return f"<ndarray shape={obj.shape} dtype={obj.dtype}: {obj.nbytes} bytes, truncated>"
    return obj.tolist()


def _pydantic_v2(obj: Any, pol: Policy) -> Any:
    ser = type(obj).__pydantic_serializer__
    try:
        return ser.to_python(obj, mode="json", warnings=False, fallback=pol.default)
    except Exception:
        # Types pydantic cannot write as JSON: take the Python form and let our hook finish.
        return ser.to_python(obj, warnings=False)


def _describe_iterator(obj: Any) -> str:
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    kind = _type_name(obj)
    return f"<{kind} {name}>" if isinstance(name, str) else f"<{kind}>"


def _sorted_items(obj: AbstractSet[Any]) -> list[Any]:
    # Sorted so the bytes do not depend on the process's hash seed (the worker's differs).
    try:
        return sorted(obj)
    except Exception:
        return list(obj)


Converter = Callable[[Any, Policy], Any]


def _converter_for(cls: type) -> Converter:
    """How to turn an instance of ``cls`` into something orjson writes natively."""
    if hasattr(cls, "__pydantic_serializer__") and hasattr(cls, "model_fields"):
        return _pydantic_v2
    if hasattr(cls, "__fields__") and callable(getattr(cls, "dict", None)):
        return lambda o, p: o.dict()  # pydantic v1
    attrs_fields = getattr(cls, "__attrs_attrs__", None)
    if attrs_fields is not None:
        names = tuple(a.name for a in attrs_fields)
        return lambda o, p: {n: getattr(o, n) for n in names}
    if dataclasses.is_dataclass(cls):
        # As orjson writes them: fields starting with an underscore are left out.
        fnames = tuple(f.name for f in dataclasses.fields(cls) if not f.name.startswith("_"))
        return lambda o, p: {n: getattr(o, n) for n in fnames}
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        return lambda o, p: dict(zip(o._fields, o, strict=False))
    if issubclass(cls, enum.Enum):
        return lambda o, p: o.value
    if issubclass(cls, (bytes, bytearray, memoryview)):
        return _bytes_b64
    if issubclass(cls, BaseException):
        return lambda o, p: _exception(o)
    if issubclass(cls, datetime.timedelta):
        return lambda o, p: o.total_seconds()
    if issubclass(
        cls,
        (
            decimal.Decimal,
            PurePath,
            uuid.UUID,
            ipaddress.IPv4Address,
            ipaddress.IPv6Address,
            ipaddress.IPv4Network,
            ipaddress.IPv6Network,
            ipaddress.IPv4Interface,
            ipaddress.IPv6Interface,
        ),
    ):
        return lambda o, p: str(o)
    if issubclass(cls, complex):
        return lambda o, p: str(o)
    module = getattr(cls, "__module__", "")
    if module == "numpy" and cls.__name__ == "ndarray":
        return _ndarray
    if module == "numpy" and hasattr(cls, "item") and hasattr(cls, "dtype"):
        return lambda o, p: o.item()
    if issubclass(
        cls,
        (types.GeneratorType, types.CoroutineType, types.AsyncGeneratorType, Iterator),
    ) or hasattr(cls, "__anext__"):
        # Described, never consumed: iterating would take the caller's items.
        return lambda o, p: _describe_iterator(o)
    if issubclass(cls, AbstractSet):
        return lambda o, p: _sorted_items(o)
    if issubclass(cls, Mapping):
        return lambda o, p: dict(o)
    if issubclass(cls, (Sequence, deque)) and not issubclass(cls, str):
        return lambda o, p: list(o)
    if issubclass(cls, (dict, list, tuple, str, int, float)):
        # Subclasses orjson declined (tuples): their base type.
        base = next(b for b in (dict, list, tuple, str, int, float) if issubclass(cls, b))
        return lambda o, p: base(o) if base is not tuple else list(o)
    return lambda o, p: _bounded_repr(o)


_converters: dict[type, Converter] = {}


def _convert(obj: Any, pol: Policy) -> Any:
    cls = type(obj)
    conv = _converters.get(cls)
    if conv is None:
        try:
            conv = _converter_for(cls)
        except Exception:
            conv = _placeholder_converter
        if len(_converters) >= _CACHE_MAX:
            _converters.clear()
        _converters[cls] = conv
    try:
        return conv(obj, pol)
    except Exception:
        return placeholder(obj)


def _placeholder_converter(obj: Any, pol: Policy) -> Any:
    return placeholder(obj)


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


def _dumps(value: Any, pol: Policy, keys_clean: bool = False) -> bytes:
    """JSON bytes for ``value`` under ``pol``; never raises, never exceeds the value cap.

    ``keys_clean``: a walk of ``value`` already showed it holds no secret key (see
    :func:`plan`), so the output is not scanned for one."""
    out: bytes | None
    try:
        out = orjson.dumps(value, default=pol.default, option=_OPTS)
    except Exception:
        out = None
    if (
        out is not None
        and len(out) <= pol.max_value_bytes
        and (keys_clean or not (pol.redact and pol.maybe_secret(out)))
    ):
        return out
    return _careful(value, pol, out)


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


# --------------------------------------------------------------------------- spans


def _attr(value: Any, pol: Policy) -> AttrValue | None:
    cls = type(value)
    if cls is str:
        return _cut_str(value, pol.max_value_bytes)
    if cls is bool or cls is float:
        return value  # type: ignore[no-any-return]
    if cls is int:
        return value if _INT64_MIN <= value < (1 << 63) else _big_int(value)
    if value is None:
        return None
    if (cls is list or cls is tuple) and value:
        kinds = {type(x) for x in value}
        if len(kinds) == 1:
            kind = kinds.pop()
            if kind is str and sum(len(x) for x in value) <= pol.max_value_bytes:
                return list(value)
            if kind is bool or kind is float:
                return list(value)
            if kind is int and all(_INT64_MIN <= x < (1 << 63) for x in value):
                return list(value)
    return _dumps(value, pol).decode("utf-8")


def _attributes(src: Mapping[str, Any] | None, pol: Policy, out: dict[str, AttrValue]) -> None:
    if not src:
        return
    for k, v in src.items():
        if type(k) is not str:
            k = _safe_str(k)
        if pol.redact and pol.is_secret(k):
            stats["redactions"] += 1
            out[k] = REDACTED
            continue
        try:
            a = _attr(v, pol)
        except Exception:
            a = placeholder(v)
        if a is not None:
            out[k] = a


def _attr_list(src: Mapping[str, Any] | None, pol: Policy) -> Attributes:
    out: dict[str, AttrValue] = {}
    _attributes(src, pol, out)
    return list(out.items())


_warned_hooks: set[str] = set()


def _run_hook(hook: Callable[[Any], Any], value: Any, which: str) -> Any:
    try:
        return hook(value)
    except Exception as exc:
        # Fail closed: the raw value might be exactly what the hook was meant to hide.
        stats["hook_errors"] += 1
        name = getattr(hook, "__qualname__", repr(hook))
        if name not in _warned_hooks:
            _warned_hooks.add(name)
            logger.warning(
                "looptrace: %s hook %s raised; value replaced", which, name, exc_info=exc
            )
        return f"<{which} failed: {type(exc).__name__}>"


def _payloads(span: Span, cfg: Config) -> tuple[tuple[bool, Any], tuple[bool, Any]]:
    site = span.site
    return (
        _processed(
            span.inputs,
            site.process_inputs if site is not None else None,
            cfg.process_inputs,
            "process_inputs",
        ),
        _processed(
            span.output,
            site.process_outputs if site is not None else None,
            cfg.process_outputs,
            "process_outputs",
        ),
    )


def _processed(
    value: Any,
    own: Callable[[Any], Any] | None,
    everywhere: Callable[[Any], Any] | None,
    which: str,
) -> tuple[bool, Any]:
    """(present, value after the decorator's hook, then the global one)."""
    if value is UNSET:
        return (False, None)
    if own is not None:
        value = _run_hook(own, value, which)
    if everywhere is not None:
        value = _run_hook(everywhere, value, which)
    return (True, value)


_code_cache: dict[CallSite, tuple[tuple[str, AttrValue], ...]] = {}


def _code_attributes(site: CallSite) -> tuple[tuple[str, AttrValue], ...]:
    found = _code_cache.get(site)
    if found is not None:
        return found
    prefix, _, function = site.qualname.rpartition(".")
    attrs: list[tuple[str, AttrValue]] = []
    if function:
        attrs.append((CODE_FUNCTION, function))
    namespace = site.module
    if prefix and "<locals>" not in prefix:
        namespace = f"{namespace}.{prefix}" if namespace else prefix
    if namespace:
        attrs.append((CODE_NAMESPACE, namespace))
    if len(_code_cache) >= _CACHE_MAX:
        _code_cache.clear()
    found = _code_cache[site] = tuple(attrs)
    return found


def _events(span: Span, pol: Policy) -> list[WireEvent]:
    if not span.events:
        return []
    events = []
    for ev in span.events:
        attrs: dict[str, AttrValue] = {}
        if ev.exception is not None and ev.name == EXCEPTION_EVENT:
            exc = ev.exception
            attrs[EXCEPTION_TYPE] = _qualified_type(exc)
            attrs[EXCEPTION_MESSAGE] = _cut_str(_safe_str(exc), pol.max_value_bytes)
            attrs[EXCEPTION_STACKTRACE] = _stacktrace(exc, ev.traceback)
        _attributes(ev.attributes, pol, attrs)
        events.append(WireEvent(ev.name, ev.time_ns, list(attrs.items())))
    return events


def _stacktrace(exc: BaseException, tb: types.TracebackType | None) -> str:
    try:
        text = "".join(traceback.format_exception(type(exc), exc, tb))
    except Exception:
        return f"{_qualified_type(exc)}: <traceback could not be formatted>"
    if len(text) > _STACKTRACE_MAX:
        # The end of a traceback (the raise site and the message) matters most.
        text = f"<truncated: {len(text)} chars>...{text[-_STACKTRACE_MAX:]}"
    return text


def _skeleton(span: Span, cfg: Config, pol: Policy) -> WireSpan:
    """Everything about a span except its input and output values."""
    attrs: dict[str, AttrValue] = {}
    site = span.site
    if site is not None:
        _attributes(site.attributes, pol, attrs)
        attrs.update(_code_attributes(site))
    _attributes(span.attributes, pol, attrs)
    if not span.end_ns:
        attrs[IN_PROGRESS] = True
    links = []
    for link in span.links or ():
        ctx = link.context
        links.append(
            WireLink(
                ctx.trace_id,
                ctx.span_id,
                ctx.trace_state,
                _attr_list(link.attributes, pol),
                ctx.is_remote,
            )
        )
    return _wire_for(span, list(attrs.items()), _events(span, pol), links)


def _wire_for(
    span: Span, attributes: Attributes, events: list[WireEvent], links: list[WireLink]
) -> WireSpan:
    """The span's identity, timing and status, with the given attributes, events and links."""
    return WireSpan(
        span.trace_id,
        span.span_id,
        span.parent_span_id,
        span.name,
        span.kind,
        span.start_ns,
        span.end_ns,
        attributes,
        events,
        links,
        span.status_code,
        span.status_message,
        span.trace_state,
        0,
        span.parent_is_remote,
        span.scope,
    )


def prepare(
    span: Span, cfg: Config
) -> tuple[WireSpan, tuple[bool, Any], tuple[bool, Any], Policy, int]:
    """The parent's half of ``to_wire``: run user hooks, build everything but the payloads.

    The result pickles (no tracebacks, no hook functions) so :func:`finish` can run in a
    worker process and produce exactly the bytes it would produce here."""
    pol = policy(cfg)
    inputs, output = _payloads(span, cfg)
    return _skeleton(span, cfg, pol), inputs, output, pol, cfg.max_span_bytes


def finish(
    wire: WireSpan,
    inputs: tuple[bool, Any],
    output: tuple[bool, Any],
    pol: Policy,
    max_span_bytes: int,
) -> WireSpan:
    """Serialize the payloads into ``wire`` and apply the per-span cap."""
    attrs = wire.attributes
    for key, mime, body in finish_payloads(wire, inputs, output, pol, max_span_bytes):
        attrs.append((key, body.decode("utf-8")))
        attrs.append((mime, JSON_MIME))
    return wire


def finish_payloads(
    wire: WireSpan,
    inputs: tuple[bool, Any],
    output: tuple[bool, Any],
    pol: Policy,
    max_span_bytes: int,
) -> list[tuple[str, str, bytes]]:
    """The payloads :func:`finish` adds to ``wire``, as (key, mime-type key, JSON), cut to
    the per-span cap: for an encoder that writes the JSON as it is."""
    payloads: list[tuple[str, str, bytes]] = []
    if inputs[0]:
        payloads.append((INPUT_VALUE, INPUT_MIME_TYPE, _dumps(inputs[1], pol)))
    if output[0]:
        payloads.append((OUTPUT_VALUE, OUTPUT_MIME_TYPE, _dumps(output[1], pol)))
    if not payloads:
        return payloads
    text_len = 0
    for _, v in wire.attributes:
        if type(v) is str:
            text_len += len(v)
    return capped(payloads, text_len, max_span_bytes)


def capped(
    payloads: list[tuple[str, str, bytes]], text_len: int, max_span_bytes: int
) -> list[tuple[str, str, bytes]]:
    """``payloads`` (key, mime type, JSON) cut to fit the per-span cap next to ``text_len``
    characters of other string attributes."""
    total = 0
    for p in payloads:
        total += len(p[2])
    if total + text_len <= max_span_bytes:
        return payloads
    return _fit(payloads, max(max_span_bytes - text_len, 1024))


def _fit(payloads: list[tuple[str, str, bytes]], budget: int) -> list[tuple[str, str, bytes]]:
    # Smallest first: a small input keeps its bytes and the big output gets what is left.
    order = sorted(range(len(payloads)), key=lambda i: len(payloads[i][2]))
    out = list(payloads)
    left = budget
    for n, i in enumerate(order):
        share = left // (len(order) - n)
        key, mime, body = payloads[i]
        if len(body) > share:
            body = _preview(body, len(body), max(share, 256))
        out[i] = (key, mime, body)
        left -= len(body)
    return out


def to_wire(span: Span, cfg: Config) -> WireSpan:
    """The span as OTLP-ready attributes, events and links. Never raises."""
    try:
        return finish(*prepare(span, cfg))
    except Exception as exc:
        from ._errors import internal_error

        internal_error("serialize.to_wire", exc)
        return _wire_for(span, [("looptrace.serialization_error", _qualified_type(exc))], [], [])


# --------------------------------------------------------------------------- sizing

_SPAN_OVERHEAD = 320
_VALUE_OVERHEAD = 48


_TEXT = frozenset((str, bytes, bytearray))


def _top_size(v: Any) -> int:
    return len(v) + 2 if type(v) in _TEXT else _VALUE_OVERHEAD


def estimate_size(span: Span) -> int:
    """A cheap guess at a span's encoded size, for buffer accounting before serialization.

    Looks only at top-level values (``len`` of strings and bytes, a fixed amount for anything
    else): O(number of arguments), never a walk. It runs on the caller's thread for every
    span, so the per-value rule is written out in the loops rather than called."""
    n = _SPAN_OVERHEAD + len(span.name)
    attrs = span.attributes
    if attrs:
        for v in attrs.values():
            n += 26 + len(v) if type(v) in _TEXT else 24 + _VALUE_OVERHEAD
    inputs = span.inputs
    if type(inputs) is dict:
        for v in inputs.values():
            n += 18 + len(v) if type(v) in _TEXT else 16 + _VALUE_OVERHEAD
    elif inputs is not UNSET:
        n += _top_size(inputs)
    if span.output is not UNSET:
        n += _top_size(span.output)
    if span.events:
        n += 256 * len(span.events)
    return n


def leaf_size(v: Any) -> int:
    """What a non-container value adds to the offload decision: arrays and memoryviews by
    their buffer, str subclasses by length, anything else nothing."""
    if type(v) is memoryview:
        return int(v.nbytes)
    if isinstance(v, str):
        return len(v)
    if hasattr(v, "__array_interface__"):
        nbytes = getattr(v, "nbytes", None)
        if type(nbytes) is int:
            return nbytes
    return 0
