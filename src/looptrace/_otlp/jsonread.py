"""Reading OTLP/JSON trace requests."""

from __future__ import annotations

import base64
import binascii
from typing import TYPE_CHECKING, Any

import orjson

from .._wire import DecodedSpan
from ._common import _INT64_MAX, _INT64_MIN, _MASK64, DecodeError

if TYPE_CHECKING:
    pass


# -- JSON ------------------------------------------------------------------------------------

_HEX = frozenset("0123456789abcdefABCDEF")
_SPAN_KINDS = {
    "SPAN_KIND_UNSPECIFIED": 0,
    "SPAN_KIND_INTERNAL": 1,
    "SPAN_KIND_SERVER": 2,
    "SPAN_KIND_CLIENT": 3,
    "SPAN_KIND_PRODUCER": 4,
    "SPAN_KIND_CONSUMER": 5,
}
_STATUS_CODES = {"STATUS_CODE_UNSET": 0, "STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}


def _get(obj: dict[str, Any], camel: str, snake: str, default: Any = None) -> Any:
    # OTLP/JSON uses lowerCamelCase; the protobuf JSON mapping also accepts the proto names.
    v = obj.get(camel)
    if v is None:
        v = obj.get(snake)
    return default if v is None else v


def _obj(v: Any, what: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise DecodeError(f"{what} must be a JSON object, got {type(v).__name__}")
    return v


def _arr(v: Any, what: str) -> list[Any]:
    if v is None:
        return []
    if not isinstance(v, list):
        raise DecodeError(f"{what} must be a JSON array, got {type(v).__name__}")
    return v


def _jstr(v: Any, what: str) -> str:
    if v is None:
        return ""
    if not isinstance(v, str):
        raise DecodeError(f"{what} must be a string, got {type(v).__name__}")
    return v


def _jint(v: Any, what: str, signed: bool = True) -> int:
    # 64-bit integers are decimal strings in OTLP/JSON; accept numbers too.
    if type(v) is str:
        try:
            n = int(v)
        except ValueError:
            raise DecodeError(f"{what} must be an integer, got {v[:40]!r}") from None
    elif v is None:
        return 0
    elif isinstance(v, bool):
        raise DecodeError(f"{what} must be an integer, got a boolean")
    elif isinstance(v, int):
        n = v
    elif isinstance(v, float) and v.is_integer():
        n = int(v)
    else:
        raise DecodeError(f"{what} must be an integer, got {type(v).__name__}")
    lo, hi = (_INT64_MIN, _INT64_MAX) if signed else (0, _MASK64)
    if not lo <= n <= hi:
        raise DecodeError(f"{what} is out of range: {n}")
    return n


def _jenum(v: Any, names: dict[str, int], what: str) -> int:
    if isinstance(v, str) and v in names:
        return names[v]
    return _jint(v, what)


def _jid(v: Any, size: int, what: str, optional: bool = False) -> str:
    """OTLP/JSON ids are hex; the generic protobuf JSON mapping would make them base64, which
    some encoders still send, so both are accepted."""
    s = _jstr(v, what)
    if len(s) == size * 2 and _HEX.issuperset(s):
        return s.lower()
    if not s:
        if optional:
            return ""
        raise DecodeError(f"{what} is missing")
    try:
        raw = base64.b64decode(s, validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) == size:
        return raw.hex()
    raise DecodeError(f"{what} must be {size * 2} hex digits, got {s[:40]!r}")


def _jdouble(v: Any, what: str) -> float:
    if isinstance(v, bool):
        raise DecodeError(f"{what} must be a number, got a boolean")
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            pass
    raise DecodeError(f"{what} must be a number, got {v!r:.40}")


def _json_value(v: Any, depth: int = 0) -> Any:
    if depth > 32:
        raise DecodeError("AnyValue nested too deeply")
    if v is None:
        return None
    v = _obj(v, "AnyValue")
    for key, val in v.items():
        if key in ("stringValue", "string_value"):
            return _jstr(val, "stringValue")
        if key in ("boolValue", "bool_value"):
            if not isinstance(val, bool):
                raise DecodeError(f"boolValue must be true or false, got {val!r:.40}")
            return val
        if key in ("intValue", "int_value"):
            return _jint(val, "intValue")
        if key in ("doubleValue", "double_value"):
            return _jdouble(val, "doubleValue")
        if key in ("bytesValue", "bytes_value"):
            try:
                return base64.b64decode(_jstr(val, "bytesValue"), validate=True)
            except (binascii.Error, ValueError):
                raise DecodeError("bytesValue is not valid base64") from None
        if key in ("arrayValue", "array_value"):
            values = _arr(_obj(val, "arrayValue").get("values"), "arrayValue.values")
            return [_json_value(x, depth + 1) for x in values]
        if key in ("kvlistValue", "kvlist_value"):
            values = _arr(_obj(val, "kvlistValue").get("values"), "kvlistValue.values")
            return dict(_json_kv(x, depth + 1) for x in values)
    return None


def _json_kv(kv: Any, depth: int = 0) -> tuple[str, Any]:
    kv = _obj(kv, "attribute")
    return _jstr(kv.get("key"), "attribute key"), _json_value(kv.get("value"), depth)


def _json_attrs_dict(v: Any, what: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in _arr(v, what):
        if type(kv) is dict:
            key = kv.get("key")
            value = kv.get("value")
            # The common case, a string attribute, without the general walk.
            if type(key) is str and type(value) is dict and len(value) == 1:
                s = value.get("stringValue")
                if type(s) is str:
                    out[key] = s
                    continue
        key, out_value = _json_kv(kv)
        out[key] = out_value
    return out


def _decode_json_request(raw: bytes, spans: list[DecodedSpan] | None = None) -> list[DecodedSpan]:
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise DecodeError(f"invalid JSON: {exc}") from None
    doc = _obj(doc, "request")
    if spans is None:
        spans = []
    for rs in _arr(_get(doc, "resourceSpans", "resource_spans"), "resourceSpans"):
        rs = _obj(rs, "resourceSpans[]")
        res = _obj(rs.get("resource") or {}, "resource")
        resource = _json_attrs_dict(res.get("attributes"), "resource.attributes")
        for ss in _arr(_get(rs, "scopeSpans", "scope_spans"), "scopeSpans"):
            ss = _obj(ss, "scopeSpans[]")
            scope = _obj(ss.get("scope") or {}, "scope")
            scope_name = _jstr(scope.get("name"), "scope.name")
            scope_version = _jstr(scope.get("version"), "scope.version")
            for sp in _arr(ss.get("spans"), "spans"):
                spans.append(_json_span(_obj(sp, "span"), resource, scope_name, scope_version))
    return spans


def _json_span(
    sp: dict[str, Any], resource: dict[str, Any], scope_name: str, scope_version: str
) -> DecodedSpan:
    status = _obj(sp.get("status") or {}, "status")
    events = []
    for ev in _arr(sp.get("events"), "events"):
        ev = _obj(ev, "event")
        events.append(
            {
                "name": _jstr(ev.get("name"), "event name"),
                "time_ns": _jint(
                    _get(ev, "timeUnixNano", "time_unix_nano"), "timeUnixNano", signed=False
                ),
                "attributes": _json_attrs_dict(ev.get("attributes"), "event attributes"),
            }
        )
    links = []
    for link in _arr(sp.get("links"), "links"):
        link = _obj(link, "link")
        links.append(
            {
                "trace_id": _jid(_get(link, "traceId", "trace_id"), 16, "link traceId"),
                "span_id": _jid(_get(link, "spanId", "span_id"), 8, "link spanId"),
                "trace_state": _jstr(_get(link, "traceState", "trace_state"), "traceState"),
                "attributes": _json_attrs_dict(link.get("attributes"), "link attributes"),
            }
        )
    parent = _jid(_get(sp, "parentSpanId", "parent_span_id"), 8, "parentSpanId", optional=True)
    return DecodedSpan(
        trace_id=_jid(_get(sp, "traceId", "trace_id"), 16, "traceId"),
        span_id=_jid(_get(sp, "spanId", "span_id"), 8, "spanId"),
        parent_span_id=parent or None,
        name=_jstr(sp.get("name"), "span name"),
        kind=_jenum(sp.get("kind"), _SPAN_KINDS, "kind"),
        start_ns=_jint(
            _get(sp, "startTimeUnixNano", "start_time_unix_nano"), "startTimeUnixNano", False
        ),
        end_ns=_jint(_get(sp, "endTimeUnixNano", "end_time_unix_nano"), "endTimeUnixNano", False),
        attributes=_json_attrs_dict(sp.get("attributes"), "attributes"),
        events=events,
        links=links,
        status_code=_jenum(status.get("code"), _STATUS_CODES, "status code"),
        status_message=_jstr(status.get("message"), "status message"),
        trace_state=_jstr(_get(sp, "traceState", "trace_state"), "traceState"),
        resource=resource,
        scope_name=scope_name,
        scope_version=scope_version,
    )
