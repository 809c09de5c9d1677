"""Reads of event-loop lag: the lag monitor's summary spans, the most lagged spans, and the
code that blocked the loop (stall events grouped by function, file and line)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from .columns import loads
from .connection import Connections
from .traces import LAG_SPAN_NAME

LAG_PREFIX = "looptrace.loop.lag."


class LagReads(Connections):
    """The store's lag queries."""

    def lag_summaries(
        self, limit: int = 100, since_ns: int | None = None, worst: int = 20
    ) -> dict[str, Any]:
        """Loop-lag facts: the ``looptrace.loop.lag`` summary spans (newest first, their
        ``looptrace.loop.lag.*`` attributes without the prefix) and the ``worst`` spans by
        ``looptrace.loop.lag_max_ms``."""
        summaries = []
        with self._reader() as conn:
            for trace_id, span_id, start, end, attrs, service, instance in conn.execute(
                "SELECT s.trace_id, s.span_id, s.start_ns, s.end_ns, s.attributes, "
                "json_extract(r.attributes, '$.\"service.name\"'), "
                "json_extract(r.attributes, '$.\"service.instance.id\"') FROM spans s "
                "LEFT JOIN resources r ON r.id = s.resource_id "
                # The name as a literal: the index of summary spans is partial on it.
                f"WHERE s.name = '{LAG_SPAN_NAME}' AND s.start_ns >= ? "
                "ORDER BY s.start_ns DESC LIMIT ?",
                (since_ns or 0, limit),
            ):
                values = {
                    k[len(LAG_PREFIX) :]: v
                    for k, v in loads(attrs).items()
                    if k.startswith(LAG_PREFIX)
                }
                summaries.append(
                    {
                        "trace_id": trace_id,
                        "span_id": span_id,
                        "start_ns": start,
                        "end_ns": end,
                        "service_name": service,
                        "instance": instance,
                        "values": values,
                    }
                )
            worst_spans = [
                {
                    "trace_id": r[0],
                    "span_id": r[1],
                    "name": r[2],
                    "start_ns": r[3],
                    "duration_ns": r[4],
                    "lag_max_ms": r[5],
                }
                # The monitor's own summary spans carry a window's lag, not a stall they
                # suffered: they are the chart, not the list of victims.
                for r in conn.execute(
                    "SELECT trace_id, span_id, name, start_ns, duration_ns, lag_max_ms FROM spans "
                    "WHERE lag_max_ms IS NOT NULL AND start_ns >= ? AND name != ? "
                    "ORDER BY lag_max_ms DESC LIMIT ?",
                    (since_ns or 0, LAG_SPAN_NAME, worst),
                )
            ]
            culprits = _culprits(
                conn.execute(
                    "SELECT trace_id, span_id, name, start_ns, end_ns, lag_max_ms, events "
                    "FROM spans WHERE lag_max_ms IS NOT NULL AND start_ns >= ? AND name != ? "
                    "ORDER BY lag_max_ms DESC LIMIT ?",
                    (since_ns or 0, LAG_SPAN_NAME, _CULPRIT_SCAN),
                ),
                worst,
            )
        return {"summaries": summaries, "worst_spans": worst_spans, "culprits": culprits}


# The lag page's culprits come from the stall events on this many of the most lagged spans.
_CULPRIT_SCAN = 2000
_STALL_EVENT = "looptrace.loop.stall"
_VICTIMS_SHOWN = 5


def _culprits(rows: Iterable[Sequence[Any]], limit: int) -> list[dict[str, Any]]:
    """Stall events grouped by the code that blocked the loop (function, file, line), worst
    first: how often, how long, the stack of the worst stall, the spans it happened in, and
    the other spans that were running (so waited) while it blocked."""
    spans = [tuple(r) for r in rows]
    groups: dict[tuple[Any, Any, Any, Any], dict[str, Any]] = {}
    for trace_id, span_id, name, _start, _end, _lag, events in spans:
        for event in loads(events) if events and events != "[]" else ():
            if event.get("name") != _STALL_EVENT:
                continue
            attrs = event.get("attributes") or {}
            # The stall is the part of the step the process was running (what the monitor
            # names a stall); its cause keeps looptrace's own work and pauses apart.
            cause = attrs.get("looptrace.loop.stall.cause") or "code"
            key = (
                attrs.get("code.function"),
                attrs.get("code.filepath"),
                attrs.get("code.lineno"),
                cause,
            )
            ms = float(attrs.get("looptrace.loop.stall.duration_ms") or 0.0) - float(
                attrs.get("looptrace.loop.stall.unscheduled_ms") or 0.0
            )
            ms = round(max(ms, 0.0), 3)
            group = groups.get(key)
            if group is None:
                group = groups[key] = {
                    "function": key[0],
                    "filepath": key[1],
                    "lineno": key[2],
                    "cause": cause,
                    "stalls": 0,
                    "total_ms": 0.0,
                    "max_ms": 0.0,
                    "stack": "",
                    "task": None,
                    "in_spans": [],
                    "waiting_spans": [],
                    "_windows": [],
                    "_seen": set(),
                }
            group["stalls"] += 1
            group["total_ms"] += ms
            if ms >= group["max_ms"]:
                group["max_ms"] = ms
                group["stack"] = attrs.get("looptrace.loop.stall.stack", "")
                group["task"] = attrs.get("looptrace.task.name")
            at = int(event.get("time_ns") or 0)
            group["_windows"].append((at, at + int(ms * 1e6)))
            group["_seen"].add((trace_id, span_id))
            if len(group["in_spans"]) < _VICTIMS_SHOWN and all(
                (v["trace_id"], v["span_id"]) != (trace_id, span_id) for v in group["in_spans"]
            ):
                group["in_spans"].append({"trace_id": trace_id, "span_id": span_id, "name": name})
    ranked = sorted(groups.values(), key=lambda g: g["max_ms"], reverse=True)[:limit]
    for group in ranked:
        windows, seen = group.pop("_windows"), group.pop("_seen")
        waiting = 0
        for trace_id, span_id, name, start, end, _lag, _events in spans:
            if (trace_id, span_id) in seen:
                continue
            stop = end or start
            if any(start <= w_end and w_start <= stop for w_start, w_end in windows):
                waiting += 1
                if len(group["waiting_spans"]) < _VICTIMS_SHOWN:
                    group["waiting_spans"].append(
                        {"trace_id": trace_id, "span_id": span_id, "name": name}
                    )
        group["waiting"] = waiting
        group["total_ms"] = round(group["total_ms"], 3)
    return ranked
