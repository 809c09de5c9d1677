"""The JSON columns (attributes, events, links, resources): values as orjson writes them, with
bytes tagged so they read back as bytes."""

from __future__ import annotations

import base64
from typing import Any

import orjson

_BYTES_TAG = "$bytes"


def _default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {_BYTES_TAG: base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"cannot store {type(value).__name__}")


def dumps(value: Any) -> str:
    return orjson.dumps(value, default=_default).decode()


def _untag(value: Any) -> Any:
    if isinstance(value, dict):
        if len(value) == 1 and _BYTES_TAG in value:
            return base64.b64decode(value[_BYTES_TAG])
        return {k: _untag(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_untag(v) for v in value]
    return value


def loads(text: str | None) -> Any:
    if text is None:
        return None
    value = orjson.loads(text)
    # Only bytes attributes are tagged, and they are rare: skip the walk unless one is there.
    return _untag(value) if _BYTES_TAG in text else value
