"""Experiments at scale: summaries summed in the store, cases a page at a time, repetitions in
a column of their own, task errors apart from scorer errors (every failing scorer named), each
scorer's trend over the last runs with what regressed; and the layout of keys and lag badges.

Store and API tests read a store built span by span (tests/experiment_support.py); browser
tests drive Debian's headless chromium against the collector serving it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from collector_support import running_collector
from experiment_support import experiment_spans
from looptrace import _semconv as sc
from looptrace._store import Store
from store_support import decoded_span
from viewer_support import (
    browser_test,
    needs_chromium,
    open_page,
    screenshot,
)

uvicorn = pytest.importorskip("uvicorn")
pytest.importorskip("starlette")

from looptrace.collector import viewer  # noqa: E402

HOUR = 3600 * 10**9
NOW = time.time_ns()

# 250 dataset rows run twice: 500 cases. The task raises on rows 5 and 17; scorers "exact" and
# "judge" raise on row 9, "judge" alone on row 11 (both repetitions each time).
BIG = f"{0xE501:032x}"
BIG_ROWS, BIG_REPS = 250, 2
TASK_ERRORS = frozenset({5, 17})
SCORER_ERRORS = {9: ("exact", "judge"), 11: ("judge",)}
# Three runs of one experiment: accuracy drops on rows 2-5 in the last; length moves by less
# than the threshold.
RUNS = [f"{0xE601 + i:032x}" for i in range(3)]
RUN_ROWS = 20
HUGE = f"{0xE701:032x}"
HUGE_CASES = 10_000
LAYOUT_TRACE = 0x1A7
LONG_NAME = "a span with a very long name " * 8
DASH = "\u2013"  # an en dash: the page writes ranges as 1, DASH, 100


def _run_scores(run: int) -> Any:
    low = {0: 0, 1: 2, 2: 6}[run]  # rows below this score 0 for accuracy
    length = 0.49 if run == 2 else 0.5
    return lambda i, rep: {"accuracy": 0.0 if i < low else 1.0, "length": length}


def _layout_spans() -> list[Any]:
    start = NOW - 5 * HOUR
    return [
        decoded_span(LAYOUT_TRACE, 1, None, "layout root", start, start + 10**9),
        decoded_span(
            LAYOUT_TRACE,
            2,
            1,
            LONG_NAME,
            start + 10**6,
            start + 5 * 10**8,
            attributes={
                "looptrace.loop.lag_max_ms": 123.4,
                sc.CASE_REPETITION: 3,
                "an.attribute_key.with_several.parts_that_is_long": "v",
                "payload": "x" * 400,
            },
        ),
    ]


@pytest.fixture(scope="module")
def store_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("experiments") / "traces.db"
    with Store(path) as store:
        store.write(
            experiment_spans(
                BIG,
                "qa-big",
                NOW - 4 * HOUR,
                BIG_ROWS,
                repetitions=BIG_REPS,
                score=lambda i, rep: 1.0 if i % 2 else 0.5,
                task_errors=TASK_ERRORS,
                scorer_errors=SCORER_ERRORS,
                input_chars=400,
            )
        )
        for run, exp_id in enumerate(RUNS):
            store.write(
                experiment_spans(
                    exp_id,
                    "nightly-qa",
                    NOW - (3 - run) * HOUR,
                    RUN_ROWS,
                    score=_run_scores(run),
                    children=0,
                )
            )
        spans = experiment_spans(
            HUGE, "huge", NOW - 6 * HOUR, HUGE_CASES, score=lambda i, rep: i % 3 / 2, children=0
        )
        for k in range(0, len(spans), 5000):
            store.write(spans[k : k + 5000])
        store.write(_layout_spans())
    return path


@pytest.fixture(scope="module")
def store(store_path: Path) -> Iterator[Store]:
    with Store(store_path) as s:
        yield s


@pytest.fixture(scope="module")
def base_url(store_path: Path) -> Iterator[str]:
    """The collector with the viewer on uvicorn at an ephemeral port."""
    with running_collector(store_path, extra_routes=viewer.routes()) as url:
        yield url


def _wait_text(page: Any, selector: str, text: str) -> None:
    page.wait_for_function(
        "([s, t]) => document.querySelector(s)?.textContent === t", arg=[selector, text]
    )


# --------------------------------------------------------------------------------------------
# the store and the API


def test_the_store_sums_errors_apart_from_scorer_errors(store: Store) -> None:
    """An experiment's head counts cases, dataset rows, task errors and scorer errors apart
    (as the summary an experiment prints), and names every failing scorer with its count."""
    exp = store.get_experiment(BIG, limit=1)
    assert exp is not None
    assert exp["case_count"] == BIG_ROWS * BIG_REPS
    assert exp["dataset_cases"] == BIG_ROWS
    assert exp["error_count"] == len(TASK_ERRORS) * BIG_REPS
    assert exp["scorer_error_count"] == len(SCORER_ERRORS) * BIG_REPS
    assert exp["scorer_errors"] == {"exact": 1 * BIG_REPS, "judge": 2 * BIG_REPS}
    assert exp["scores"]["accuracy"]["count"] == BIG_ROWS * BIG_REPS
    (listed,) = [e for e in store.list_experiments(limit=100) if e["id"] == BIG]
    assert (listed["error_count"], listed["scorer_error_count"]) == (4, 4)


def test_cases_come_a_page_at_a_time_in_case_then_repetition_order(store: Store) -> None:
    """limit/offset page the cases, ordered by case index then repetition; each carries its
    repetition, its task error (or None) and every scorer that raised on it."""
    first = store.get_experiment(BIG, limit=100)
    assert first is not None
    assert first["case_rows"] == BIG_ROWS * BIG_REPS
    assert [(c["case_index"], c["repetition"]) for c in first["cases"][:4]] == [
        (0, 0),
        (0, 1),
        (1, 0),
        (1, 1),
    ]
    second = store.get_experiment(BIG, limit=100, offset=100)
    assert second is not None
    assert second["cases"][0]["case_index"] == 50
    assert len(second["cases"]) == 100
    nine = [c for c in first["cases"] if c["case_index"] == 9]
    assert [c["scorer_errors"] for c in nine] == [
        {"exact": "KeyError: exact", "judge": "KeyError: judge"}
    ] * 2
    assert all(c["error"] is None and c["status"] == "error" for c in nine)
    five = [c for c in first["cases"] if c["case_index"] == 5]
    assert [c["error"] for c in five] == ["ValueError: no answer"] * 2
    # The preview is cut; the size says how long the whole value is.
    assert five[0]["input_size"] > len(five[0]["input"]) == 200


def test_cases_filter_by_outcome(store: Store) -> None:
    """case_filter keeps task errors, scorer errors, any failure or the passed cases; case_rows
    counts what the filter keeps."""
    counts = {}
    for name in ("task_error", "scorer_error", "error", "ok"):
        exp = store.get_experiment(BIG, limit=1000, case_filter=name)
        assert exp is not None
        assert exp["case_rows"] == len(exp["cases"])
        counts[name] = sorted({c["case_index"] for c in exp["cases"]})
    assert counts["task_error"] == sorted(TASK_ERRORS)
    assert counts["scorer_error"] == sorted(SCORER_ERRORS)
    assert counts["error"] == sorted(TASK_ERRORS | set(SCORER_ERRORS))
    assert len(counts["ok"]) == BIG_ROWS - 4
    with pytest.raises(ValueError):
        store.get_experiment(BIG, case_filter="nope")


def test_the_trend_compares_the_last_runs_and_names_regressions(store: Store) -> None:
    """A scorer's trend lists the runs of the same experiment name up to this one, oldest
    first, with their means; against the previous run it flags a mean that dropped past the
    threshold and the cases that scored lower, but not a drop within the threshold."""
    trend = store.experiment_trend(RUNS[2], runs=10, threshold=0.05)
    assert trend is not None
    assert [r["id"] for r in trend["runs"]] == RUNS
    assert [(r["case_count"], r["failed_count"]) for r in trend["runs"]] == [(RUN_ROWS, 0)] * 3
    assert [r["scores"]["accuracy"]["mean"] for r in trend["runs"]] == pytest.approx(
        [1.0, 0.9, 0.7]
    )
    assert trend["previous"] == RUNS[1]
    acc = trend["regressions"]["accuracy"]
    assert acc["mean_regressed"] is True
    assert acc["delta"] == pytest.approx(-0.2)
    assert acc["cases_dropped"] == 4
    assert [d["case_index"] for d in acc["dropped"]] == [2, 3, 4, 5]
    length = trend["regressions"]["length"]
    assert length["delta"] == pytest.approx(-0.01)
    assert (length["mean_regressed"], length["cases_dropped"]) == (False, 0)
    # The middle run's trend stops at it: later runs are not its past.
    middle = store.experiment_trend(RUNS[1])
    assert middle is not None
    assert [r["id"] for r in middle["runs"]] == RUNS[:2]
    assert store.experiment_trend("nope") is None


def test_the_api_pages_a_10000_case_experiment(base_url: str) -> None:
    """At 10,000 cases the experiment answer holds one page (100 cases by default) with the
    totals summed by the store, in a small answer; any page can be asked for."""
    answer = httpx.get(f"{base_url}/api/experiments/{HUGE}", timeout=60)
    assert answer.status_code == 200
    body = answer.json()
    assert body["case_count"] == HUGE_CASES
    assert len(body["cases"]) == 100
    assert body["scores"]["accuracy"]["count"] == HUGE_CASES
    assert len(answer.content) < 100_000
    last = httpx.get(
        f"{base_url}/api/experiments/{HUGE}", params={"offset": HUGE_CASES - 10}, timeout=60
    ).json()
    assert [c["case_index"] for c in last["cases"]] == list(range(HUGE_CASES - 10, HUGE_CASES))


def test_the_api_refuses_bad_paging_and_unknown_experiments(base_url: str) -> None:
    """A bad filter or limit is a 400 that says which; an unknown experiment (or its trend) is
    a 404."""
    bad = httpx.get(f"{base_url}/api/experiments/{BIG}", params={"filter": "nope"})
    assert bad.status_code == 400
    assert "filter" in bad.json()["error"]
    assert httpx.get(f"{base_url}/api/experiments/{BIG}", params={"limit": 0}).status_code == 400
    assert httpx.get(f"{base_url}/api/experiments/nope").status_code == 404
    assert httpx.get(f"{base_url}/api/experiments/nope/trend").status_code == 404
    trend = httpx.get(f"{base_url}/api/experiments/{RUNS[2]}/trend", params={"runs": 2}).json()
    assert [r["id"] for r in trend["runs"]] == RUNS[1:]


# --------------------------------------------------------------------------------------------
# in the browser


@browser_test
@needs_chromium
def test_the_experiment_page_pages_its_cases_with_a_repetition_column(page: Any) -> None:
    """The page draws 100 cases, repetitions as a column (case 0 twice: rep 0 and rep 1), and
    pages forward and back with the page in the address."""
    open_page(page, f"/experiments/{BIG}")
    rows = page.locator("table.cases tbody tr")
    assert rows.count() == 100
    assert page.inner_text("#case-range") == f"1{DASH}100 of 500"
    assert [rows.nth(i).get_attribute("data-case-index") for i in range(2)] == ["0", "0"]
    assert [rows.nth(i).locator("td.rep").inner_text() for i in range(2)] == ["0", "1"]
    assert page.locator("table.cases th", has_text="rep").count() == 1

    page.click("#cases-next")
    _wait_text(page, "#case-range", f"101{DASH}200 of 500")
    assert "offset=100" in page.url
    assert rows.nth(0).get_attribute("data-case-index") == "50"
    page.go_back()
    _wait_text(page, "#case-range", f"1{DASH}100 of 500")
    assert rows.nth(0).get_attribute("data-case-index") == "0"


@browser_test
@needs_chromium
def test_errors_and_scorer_errors_are_apart_and_every_failing_scorer_shows(
    page: Any, tmp_path: Path
) -> None:
    """The ERRORS card counts task errors and a SCORER ERRORS card the cases a scorer failed
    on, as the store sums them; filtered to scorer errors, a case on which two scorers raised
    names both."""
    open_page(page, f"/experiments/{BIG}")
    assert page.inner_text(".card[data-card='errors'] .v") == "4"
    scorer_card = page.locator(".card[data-card='scorer-errors']")
    assert scorer_card.locator(".v").inner_text() == "4"
    assert "exact 2 · judge 4" in scorer_card.inner_text()

    page.select_option("#case-filter", "scorer_error")
    _wait_text(page, "#case-range", f"1{DASH}4 of 4")
    nine = page.locator("table.cases tbody tr[data-case-index='9']")
    assert nine.count() == 2
    first = nine.nth(0)
    assert first.locator("li[data-scorer='exact']").count() == 1
    assert first.locator("li[data-scorer='judge']").count() == 1
    assert "KeyError: judge" in first.inner_text()
    assert first.locator(".task-error").count() == 0
    screenshot(page, "experiment-errors", tmp_path)

    page.select_option("#case-filter", "task_error")
    # The same range as before ("1-4 of 4"): wait for the rows themselves.
    page.wait_for_function(
        "() => document.querySelectorAll('table.cases tbody tr .task-error').length === 4"
        " && !document.querySelector('table.cases li[data-scorer]')"
    )
    texts = page.locator("table.cases tbody tr .task-error").all_inner_texts()
    assert texts == ["ValueError: no answer"] * 4


@browser_test
@needs_chromium
def test_inputs_stay_on_one_line_and_expand_on_click(page: Any) -> None:
    """A long JSON input takes one line in a column wide enough to read, cut with an
    ellipsis; a click opens it indented in place."""
    open_page(page, f"/experiments/{BIG}")
    cell = page.locator("table.cases tbody tr").nth(0).locator("td.payload.input")
    assert cell.bounding_box()["width"] >= 200
    # Cases 0-4 passed: their rows hold one line each (a failed case may list its errors).
    heights = page.eval_on_selector_all(
        "table.cases tbody tr", "rows => rows.slice(0, 10).map((r) => r.offsetHeight)"
    )
    assert max(heights) < 40, heights
    summary = cell.locator("summary")
    assert summary.evaluate("s => s.scrollWidth > s.clientWidth")
    summary.click()
    block = cell.locator("pre.json")
    block.wait_for(state="visible")
    assert '"question": "What is 0 + 0?"' in block.inner_text()
    assert "the first 200 of" in cell.inner_text()


@browser_test
@needs_chromium
def test_the_scorer_trend_calls_out_a_regression(page: Any, tmp_path: Path) -> None:
    """The last run's page shows each scorer's mean over the runs of the same experiment and
    calls out the one whose mean dropped past the threshold, with the cases that dropped; a
    scorer that moved within the threshold is not called out."""
    open_page(page, f"/experiments/{RUNS[2]}")
    page.wait_for_selector("body[data-trend-ready='1']")
    table = page.locator("#trend table.trend-table")
    assert table.locator("thead th.num").count() == 4  # three runs and the change
    accuracy = table.locator("tr[data-trend-score='accuracy']")
    assert "regressed" in (accuracy.get_attribute("class") or "")
    text = accuracy.inner_text()
    for mean in ("1.000", "0.900", "0.700", "-0.200"):
        assert mean in text
    assert "mean dropped 0.200" in text
    assert "4 cases scored lower" in text
    assert "#2" in text and "#5" in text
    length = table.locator("tr[data-trend-score='length']")
    assert "regressed" not in (length.get_attribute("class") or "")
    assert "none" in length.inner_text()
    assert accuracy.locator("svg.sparkline polyline").count() == 1
    screenshot(page, "experiment-trend", tmp_path)


@browser_test
@needs_chromium
def test_attribute_keys_wrap_between_words_and_lag_badges_are_whole(
    browser: Any, base_url: str
) -> None:
    """In a narrow window, an attribute key wraps only at its dots and underscores (never
    "looptrace.case.repetitio / n"), and a long span name gives way to its lag badge, which
    stays inside the name column."""
    context = browser.new_context(viewport={"width": 900, "height": 800}, base_url=base_url)
    try:
        page = context.new_page()
        open_page(page, f"/traces/{LAYOUT_TRACE:032x}#span={2:016x}")
        page.wait_for_selector("#span-panel table.attributes")
        broken = page.evaluate(
            """() => {
              const out = [];
              for (const td of document.querySelectorAll('#span-panel td.key')) {
                for (const node of td.childNodes) {
                  if (node.nodeType !== Node.TEXT_NODE) continue;
                  const range = document.createRange();
                  range.selectNodeContents(node);
                  const lines = new Set([...range.getClientRects()].map((r) => Math.round(r.top)));
                  if (lines.size > 1) out.push(node.textContent);
                }
              }
              return out;
            }"""
        )
        assert broken == []
        # The long key did wrap (so the check above had something to check).
        lines = page.locator("#span-panel td.key", has_text="parts_that").evaluate(
            """td => {
              const range = document.createRange();
              range.selectNodeContents(td);
              return new Set([...range.getClientRects()].map((r) => Math.round(r.top))).size;
            }"""
        )
        assert lines > 1
        key = page.locator("#span-panel td.key", has_text="repetition")
        assert key.inner_text().replace("\n", "") == sc.CASE_REPETITION

        label = page.locator(f".wf-row[data-span-id='{2:016x}'] .label")
        badge = label.locator(".lag-mark")
        assert "lag 123.4 ms" in badge.inner_text()
        box, badge_box = label.bounding_box(), badge.bounding_box()
        assert badge_box["x"] + badge_box["width"] <= box["x"] + box["width"] + 0.5
        assert badge.evaluate("b => b.scrollWidth <= b.clientWidth + 1")
        assert label.locator(".name").evaluate("n => n.scrollWidth > n.clientWidth")
    finally:
        context.close()
