"""The writer: ``Store.write`` applies a batch of spans in one transaction.

``_prepare`` turns a DecodedSpan into its row (payloads in their own columns, the
experiment, case and score attributes picked out) outside the write lock; the writer then
upserts the rows (a final record replaces an in-progress one, never the reverse), stores each
resource once, recomputes the touched traces' summaries in one statement, and records
experiments and scores. Retention runs after the commit when it is due.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import orjson

from .. import _semconv as sc
from .._wire import DecodedSpan
from .columns import dumps
from .retention import Retention


class _Prepared(NamedTuple):
    params: tuple[Any, ...]
    trace_id: str
    span_id: str
    experiment: tuple[str, str | None, int, str | None, str | None] | None
    scores: list[tuple[str, float, str | None]]
    experiment_id: str | None
    case_index: int | None


_SPAN_COLUMNS = (
    "trace_id, span_id, parent_span_id, name, kind, start_ns, end_ns, duration_ns, status_code, "
    "status_message, attributes, events, links, resource_id, scope_name, scope_version, "
    "trace_state, input, output, lag_max_ms, in_progress, experiment_id, case_index, size"
)
_UPSERT_SPAN = (
    f"INSERT INTO spans ({_SPAN_COLUMNS}) VALUES ({', '.join('?' * 24)}) "
    "ON CONFLICT (trace_id, span_id) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in _SPAN_COLUMNS.replace(" ", "").split(",")[2:])
    # An in-progress snapshot must never overwrite the final record of the same span.
    + " WHERE NOT (excluded.in_progress = 1 AND spans.in_progress = 0)"
)

_UPDATE_TRACES = """
WITH
touched AS (SELECT value AS trace_id FROM json_each(?)),
agg AS (
    SELECT trace_id, count(*) AS n, min(start_ns) AS start_ns, max(end_ns) AS end_ns,
        coalesce(sum(status_code = 2), 0) AS errors, max(experiment_id) AS experiment_id,
        sum(size) AS bytes
    FROM spans WHERE trace_id IN (SELECT trace_id FROM touched) GROUP BY trace_id
),
pick AS (
    SELECT agg.*, coalesce(
        (SELECT rowid FROM spans s WHERE s.trace_id = agg.trace_id AND s.parent_span_id IS NULL
            ORDER BY s.start_ns LIMIT 1),
        (SELECT rowid FROM spans s WHERE s.trace_id = agg.trace_id ORDER BY s.start_ns LIMIT 1)
    ) AS root_rowid
    FROM agg
)
INSERT INTO traces (trace_id, name, root_span_id, service_name, start_ns, end_ns, status_code,
    span_count, error_count, in_progress, experiment_id, bytes)
SELECT pick.trace_id, root.name, root.span_id, json_extract(r.attributes, '$."service.name"'),
    pick.start_ns, pick.end_ns, root.status_code, pick.n, pick.errors, root.in_progress,
    pick.experiment_id, pick.bytes
FROM pick JOIN spans root ON root.rowid = pick.root_rowid
LEFT JOIN resources r ON r.id = root.resource_id
WHERE true
ON CONFLICT (trace_id) DO UPDATE SET
    name = excluded.name, root_span_id = excluded.root_span_id,
    service_name = excluded.service_name, start_ns = excluded.start_ns,
    end_ns = excluded.end_ns, status_code = excluded.status_code,
    span_count = excluded.span_count, error_count = excluded.error_count,
    in_progress = excluded.in_progress, experiment_id = excluded.experiment_id,
    bytes = excluded.bytes
