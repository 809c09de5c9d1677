"""The store's search index (attribute and text search over traces) and its housekeeping
(deleting traces and experiments, pruning by age, service and experiment)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from looptrace._store import SCHEMA_VERSION, Store
from looptrace._wire import DecodedSpan
from store_support import decoded_span

NOW = time.time_ns()
DAY = 86_400 * 10**9


def span(
    trace: int,
    span_id: int = 1,
    *,
    name: str = "op",
    attributes: dict[str, Any] | None = None,
    status: int = 0,
    message: str = "",
    events: list[dict[str, Any]] | None = None,
    service: str = "api",
    start: int = 0,
    parent: int | None = None,
) -> DecodedSpan:
    start_ns = NOW + start
    return decoded_span(
        trace,
        span_id,
        parent,
        name,
        start_ns,
        start_ns + 1000,
        attributes=attributes,
        events=events,
        status=status,
        message=message,
        resource={"service.name": service},
    )


@pytest.fixture
def store(tmp_path: Path) -> Any:
    s = Store(tmp_path / "s.db")
    s.write(
        [
            span(1, name="GET /search", attributes={"http.route": "/search", "user.id": "ada"}),
            # The attribute is on a child span: the whole trace is found.
            span(2, name="GET /items", start=1),
            span(
                2,
                2,
                parent=1,
                name="db.query",
                attributes={"http.status_code": 503, "retry": True, "tags": ["a", "b"]},
                start=2,
            ),
            span(
                3,
                name="payment",
                status=2,
                message="card declined by issuer",
                events=[
                    {
                        "name": "exception",
                        "time_ns": NOW,
                        "attributes": {
                            "exception.type": "TimeoutError",
                            "exception.message": "upstream did not answer",
                        },
                    }
                ],
                service="billing",
                start=3,
            ),
            span(
                4,
                name="chat",
                attributes={"input.value": '{"secret": "needle"}', "note": "Grüße aus Köln"},
                start=4,
            ),
        ]
    )
    yield s
    s.close()


def _names(store: Store, **filters: Any) -> list[str]:
    return [t["name"] for t in store.list_traces(**filters)]


def test_attribute_search_matches_any_span_of_a_trace(store: Store) -> None:
    """``key=value`` finds the traces with a span holding that attribute; numbers, booleans
    and list items compare as their text; several attributes must all hold."""
    assert _names(store, attrs=[("http.route", "/search")]) == ["GET /search"]
    assert _names(store, attrs=[("http.status_code", "503")]) == ["GET /items"]
    assert _names(store, attrs=[("retry", "true")]) == ["GET /items"]
    assert _names(store, attrs=[("tags", "b")]) == ["GET /items"]
    assert _names(store, attrs=[("http.status_code", "503"), ("retry", "true")]) == ["GET /items"]
    assert _names(store, attrs=[("http.status_code", "503"), ("user.id", "ada")]) == []
    assert _names(store, attrs=[("http.route", "/sear")]) == []  # values match whole


def test_text_search_finds_words_of_names_values_and_errors(store: Store) -> None:
    """Text search matches words (and the start of words) in span names, attribute values,
    status messages and exception messages, case-insensitively; every word must match."""
    assert _names(store, text="declined") == ["payment"]
    assert _names(store, text="TIMEOUT") == ["payment"]  # exception.type, by its start
    assert _names(store, text="upstream answer") == ["payment"]
    assert _names(store, text="upstream search") == []
    assert _names(store, text="db.query") == ["GET /items"]  # a child's name
    assert _names(store, text="ada") == ["GET /search"]
    assert _names(store, text="köln") == ["chat"]
    # Payloads are not indexed.
    assert _names(store, text="needle") == []


def test_search_combines_with_the_other_filters(store: Store) -> None:
    """Search narrows what the list's other filters (service, status, time) keep."""
    assert _names(store, text="declined", service="billing") == ["payment"]
    assert _names(store, text="declined", service="api") == []
    assert _names(store, text="declined", status="ok") == []
    assert _names(store, text="get", since_ns=NOW + 1) == ["GET /items"]


