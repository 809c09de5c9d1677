"""OTLP/JSON encoding of a span (ids in hex, 64-bit integers as strings)."""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import orjson

from .._wire import Attributes, WireSpan
from ._common import (
    _FLAGS_LOCAL,
    _FLAGS_REMOTE,
    _INT64_MAX,
    _INT64_MIN,
    FLAG_HAS_IS_REMOTE,
    FLAG_IS_REMOTE,
)
from .pb import _base_value

if TYPE_CHECKING:
    pass


# ---------------------------------------------------------------------------------------------
# JSON encoding (OTLP/JSON: hex ids, 64-bit integers as decimal strings, enums as integers)
# ---------------------------------------------------------------------------------------------


def _json_any(v: Any) -> dict[str, Any]:
    t = type(v)
    if t is str:
        return {"stringValue": v}
    if t is bool:
        return {"boolValue": v}
    if t is int:
        if _INT64_MIN <= v <= _INT64_MAX:
            return {"intValue": str(v)}
        return {"stringValue": str(v)}
    if t is float:
        if math.isfinite(v):
            return {"doubleValue": v}
        # The protobuf JSON mapping spells the special doubles as strings.
        return {"doubleValue": "NaN" if v != v else ("Infinity" if v > 0 else "-Infinity")}
    if t is bytes or t is bytearray or t is memoryview:
        return {"bytesValue": base64.b64encode(bytes(v)).decode("ascii")}
    if t is list or t is tuple:
        return {"arrayValue": {"values": [_json_any(x) for x in v]}}
    if isinstance(v, Mapping):
        return {
            "kvlistValue": {
                "values": [{"key": str(k), "value": _json_any(x)} for k, x in v.items()]
            }
        }
    if v is None:
        return {}
    return _json_any(_base_value(v))


def _json_attrs(attrs: Attributes) -> list[dict[str, Any]]:
    return [
        {"key": k, "value": {"stringValue": v} if type(v) is str else _json_any(v)}
        for k, v in attrs
    ]


def _span_json_obj(w: WireSpan) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "traceId": f"{w.trace_id:032x}",
        "spanId": f"{w.span_id:016x}",
        "flags": _FLAGS_REMOTE if w.parent_is_remote else _FLAGS_LOCAL,
        "name": w.name,
        "kind": w.kind,
        "startTimeUnixNano": str(w.start_ns),
        "endTimeUnixNano": str(w.end_ns),
        "attributes": [
            {"key": k, "value": {"stringValue": v} if type(v) is str else _json_any(v)}
            for k, v in w.attributes
        ],
    }
    if w.parent_span_id:
        obj["parentSpanId"] = f"{w.parent_span_id:016x}"
    if w.trace_state:
        obj["traceState"] = w.trace_state
    if w.dropped_attributes:
        obj["droppedAttributesCount"] = w.dropped_attributes
    if w.events:
        obj["events"] = [
            {
                "timeUnixNano": str(ev.time_ns),
                "name": ev.name,
                "attributes": _json_attrs(ev.attributes),
            }
            for ev in w.events
        ]
    if w.links:
        obj["links"] = [
            {
                "traceId": f"{link.trace_id:032x}",
                "spanId": f"{link.span_id:016x}",
                **({"traceState": link.trace_state} if link.trace_state else {}),
                "attributes": _json_attrs(link.attributes),
                "flags": FLAG_HAS_IS_REMOTE | (FLAG_IS_REMOTE if link.is_remote else 0),
            }
            for link in w.links
        ]
    status: dict[str, Any] = {}
    if w.status_message:
        status["message"] = w.status_message
    if w.status_code:
        status["code"] = w.status_code
    if status:
        obj["status"] = status
    return obj


def _dumps(obj: Any) -> bytes:
    try:
        return orjson.dumps(obj)
    except orjson.JSONEncodeError:
        # Only invalid text (lone surrogates) gets here: replace it and try once more.
        return orjson.dumps(_scrub(obj))


def _scrub(obj: Any) -> Any:
    if isinstance(obj, str):
        return obj.encode("utf-8", "replace").decode("utf-8")
    if isinstance(obj, dict):
        return {_scrub(k): _scrub(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_scrub(x) for x in obj]
    return obj
