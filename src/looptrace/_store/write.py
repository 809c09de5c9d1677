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
from collections.abc import Set as AbstractSet
from typing import Any, NamedTuple

import orjson

from .. import _semconv as sc
from .._wire import DecodedSpan
from .columns import dumps
from .retention import Retention
from .search import TermIndex, span_terms, trace_terms_of_rows


class _Prepared(NamedTuple):
    params: tuple[Any, ...]
    trace_id: str
    span_id: str
    experiment: tuple[str, str | None, int, str | None, str | None] | None
    scores: Sequence[tuple[str, float, str | None]]
    experiment_id: str | None
    case_index: int | None
    labels: tuple[tuple[str, str], ...]
    size: int
    terms: AbstractSet[str]


class _Job:
    """One caller's batch, waiting to be written (``write``'s group commit)."""

    __slots__ = ("done", "error", "prepared", "spans")

    def __init__(self, spans: Sequence[DecodedSpan], prepared: list[_Prepared]) -> None:
        self.spans = spans
        self.prepared = prepared
        self.done = False
        self.error: BaseException | None = None


_SPAN_COLUMNS = (
    "trace_id, span_id, parent_span_id, name, kind, start_ns, end_ns, duration_ns, status_code, "
    "status_message, attributes, events, links, scope_name, scope_version, "
    "trace_state, input, output, lag_max_ms, in_progress, experiment_id, case_index, size, "
    "session_id, user_id, span_type, input_tokens, output_tokens, cost_usd, resource_id"
)
_UPSERT_SPAN = (
    f"INSERT INTO spans ({_SPAN_COLUMNS}) VALUES ({', '.join('?' * 30)}) "
    "ON CONFLICT (trace_id, span_id) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in _SPAN_COLUMNS.replace(" ", "").split(",")[2:])
    # An in-progress snapshot must never overwrite the final record of the same span.
    + " WHERE NOT (excluded.in_progress = 1 AND spans.in_progress = 0)"
)

_UPDATE_TRACES = """
WITH
touched AS (SELECT value AS trace_id FROM json_each(?)),
agg AS (
    SELECT trace_id, count(*) - coalesce(sum(span_type = '{score}'), 0) AS n,
        min(start_ns) AS start_ns,
        coalesce(max(CASE WHEN span_type IS NOT '{score}' THEN end_ns END), max(end_ns)) AS end_ns,
        coalesce(sum(status_code = 2), 0) AS errors, max(experiment_id) AS experiment_id,
        sum(size) AS bytes, max(session_id) AS any_session, max(user_id) AS any_user,
        sum(input_tokens) AS input_tokens, sum(output_tokens) AS output_tokens,
        sum(cost_usd) AS cost_usd,
        coalesce(sum(cost_usd IS NULL AND coalesce(input_tokens, output_tokens) IS NOT NULL), 0)
            AS uncosted,
        coalesce(sum(span_type = '{score}'), 0) AS scores
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
    span_count, error_count, in_progress, experiment_id, bytes, session_id, user_id,
    input_tokens, output_tokens, cost_usd, uncosted_calls, score_count)
SELECT pick.trace_id, root.name, root.span_id, json_extract(r.attributes, '$."service.name"'),
    pick.start_ns, pick.end_ns, root.status_code, pick.n, pick.errors, root.in_progress,
    pick.experiment_id, pick.bytes, coalesce(root.session_id, pick.any_session),
    coalesce(root.user_id, pick.any_user), pick.input_tokens, pick.output_tokens, pick.cost_usd,
    pick.uncosted, pick.scores
FROM pick JOIN spans root ON root.rowid = pick.root_rowid
LEFT JOIN resources r ON r.id = root.resource_id
WHERE true
ON CONFLICT (trace_id) DO UPDATE SET
    name = excluded.name, root_span_id = excluded.root_span_id,
    service_name = excluded.service_name, start_ns = excluded.start_ns,
    end_ns = excluded.end_ns, status_code = excluded.status_code,
    span_count = excluded.span_count, error_count = excluded.error_count,
    in_progress = excluded.in_progress, experiment_id = excluded.experiment_id,
    bytes = excluded.bytes, session_id = excluded.session_id, user_id = excluded.user_id,
    input_tokens = excluded.input_tokens, output_tokens = excluded.output_tokens,
    cost_usd = excluded.cost_usd, uncosted_calls = excluded.uncosted_calls,
    score_count = excluded.score_count
""".replace("{score}", sc.SPAN_TYPE_SCORE)


