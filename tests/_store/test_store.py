"""The local store: schema, upserts, summaries, experiments, retention, migrations, transport."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from looptrace import _store
from looptrace._store import SCHEMA_VERSION, Store, StoreError, span_from_row
from looptrace._wire import DecodedSpan
from store_support import decoded_span

NOW = time.time_ns()
RESOURCE = {"service.name": "svc", "telemetry.sdk.name": "looptrace"}


def dspan(
    trace: int,
    span: int,
    parent: int | None = None,
    name: str = "op",
    start: int = 0,
    end: int | None = 1000,
    attributes: dict[str, Any] | None = None,
    status: int = 0,
    message: str = "",
    resource: dict[str, Any] | None = None,
) -> DecodedSpan:
    start_ns = NOW + start
    return decoded_span(
        trace,
        span,
        parent,
        name,
        start_ns,
        0 if end is None else start_ns + end,
        attributes=attributes,
        status=status,
        message=message,
        resource=RESOURCE if resource is None else resource,
        scope=("looptrace", "0.1.0"),
    )


@pytest.fixture
def store(tmp_path: Path) -> Any:
    s = Store(tmp_path / "s.db")
    yield s
    s.close()


def test_round_trip_keeps_every_field(store: Store) -> None:
    """A span read back is the span written: ids, times, kinds, every attribute type (bytes
    and lists included), events, links, resource, scope, status, and the payloads."""
    original = DecodedSpan(
        trace_id="0af7651916cd43dd8448eb211c80319c",
        span_id="b7ad6b7169203331",
        parent_span_id="00f067aa0ba902b7",
        name="fetch",
        kind=3,
        start_ns=NOW,
        end_ns=NOW + 12_345,
        attributes={
            "s": "text",
            "i": -(2**62),
            "f": 1.5,
            "b": True,
            "raw": b"\x00\xffbytes",
            "list": ["a", "b"],
            "ints": [1, 2, 3],
            "input.value": '{"q": "x"}',
            "input.mime_type": "application/json",
            "output.value": '"y"',
        },
        events=[{"name": "exception", "time_ns": NOW + 5, "attributes": {"exception.type": "E"}}],
        links=[
            {
                "trace_id": "1" * 32,
                "span_id": "2" * 16,
                "trace_state": "k=v",
                "attributes": {"why": "retry"},
            }
        ],
        status_code=2,
        status_message="boom",
        trace_state="vendor=1",
        resource={"service.name": "svc", "host.cpus": 2},
        scope_name="my.scope",
        scope_version="9.9",
    )
    store.write([original])
    rows = store.get_trace(original.trace_id)
    assert len(rows) == 1
    assert span_from_row(rows[0]) == original
    assert rows[0]["input"] == '{"q": "x"}'
    assert rows[0]["duration_ns"] == 12_345


def test_preview_leaves_payloads_out_of_attributes(store: Store) -> None:
    """get_trace(preview=N) gives the first N characters of input/output and their full sizes,
    and no payload inside attributes (a 10,000-span listing never loads whole payloads)."""
    store.write([dspan(1, 1, attributes={"input.value": "x" * 5000, "output.value": "short"})])
    (row,) = store.get_trace(f"{1:032x}", preview=100)
    assert row["input"] == "x" * 100
    assert row["input_size"] == 5000
    assert row["output"] == "short"
    assert "input.value" not in row["attributes"]


def test_final_record_replaces_in_progress_but_never_the_reverse(store: Store) -> None:
    """An in-progress snapshot (end 0, looptrace.in_progress) is replaced by the final record;
    a late snapshot arriving after the final record changes nothing."""
    trace = f"{7:032x}"
    snapshot = dspan(7, 1, name="long", end=None, attributes={"looptrace.in_progress": True})
    store.write([snapshot])
    assert store.list_traces()[0]["status"] == "in_progress"
    assert store.get_trace(trace)[0]["in_progress"] is True
    final = dspan(7, 1, name="long", end=5000, status=1)
    store.write([final])
    store.write([snapshot])  # a retry of the old snapshot, delivered late
    (row,) = store.get_trace(trace)
    assert row["in_progress"] is False
    assert row["end_ns"] == final.end_ns
    summary = store.list_traces()[0]
    assert summary["status"] == "ok"
    assert summary["duration_ns"] == 5000


def test_trace_summary_is_maintained_across_batches_and_duplicates(store: Store) -> None:
    """The traces table counts spans and errors, takes the root's name and status and the
    whole extent, whatever order the spans arrive in and however often a batch is resent."""
    spans = [
        dspan(3, 2, parent=1, name="child", start=10, end=50, status=2, message="bad"),
        dspan(3, 3, parent=2, name="grandchild", start=20, end=3000),
    ]
    root = dspan(3, 1, name="root", start=0, end=100, status=1)
    store.write(spans)
    store.write([root])
    store.write(spans)  # resent: no double counting
    (summary,) = store.list_traces()
    assert summary["name"] == "root"
    assert summary["span_count"] == 3
    assert summary["error_count"] == 1
    assert summary["status"] == "ok"
    assert summary["duration_ns"] == 3020
    assert summary["service_name"] == "svc"
    assert store.list_traces(status="error")[0]["trace_id"] == summary["trace_id"]
    assert store.list_traces(status="ok") == []


def test_list_traces_orders_filters_and_pages(store: Store) -> None:
    """Newest first; name is a substring of the root name; status and experiment filter;
    limit and offset page."""
    for i in range(5):
        attrs = {"looptrace.experiment.id": "e1"} if i % 2 else {}
        store.write([dspan(100 + i, 1, name=f"job-{i}", start=i * 1000, attributes=attrs)])
    names = [t["name"] for t in store.list_traces()]
    assert names == ["job-4", "job-3", "job-2", "job-1", "job-0"]
    assert [t["name"] for t in store.list_traces(limit=2, offset=1)] == ["job-3", "job-2"]
    assert [t["name"] for t in store.list_traces(name="b-2")] == ["job-2"]
    assert [t["name"] for t in store.list_traces(experiment="e1")] == ["job-3", "job-1"]
    with pytest.raises(ValueError, match="status must be"):
        store.list_traces(status="bogus")
    assert store.find_trace_ids(f"{102:032x}") == [f"{102:032x}"]
    assert len(store.find_trace_ids("00000", limit=10)) == 5


def _experiment_spans(exp_id: str) -> list[DecodedSpan]:
    common = {"looptrace.experiment.id": exp_id, "looptrace.experiment.name": "qa"}
    out = [
        dspan(
            int(exp_id, 16),
            1,
            name="qa",
            attributes={
                **common,
                "looptrace.experiment.metadata": '{"model": "m1"}',
                "looptrace.experiment.tags": ["nightly"],
            },
        )
    ]
    for i in range(3):
        attrs: dict[str, Any] = {
            **common,
            "looptrace.case.index": i,
            "looptrace.case.repetition": 0,
            "looptrace.expected.value": "Paris",
            "input.value": f'"q{i}"',
            "output.value": '"Paris"' if i != 1 else '"Lyon"',
            "looptrace.score.exact": 0.0 if i == 1 else 1.0,
            "looptrace.score.len": float(i),
        }
        if i:
            attrs["looptrace.case.input_tokens"] = 10 * i
            attrs["looptrace.case.output_tokens"] = i
        status, message = 0, ""
        if i == 2:
            attrs["looptrace.score.exact.comment"] = "lucky"
            attrs["looptrace.case.error"] = "KeyError: 'x'"
            status, message = 2, "KeyError"
        out.append(
            dspan(
                500 + i,
                1,
                name=f"case {i}",
                start=10 + i,
                attributes=attrs,
                status=status,
                message=message,
            )
        )
        out.append(dspan(500 + i, 2, parent=1, name="answer", start=11 + i))
    return out


def test_experiments_cases_and_scores(store: Store) -> None:
    """Experiment facts come from span attributes: name, metadata, tags; cases by index with
    input, output, expected, error and scores (comments apart); score aggregates."""
    exp_id = f"{0xE1:032x}"
    store.write(_experiment_spans(exp_id))
    (head,) = store.list_experiments()
    assert head["id"] == exp_id
    assert head["name"] == "qa"
    assert head["metadata"] == {"model": "m1"}
    assert head["tags"] == ["nightly"]
    assert head["case_count"] == 3
    assert head["error_count"] == 1
    assert head["scores"]["exact"]["mean"] == pytest.approx(2 / 3)
    assert head["scores"]["len"] == {"mean": 1.0, "min": 0.0, "max": 2.0, "count": 3}
    assert (head["input_tokens"], head["output_tokens"]) == (30, 3)
    exp = store.get_experiment(exp_id)
    assert exp is not None
    assert [c["case_index"] for c in exp["cases"]] == [0, 1, 2]
    c1, c2 = exp["cases"][1], exp["cases"][2]
    assert (c1["output"], c1["expected"], c1["scores"]) == (
        '"Lyon"',
        "Paris",
        {"exact": 0.0, "len": 1.0},
    )
    assert c2["error"] == "KeyError: 'x'"
    assert c2["status"] == "error"
    assert c2["comments"] == {"exact": "lucky"}
    assert [(c["input_tokens"], c["output_tokens"]) for c in exp["cases"]] == [
        (None, None),
        (10, 1),
        (20, 2),
    ]
    assert exp["trace"]["name"] == "qa"
    assert store.get_experiment("nope") is None


def test_lag_summaries_and_worst_spans(store: Store) -> None:
    """looptrace.loop.lag spans come back with their figures (prefix stripped), and spans are
    ranked by looptrace.loop.lag_max_ms, the summary spans themselves left out (they are the
    chart, not the victims of a stall)."""
    store.write(
        [
            dspan(
                8,
                1,
                name="looptrace.loop.lag",
                attributes={
                    "looptrace.loop.lag.max_ms": 12.5,
                    "looptrace.loop.lag.count": 40,
                    "looptrace.loop.lag_max_ms": 99.0,
                },
            ),
            dspan(9, 2, name="slow", attributes={"looptrace.loop.lag_max_ms": 30.0}),
            dspan(9, 3, name="fast", attributes={"looptrace.loop.lag_max_ms": 0.5}),
        ]
    )
    lag = store.lag_summaries()
    assert lag["summaries"][0]["values"] == {"max_ms": 12.5, "count": 40}
    assert [s["name"] for s in lag["worst_spans"]] == ["slow", "fast"]
    # Summary traces stay out of the trace list unless asked for.
    assert [t["trace_id"] for t in store.list_traces()] == [f"{9:032x}"]
    assert len(store.list_traces(include_lag=True)) == 2


def test_store_file_is_wal_and_versioned(tmp_path: Path) -> None:
    """The file is in WAL mode and records the schema version."""
    path = tmp_path / "v.db"
    with Store(path) as s:
        s.write([dspan(1, 1)])
        assert s.schema_version == SCHEMA_VERSION
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0] == str(
        SCHEMA_VERSION
    )
    conn.close()


def test_migrates_forward_and_refuses_newer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opening a file made by an older schema runs the missing migrations and keeps the data;
    a file from a newer looptrace is refused with a clear error."""
    path = tmp_path / "m.db"
    with Store(path) as s:
        s.write([dspan(1, 1, name="kept")])

    def add_note_column(conn: sqlite3.Connection) -> None:
        conn.execute("ALTER TABLE traces ADD COLUMN note TEXT")

    monkeypatch.setattr(_store.schema, "_MIGRATIONS", [*_store.schema._MIGRATIONS, add_note_column])
    monkeypatch.setattr(_store.schema, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    with Store(path) as s:
        assert s.schema_version == SCHEMA_VERSION + 1
        assert s.list_traces()[0]["name"] == "kept"
    monkeypatch.undo()
    with pytest.raises(StoreError, match="newer looptrace"), Store(path) as s:
        s.list_traces()


def test_refuses_a_file_that_is_not_a_store(tmp_path: Path) -> None:
    """An SQLite file with other tables is not silently taken over."""
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE users (id INTEGER)")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="not a looptrace store"), Store(path) as s:
        s.list_traces()


def test_a_failed_write_leaves_nothing_behind(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch is one transaction: when any part fails, none of its spans are stored."""
    store.write([dspan(1, 1)])

    def broken(conn: sqlite3.Connection, trace_ids: list[str]) -> None:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(store, "_update_traces", broken)
    with pytest.raises(sqlite3.OperationalError):
        store.write([dspan(2, 1), dspan(2, 2, parent=1)])
    monkeypatch.undo()
    assert store.get_trace(f"{2:032x}") == []
    assert [t["trace_id"] for t in store.list_traces()] == [f"{1:032x}"]


def test_retention_by_age_deletes_old_traces_and_their_experiments(tmp_path: Path) -> None:
    """Traces that started before max_age_days are deleted with their spans and scores; an
    experiment with no traces left goes too; recent traces stay."""
    day = 86_400 * 10**9
    with Store(tmp_path / "r.db", max_age_days=7) as s:
        s.write(
            [
                dspan(
                    1,
                    1,
                    name="old",
                    start=-10 * day,
                    attributes={
                        "looptrace.experiment.id": "e",
                        "looptrace.case.index": 0,
                        "looptrace.score.x": 1.0,
                    },
                ),
                dspan(2, 1, name="new", start=-1 * day),
            ]
        )
        # The first write pruned already; say so explicitly too.
        s.prune()
        assert [t["name"] for t in s.list_traces()] == ["new"]
        assert s.get_trace(f"{1:032x}") == []
        assert s.list_experiments() == []


def test_retention_by_size_keeps_the_newest(tmp_path: Path) -> None:
    """Past max_bytes, the oldest traces go until the store is under the limit again."""
    limit = 400_000
    with Store(tmp_path / "size.db", max_bytes=limit) as s:
        s.max_bytes = None  # fill first, prune once
        for i in range(60):
            s.write([dspan(1000 + i, 1, start=i, attributes={"input.value": "x" * 20_000})])
        s.max_bytes = limit
        deleted = s.prune()
        assert deleted > 0
        assert s.stats()["bytes"] <= limit
        remaining = {t["trace_id"] for t in s.list_traces(limit=100)}
        assert f"{1059:032x}" in remaining
        assert f"{1000:032x}" not in remaining


def test_two_writers_on_one_file_lose_nothing(tmp_path: Path) -> None:
    """Two Store objects on one file (a program and `looptrace serve`), writing from several
    threads at once, wait for each other instead of failing."""
    path = tmp_path / "shared.db"
    stores = [Store(path), Store(path)]
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            for i in range(10):
                stores[n % 2].write([dspan(n * 1000 + i, j + 1) for j in range(5)])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert stores[0].stats()["spans"] == 4 * 10 * 5
    for s in stores:
        s.close()


def test_trace_list_filters_by_service_duration_and_start(tmp_path: Path) -> None:
    """The filters the viewer's trace list offers, each answered by the store."""
    ms = 10**6
    spans = [
        decoded_span(1, 1, None, "quick", 1_000 * ms, 1_002 * ms, resource={"service.name": "api"}),
        decoded_span(2, 1, None, "slow", 2_000 * ms, 2_500 * ms, resource={"service.name": "api"}),
        decoded_span(3, 1, None, "other", 3_000 * ms, 3_900 * ms, resource={"service.name": "job"}),
        decoded_span(4, 1, None, "running", 4_000 * ms, 0, resource={"service.name": "job"}),
    ]
    with Store(tmp_path / "s.db") as store:
        store.write(spans)

        def names(**filters: Any) -> list[str]:
            return sorted(t["name"] for t in store.list_traces(**filters))

        assert store.services() == ["api", "job"]
        assert names(service="api") == ["quick", "slow"]
        assert names(min_duration_ns=400 * ms) == ["other", "slow"]  # never a running trace
        assert names(since_ns=2_000 * ms, until_ns=3_000 * ms) == ["other", "slow"]
        assert names(service="job", min_duration_ns=0) == ["other"]


def test_lag_culprits_group_stalls_by_code_and_name_the_spans_that_waited(
    tmp_path: Path,
) -> None:
    """The lag page's lead: stalls grouped by the code that blocked (worst first), with the
    stack of the worst, the spans they happened in, and the spans running meanwhile."""
    ms = 10**6

    def stall(at: int, duration_ms: float, function: str, line: int) -> dict[str, Any]:
        return {
            "name": "looptrace.loop.stall",
            "time_ns": at,
            "attributes": {
                "looptrace.loop.stall.duration_ms": duration_ms,
                "code.function": function,
                "code.filepath": "app.py",
                "code.lineno": line,
                "looptrace.loop.stall.stack": f"app.py:{line} in {function}",
                "looptrace.task.name": "Task-1",
            },
        }

    lag = "looptrace.loop.lag_max_ms"
    spans = [
        decoded_span(
            1,
            1,
            None,
            "parse",
            0,
            300 * ms,
            attributes={lag: 200.0},
            events=[stall(50 * ms, 200.0, "parse_json", 10)],
        ),
        decoded_span(
            2,
            1,
            None,
            "parse again",
            1000 * ms,
            1100 * ms,
            attributes={lag: 80.0},
            events=[stall(1010 * ms, 80.0, "parse_json", 10)],
        ),
        decoded_span(
            3,
            1,
            None,
            "hash",
            2000 * ms,
            2050 * ms,
            attributes={lag: 40.0},
            events=[stall(2005 * ms, 40.0, "sha_loop", 22)],
        ),
        decoded_span(4, 1, None, "fetch", 40 * ms, 400 * ms, attributes={lag: 200.0}),
        decoded_span(5, 1, None, "unrelated", 5000 * ms, 5001 * ms, attributes={lag: 0.5}),
    ]
    with Store(tmp_path / "s.db") as store:
        store.write(spans)
        culprits = store.lag_summaries()["culprits"]
    assert [(c["function"], c["lineno"], c["stalls"]) for c in culprits] == [
        ("parse_json", 10, 2),
        ("sha_loop", 22, 1),
    ]
    worst = culprits[0]
    assert (worst["max_ms"], worst["total_ms"], worst["task"]) == (200.0, 280.0, "Task-1")
    assert worst["stack"] == "app.py:10 in parse_json"
    assert sorted(s["name"] for s in worst["in_spans"]) == ["parse", "parse again"]
    assert [s["name"] for s in worst["waiting_spans"]] == ["fetch"]
    assert worst["waiting"] == 1
    assert culprits[1]["waiting_spans"] == []


def test_absent_fields_are_stored_as_sql_null(tmp_path: Path) -> None:
    """What a span does not have (a parent, payloads, a session, token counts, a duration while
    in progress) is NULL in its column, so the partial indexes and the readers' ``IS NULL``
    filters see it; what it has is stored as given."""
    path = tmp_path / "n.db"
    with Store(path) as store:
        store.write(
            [
                dspan(1, 1, end=None, attributes={"looptrace.in_progress": True}),
                dspan(
                    1,
                    2,
                    parent=1,
                    attributes={
                        "session.id": "s1",
                        "gen_ai.usage.input_tokens": 3,
                        "llm.cost.total": 0.5,
                        "input.value": "in",
                        "looptrace.loop.lag_max_ms": 2.5,
                    },
                ),
            ]
        )
    columns = (
        "parent_span_id, duration_ns, input, output, lag_max_ms, experiment_id, case_index, "
        "session_id, user_id, span_type, input_tokens, output_tokens, cost_usd"
    )
    conn = sqlite3.connect(path)
    try:
        types = conn.execute(
            "SELECT "
            + ", ".join(f"typeof({c})" for c in columns.split(", "))
            + " FROM spans ORDER BY span_id"
        ).fetchall()
        roots = conn.execute(
            "SELECT span_id FROM spans INDEXED BY spans_roots WHERE parent_span_id IS NULL"
        ).fetchall()
    finally:
        conn.close()
    assert types[0] == ("null",) * 13
    assert types[1] == (
        "text", "integer", "text", "null", "real", "null", "null",
        "text", "null", "null", "integer", "null", "real",
    )  # fmt: skip
    assert roots == [(f"{1:016x}",)]


def test_a_schema_4_store_opens_and_reads_lag_summaries_from_their_own_index(
    tmp_path: Path,
) -> None:
    """A store of schema 4 (every span indexed by name) is migrated on opening: the index by
    name gives way to one of the lag monitor's summary spans alone, which the lag page reads
    (both before and after the migration, the summaries come back newest first)."""
    path = tmp_path / "v4.db"
    lag = {"looptrace.loop.lag.max_ms": 12.0}
    with Store(path) as s:
        s.write([dspan(1, 1, name="looptrace.loop.lag", start=0, attributes=lag)])
        s.write([dspan(2, 1, name="work", start=5)])
    conn = sqlite3.connect(path)
    conn.execute("DROP INDEX spans_lag_summaries")
    conn.execute("CREATE INDEX spans_by_name ON spans (name, start_ns)")
    conn.execute("UPDATE meta SET value = '4' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    with Store(path) as s:
        assert s.schema_version == SCHEMA_VERSION
        s.write([dspan(3, 1, name="looptrace.loop.lag", start=10, attributes=lag)])
        summaries = s.lag_summaries()["summaries"]
    assert [x["trace_id"] for x in summaries] == [f"{3:032x}", f"{1:032x}"]
    assert summaries[0]["values"] == {"max_ms": 12.0}
    conn = sqlite3.connect(path)
    try:
        indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
        plan = " ".join(
            str(r[-1])
            for r in conn.execute(
                "EXPLAIN QUERY PLAN SELECT span_id FROM spans s WHERE "
                "s.name = 'looptrace.loop.lag' AND s.start_ns >= 0 ORDER BY s.start_ns DESC"
            )
        )
    finally:
        conn.close()
    assert "spans_by_name" not in indexes
    assert "spans_lag_summaries" in plan
