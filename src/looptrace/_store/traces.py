"""Reads of traces: the trace list and its filters, one trace's spans (whole or with payload
previews), the tree ``looptrace show`` prints, one span, and a row back into a DecodedSpan."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .. import _semconv as sc
from .._wire import DecodedSpan
from .columns import loads
from .connection import Connections
from .schema import LAG_SPAN_NAME as LAG_SPAN_NAME
from .search import search_plan
from .write import METADATA_LABEL_PREFIX, TAG_LABEL

STATUS_NAMES = {0: "unset", 1: "ok", 2: "error"}


class TraceReads(Connections):
    """The store's trace queries."""

    def list_traces(
        self,
        limit: int = 50,
        offset: int = 0,
        name: str | None = None,
        status: str | None = None,
        experiment: str | None = None,
        include_lag: bool = False,
        *,
        service: str | None = None,
        min_duration_ns: int | None = None,
        since_ns: int | None = None,
        until_ns: int | None = None,
        user: str | None = None,
        session: str | None = None,
        tags: Sequence[str] = (),
        metadata: Sequence[tuple[str, str]] = (),
        attrs: Sequence[tuple[str, str]] = (),
        text: str | None = None,
    ) -> list[dict[str, Any]]:
        """Trace summaries, newest first. ``name`` matches a substring of the root's name;
        ``status`` is ``ok`` (no span failed), ``error`` (the root or any span failed) or
        ``in_progress``; ``service`` is the root's service, exactly; ``min_duration_ns`` keeps
        finished traces at least that long; ``since_ns``/``until_ns`` bound the start time.
        ``user`` and ``session`` are the trace's ``user.id`` and ``session.id`` (its root's,
        else any span's), exactly; a trace has each of ``tags`` when any of its spans lists
        it in ``tag.tags``, and each ``(key, value)`` of ``metadata`` when any span's
        ``metadata`` holds it (a value that is not a string compares as its JSON text).
        A trace has each ``(key, value)`` of ``attrs`` when any of its spans has that
        attribute with that value (compared as text: a number or boolean as its JSON form);
        ``text`` keeps the traces in which every word of it starts a word of a span's name,
        status message, string attribute value or exception message (``search``). Both
        are looked up in the search index, never by reading spans.
        The lag monitor's summary traces (``looptrace.loop.lag``) are left out unless
        ``include_lag``: ``lag_summaries`` is their view."""
        where: list[str] = []
        params: list[Any] = []
        if user is not None:
            where.append("user_id = ?")
            params.append(user)
        if session is not None:
            where.append("session_id = ?")
            params.append(session)
        for key, value in [(TAG_LABEL, t) for t in tags] + [
            (METADATA_LABEL_PREFIX + k, v) for k, v in metadata
        ]:
            where.append(
                "trace_id IN (SELECT trace_id FROM trace_labels WHERE key = ? AND value = ?)"
            )
            params.extend((key, value))
        if service:
            where.append("service_name = ?")
            params.append(service)
        if min_duration_ns is not None:
            where.append("in_progress = 0 AND end_ns - start_ns >= ?")
            params.append(min_duration_ns)
        if since_ns is not None:
            where.append("start_ns >= ?")
            params.append(since_ns)
        if until_ns is not None:
            where.append("start_ns <= ?")
            params.append(until_ns)
        if not include_lag:
            where.append("name != ?")
            params.append(LAG_SPAN_NAME)
        if name:
            where.append("instr(name, ?) > 0")
            params.append(name)
        if status == "error":
            where.append("(status_code = 2 OR error_count > 0)")
        elif status == "in_progress":
            where.append("in_progress = 1")
        elif status == "ok":
            where.append("status_code != 2 AND error_count = 0 AND in_progress = 0")
        elif status == "unset":
            # The exact OpenTelemetry status of the root (ok also includes roots set to OK).
            where.append("status_code = 0 AND error_count = 0 AND in_progress = 0")
        elif status is not None:
            raise ValueError(f"status must be ok, error, unset or in_progress, got {status!r}")
        if experiment:
            where.append("experiment_id = ?")
            params.append(experiment)
        with self._reader() as conn:
            # The search part needs the index to plan (how common each term is).
            plan = search_plan(conn, attrs, text)
            sql = plan.source(TRACE_COLUMNS)
            if where or plan.where:
                sql += " WHERE " + " AND ".join([*plan.where, *where])
            sql += " ORDER BY start_ns DESC LIMIT ? OFFSET ?"
            found = () if plan.found is None else (plan.found,)
            args = (*found, *plan.params, *params, limit, offset)
            return [trace_dict(r) for r in conn.execute(sql, args)]

    def services(self) -> list[str]:
        """The services that have traces, by name (what the trace list's filter offers)."""
        with self._reader() as conn:
            rows = conn.execute(
                "SELECT DISTINCT service_name FROM traces WHERE service_name IS NOT NULL "
                "ORDER BY service_name LIMIT 1000"
            )
            return [r[0] for r in rows]

    def get_trace_summary(self, trace_id: str) -> dict[str, Any] | None:
        """The summary row of one trace, or None."""
        with self._reader() as conn:
            row = conn.execute(TRACE_SELECT + " WHERE trace_id = ?", (trace_id,)).fetchone()
        return None if row is None else trace_dict(row)

    def find_trace_ids(self, prefix: str, limit: int = 2) -> list[str]:
        """Trace ids starting with ``prefix`` (so the CLI accepts a short id)."""
        prefix = prefix.lower()
        with self._reader() as conn:
            return [
                r[0]
                for r in conn.execute(
                    "SELECT trace_id FROM traces WHERE trace_id >= ? AND trace_id < ? LIMIT ?",
                    (prefix, prefix + "g", limit),
                )
            ]

    def get_trace(
        self,
        trace_id: str,
        preview: int | None = None,
        *,
        span_id: str | None = None,
        limit: int | None = None,
    ) -> list[dict[str, Any]]:
        """Every span of a trace (the first ``limit``, with one), ordered by start time (empty
        if unknown).

        With ``preview=None`` each row is complete: ``attributes`` includes ``input.value`` and
        ``output.value``. With ``preview=N`` the payloads are left out of ``attributes`` and
        ``input``/``output`` hold their first N characters (``input_size``/``output_size`` say
        how long they are), which is what listing a 10,000-span trace needs.
        """
        if preview is None:
            payload = "s.input, s.output"
        else:
            n = int(preview)
            payload = f"substr(s.input, 1, {n}), substr(s.output, 1, {n})"
        sql = (
            "SELECT s.trace_id, s.span_id, s.parent_span_id, s.name, s.kind, s.start_ns, s.end_ns, "
            "s.duration_ns, s.status_code, s.status_message, s.attributes, s.events, s.links, "
            "r.attributes, s.scope_name, s.scope_version, s.trace_state, "
            f"{payload}, length(s.input), length(s.output), s.lag_max_ms, s.in_progress, "
            "s.experiment_id, s.case_index FROM spans s LEFT JOIN resources r ON r.id = s.resource_id "
            "WHERE s.trace_id = ?"
            + (" AND s.span_id = ?" if span_id is not None else "")
            + " ORDER BY s.start_ns, s.span_id"
            + (f" LIMIT {int(limit)}" if limit is not None else "")
        )
        resources: dict[str, Any] = {}
        out = []
        with self._reader() as conn:
            args = (trace_id,) if span_id is None else (trace_id, span_id)
            for row in conn.execute(sql, args):
                attributes = loads(row[10])
                if preview is None:
                    if row[17] is not None:
                        attributes[sc.INPUT_VALUE] = row[17]
                    if row[18] is not None:
                        attributes[sc.OUTPUT_VALUE] = row[18]
                resource_text = row[13] or "{}"
                resource = resources.get(resource_text)
                if resource is None:
                    resource = resources[resource_text] = loads(resource_text)
                out.append(
                    {
                        "trace_id": row[0],
                        "span_id": row[1],
                        "parent_span_id": row[2],
                        "name": row[3],
                        "kind": row[4],
                        "start_ns": row[5],
                        "end_ns": row[6],
                        "duration_ns": row[7],
                        "status_code": row[8],
                        "status": STATUS_NAMES.get(row[8], "unset"),
                        "status_message": row[9],
                        "attributes": attributes,
                        "events": loads(row[11]),
                        "links": loads(row[12]),
                        "resource": resource,
                        "scope_name": row[14],
                        "scope_version": row[15],
                        "trace_state": row[16],
                        "input": row[17],
                        "output": row[18],
                        "input_size": row[19],
                        "output_size": row[20],
                        "lag_max_ms": row[21],
                        "in_progress": bool(row[22]),
                        "experiment_id": row[23],
                        "case_index": row[24],
                    }
                )
        return out

    def get_tree(self, trace_id: str, preview: int = 200) -> list[dict[str, Any]]:
        """What a span tree shows, and nothing more (no JSON columns are parsed): per span,
        ``span_id``, ``parent_span_id``, ``name``, ``start_ns``, ``duration_ns``, ``status``,
        ``status_message``, ``lag_max_ms``, ``in_progress``, ``input``/``output`` previews and
        ``events`` (parsed only for the spans that have any), and ``attributes`` for LLM calls
        and scores only (spans with GenAI attributes or of type ``score``; others get an empty
        dict), ordered by start time.
        ``looptrace show`` on 10,000 spans reads this."""
        n = int(preview)
        sql = (
            "SELECT span_id, parent_span_id, name, start_ns, duration_ns, status_code, "
            f"status_message, lag_max_ms, in_progress, substr(input, 1, {n}), "
            f"substr(output, 1, {n}), CASE WHEN events = '[]' THEN NULL ELSE events END, "
            "CASE WHEN instr(attributes, '\"gen_ai.operation.name\"') > 0 "
            "OR span_type = 'score' THEN attributes END "
            "FROM spans WHERE trace_id = ? ORDER BY start_ns, span_id"
        )
        with self._reader() as conn:
            return [
                {
                    "span_id": r[0],
                    "parent_span_id": r[1],
                    "name": r[2],
                    "start_ns": r[3],
                    "duration_ns": r[4],
                    "status": STATUS_NAMES.get(r[5], "unset"),
                    "status_message": r[6],
                    "lag_max_ms": r[7],
                    "in_progress": bool(r[8]),
                    "input": r[9],
                    "output": r[10],
                    "events": loads(r[11]) if r[11] is not None else [],
                    "attributes": loads(r[12]) if r[12] is not None else {},
                }
                for r in conn.execute(sql, (trace_id,))
            ]

    def get_span(self, trace_id: str, span_id: str) -> dict[str, Any] | None:
        """One complete span row (payloads included), or None."""
        rows = self.get_trace(trace_id, span_id=span_id)
        return rows[0] if rows else None