class Writer(Retention):
    """``Store.write`` and what it needs."""

    def write(self, spans: Sequence[DecodedSpan]) -> None:
        """Store ``spans``; durable when this returns. Blocking: call it from a worker thread,
        never on an event loop.

        Group commit: batches that arrive while another is being written wait for the lock,
        and whichever thread takes it next writes every waiting batch in one transaction (one
        fsync, one update of the traces' summaries), then each of their callers returns, or
        raises what that transaction raised. So the collector's concurrent requests share
        commits instead of queueing one fsync each, and each is still answered only once its
        spans are durable."""
        if not spans:
            return
        parsed: dict[str, Any] = {}
        job = _Job(spans, [_prepare(s, parsed) for s in spans])
        with self._queue_lock:
            self._queue.append(job)
        with self._write_lock:
            if not job.done:
                with self._queue_lock:
                    jobs, self._queue = self._queue, []
                self._write_jobs(jobs)
        if job.error is not None:
            raise job.error

    def _write_jobs(self, jobs: list[_Job]) -> None:
        # Called with _write_lock held; ``jobs`` holds at least the caller's own.
        spans = [s for j in jobs for s in j.spans]
        prepared = [p for j in jobs for p in j.prepared]
        conn = self._writer_conn()
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                self._write_locked(conn, spans, prepared)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                # The caches may name rows the rollback removed.
                self._resource_ids.clear()
                self._terms.forget()
                raise
        except BaseException as exc:
            for j in jobs:
                j.error = exc
                j.done = True
            return
        for j in jobs:
            j.done = True
        self.counters.writes += 1
        self.counters.spans_written += len(spans)
        self.counters.bytes_since_prune += sum(p.size for p in prepared)
        if self._prune_due():
            self._prune_locked(conn)

    def _write_locked(
        self, conn: sqlite3.Connection, spans: Sequence[DecodedSpan], prepared: list[_Prepared]
    ) -> None:
        rows = []
        # The spans of one request (or one flush) share their resource dict: its id is looked
        # up once per batch, not serialized and sorted once per span.
        resources: dict[int, int] = {}
        for span, prep in zip(spans, prepared, strict=True):
            rid = resources.get(id(span.resource))
            if rid is None:
                rid = resources[id(span.resource)] = self._resource_id(conn, span.resource)
            rows.append((*prep.params, rid))
        conn.executemany(_UPSERT_SPAN, rows)
        self._update_traces(conn, list(dict.fromkeys(p.trace_id for p in prepared)))
        # One row per (trace, key, value), however many spans repeat it: the spans of one
        # block share one labels tuple, so a trace's rows are made once per distinct tuple.
        blocks = {(p.trace_id, id(p.labels)): p for p in prepared if p.labels}
        if blocks:
            labels = {(k, v, p.trace_id) for p in blocks.values() for k, v in p.labels}
            conn.executemany(
                "INSERT OR IGNORE INTO trace_labels (key, value, trace_id) VALUES (?, ?, ?)",
                sorted(labels),
            )
        # The search index: a trace's terms once per batch. The spans of a trace usually repeat
        # their terms: a new set only when one adds some.
        found: dict[str, AbstractSet[str]] = {}
        for p in prepared:
            terms = found.get(p.trace_id)
            if terms is None:
                found[p.trace_id] = p.terms
            elif not p.terms <= terms:
                found[p.trace_id] = terms | p.terms
        self._terms.add(conn, found)
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
        # the root has not arrived, the first span). A score attached after the fact is a span
        # of the trace, but neither counted as one nor stretching its end: a thumbs-up ten
        # minutes later does not make a two-second request last ten minutes.
        conn.execute(_UPDATE_TRACES, (orjson.dumps(trace_ids).decode(),))


