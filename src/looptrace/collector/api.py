"""The JSON API the viewer reads (``/api/...``; shapes documented in docs/collector.md).

Every handler reads the store in a worker thread. A bad query parameter is a 400 that says
which; a store that cannot be read (locked past its busy timeout, gone) is a 503.
"""

from __future__ import annotations

import functools
import math
import sqlite3
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.to_thread
import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from ._internals import BadRequest as _BadRequest
from ._internals import Store, StoreError
from .receiver import receive_traces


def _json_default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        import base64

        return base64.b64encode(bytes(value)).decode("ascii")
    raise TypeError(f"cannot encode {type(value).__name__}")


class JSONResponse(Response):
    """orjson-encoded JSON (bytes attribute values become base64 strings)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, default=_json_default)


def _api_error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _int_param(request: Request, name: str, default: int, lo: int = 0, hi: int = 10_000) -> int:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise _BadRequest(f"{name} must be an integer, got {raw!r}") from None
    if not lo <= value <= hi:
        raise _BadRequest(f"{name} must be between {lo} and {hi}")
    return value


async def _in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    return await anyio.to_thread.run_sync(lambda: fn(*args))


async def _api_traces(request: Request) -> Response:
    store: Store = request.app.state.store
    limit = _int_param(request, "limit", 50, 1, 1000)
    offset = _int_param(request, "offset", 0, 0, 10**9)
    status = request.query_params.get("status") or None
    if status not in (None, "ok", "error", "unset", "in_progress"):
        raise _BadRequest("status must be ok, error, unset or in_progress")
    include_lag = request.query_params.get("include_lag", "") in ("1", "true")
    min_ms = _float_param(request, "min_duration_ms")
    # ``range``: seconds back from now, what the list's time-range menu sends; since/until
    # are absolute bounds in nanoseconds.
    seconds_back = _float_param(request, "range")
    since = _int_param(request, "since", -1, -1, 2**63 - 1)
    until = _int_param(request, "until", -1, -1, 2**63 - 1)
    if seconds_back is not None:
        since = max(since, time.time_ns() - int(seconds_back * 1e9))
    traces = await _in_thread(
        functools.partial(
            store.list_traces,
            limit,
            offset,
            request.query_params.get("name") or None,
            status,
            request.query_params.get("experiment") or None,
            include_lag,
            service=request.query_params.get("service") or None,
            min_duration_ns=None if min_ms is None else int(min_ms * 1e6),
            since_ns=None if since < 0 else since,
            until_ns=None if until < 0 else until,
            user=request.query_params.get("user") or None,
            session=request.query_params.get("session") or None,
            tags=[t for t in request.query_params.getlist("tag") if t],
            metadata=_meta_params(request),
            attrs=_pair_params(request, "attr"),
            text=request.query_params.get("q") or None,
        )
    )
    return JSONResponse({"traces": traces, "limit": limit, "offset": offset})


async def _api_delete_trace(request: Request) -> Response:
    store: Store = request.app.state.store
    trace_id = request.path_params["trace_id"].lower()
    deleted = await _in_thread(store.delete_traces, [trace_id])
    if not deleted:
        return _api_error(404, f"no trace {trace_id}")
    return JSONResponse({"deleted": {"traces": [trace_id]}})


async def _api_delete_experiment(request: Request) -> Response:
    store: Store = request.app.state.store
    experiment_id = request.path_params["experiment_id"]
    deleted = await _in_thread(store.delete_experiment, experiment_id)
    if deleted is None:
        return _api_error(404, f"no experiment {experiment_id}")
    return JSONResponse({"deleted": {"experiment": experiment_id, "traces": deleted}})


def _meta_params(request: Request) -> list[tuple[str, str]]:
    return _pair_params(request, "meta")


def _pair_params(request: Request, name: str) -> list[tuple[str, str]]:
    # ``meta=key=value`` or ``attr=key=value``, repeatable: the first "=" splits, so a value
    # may hold more of them.
    out = []
    for raw in request.query_params.getlist(name):
        if not raw:
            continue
        key, sep, value = raw.partition("=")
        if not sep or not key:
            raise _BadRequest(f"{name} must be key=value, got {raw!r}")
        out.append((key, value))
    return out


async def _api_sessions(request: Request) -> Response:
    store: Store = request.app.state.store
    limit = _int_param(request, "limit", 50, 1, 1000)
    offset = _int_param(request, "offset", 0, 0, 10**9)
    preview = _int_param(request, "preview", 200, 0, 10**6)
    seconds_back = _float_param(request, "range")
    sessions = await _in_thread(
        functools.partial(
            store.list_sessions,
            limit,
            offset,
            user=request.query_params.get("user") or None,
            since_ns=None if seconds_back is None else time.time_ns() - int(seconds_back * 1e9),
            preview=preview,
        )
    )
    return JSONResponse({"sessions": sessions, "limit": limit, "offset": offset})


async def _api_session(request: Request) -> Response:
    store: Store = request.app.state.store
    session_id = request.path_params["session_id"]
    preview = _int_param(request, "preview", 200, 0, 10**6)
    limit = _int_param(request, "limit", 1000, 1, 10_000)
    session = await _in_thread(store.get_session, session_id, preview, limit)
    if session is None:
        return _api_error(404, f"no session {session_id}")
    return JSONResponse(session)


def _float_param(request: Request, name: str) -> float | None:
    raw = request.query_params.get(name)
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise _BadRequest(f"{name} must be a number") from None
    if not math.isfinite(value) or value < 0:
        raise _BadRequest(f"{name} must be a number of 0 or more")
    return value


async def _api_services(request: Request) -> Response:
    store: Store = request.app.state.store
    return JSONResponse({"services": await _in_thread(store.services)})


async def _api_trace(request: Request) -> Response:
    store: Store = request.app.state.store
    trace_id = request.path_params["trace_id"].lower()
    preview = _int_param(request, "preview", 1000, 0, 10**8)
    cap: int = request.app.state.max_trace_spans
    limit = _int_param(request, "limit", cap, 1, cap)

    def read() -> tuple[Any, Any]:
        # One more than asked: whether the trace goes on past the page, without counting it.
        spans = store.get_trace(trace_id, preview=preview, limit=limit + 1)
        return store.get_trace_summary(trace_id), spans

    summary, spans = await anyio.to_thread.run_sync(read)
    if summary is None:
        return _api_error(404, f"no trace {trace_id}")
    truncated = len(spans) > limit
    return JSONResponse({"trace": summary, "spans": spans[:limit], "truncated": truncated})


async def _api_span(request: Request) -> Response:
    store: Store = request.app.state.store
    span = await _in_thread(
        store.get_span,
        request.path_params["trace_id"].lower(),
        request.path_params["span_id"].lower(),
    )
    if span is None:
        return _api_error(404, "no such span")
    return JSONResponse({"span": span})


async def _api_experiments(request: Request) -> Response:
    store: Store = request.app.state.store
    limit = _int_param(request, "limit", 50, 1, 1000)
    offset = _int_param(request, "offset", 0, 0, 10**9)
    experiments = await _in_thread(store.list_experiments, limit, offset)
    return JSONResponse({"experiments": experiments, "limit": limit, "offset": offset})


async def _api_lag(request: Request) -> Response:
    store: Store = request.app.state.store
    limit = _int_param(request, "limit", 100, 1, 10_000)
    worst = _int_param(request, "worst", 20, 0, 1000)
    since = _int_param(request, "since_ns", 0, 0, 2**63 - 1)
    until = _int_param(request, "until_ns", 0, 0, 2**63 - 1)
    service = request.query_params.get("service") or None
    data = await _in_thread(store.lag_summaries, limit, since or None, worst)
    return JSONResponse(_lag_figures(data, service, until or None))


# A culprit whose cause is one of these held the loop for the program; the others (looptrace's
# own work, the process not running) are listed apart, never among the program's culprits.
_PROGRAM_CAUSES = ("code", "gc")


def _lag_figures(data: dict[str, Any], service: str | None, until_ns: int | None) -> dict[str, Any]:
    """The lag page's data with its named figures (``figures``), over the summaries shown.

    ``worst_stall_ms``: the longest time the program held the loop (its code or its garbage
    collection; not looptrace's own work, not time the process was not scheduled), the worst
    of the summaries' windows, with ``worst_stall_cause``. ``p99_lag_ms``: the worst window's
    p99 lag, that window ``p99_window_ms`` long. ``worst_lag_ms``: the worst lag, everything
    included. ``unscheduled_ms`` and ``looptrace_ms``: summed over the windows. Summaries from
    before the stall figures existed count their worst lag as their worst stall.
    """
    summaries = [
        s
        for s in data["summaries"]
        if (service is None or s.get("service_name") == service)
        and (until_ns is None or (s.get("start_ns") or 0) <= until_ns)
    ]
    figures: dict[str, Any] = {
        "summaries": len(summaries),
        "processes": len({(s.get("service_name"), s.get("instance")) for s in summaries}),
        "window_start_ns": min((s["start_ns"] for s in summaries), default=None),
        "window_end_ns": max((s["end_ns"] or s["start_ns"] for s in summaries), default=None),
        "worst_stall_ms": None,
        "worst_stall_cause": "",
        "worst_stall_start_ns": None,
        "p99_lag_ms": None,
        "p99_window_ms": None,
        "worst_lag_ms": None,
        "unscheduled_ms": 0.0,
        "looptrace_ms": 0.0,
    }
    for s in summaries:
        values = s.get("values") or {}
        lag = _number(values.get("max_ms"))
        stall = _number(values.get("worst_stall_ms", lag))
        p99 = _number(values.get("p99_ms"))
        if stall is not None and (
            figures["worst_stall_ms"] is None or stall > figures["worst_stall_ms"]
        ):
            figures["worst_stall_ms"] = stall
            figures["worst_stall_cause"] = str(values.get("worst_stall_cause") or "")
            figures["worst_stall_start_ns"] = s["start_ns"]
        if p99 is not None and (figures["p99_lag_ms"] is None or p99 > figures["p99_lag_ms"]):
            figures["p99_lag_ms"] = p99
            length = _number(values.get("window_ms"))
            figures["p99_window_ms"] = (
                length
                if length is not None
                else ((s["end_ns"] or s["start_ns"]) - s["start_ns"]) / 1e6
            )
        if lag is not None and (figures["worst_lag_ms"] is None or lag > figures["worst_lag_ms"]):
            figures["worst_lag_ms"] = lag
        figures["unscheduled_ms"] += _number(values.get("unscheduled_ms")) or 0.0
        figures["looptrace_ms"] += _number(values.get("looptrace_ms")) or 0.0
    figures["unscheduled_ms"] = round(figures["unscheduled_ms"], 3)
    figures["looptrace_ms"] = round(figures["looptrace_ms"], 3)
    culprits = data.get("culprits") or []
    return {
        **data,
        "summaries": summaries,
        "figures": figures,
        "culprits": [c for c in culprits if c.get("cause", "code") in _PROGRAM_CAUSES],
        "other_stalls": [c for c in culprits if c.get("cause", "code") not in _PROGRAM_CAUSES],
    }


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


async def _api_stats(request: Request) -> Response:
    store: Store = request.app.state.store
    return JSONResponse(await _in_thread(store.stats))


def _api(
    handler: Callable[[Request], Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except _BadRequest as exc:
            return _api_error(400, str(exc))
        except (sqlite3.OperationalError, StoreError) as exc:
            return _api_error(503, f"store unavailable: {exc}")

    return wrapped


def api_routes() -> list[BaseRoute]:
    """``/v1/traces`` and the ``/api`` routes (what ``create_app`` mounts before extra routes)."""
    # Imported here: they build on this module's helpers.
    from . import api_experiments, live

    return [
        Route("/v1/traces", receive_traces, methods=["POST"]),
        Route("/api/traces", _api(_api_traces), methods=["GET"]),
        Route("/api/traces/{trace_id}", _api(_api_trace), methods=["GET"]),
        # Deleting is DELETE only: a cross-site page cannot send one without a CORS preflight,
        # which the collector never grants, and a token, when set, guards it like every route.
        Route("/api/traces/{trace_id}", _api(_api_delete_trace), methods=["DELETE"]),
        Route("/api/traces/{trace_id}/spans/{span_id}", _api(_api_span), methods=["GET"]),
        Route("/api/services", _api(_api_services), methods=["GET"]),
        Route("/api/sessions", _api(_api_sessions), methods=["GET"]),
        # A session id is the application's own string and may hold a "/".
        Route("/api/sessions/{session_id:path}", _api(_api_session), methods=["GET"]),
        Route("/api/experiments", _api(_api_experiments), methods=["GET"]),
        *api_experiments.routes(),
        Route("/api/experiments/{experiment_id}", _api(_api_delete_experiment), methods=["DELETE"]),
        *live.routes(),
        Route("/api/lag", _api(_api_lag), methods=["GET"]),
        Route("/api/stats", _api(_api_stats), methods=["GET"]),
    ]