def test_search_answers_from_the_index_not_a_scan(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rare term is read from the index and the list looked up by those traces' rows; a
    common one is checked per trace with a lookup of the index's key: SQLite's plan never
    scans the index. Both plans give the same answers."""
    from looptrace._store import search

    conn = sqlite3.connect(store.path)

    def plan_text(attrs: list[tuple[str, str]], text: str | None) -> tuple[bool, str]:
        plan = search.search_plan(conn, attrs, text)
        found = () if plan.found is None else (plan.found,)
        rows = conn.execute(
            "EXPLAIN QUERY PLAN "
            + plan.source("trace_id")
            + (" WHERE " + " AND ".join(plan.where) if plan.where else "")
            # Another filter with an index of its own must not make SQLite walk the table.
            + (" AND " if plan.where else " WHERE ")
            + "service_name = 'api' ORDER BY start_ns DESC",
            (*found, *plan.params),
        ).fetchall()
        return plan.found is not None, " ".join(str(row[-1]) for row in rows)

    by_rowid, details = plan_text([("http.route", "/search")], "get")
    assert by_rowid
    assert "SCAN trace_terms" not in details and "SCAN traces" not in details
    rare = _names(store, attrs=[("http.route", "/search")], text="get")
    monkeypatch.setattr(search, "RARE", 0)  # every term counts as common
    by_rowid, details = plan_text([("http.route", "/search")], "get")
    assert not by_rowid
    assert "SCAN trace_terms" not in details
    assert "trace_terms USING PRIMARY KEY" in details
    assert _names(store, attrs=[("http.route", "/search")], text="get") == rare == ["GET /search"]
    assert _names(store, text="get") == ["GET /items", "GET /search"]
    conn.close()


def test_deleting_a_trace_removes_it_from_search_and_lists(store: Store) -> None:
    """A deleted trace leaves nothing behind: its spans, its summary, its index rows."""
    trace_id = f"{2:032x}"
    assert store.delete_traces([trace_id, f"{99:032x}"]) == 1
    assert store.get_trace(trace_id) == []
    assert _names(store, attrs=[("retry", "true")]) == []
    conn = sqlite3.connect(store.path)
    # No index row is left over, and no term that only this trace held.
    assert (
        conn.execute(
            "SELECT count(*) FROM search_terms WHERE term LIKE '%db.query%' OR term LIKE '%503%'"
        ).fetchone()[0]
        == 0
    )
    assert (
        conn.execute(
            "SELECT count(*) FROM trace_terms WHERE trace_key NOT IN (SELECT rowid FROM traces)"
        ).fetchone()[0]
        == 0
    )
    conn.close()


def test_delete_experiment_removes_its_traces_and_scores(tmp_path: Path) -> None:
    """Deleting an experiment deletes every trace of it and the experiment itself; other
    traces stay; an unknown experiment is None."""
    with Store(tmp_path / "e.db") as s:
        exp = {"looptrace.experiment.id": "e1", "looptrace.experiment.name": "first"}
        s.write(
            [
                span(1, attributes={**exp, "looptrace.case.index": 0, "looptrace.score.ok": 1}),
                span(2, attributes={**exp, "looptrace.case.index": 1}),
                span(3, name="other"),
            ]
        )
        assert [e["id"] for e in s.list_experiments()] == ["e1"]
        assert s.delete_experiment("e1") == 2
        assert s.list_experiments() == []
        assert _names(s) == ["other"]
        assert s.delete_experiment("e1") is None


def test_prune_by_age_service_and_experiment(tmp_path: Path) -> None:
    """Prune deletes what every given filter matches, counts it (a dry run only counts),
    and refuses to run with no filter."""
    with Store(tmp_path / "p.db") as s:
        s.write(
            [
                span(1, name="old-api", start=-10 * DAY),
                span(2, name="old-job", service="job", start=-10 * DAY),
                span(3, name="new-api", start=-1),
                span(4, name="new-job", service="job", start=-2),
            ]
        )
        assert s.prune_traces(before_ns=NOW - DAY, dry_run=True) == {"traces": 2, "spans": 2}
        assert len(_names(s)) == 4
        assert s.prune_traces(before_ns=NOW - DAY, service="job") == {"traces": 1, "spans": 1}
        assert sorted(_names(s)) == ["new-api", "new-job", "old-api"]
        assert s.prune_traces(service="api") == {"traces": 2, "spans": 2}
        assert _names(s) == ["new-job"]
        with pytest.raises(ValueError):
            s.prune_traces()


def test_an_older_store_is_indexed_when_opened(tmp_path: Path) -> None:
    """A store written before the search index existed (schema 2) is indexed by the
    migration: its traces are found at once."""
    path = tmp_path / "old.db"
    with Store(path) as s:
        s.write([span(1, name="legacy", attributes={"k": "v"}, message="broken pipe")])
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE trace_terms")
    conn.execute("DROP TABLE search_terms")
    conn.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    with Store(path) as s:
        assert s.schema_version == SCHEMA_VERSION
        assert _names(s, attrs=[("k", "v")]) == ["legacy"]
        assert _names(s, text="pipe") == ["legacy"]


def test_batches_that_wait_for_the_writer_share_one_commit(tmp_path: Path) -> None:
    """Group commit: batches that arrive while the writer is busy are written together in
    one transaction, and every caller returns only after it; if that transaction fails,
    every one of them raises (none is told its spans are stored)."""
    import threading

    with Store(tmp_path / "g.db") as s:
        s.write([span(1)])
        writes = s.counters.writes
        errors: list[BaseException] = []

        def writer(trace: int) -> None:
            try:
                s.write([span(trace, name=f"t{trace}")])
            except BaseException as exc:
                errors.append(exc)

        def queued(n: int) -> None:
            deadline = time.monotonic() + 60
            while len(s._queue) < n:
                assert time.monotonic() < deadline, "the writers never queued"
                time.sleep(0.01)

        with s._write_lock:  # the writer is busy
            threads = [threading.Thread(target=writer, args=(t,)) for t in (2, 3, 4)]
            for t in threads:
                t.start()
            queued(3)
        for t in threads:
            t.join(60)
        assert errors == []
        assert s.counters.writes == writes + 1
        assert sorted(_names(s)) == ["op", "t2", "t3", "t4"]

        def broken(*args: Any) -> None:
            raise sqlite3.OperationalError("disk I/O error")

        s._write_locked = broken  # type: ignore[method-assign]
        with s._write_lock:
            threads = [threading.Thread(target=writer, args=(t,)) for t in (5, 6)]
            for t in threads:
                t.start()
            queued(2)
        for t in threads:
            t.join(60)
        assert [str(e) for e in errors] == ["disk I/O error", "disk I/O error"]
        del s._write_locked
        assert sorted(_names(s)) == ["op", "t2", "t3", "t4"]


def test_spans_of_one_shape_index_every_trace_they_belong_to(tmp_path: Path) -> None:
    """Spans repeating one name and attributes (a function called again and again) index each
    of their traces, in one batch or across batches; a span of that shape with an exception
    event adds its error's words; a new value of an attribute is a new term."""
    attrs = {"code.function": "lookup", "tier": 2}
    with Store(tmp_path / "shape.db") as s:
        s.write([span(t, name="lookup", attributes=dict(attrs), start=t) for t in (1, 2)])
        s.write([span(3, name="lookup", attributes=dict(attrs), start=3)])
        error = {"name": "exception", "time_ns": NOW, "attributes": {"exception.message": "gone"}}
        s.write([span(4, name="lookup", attributes=dict(attrs), start=4, events=[error])])
        s.write([span(5, name="lookup", attributes={**attrs, "tier": 3}, start=5)])
        everything = sorted(_names(s, attrs=[("code.function", "lookup")]))
        assert everything == ["lookup"] * 5
        assert len(s.list_traces(attrs=[("tier", "2")])) == 4
        assert [t["trace_id"] for t in s.list_traces(text="gone")] == [f"{4:032x}"]
        assert [t["trace_id"] for t in s.list_traces(attrs=[("tier", "3")])] == [f"{5:032x}"]


def test_one_batch_of_many_traces_indexes_each_by_its_own_terms(tmp_path: Path) -> None:
    """In one batch: traces of one span each, of two shapes, and a trace holding a span of
    each shape; every trace is found by the terms its spans hold and by no others."""
    a = {"code.function": "fetch"}
    b = {"code.function": "store"}
    batch = [span(t, name="fetch", attributes=dict(a), start=t) for t in range(1, 6)]
    batch += [span(t, name="store", attributes=dict(b), start=t) for t in range(6, 9)]
    batch += [
        span(9, 1, name="fetch", attributes=dict(a), start=9),
        span(9, 2, name="store", attributes=dict(b), start=9, parent=1),
    ]
    with Store(tmp_path / "many.db") as s:
        s.write(batch)

        def found(**filters: Any) -> list[int]:
            return sorted(int(t["trace_id"], 16) for t in s.list_traces(**filters))

        assert found(attrs=[("code.function", "fetch")]) == [1, 2, 3, 4, 5, 9]
        assert found(attrs=[("code.function", "store")]) == [6, 7, 8, 9]
        assert found(text="store") == [6, 7, 8, 9]
        assert found(attrs=[("code.function", "fetch"), ("code.function", "store")]) == [9]