# Binds as SQL NULL (SQLite stores a NaN as NULL) without the sqlite3 module's adapter
# lookup, which every None parameter goes through: about 3,000 instructions each, and a span
# row has ten or so.
_NULL = float("nan")
_NO_ITEMS = "[]"
# The attributes that fill a column of their own or a row elsewhere: a span holding none of
# them (most spans) skips their lookups.
_SPECIAL = frozenset(
    {
        sc.IN_PROGRESS,
        sc.LOOP_LAG_MAX_MS,
        sc.EXPERIMENT_ID,
        sc.CASE_INDEX,
        sc.SESSION_ID,
        sc.USER_ID,
        sc.SPAN_TYPE,
        sc.GEN_AI_USAGE_INPUT_TOKENS,
        sc.GEN_AI_USAGE_OUTPUT_TOKENS,
        sc.LLM_COST_TOTAL,
        sc.TAG_TAGS,
        sc.METADATA,
    }
)
# A score's key as its JSON text starts: looked for in the attributes' text (one search in C)
# before the attributes are walked.
_SCORE_KEY_TEXT = '"' + sc.SCORE_PREFIX


def _prepare(span: DecodedSpan, parsed: dict[str, Any] | None = None) -> _Prepared:
    attributes = span.attributes
    raw_input = attributes.get(sc.INPUT_VALUE)
    raw_output = attributes.get(sc.OUTPUT_VALUE)
    # Payloads live in their own columns (so a trace can be listed without reading them); a
    # non-string payload from a foreign SDK stays an attribute.
    if raw_input is not None or raw_output is not None:
        attributes = dict(attributes)
        if isinstance(raw_input, str):
            del attributes[sc.INPUT_VALUE]
        else:
            raw_input = None
        if isinstance(raw_output, str):
            del attributes[sc.OUTPUT_VALUE]
        else:
            raw_output = None
    attributes_text = dumps(attributes)
    events_text = dumps(span.events) if span.events else _NO_ITEMS
    links_text = dumps(span.links) if span.links else _NO_ITEMS
    size = (
        len(attributes_text)
        + len(events_text)
        + len(links_text)
        + (0 if raw_input is None else len(raw_input))
        + (0 if raw_output is None else len(raw_output))
        + len(span.name)
        + 160
    )
    in_progress = span.end_ns == 0
    lag_max: float | None = None
    experiment_id: str | None = None
    case_index: int | None = None
    session_id = user_id = span_type = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost: float | None = None
    labels: tuple[tuple[str, str], ...] = ()
    experiment = None
    if not _SPECIAL.isdisjoint(attributes):
        in_progress = in_progress or attributes.get(sc.IN_PROGRESS) is True
        lag = attributes.get(sc.LOOP_LAG_MAX_MS)
        if isinstance(lag, (int, float)) and not isinstance(lag, bool):
            lag_max = float(lag)
        found = attributes.get(sc.EXPERIMENT_ID)
        experiment_id = str(found) if found is not None else None
        case = attributes.get(sc.CASE_INDEX)
        case_index = case if isinstance(case, int) and not isinstance(case, bool) else None
        if experiment_id is not None:
            name = attributes.get(sc.EXPERIMENT_NAME)
            experiment = (
                experiment_id,
                str(name) if name is not None else None,
                span.start_ns,
                _json_column(attributes.get(sc.EXPERIMENT_METADATA)),
                _json_column(attributes.get(sc.EXPERIMENT_TAGS)),
            )
        found = attributes.get(sc.SESSION_ID)
        session_id = None if found is None else str(found)
        found = attributes.get(sc.USER_ID)
        user_id = None if found is None else str(found)
        found = attributes.get(sc.SPAN_TYPE)
        span_type = None if found is None else str(found)
        raw_in = attributes.get(sc.GEN_AI_USAGE_INPUT_TOKENS)
        raw_out = attributes.get(sc.GEN_AI_USAGE_OUTPUT_TOKENS)
        raw_cost = attributes.get(sc.LLM_COST_TOTAL)
        # An agent's span may repeat the usage of the calls inside it: only calls are summed.
        if (raw_in is not None or raw_out is not None or raw_cost is not None) and (
            attributes.get(sc.GEN_AI_OPERATION_NAME) != sc.GEN_AI_OP_INVOKE_AGENT
        ):
            input_tokens = _count(raw_in)
            output_tokens = _count(raw_out)
            cost = _amount(raw_cost)
        tags = attributes.get(sc.TAG_TAGS)
        metadata = attributes.get(sc.METADATA)
        if tags is not None or metadata is not None:
            labels = _labels(tags, metadata, {} if parsed is None else parsed)
    scores: Sequence[tuple[str, float, str | None]] = ()
    if _SCORE_KEY_TEXT in attributes_text:
        found_scores: list[tuple[str, float, str | None]] = []
        comments: dict[str, str] = {}
        for key, value in attributes.items():
            if key.startswith(sc.SCORE_PREFIX):
                name = key[len(sc.SCORE_PREFIX) :]
                # Scores are numbers; a string at "<name>.comment" is that score's comment.
                if isinstance(value, (bool, int, float)):
                    found_scores.append((name, float(value), None))
                elif isinstance(value, str) and name.endswith(sc.SCORE_COMMENT_SUFFIX):
                    comments[name[: -len(sc.SCORE_COMMENT_SUFFIX)]] = value
        scores = found_scores
        if comments:
            scores = [(name, v, comments.get(name)) for name, v, _ in found_scores]
    params = (
        span.trace_id,
        span.span_id,
        span.parent_span_id or _NULL,
        span.name,
        span.kind,
        span.start_ns,
        0 if in_progress and span.end_ns == 0 else span.end_ns,
        _NULL if in_progress else span.end_ns - span.start_ns,
        span.status_code,
        span.status_message,
        attributes_text,
        events_text,
        links_text,
        span.scope_name,
        span.scope_version,
        span.trace_state,
        _NULL if raw_input is None else raw_input,
        _NULL if raw_output is None else raw_output,
        _NULL if lag_max is None else lag_max,
        int(in_progress),
        _NULL if experiment_id is None else experiment_id,
        _NULL if case_index is None else case_index,
        size,
        _NULL if session_id is None else session_id,
        _NULL if user_id is None else user_id,
        _NULL if span_type is None else span_type,
        _NULL if input_tokens is None else input_tokens,
        _NULL if output_tokens is None else output_tokens,
        _NULL if cost is None else cost,
        # resource_id is appended by the writer
    )
    return _Prepared(
        params,
        span.trace_id,
        span.span_id,
        experiment,
        scores,
        experiment_id,
        case_index,
        labels,
        size,
        _terms_of(span, attributes, attributes_text),
    )