"""


class Writer(Retention):
    """``Store.write`` and what it needs."""

    def write(self, spans: Sequence[DecodedSpan]) -> None:
        """Store ``spans`` in one transaction; durable when this returns. Blocking: call it
        from a worker thread, never on an event loop."""
        if not spans:
            return
        prepared = [_prepare(s) for s in spans]
        with self._write_lock:
            conn = self._writer_conn()
            conn.execute("BEGIN IMMEDIATE")
            try:
                self._write_locked(conn, spans, prepared)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                # The resource cache may name rows the rollback removed.
                self._resource_ids.clear()
                raise
            self.counters.writes += 1
            self.counters.spans_written += len(spans)
            self.counters.bytes_since_prune += sum(p.params[-1] for p in prepared)
            if self._prune_due():
                self._prune_locked(conn)

    def _write_locked(
        self, conn: sqlite3.Connection, spans: Sequence[DecodedSpan], prepared: list[_Prepared]
    ) -> None:
        rows = []
        for span, prep in zip(spans, prepared, strict=True):
            rows.append(
                (*prep.params[:13], self._resource_id(conn, span.resource), *prep.params[13:])
            )
        conn.executemany(_UPSERT_SPAN, rows)
        self._update_traces(conn, list(dict.fromkeys(p.trace_id for p in prepared)))
        for prep in prepared:
            if prep.experiment is not None:
                conn.execute(
                    "INSERT INTO experiments (id, name, created_ns, metadata, tags) "
                    "VALUES (?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET "
                    "name = coalesce(excluded.name, name), "
                    "created_ns = min(created_ns, excluded.created_ns), "
                    "metadata = coalesce(excluded.metadata, metadata), "
                    "tags = coalesce(excluded.tags, tags)",
                    prep.experiment,
                )
            if prep.scores:
                experiment_id = prep.experiment_id
                if experiment_id is None:
                    row = conn.execute(
                        "SELECT experiment_id FROM traces WHERE trace_id = ?", (prep.trace_id,)
                    ).fetchone()
                    experiment_id = row[0] if row else None
                conn.executemany(
                    "INSERT INTO scores (trace_id, span_id, name, experiment_id, case_index, "
                    "value, comment) VALUES (?, ?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT (trace_id, span_id, name) DO UPDATE SET "
                    "experiment_id = excluded.experiment_id, case_index = excluded.case_index, "
                    "value = excluded.value, comment = excluded.comment",
                    [
                        (prep.trace_id, prep.span_id, name, experiment_id, prep.case_index, v, c)
                        for name, v, c in prep.scores
                    ],
                )

    def _resource_id(self, conn: sqlite3.Connection, resource: Mapping[str, Any]) -> int:
        text = dumps(dict(sorted(resource.items())))
        rid = self._resource_ids.get(text)
        if rid is None:
            conn.execute("INSERT OR IGNORE INTO resources (attributes) VALUES (?)", (text,))
            rid = conn.execute("SELECT id FROM resources WHERE attributes = ?", (text,)).fetchone()[
                0
            ]
            if len(self._resource_ids) > 1000:
                self._resource_ids.clear()
            self._resource_ids[text] = rid
        return int(rid)

    def _update_traces(self, conn: sqlite3.Connection, trace_ids: list[str]) -> None:
        # Recomputed from the spans of the touched traces (index ranges on the primary key), in
        # one statement per batch, so replacing an in-progress record or receiving a span twice
        # cannot skew the counts. The root is the parentless span that started first (or, while
        # the root has not arrived, the first span).
        conn.execute(_UPDATE_TRACES, (orjson.dumps(trace_ids).decode(),))


def _prepare(span: DecodedSpan) -> _Prepared:
    attributes = dict(span.attributes)
    raw_input = attributes.pop(sc.INPUT_VALUE, None)
    raw_output = attributes.pop(sc.OUTPUT_VALUE, None)
    # Payloads live in their own columns (so a trace can be listed without reading them); a
    # non-string payload from a foreign SDK stays an attribute.
    if raw_input is not None and not isinstance(raw_input, str):
        attributes[sc.INPUT_VALUE] = raw_input
        raw_input = None
    if raw_output is not None and not isinstance(raw_output, str):
        attributes[sc.OUTPUT_VALUE] = raw_output
        raw_output = None
    in_progress = span.end_ns == 0 or attributes.get(sc.IN_PROGRESS) is True
    lag = attributes.get(sc.LOOP_LAG_MAX_MS)
    lag_max = float(lag) if isinstance(lag, (int, float)) and not isinstance(lag, bool) else None
    experiment_id = attributes.get(sc.EXPERIMENT_ID)
    experiment_id = str(experiment_id) if experiment_id is not None else None
    case = attributes.get(sc.CASE_INDEX)
    case_index = case if isinstance(case, int) and not isinstance(case, bool) else None
    attributes_text = dumps(attributes)
    events_text = dumps(span.events)
    links_text = dumps(span.links)
    size = (
        len(attributes_text)
        + len(events_text)
        + len(links_text)
        + len(raw_input or "")
        + len(raw_output or "")
        + len(span.name)
        + 160
    )
    experiment = None
    if experiment_id is not None:
        name = attributes.get(sc.EXPERIMENT_NAME)
        metadata = attributes.get(sc.EXPERIMENT_METADATA)
        tags = attributes.get(sc.EXPERIMENT_TAGS)
        experiment = (
            experiment_id,
            str(name) if name is not None else None,
            span.start_ns,
            _json_column(metadata),
            _json_column(tags),
        )
    scores: list[tuple[str, float, str | None]] = []
    comments: dict[str, str] = {}
    for key, value in attributes.items():
        if key.startswith(sc.SCORE_PREFIX):
            name = key[len(sc.SCORE_PREFIX) :]
            # Scores are numbers; a string at "<name>.comment" is that score's comment.
            if isinstance(value, (bool, int, float)):
                scores.append((name, float(value), None))
            elif isinstance(value, str) and name.endswith(sc.SCORE_COMMENT_SUFFIX):
                comments[name[: -len(sc.SCORE_COMMENT_SUFFIX)]] = value
    if comments:
        scores = [(name, v, comments.get(name)) for name, v, _ in scores]
    duration = span.end_ns - span.start_ns if not in_progress else None
    params = (
        span.trace_id,
        span.span_id,
        span.parent_span_id or None,
        span.name,
        span.kind,
        span.start_ns,
        0 if in_progress and span.end_ns == 0 else span.end_ns,
        duration,
        span.status_code,
        span.status_message,
        attributes_text,
        events_text,
        links_text,
        # resource_id is spliced in here by the writer
        span.scope_name,
        span.scope_version,
        span.trace_state,
        raw_input,
        raw_output,
        lag_max,
        int(in_progress),
        experiment_id,
        case_index,
        size,
    )
    return _Prepared(
        params, span.trace_id, span.span_id, experiment, scores, experiment_id, case_index
    )


def _json_column(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        # Metadata arrives as a JSON string (the serializer's form for dicts); keep it if valid.
        try:
            orjson.loads(value)
        except orjson.JSONDecodeError:
            return dumps(value)
        return value
    return dumps(value)
