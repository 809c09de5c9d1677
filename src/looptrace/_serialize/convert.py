"""Values orjson does not know, turned into ones it does (the ``default`` hook)."""

from __future__ import annotations

import base64
import dataclasses
import datetime
import decimal
import enum
import ipaddress
import types
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from pathlib import PurePath
from typing import TYPE_CHECKING, Any

from ._common import _CACHE_MAX, _MARKER_ROOM, _REPR_MAX, stats

if TYPE_CHECKING:
    from .policy import Policy


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


Converter = Callable[[Any, "Policy"], Any]


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