# The terms of a span without events, by its name, status message and attributes' text: the
# spans of one function repeat these, so most spans cost a lookup instead of a walk of their
# attributes. Bounded in entries and in the text they keep.
_SHAPES: dict[tuple[str, str, str], frozenset[str]] = {}
_SHAPES_MAX = 2048
_SHAPE_TEXT_MAX = 512


def _terms_of(span: DecodedSpan, attributes: Mapping[str, Any], text: str) -> AbstractSet[str]:
    if span.events or len(text) > _SHAPE_TEXT_MAX:
        return span_terms(span.name, span.status_message, attributes, span.events)
    key = (span.name, span.status_message, text)
    terms = _SHAPES.get(key)
    if terms is None:
        if len(_SHAPES) >= _SHAPES_MAX:
            _SHAPES.clear()
        terms = _SHAPES[key] = frozenset(
            span_terms(span.name, span.status_message, attributes, span.events)
        )
    return terms


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _amount(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        return float(value)
    return None


TAG_LABEL = "tag"
METADATA_LABEL_PREFIX = "metadata."


def label_value(value: Any) -> str:
    """A metadata value as the filter compares it: strings as they are, the rest as JSON."""
    return value if isinstance(value, str) else orjson.dumps(value).decode()


def _labels(tags: Any, metadata: Any, parsed: dict[Any, Any]) -> tuple[tuple[str, str], ...]:
    # Every span of a looptrace.attributes() block carries the same tags and metadata: their
    # labels are made once per batch, and the one tuple shared by those spans.
    key: Any = (tuple(tags) if isinstance(tags, (list, tuple)) else tags, metadata)
    try:
        cached: tuple[tuple[str, str], ...] | None = parsed.get(key)
    except TypeError:  # an unhashable value in a foreign SDK's tags
        cached, key = None, None
    if cached is not None:
        return cached
    out: list[tuple[str, str]] = []
    if isinstance(tags, str):
        out.append((TAG_LABEL, tags))
    elif isinstance(tags, (list, tuple)):
        out.extend((TAG_LABEL, str(t)) for t in tags)
    if isinstance(metadata, str):
        try:
            fields = orjson.loads(metadata)
        except orjson.JSONDecodeError:
            fields = None
        if isinstance(fields, dict):
            out.extend((METADATA_LABEL_PREFIX + k, label_value(v)) for k, v in fields.items())
    labels = tuple(out)
    if key is not None and len(parsed) < 256:
        parsed[key] = labels
    return labels


_BACKFILL_SPANS = """
UPDATE spans SET
    session_id = json_extract(attributes, '$."session.id"'),
    user_id = json_extract(attributes, '$."user.id"'),
    span_type = json_extract(attributes, '$."looptrace.span.type"'),
    input_tokens = CASE WHEN coalesce(json_extract(attributes, '$."gen_ai.operation.name"'), '')
        != 'invoke_agent' THEN json_extract(attributes, '$."gen_ai.usage.input_tokens"') END,
    output_tokens = CASE WHEN coalesce(json_extract(attributes, '$."gen_ai.operation.name"'), '')
        != 'invoke_agent' THEN json_extract(attributes, '$."gen_ai.usage.output_tokens"') END,
    cost_usd = CASE WHEN coalesce(json_extract(attributes, '$."gen_ai.operation.name"'), '')
        != 'invoke_agent' THEN json_extract(attributes, '$."llm.cost.total"') END
WHERE instr(attributes, '"session.id"') OR instr(attributes, '"user.id"')
    OR instr(attributes, '"looptrace.span.type"') OR instr(attributes, '"gen_ai.usage.')
    OR instr(attributes, '"llm.cost.total"')
"""
_BACKFILL_TAGS = """
INSERT OR IGNORE INTO trace_labels (key, value, trace_id)
SELECT 'tag', CAST(j.value AS TEXT), s.trace_id
FROM spans s, json_each(json_extract(s.attributes, '$."tag.tags"')) j
WHERE instr(s.attributes, '"tag.tags"') AND json_valid(s.attributes)
    AND json_type(s.attributes, '$."tag.tags"') = 'array'
"""
_BACKFILL_METADATA = """
INSERT OR IGNORE INTO trace_labels (key, value, trace_id)
SELECT 'metadata.' || j.key,
    CASE j.type WHEN 'text' THEN j.value WHEN 'true' THEN 'true' WHEN 'false' THEN 'false'
        WHEN 'null' THEN 'null' ELSE CAST(j.value AS TEXT) END,
    s.trace_id
FROM spans s, json_each(json_extract(s.attributes, '$.metadata')) j
WHERE instr(s.attributes, '"metadata"') AND json_type(s.attributes, '$.metadata') = 'text'
    AND json_valid(json_extract(s.attributes, '$.metadata'))
    AND json_type(json_extract(s.attributes, '$.metadata')) = 'object'
"""


def backfill_v2(conn: sqlite3.Connection) -> None:
    """Fill the version-2 columns and labels of spans stored before them (a migration step,
    run inside its transaction)."""
    conn.execute(_BACKFILL_SPANS)
    conn.execute(_BACKFILL_TAGS)
    conn.execute(_BACKFILL_METADATA)
    touched = [
        r[0]
        for r in conn.execute(
            "SELECT DISTINCT trace_id FROM spans WHERE session_id IS NOT NULL "
            "OR user_id IS NOT NULL OR span_type IS NOT NULL OR input_tokens IS NOT NULL "
            "OR output_tokens IS NOT NULL OR cost_usd IS NOT NULL"
        )
    ]
    for start in range(0, len(touched), 500):
        conn.execute(_UPDATE_TRACES, (orjson.dumps(touched[start : start + 500]).decode(),))


def backfill_v3(conn: sqlite3.Connection) -> None:
    """Index the spans stored before the search index (a migration step, run inside its
    transaction), a few hundred traces at a time."""
    trace_ids = [r[0] for r in conn.execute("SELECT trace_id FROM traces ORDER BY rowid")]
    index = TermIndex()
    for start in range(0, len(trace_ids), 500):
        found = {}
        for trace_id in trace_ids[start : start + 500]:
            found[trace_id] = trace_terms_of_rows(
                conn.execute(
                    "SELECT name, status_message, attributes, events FROM spans WHERE trace_id = ?",
                    (trace_id,),
                )
            )
        index.add(conn, found)


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