TRACE_COLUMNS = (
    "trace_id, name, root_span_id, service_name, start_ns, end_ns, status_code, span_count, "
    "error_count, in_progress, experiment_id, bytes, session_id, user_id, input_tokens, "
    "output_tokens, cost_usd, uncosted_calls, score_count"
)
TRACE_SELECT = f"SELECT {TRACE_COLUMNS} FROM traces"


def trace_dict(row: Sequence[Any]) -> dict[str, Any]:
    (trace_id, name, root, service, start, end, status, count, errors, in_progress, exp, size) = (
        row[:12]
    )
    (session, user, tokens_in, tokens_out, cost, uncosted, scores) = row[12:19]
    return {
        "trace_id": trace_id,
        "name": name,
        "root_span_id": root,
        "service_name": service,
        "start_ns": start,
        "end_ns": end,
        "duration_ns": None if in_progress or end == 0 else end - start,
        # For people: the root failed, is still running, or not (OpenTelemetry's UNSET means
        # "no error"); status_code keeps the exact value.
        "status": "in_progress" if in_progress else ("error" if status == 2 else "ok"),
        "status_code": status,
        "span_count": count,
        "error_count": errors,
        "in_progress": bool(in_progress),
        "experiment_id": exp,
        "bytes": size,
        "session_id": session,
        "user_id": user,
        # Summed over the trace's LLM calls; None when none reported any (never a made-up 0).
        "input_tokens": tokens_in,
        "output_tokens": tokens_out,
        "cost_usd": cost,
        # LLM calls with tokens but no price (an unknown model): the cost leaves them out.
        "uncosted_calls": uncosted,
        "score_count": scores,
    }


def span_from_row(row: Mapping[str, Any]) -> DecodedSpan:
    """Turn a complete ``get_trace`` row back into the DecodedSpan that was written."""
    return DecodedSpan(
        trace_id=row["trace_id"],
        span_id=row["span_id"],
        parent_span_id=row["parent_span_id"],
        name=row["name"],
        kind=row["kind"],
        start_ns=row["start_ns"],
        end_ns=row["end_ns"],
        attributes=row["attributes"],
        events=row["events"],
        links=row["links"],
        status_code=row["status_code"],
        status_message=row["status_message"],
        trace_state=row["trace_state"],
        resource=row["resource"],
        scope_name=row["scope_name"],
        scope_version=row["scope_version"],
    )
