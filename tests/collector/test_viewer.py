"""The web viewer (``looptrace serve``): pages driven in a real headless chromium against a real
collector whose store was filled by ``looptrace demo``.

Browser tests need Debian's chromium at /usr/bin/chromium (``apt-get install chromium``); they
are skipped with a reason when it is absent. Screenshots go to docs/img/ only with
LOOPTRACE_SAVE_SCREENSHOTS=1 (that is how the committed images are made), else to tmp_path.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from collector_support import running_collector
from looptrace import _semconv as sc
from looptrace._store import Store
from looptrace._wire import DecodedSpan
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

XSS_NAME = "<script>window.__xss=1</script>"
XSS_ATTR = '<img src=x onerror="window.__xss=2"><b>bold</b>'
BIG_OUTPUT_CHARS = 5000


# --------------------------------------------------------------------------------------------
# a store filled by the demo, plus a few hand-made traces for what the demo does not show


def _span(
    trace: int, span: int, parent: int | None, name: str, start: int, end: int, **kw: Any
) -> DecodedSpan:
    return decoded_span(
        trace,
        span,
        parent,
        name,
        start,
        end,
        attributes=kw.get("attributes", {}),
        events=kw.get("events", []),
        status=kw.get("status_code", 0),
        resource={"service.name": "viewer-test"},
        scope=("test", "0"),
    )


# Far older than the demo's traces, so they sit at the end of the list, off the screenshots.
_OLD = time.time_ns() - 3600 * 10**9
XSS_TRACE = f"{0xA1:032x}"
OPEN_TRACE = f"{0xA2:032x}"
LLM_TRACE = f"{0xA3:032x}"
TOKENS_EXPERIMENT = f"{0xE7:032x}"
LLM_ATTRIBUTES = {
    "gen_ai.provider.name": "openai",
    "gen_ai.operation.name": "chat",
    "gen_ai.request.model": "gpt-4o",
    "gen_ai.response.model": "gpt-4o-2024",
    "gen_ai.usage.input_tokens": 12,
    "gen_ai.usage.output_tokens": 7,
    "gen_ai.response.finish_reasons": ["tool_calls"],
    "gen_ai.response.time_to_first_chunk": 0.0425,
    "gen_ai.system_instructions": '[{"type": "text", "content": "Be terse."}]',
    "gen_ai.input.messages": '[{"role": "user", "parts": [{"type": "text", "content": '
    '"Weather in Paris?"}]}]',
    "gen_ai.output.messages": '[{"role": "assistant", "parts": [{"type": "tool_call", "id": '
    '"call_1", "name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}], '
    '"finish_reason": "tool_calls"}]',
}


def _token_experiment() -> list[DecodedSpan]:
    """An experiment whose cases made LLM calls: token totals on each case span."""
    ms = 10**6
    common = {sc.EXPERIMENT_ID: TOKENS_EXPERIMENT, sc.EXPERIMENT_NAME: "llm-tokens"}
    out = [_span(0xE7, 1, None, "llm-tokens", _OLD - 10 * ms, _OLD, attributes=common)]
    for i in range(2):
        attrs = {
            **common,
            sc.CASE_INDEX: i,
            sc.CASE_REPETITION: 0,
            sc.CASE_INPUT_TOKENS: 10 * (i + 1),
            sc.CASE_OUTPUT_TOKENS: i + 1,
        }
        if i == 0:
            # One case priced, the other not (an unknown model): the sum is of what is known.
            attrs[sc.CASE_COST_USD] = 0.015
        start = _OLD - 9 * ms + i * ms
        out.append(_span(0xE70 + i, 1, None, f"case {i}", start, start + ms, attributes=attrs))
    return out


def _extra_spans() -> list[DecodedSpan]:
    ms = 10**6
    return [
        *_token_experiment(),
        _span(0xA3, 1, None, "agent", _OLD + 40 * ms, _OLD + 50 * ms),
        _span(0xA3, 2, 1, "chat gpt-4o", _OLD + 41 * ms, _OLD + 49 * ms, attributes=LLM_ATTRIBUTES),
        _span(0xA1, 1, None, XSS_NAME, _OLD, _OLD + 5 * ms, attributes={"note": XSS_ATTR}),
        _span(
            0xA1,
            2,
            1,
            "child",
            _OLD + ms,
            _OLD + 2 * ms,
            attributes={sc.INPUT_VALUE: '{"html": "<script>window.__xss=3</script>"}'},
        ),
        _span(0xA2, 1, None, "long job", _OLD + 10 * ms, 0, attributes={sc.IN_PROGRESS: True}),
        _span(
            0xA2,
            2,
            1,
            "big step",
            _OLD + 11 * ms,
            _OLD + 30 * ms,
            attributes={sc.OUTPUT_VALUE: '"' + "x" * BIG_OUTPUT_CHARS + '"'},
        ),
    ]


# Two conversations of a support bot, as `looptrace.attributes(session_id=..., user_id=...,
# tags=..., metadata=...)` writes them on every span; each turn's LLM call has tokens and a cost,
# but for one whose model has no known price; a thumbs-up arrives five minutes after a turn.
SESSION_A = "chat-7f3a"
SESSION_B = "chat-91bc"
SCORED_TRACE = f"{0x5A2:032x}"
SCORED_SPAN = f"{1:016x}"
_TURNS = [
    # (trace, session, user, plan, question, answer, model, tokens in, out, cost or None)
    (
        0x5A1,
        SESSION_A,
        "ada@example.com",
        "pro",
        "My order #1182 has not arrived.",
        "Sorry about that: order #1182 left our warehouse on Monday; it should arrive tomorrow.",
        "gpt-4o-mini",
        412,
        38,
        0.000084,
    ),
    (
        0x5A2,
        SESSION_A,
        "ada@example.com",
        "pro",
        "Can I change the delivery address?",
        "Yes: until it ships from the local depot. I have updated it to 12 Rue Cler.",
        "gpt-4o-mini",
        486,
        41,
        0.000096,
    ),
    (
        0x5A3,
        SESSION_A,
        "ada@example.com",
        "pro",
        "Thanks! And the invoice?",
        "Sent to ada@example.com a minute ago.",
        "gpt-4o",
        530,
        22,
        0.00154,
    ),
    (
        0x5B1,
        SESSION_B,
        "grace",
        "free",
        "How do I reset my password?",
        "Use 'Forgot password' on the sign-in page; the link is valid for one hour.",
        "gpt-4o-mini",
        301,
        29,
        0.000062,
    ),
    (
        0x5B2,
        SESSION_B,
        "grace",
        "free",
        "The link expired.",
        "I have sent a new one; it is valid until 14:30.",
        "in-house-llm",
        355,
        18,
        None,
    ),
]


def _session_spans() -> list[DecodedSpan]:
    out = []
    ms = 10**6
    for k, (trace, session, user, plan, question, answer, model, t_in, t_out, cost) in enumerate(
        _TURNS
    ):
        start = _OLD + 200 * ms + k * 40_000 * ms
        context = {
            sc.SESSION_ID: session,
            sc.USER_ID: user,
            sc.TAG_TAGS: ["support", "beta"] if session == SESSION_A else ["support"],
            sc.METADATA: f'{{"plan": "{plan}", "turn": {k}}}',
        }
        llm = {
            **context,
            sc.GEN_AI_OPERATION_NAME: "chat",
            sc.GEN_AI_PROVIDER_NAME: "openai",
            sc.GEN_AI_REQUEST_MODEL: model,
            sc.GEN_AI_USAGE_INPUT_TOKENS: t_in,
            sc.GEN_AI_USAGE_OUTPUT_TOKENS: t_out,
        }
        if cost is not None:
            llm |= {
                sc.LLM_COST_PROMPT: cost * 0.8,
                sc.LLM_COST_COMPLETION: cost * 0.2,
                sc.LLM_COST_TOTAL: cost,
            }
        root = {
            **context,
            sc.INPUT_VALUE: f'{{"message": "{question}"}}',
            sc.OUTPUT_VALUE: f'"{answer}"',
        }
        resource = {"service.name": "support-bot"}
        out += [
            decoded_span(
                trace,
                1,
                None,
                "answer",
                start,
                start + 1400 * ms,
                attributes=root,
                resource=resource,
            ),
            decoded_span(
                trace,
                2,
                1,
                f"chat {model}",
                start + 100 * ms,
                start + 1300 * ms,
                attributes=llm,
                resource=resource,
            ),
        ]
    # Feedback after the fact: a score span parented to the second turn's root.
    later = _OLD + 200 * ms + 40_000 * ms + 300_000 * ms
    score = {
        sc.SESSION_ID: SESSION_A,
        sc.SPAN_TYPE: sc.SPAN_TYPE_SCORE,
        sc.OPENINFERENCE_SPAN_KIND: "EVALUATOR",
        sc.GEN_AI_EVALUATION_NAME: "helpful",
        sc.GEN_AI_EVALUATION_SCORE_VALUE: 1.0,
        sc.GEN_AI_EVALUATION_SCORE_LABEL: "thumbs up",
        sc.GEN_AI_EVALUATION_EXPLANATION: "fixed my address",
    }
    out.append(
        decoded_span(
            0x5A2,
            9,
            1,
            "gen_ai.evaluation.result",
            later,
            later,
            attributes=score,
            resource={"service.name": "support-bot"},
        )
    )
    return out


BIG_TRACE = f"{0xA9:032x}"
BIG_BATCHES = 100
BIG_ITEMS = 99  # per batch: 1 + 100 + 9,900 = 10,001 spans


def _big_trace() -> list[DecodedSpan]:
    """A fan-out of 10,001 spans: a root, 100 batches, 99 items each; one item carries a
    needle for the search test."""
    start = _OLD - 600 * 10**9
    spans = [_span(0xA9, 1, None, "fan-out", start, start + 10**9)]
    for b in range(BIG_BATCHES):
        batch_id = 2 + b
        b0 = start + b * 10**7
        spans.append(_span(0xA9, batch_id, 1, f"batch {b}", b0, b0 + 9 * 10**6))
        for i in range(BIG_ITEMS):
            attrs = {"needle": "golden-haystack"} if (b, i) == (57, 42) else {}
            item_id = 1000 + b * 1000 + i
            t = b0 + i * 90_000
            spans.append(
                _span(0xA9, item_id, batch_id, f"item {b}.{i}", t, t + 80_000, attributes=attrs)
            )
    return spans


def _run_demo(store: Path, cases: int) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPTRACE_")}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "looptrace.cli",
            "--store",
            str(store),
            "demo",
            "--cases",
            str(cases),
        ],
        check=True,
        env=env,
        capture_output=True,
        timeout=60,
    )


@pytest.fixture(scope="module")
def store_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store filled by two runs of `looptrace demo` plus the hand-made traces above."""
    path = tmp_path_factory.mktemp("viewer") / "traces.db"
    # Two runs of the demo: two experiments to compare.
    _run_demo(path, 6)
    _run_demo(path, 8)
    with Store(path) as store:
        store.write(_extra_spans())
        store.write(_big_trace())
        store.write(_session_spans())
    return path


@pytest.fixture(scope="module")
def store(store_path: Path) -> Iterator[Store]:
    """The same store, read directly: what the pages must agree with."""
    with Store(store_path) as s:
        yield s


@pytest.fixture(scope="module")
def base_url(store_path: Path) -> Iterator[str]:
    """The collector app with the viewer's routes, on uvicorn at an ephemeral port."""
    with running_collector(store_path, extra_routes=viewer.routes()) as url:
        yield url


def _rows(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The spans a waterfall draws as rows: all but the scores, which show on their span."""
    return [s for s in spans if s["attributes"].get(sc.SPAN_TYPE) != sc.SPAN_TYPE_SCORE]


def _demo_case(store: Store, *, error: bool, experiment_index: int = 0) -> dict[str, Any]:
    experiment = store.list_experiments()[experiment_index]
    full = store.get_experiment(experiment["id"])
    assert full is not None
    return next(c for c in full["cases"] if (c["status"] == "error") == error)


# --------------------------------------------------------------------------------------------
# pages in the browser


@browser_test
@needs_chromium
def test_trace_list_shows_the_stores_newest_traces(page: Any, store: Store, tmp_path: Path) -> None:
    """The list page shows the newest traces in the store, newest first, with their span
    counts, and links each to its own page."""
    open_page(page, "/")
    expected = store.list_traces(limit=50)
    rows = page.locator("table.traces tbody tr")
    assert rows.count() == len(expected)
    assert [r.get_attribute("data-trace-id") for r in rows.all()] == [
        t["trace_id"] for t in expected
    ]
    first = rows.nth(0)
    assert first.locator("td").nth(0).inner_text() == expected[0]["name"]
    assert first.locator("td").nth(4).inner_text() == str(expected[0]["span_count"])
    assert first.locator("a").first.get_attribute("href") == f"/traces/{expected[0]['trace_id']}"
    assert "capitals-demo" in page.locator("table.traces").inner_text()
    screenshot(page, "traces", tmp_path)


@browser_test
@needs_chromium
def test_trace_list_filters_and_pages(page: Any, store: Store) -> None:
    """The filter form narrows the list by status and name through the address bar, and the
    pager moves by whole pages."""
    open_page(page, "/")
    page.select_option("select[name=status]", "error")
    page.click("form.filters button[type=submit]")
    page.wait_for_url(re.compile(r"status=error"))
    page.wait_for_selector("body[data-ready='1']")
    errors = store.list_traces(limit=50, status="error")
    assert errors, "the demo has a failing case"
    ids = [r.get_attribute("data-trace-id") for r in page.locator("table.traces tbody tr").all()]
    assert ids == [t["trace_id"] for t in errors]

    open_page(page, "/?name=case%201")
    named = store.list_traces(limit=50, name="case 1")
    assert page.locator("table.traces tbody tr").count() == len(named) > 0

    total = len(store.list_traces(limit=1000))
    open_page(page, "/?offset=2")
    assert page.locator("table.traces tbody tr").count() == min(50, total - 2)
    assert page.locator(".pager").inner_text().startswith("← newer")


@browser_test
@needs_chromium
def test_clicking_a_trace_opens_its_waterfall_and_a_span_shows_inputs_and_outputs(
    page: Any, store: Store, tmp_path: Path
) -> None:
    """From the list, a trace opens as a waterfall with one row per span, nested under its
    parent; clicking a span shows its input and output as pretty-printed JSON."""
    case = _demo_case(store, error=False)
    open_page(page, "/")
    page.click(f"tr[data-trace-id='{case['trace_id']}'] a")
    page.wait_for_url(f"**/traces/{case['trace_id']}")
    page.wait_for_selector("body[data-ready='1']")
    spans = _rows(store.get_trace(case["trace_id"]))
    assert page.locator(".wf-row").count() == len(spans)
    root = page.locator(".wf-row").nth(0)
    child = page.locator(".wf-row", has_text="generate")
    root_pad = root.locator(".label").evaluate("e => parseFloat(e.style.paddingLeft)")
    child_pad = child.locator(".label").evaluate("e => parseFloat(e.style.paddingLeft)")
    assert child_pad > root_pad

    child.click()
    page.wait_for_url(re.compile(r"#span="))
    generate = next(s for s in spans if s["name"] == "generate")
    panel = page.locator("#span-panel")
    panel.locator("h2", has_text="generate").wait_for()
    blocks = panel.locator("pre.json")
    assert "What is the capital of" in blocks.nth(0).inner_text()
    # Pretty-printed: the stored compact JSON comes back indented.
    assert "\n  " in blocks.nth(0).inner_text()
    assert blocks.nth(1).inner_text().strip('"') == generate["attributes"][sc.OUTPUT_VALUE].strip(
        '"'
    )
    assert page.locator(".wf-row.selected").get_attribute("data-span-id") == generate["span_id"]
    screenshot(page, "trace", tmp_path)


@browser_test
@needs_chromium
def test_a_failing_case_shows_red_spans_and_its_exception(page: Any, store: Store) -> None:
    """Spans with error status are drawn red, and the panel shows the exception's type and
    message."""
    case = _demo_case(store, error=True)
    spans = store.get_trace(case["trace_id"])
    failed = [s for s in spans if s["status_code"] == 2]
    open_page(page, f"/traces/{case['trace_id']}")
    assert page.locator(".wf-row.error").count() == len(failed) > 0
    color = page.locator(".wf-row.error .bar").first.evaluate(
        "e => getComputedStyle(e).backgroundColor"
    )
    assert color == "rgb(214, 59, 59)"
    retrieve = next(s for s in failed if s["name"] == "retrieve")
    page.click(f".wf-row[data-span-id='{retrieve['span_id']}']")
    page.locator("#span-panel .exception").wait_for()
    assert "LookupError" in page.locator("#span-panel .exception").inner_text()


@browser_test
@needs_chromium
def test_a_trace_past_the_read_cap_says_it_was_cut(
    browser: Any, store_path: Path, store: Store
) -> None:
    """A trace with more spans than the collector returns per read shows the spans it got,
    and says how many of how many."""
    trace = max(store.list_traces(limit=1000), key=lambda t: t["span_count"])
    assert trace["span_count"] > 3

    with running_collector(store_path, extra_routes=viewer.routes(), max_trace_spans=3) as url:
        context = browser.new_context(base_url=url)
        try:
            tab = context.new_page()
            open_page(tab, f"/traces/{trace['trace_id']}")
            assert tab.locator(".wf-row").count() == 3
            banner = tab.locator("#truncated").inner_text()
            assert f"first 3 of {trace['span_count']:,} spans" in banner
        finally:
            context.close()


@browser_test
@needs_chromium
def test_an_llm_span_shows_model_tokens_and_the_conversation(page: Any) -> None:
    """A span with GenAI attributes shows model, tokens and time to first chunk, then the
    conversation by role (system, user, the assistant's tool call); the message attributes are
    not repeated in the attribute table."""
    open_page(page, f"/traces/{LLM_TRACE}#span={2:016x}")
    panel = page.locator("#span-panel")
    panel.locator(".conversation").wait_for()
    facts = panel.locator("dl.kv").nth(1).inner_text()
    assert "openai gpt-4o-2024" in facts
    assert "12 in · 7 out" in facts
    assert "42.5 ms" in facts
    roles = panel.locator(".conversation .msg")
    assert roles.count() == 3
    assert [roles.nth(i).get_attribute("class") for i in range(3)] == [
        "msg role-system",
        "msg role-user",
        "msg role-assistant",
    ]
    assert "Weather in Paris?" in roles.nth(1).inner_text()
    assert 'get_weather({"city": "Paris"})' in roles.nth(2).inner_text()
    assert "gen_ai.input.messages" not in panel.locator("table.attributes").inner_text()


@browser_test
@needs_chromium
def test_an_experiment_with_llm_calls_shows_its_token_totals(page: Any, store: Store) -> None:
    """An experiment whose cases used LLM tokens shows the totals in a card and each case's
    tokens in a column of its own."""
    full = store.get_experiment(TOKENS_EXPERIMENT)
    assert full is not None
    assert (full["input_tokens"], full["output_tokens"]) == (30, 3)
    open_page(page, f"/experiments/{TOKENS_EXPERIMENT}")
    assert page.locator(".card[data-tokens]").inner_text().endswith("30 in · 3 out")
    assert "Tokens in / out" in page.locator("table.cases thead").inner_text()
    cells = page.locator("table.cases tbody tr")
    assert cells.count() == 2
    assert "10 / 1" in cells.nth(0).inner_text()
    assert "20 / 2" in cells.nth(1).inner_text()


@browser_test
@needs_chromium
def test_spans_that_saw_loop_lag_are_marked(page: Any, store: Store) -> None:
    """A span whose loop lag max is above 10 ms carries a lag marker with the figure, and one
    under it none. The demo blocks its loop for 15 ms; a span's figure leaves out the time the
    process was not scheduled, so on a loaded machine it can come out under 10 ms."""
    lagged = store.lag_summaries(worst=1)["worst_spans"]
    assert lagged, "the demo runs under a lag monitor"
    worst = lagged[0]
    assert worst["lag_max_ms"] > 5, "the demo blocks the loop for 15 ms"
    open_page(page, f"/traces/{worst['trace_id']}#span={worst['span_id']}")
    row = page.locator(f".wf-row[data-span-id='{worst['span_id']}']")
    assert page.locator(".wf-row.selected").get_attribute("data-span-id") == worst["span_id"]
    if worst["lag_max_ms"] > 10:
        assert f"lag {worst['lag_max_ms']:.1f} ms" in row.locator(".lag-mark").inner_text()
        assert "lagged" in (row.locator(".bar").get_attribute("class") or "")
    else:
        assert row.locator(".lag-mark").count() == 0
        assert "lagged" not in (row.locator(".bar").get_attribute("class") or "")


@browser_test
@needs_chromium
def test_in_progress_spans_are_open_ended_and_large_values_collapsed(page: Any) -> None:
    """An in-progress span is drawn to the end of the axis with the open style; an output past
    2 KB starts collapsed and opens on click."""
    open_page(page, f"/traces/{OPEN_TRACE}")
    open_bar = page.locator(f".wf-row[data-span-id='{1:016x}'] .bar")
    assert "open" in (open_bar.get_attribute("class") or "")
    left = open_bar.evaluate("e => parseFloat(e.style.left) + parseFloat(e.style.width)")
    assert left == pytest.approx(100, abs=0.01)
    page.click(f".wf-row[data-span-id='{2:016x}']")
    details = page.locator("#span-panel details", has_text="KB")
    details.wait_for()
    assert details.get_attribute("open") is None
    assert not details.locator("pre").is_visible()
    details.locator("summary").click()
    assert len(details.locator("pre").inner_text()) >= BIG_OUTPUT_CHARS


@browser_test
@needs_chromium
def test_span_data_renders_as_text_never_as_html(page: Any) -> None:
    """A span named <script>..., an attribute holding HTML and an input holding a script tag
    all appear as literal text: nothing runs and no element is created from them."""
    open_page(page, f"/traces/{XSS_TRACE}")
    assert page.locator("h1").inner_text() == XSS_NAME
    assert page.locator(".wf-row .name").first.inner_text() == XSS_NAME
    page.locator("#span-panel td", has_text="<img").wait_for()
    assert page.locator("#span-panel").inner_text().count(XSS_ATTR) == 1
    page.click(f".wf-row[data-span-id='{2:016x}']")
    page.locator("#span-panel pre.json", has_text="window.__xss=3").wait_for()
    assert page.evaluate("window.__xss") is None
    assert page.locator("main img, main b, main script").count() == 0
    open_page(page, "/?offset=0&name=" + "%3Cscript%3E")
    assert page.locator("table.traces tbody td a").first.inner_text() == XSS_NAME
    assert page.evaluate("window.__xss") is None


@browser_test
@needs_chromium
def test_experiment_pages_show_the_demos_scores(page: Any, store: Store, tmp_path: Path) -> None:
    """The experiments table shows each experiment's case count, errors and score means; one
    experiment lists every case by name (a test's name, for an experiment the pytest plugin
    made) with input, output, expected and scores, linked to its trace."""
    experiments = store.list_experiments()
    open_page(page, "/experiments")
    rows = page.locator("table.experiments tbody tr")
    assert [r.get_attribute("data-experiment-id") for r in rows.all()] == [
        e["id"] for e in experiments
    ]
    newest = experiments[0]
    text = rows.nth(0).inner_text()
    assert str(newest["case_count"]) in text
    for score in newest["scores"].values():
        assert f"{score['mean']:.3f}" in text
    screenshot(page, "experiments", tmp_path)

    rows.nth(0).locator("a").click()
    page.wait_for_url(f"**/experiments/{newest['id']}")
    page.wait_for_selector("body[data-ready='1']")
    full = store.get_experiment(newest["id"])
    assert full is not None
    cases = page.locator("table.cases tbody tr")
    assert cases.count() == len(full["cases"])
    for name, agg in full["scores"].items():
        assert f"{agg['mean']:.3f}" in page.locator(f".card[data-score='{name}']").inner_text()
    first = full["cases"][0]
    row = cases.nth(0)
    assert row.locator(".case-name").inner_text() == first["name"]
    assert "What is the capital of" in row.inner_text()
    assert str(first["expected"]).strip('"') in row.inner_text()
    href = row.locator("a", has_text="trace").get_attribute("href")
    assert href == f"/traces/{first['trace_id']}#span={first['span_id']}"
    screenshot(page, "experiment", tmp_path)


@browser_test
@needs_chromium
def test_two_experiments_compare_by_score(page: Any, store: Store, tmp_path: Path) -> None:
    """Ticking two experiments and pressing Compare shows both score means and their
    difference, and the cases side by side."""
    a, b = store.list_experiments()[:2]
    open_page(page, "/experiments")
    page.check(f"input[data-experiment-id='{a['id']}']")
    assert page.locator("#compare").is_disabled()
    page.check(f"input[data-experiment-id='{b['id']}']")
    page.click("#compare")
    page.wait_for_url(re.compile(r"/compare\?a="))
    page.wait_for_selector("body[data-ready='1']")
    for name in a["scores"]:
        row = page.locator(f"table.compare-summary tr[data-score='{name}']").inner_text()
        assert f"{a['scores'][name]['mean']:.3f}" in row
        assert f"{b['scores'][name]['mean']:.3f}" in row
    indexes = {c["case_index"] for e in (a, b) for c in store.get_experiment(e["id"])["cases"]}  # type: ignore[index]
    assert page.locator("table.compare-cases tbody tr").count() == len(indexes)
    screenshot(page, "compare", tmp_path)


@browser_test
@needs_chromium
def test_lag_page_charts_every_summary(page: Any, store: Store, tmp_path: Path) -> None:
    """The lag page draws a p99 point per lag summary in the store and the worst lags, and
    lists the spans that saw the most lag."""
    summaries = store.lag_summaries(limit=500)["summaries"]
    assert summaries, "the demo runs a lag monitor with summaries"
    open_page(page, "/lag")
    assert page.locator("#lag-chart circle.dot-p99").count() == len(summaries)
    # Lines join adjacent windows of one process; how many the demo makes depends on how long
    # its monitor ran, so the worst lag is checked by its points.
    assert page.locator("#lag-chart circle.dot-max").count() >= 1
    assert page.locator("table.worst tbody tr").count() > 0
    screenshot(page, "lag", tmp_path)


# --------------------------------------------------------------------------------------------
# HTTP-level guarantees (no browser needed)


def test_pages_carry_a_strict_content_security_policy(base_url: str) -> None:
    """Every viewer page and static file is sent with a CSP that allows only this origin and
    no inline script, and the shell has no inline script to allow."""
    with httpx.Client(base_url=base_url) as client:
        for path in (
            "/",
            "/traces/abc",
            "/sessions",
            "/sessions/chat%2F1",
            "/experiments",
            "/experiments/x",
            "/compare",
            "/lag",
            "/static/viewer.js",
            "/static/viewer.css",
        ):
            response = client.get(path)
            assert response.status_code == 200, path
            csp = response.headers["content-security-policy"]
            assert "default-src 'self'" in csp
            assert "script-src 'self'" in csp
            assert "unsafe-inline" not in csp
            assert response.headers["x-content-type-options"] == "nosniff"
        html = client.get("/").text
    scripts = re.findall(r"<script\b[^>]*>(.*?)</script>", html, re.S)
    assert scripts
    assert all(body.strip() == "" for body in scripts)
    assert "http://" not in html
    assert "https://" not in html


def test_static_files_use_no_html_sinks_and_no_remote_assets() -> None:
    """The viewer script never hands data to an HTML parser (innerHTML, outerHTML,
    insertAdjacentHTML, document.write) and nothing loads from the internet."""
    for path in viewer.STATIC_DIR.iterdir():
        text = path.read_text()
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
            assert sink not in text, f"{path.name} uses {sink}"
        assert not re.search(r"(src|href)\s*=\s*[\"']?(https?:)?//", text), path.name


def test_looptrace_serve_serves_the_viewer(store_path: Path) -> None:
    """The real `looptrace serve` command serves the viewer shell and its script next to the
    API, on the port it is given."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPTRACE_")}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "looptrace.cli",
            "--store",
            str(store_path),
            "serve",
            "--port",
            str(port),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 15
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
            while True:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                try:
                    response = client.get("/")
                    break
                except httpx.TransportError:
                    assert time.monotonic() < deadline, "looptrace serve did not answer in 15 s"
                    time.sleep(0.05)
            assert response.status_code == 200
            assert '<script src="/static/viewer.js"' in response.text
            assert client.get("/static/viewer.js").status_code == 200
            assert client.get("/api/traces?limit=1").json()["traces"]
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _summary(n: int, start_s: float, end_s: float, instance: str, p99: float) -> DecodedSpan:
    base = 1_795_000_000_000_000_000  # nanoseconds since the epoch: past what a JS number holds
    return decoded_span(
        0x7000 + n,
        1,
        None,
        "looptrace.loop.lag",
        base + int(start_s * 1e9),
        base + int(end_s * 1e9),
        attributes={
            "looptrace.loop.lag.p99_ms": p99,
            "looptrace.loop.lag.max_ms": p99 * 2,
            "looptrace.loop.lag.count": 100,
        },
        resource={"service.name": "svc", "service.instance.id": instance},
    )


@browser_test
@needs_chromium
@pytest.mark.parametrize(
    ("summaries", "lines", "dots"),
    [
        # One summary (the quick start's): one dot, no line, no NaN anywhere.
        ([(0, 10, "a")], 0, 1),
        # One process, two windows back to back, then one two minutes later: the line breaks.
        ([(0, 10, "a"), (10, 20, "a"), (140, 150, "a")], 1, 3),
        # Two processes at once, each two windows: two lines, never one across both.
        ([(0, 10, "a"), (5, 15, "b"), (10, 20, "a"), (15, 25, "b")], 2, 4),
    ],
)
def test_the_lag_chart_is_right_for_one_point_for_gaps_and_for_processes(
    browser: Any,
    tmp_path: Path,
    summaries: list[tuple[float, float, str]],
    lines: int,
    dots: int,
) -> None:
    """The lag chart draws one summary as a dot (nanosecond timestamps no longer make every
    coordinate NaN), breaks the line where summaries stop for a while, and draws each process
    as its own line."""

    path = tmp_path / "lag.db"
    with Store(path) as store:
        store.write([_summary(i, s, e, inst, 1.0 + i) for i, (s, e, inst) in enumerate(summaries)])
    with running_collector(path, extra_routes=viewer.routes()) as url:
        context = browser.new_context(base_url=url)
        try:
            tab = context.new_page()
            open_page(tab, "/lag")
            chart = tab.locator("#lag-chart")
            assert chart.locator("circle.dot-p99").count() == dots
            assert chart.locator("polyline.p99").count() == lines
            markup = chart.inner_html()
            assert "NaN" not in markup and "Infinity" not in markup
            if lines == 2:
                series = {
                    p.get_attribute("data-series") for p in chart.locator("polyline.p99").all()
                }
                assert len(series) == 2
        finally:
            context.close()


@browser_test
@needs_chromium
def test_the_span_panel_rounds_numbers_shows_stacks_as_lines_and_says_ok(
    browser: Any, tmp_path: Path
) -> None:
    """In the span panel a float attribute is rounded (its exact value on hover), a loop
    stall's stack reads as lines rather than one string with literal \\n, and a span whose
    status is unset reads as ok, as the trace list says."""

    path = tmp_path / "panel.db"
    start = 1_795_000_000_000_000_000
    span = decoded_span(
        0x7A,
        1,
        None,
        "handler",
        start,
        start + 50_000_000,
        attributes={"ratio": 0.123456789123},
        events=[
            {
                "name": "looptrace.loop.stall",
                "time_ns": start + 1_000_000,
                "attributes": {
                    "looptrace.loop.stall.duration_ms": 31.25,
                    "looptrace.loop.stall.stack": "app.py:3 in main\napp.py:9 in parse",
                },
            }
        ],
    )
    with Store(path) as store:
        store.write([span])
    with running_collector(path, extra_routes=viewer.routes()) as url:
        context = browser.new_context(base_url=url)
        try:
            tab = context.new_page()
            open_page(tab, f"/traces/{0x7A:032x}#span={1:016x}")
            panel = tab.locator("#span-panel")
            panel.locator("pre.lines").wait_for()
            assert panel.locator("pre.lines").inner_text().splitlines() == [
                "app.py:3 in main",
                "app.py:9 in parse",
            ]
            text = panel.inner_text()
            assert "\\n" not in text
            assert "0.123457" in text and "0.123456789123" not in text
            assert "ok (status unset)" in text
        finally:
            context.close()


@browser_test
@needs_chromium
def test_a_subtree_folds_and_unfolds(page: Any, store: Store) -> None:
    """The fold toggle hides a span's descendants and brings them back."""
    case = _demo_case(store, error=False)
    spans = _rows(store.get_trace(case["trace_id"]))
    open_page(page, f"/traces/{case['trace_id']}")
    rows = page.locator(".wf-row")
    assert rows.count() == len(spans)
    root = rows.nth(0)
    root.locator("button.fold").click()
    assert rows.count() == 1
    assert root.locator("button.fold").get_attribute("aria-expanded") == "false"
    root.locator("button.fold").click()
    assert rows.count() == len(spans)


@browser_test
@needs_chromium
def test_a_10000_span_trace_opens_folded_with_a_minimap_and_search_finds_a_deep_span(
    page: Any, tmp_path: Path
) -> None:
    """A trace of 10,001 spans opens with only the root's children drawn, a minimap of all of
    them, and a search that finds, counts, reveals and selects a span three levels down."""
    open_page(page, f"/traces/{BIG_TRACE}")
    assert page.locator(".wf-row").count() == 1 + BIG_BATCHES
    assert page.locator("#minimap").evaluate("c => c.width") > 100
    page.fill("#trace-search", "golden-haystack")
    page.press("#trace-search", "Enter")
    page.wait_for_selector(".wf-row.selected >> text=item 57.42")
    assert page.locator("#search-count").inner_text() == "1 of 1"
    assert page.locator(".wf-row.match").count() == 1
    # Its batch opened to show it; the other 99 batches stay folded.
    assert page.locator(".wf-row").count() == 1 + BIG_BATCHES + BIG_ITEMS
    page.locator("#span-panel h2", has_text="item 57.42").wait_for()
    screenshot(page, "trace-large", tmp_path)

    # The keyboard: from the root, down to batch 0, open it, into its first item, back up to
    # the batch, and fold it again.
    page.locator(".wf-row[data-index='0']").click()
    page.wait_for_selector(".wf-row.selected[data-index='0']")
    page.locator("#wf-rows").focus()
    shown = page.locator(".wf-row").count()
    page.keyboard.press("ArrowDown")
    page.wait_for_selector(".wf-row.selected >> text=batch 0")
    page.keyboard.press("ArrowRight")
    page.wait_for_function(f"document.querySelectorAll('.wf-row').length === {shown + BIG_ITEMS}")
    page.keyboard.press("ArrowRight")
    page.wait_for_selector(".wf-row.selected >> text=item 0.0")
    page.keyboard.press("ArrowLeft")
    page.wait_for_selector(".wf-row.selected >> text=batch 0")
    page.keyboard.press("ArrowLeft")
    page.wait_for_function(f"document.querySelectorAll('.wf-row').length === {shown}")
    # Drawing 10,001 rows holds the page's thread inside the click: on a loaded machine that
    # takes longer than the default 5 s.
    page.click("#unfold-all", timeout=30_000)
    page.wait_for_function("document.querySelectorAll('.wf-row').length === 10001", timeout=30_000)
    page.fill("#trace-search", "no such thing")
    page.press("#trace-search", "Enter")
    assert page.locator("#search-count").inner_text() == "no match"
    assert page.locator(".wf-row.match").count() == 0


@browser_test
@needs_chromium
def test_the_trace_list_filters_by_service_duration_and_time(page: Any, store: Store) -> None:
    """Service, minimum duration and time range narrow the list (the filters go in the
    address, so the filtered list can be shared); the list agrees with the store."""
    open_page(page, "/")
    page.select_option("select[name=service]", "viewer-test")
    page.click("form.filters button[type=submit]")
    page.wait_for_url(re.compile(r"service=viewer-test"))
    page.wait_for_selector("body[data-ready='1']")
    ids = set(
        page.locator("tr[data-trace-id]").evaluate_all("rs => rs.map(r => r.dataset.traceId)")
    )
    assert ids == {t["trace_id"] for t in store.list_traces(service="viewer-test")}
    assert {XSS_TRACE, OPEN_TRACE, BIG_TRACE} <= ids
    assert all(t["service_name"] == "viewer-test" for t in store.list_traces(service="viewer-test"))

    open_page(page, "/?service=viewer-test&min_duration_ms=100")
    ids = set(
        page.locator("tr[data-trace-id]").evaluate_all("rs => rs.map(r => r.dataset.traceId)")
    )
    # A second long; the hand-made others last milliseconds or are still running.
    assert ids == {BIG_TRACE}

    open_page(page, "/?range=900")
    listed = page.locator("tr[data-trace-id]").count()
    recent = store.list_traces(limit=51, since_ns=time.time_ns() - 900 * 10**9)
    assert listed == min(len(recent), 50) > 0
    assert page.locator(f"tr[data-trace-id='{BIG_TRACE}']").count() == 0


@browser_test
@needs_chromium
def test_the_lag_page_leads_with_what_blocked_the_loop(page: Any, store: Store) -> None:
    """The demo blocks its loop in `generate` (a time.sleep in async code): the lag page opens
    with that line as the culprit, the span it blocked in, and the spans that waited on it,
    before the chart and the list of lagged spans."""
    culprits = store.lag_summaries()["culprits"]
    # On a loaded machine another step can stall longer than the demo's own: find its row.
    culprit = next(c for c in culprits if c["function"] == "generate")
    assert culprit["filepath"].endswith("_demo.py")
    open_page(page, "/lag")
    first = page.locator("h2").first.inner_text()
    assert first == "What blocked the loop"
    row = (
        page.locator("#culprits tr.culprit").filter(has_text=f"_demo.py:{culprit['lineno']}").first
    )
    text = row.inner_text()
    assert "generate" in text and f"_demo.py:{culprit['lineno']}" in text
    assert f"{culprit['max_ms']:.1f} ms" in text
    assert row.locator("td").nth(4).locator("a").count() == len(culprit["in_spans"])
    if culprit["waiting"]:
        assert row.locator("td").nth(5).locator("a").count() == len(culprit["waiting_spans"])
    row.locator("summary", has_text="stack").click()
    assert "generate" in row.locator("pre.stack").inner_text()


@browser_test
@needs_chromium
def test_a_bytes_output_says_it_is_base64(browser: Any, tmp_path: Path) -> None:
    """A traced function that returned bytes: the panel says the output is bytes shown as
    base64, and how many; a text output gets no such note."""
    import looptrace
    from looptrace.testing import capture_spans

    @looptrace.traced(name="thumbnail")
    def thumbnail(name: str) -> bytes:
        return bytes(range(256)) + b"\x00" * 44  # 300 bytes of image

    path = tmp_path / "bytes.db"
    with capture_spans() as captured:
        thumbnail("cat.png")
    span = captured.by_name("thumbnail")
    from looptrace import _otlp
    from looptrace._config import Config
    from looptrace._serialize import to_wire
    from looptrace.collector.decode import decode_request

    cfg = Config()
    body = _otlp.encode_request(
        [_otlp.encode_span(to_wire(span, cfg), "protobuf")], _otlp.default_resource(cfg), "protobuf"
    )
    with Store(path) as store:
        store.write(decode_request(body, _otlp.PROTOBUF_CONTENT_TYPE, None))
    with running_collector(path, extra_routes=viewer.routes()) as url:
        context = browser.new_context(base_url=url)
        try:
            tab = context.new_page()
            open_page(tab, f"/traces/{span.trace_id:032x}#span={span.span_id:016x}")
            hint = tab.locator("#span-panel .bytes-hint")
            hint.wait_for()
            assert hint.count() == 1  # the output; the input is a dict of text
            assert hint.inner_text() == "bytes, shown as base64: 300 bytes"
        finally:
            context.close()


# --------------------------------------------------------------------------------------------
# sessions, the filters by user, tag and metadata, cost, and scores attached after the fact


def _ids(page: Any, selector: str, attribute: str) -> list[str]:
    return [r.get_attribute(attribute) for r in page.locator(selector).all()]


@browser_test
@needs_chromium
def test_sessions_list_their_traces_users_tokens_and_cost(
    page: Any, store: Store, tmp_path: Path
) -> None:
    """/sessions lists each session (most recently active first) with its trace count, users,
    tokens and cost; a cost left out for an unknown model is marked with a "+" and said on
    hover. A session opens on its traces in conversation order, with each turn's input,
    output, tokens and cost."""
    expected = [s["session_id"] for s in store.list_sessions()]
    # The demo's sessions, if it makes any, are newer than the support bot's two.
    assert expected[-2:] == [SESSION_B, SESSION_A]
    open_page(page, "/sessions")
    assert page.locator("[data-nav='sessions']").get_attribute("class") == "active"
    assert _ids(page, "table.sessions tbody tr", "data-session-id") == expected
    a = page.locator(f"tr[data-session-id='{SESSION_A}'] td")
    assert a.nth(1).inner_text() == "3"
    assert a.nth(2).inner_text() == "ada@example.com"
    assert a.nth(5).inner_text() == "1428 / 101"
    assert a.nth(6).inner_text() == "$0.0017"
    assert "My order #1182" in a.nth(9).inner_text()
    b = page.locator(f"tr[data-session-id='{SESSION_B}'] td.cost")
    assert b.inner_text() == "$0.000062+"
    assert "1 LLM call of unknown price" in (b.get_attribute("title") or "")
    screenshot(page, "sessions", tmp_path)

    page.click(f"tr[data-session-id='{SESSION_A}'] a")
    page.wait_for_url(f"**/sessions/{SESSION_A}")
    page.wait_for_selector("body[data-ready='1']")
    session = store.get_session(SESSION_A)
    assert session is not None
    turns = [t["trace_id"] for t in session["traces"]]
    assert turns == [f"{t:032x}" for t in (0x5A1, 0x5A2, 0x5A3)]
    assert _ids(page, "table.session-traces tbody tr", "data-trace-id") == turns
    first = page.locator("table.session-traces tbody tr").nth(0).inner_text()
    assert "My order #1182 has not arrived." in first
    assert "left our warehouse on Monday" in first
    assert "412 / 38" in first
    assert "$0.000084" in first
    assert page.locator(".card[data-cost] .v").inner_text() == "$0.0017"
    assert page.locator(".card[data-tokens] .v").inner_text() == "1428 in · 101 out"
    assert "1 score" in page.locator("table.session-traces tbody tr").nth(1).inner_text()
    screenshot(page, "session", tmp_path)


@browser_test
@needs_chromium
def test_the_trace_list_filters_by_user_session_tag_and_metadata(page: Any, store: Store) -> None:
    """User, session, tag and metadata (key=value) narrow the list through the address, each
    filter combinable with the others and a tag or metadata filter repeatable; the list agrees
    with the store."""
    open_page(page, "/")
    page.fill("form.filters input[name=user]", "grace")
    page.click("form.filters button[type=submit]")
    page.wait_for_url(re.compile(r"user=grace"))
    page.wait_for_selector("body[data-ready='1']")
    grace = [t["trace_id"] for t in store.list_traces(user="grace")]
    assert grace == [f"{0x5B2:032x}", f"{0x5B1:032x}"]
    assert _ids(page, "table.traces tbody tr", "data-trace-id") == grace
    assert page.locator("form.filters input[name=user]").input_value() == "grace"

    open_page(page, f"/?session={SESSION_A}")
    session_a = [f"{t:032x}" for t in (0x5A3, 0x5A2, 0x5A1)]
    assert _ids(page, "table.traces tbody tr", "data-trace-id") == session_a
    row = page.locator(f"tr[data-trace-id='{SCORED_TRACE}']")
    assert row.locator("td.scores").inner_text() == "1"
    assert row.locator("td.cost").inner_text() == "$0.000096"
    assert row.locator("td.tokens").inner_text() == "486 / 41"
    assert row.locator("td.session a").get_attribute("href") == f"/sessions/{SESSION_A}"

    open_page(page, "/?tag=support&tag=beta")
    assert _ids(page, "table.traces tbody tr", "data-trace-id") == session_a
    assert page.locator("form.filters input[name=tag]").count() == 3  # two, and one to add

    open_page(page, "/")
    page.fill("form.filters input[name=meta]", "plan=free")
    page.click("form.filters button[type=submit]")
    page.wait_for_url(re.compile(r"meta=plan%3Dfree"))
    page.wait_for_selector("body[data-ready='1']")
    assert _ids(page, "table.traces tbody tr", "data-trace-id") == grace
    open_page(page, "/?meta=turn%3D0&tag=support")
    assert _ids(page, "table.traces tbody tr", "data-trace-id") == [f"{0x5A1:032x}"]
    open_page(page, "/?user=grace&tag=beta")
    assert page.locator("table.traces").count() == 0
    assert "No more traces" not in page.locator("main").inner_text()


@browser_test
@needs_chromium
def test_a_score_attached_later_shows_on_its_span_not_as_a_row(page: Any, store: Store) -> None:
    """A score span (looptrace.span.type "score") parented to a span is a badge on that span's
    row and a row of the span's Scores table (name, value, label, comment); it is not a row of
    the waterfall and does not stretch the trace's time axis; a link to the score's own span
    selects the span it scores."""
    trace = store.get_trace_summary(SCORED_TRACE)
    assert trace is not None
    assert trace["score_count"] == 1 and trace["span_count"] == 2
    assert trace["duration_ns"] == 1400 * 10**6  # not stretched to the score, 5 minutes later
    open_page(page, f"/traces/{SCORED_TRACE}#span={9:016x}")
    assert page.locator(".wf-row").count() == 2
    root = page.locator(f".wf-row[data-span-id='{SCORED_SPAN}']")
    badge = root.locator(".score-badge")
    assert badge.inner_text() == "helpful: 1 (thumbs up)"
    assert badge.get_attribute("title") == "fixed my address"
    assert page.locator(".wf-row.selected").get_attribute("data-span-id") == SCORED_SPAN
    row = page.locator("#span-panel table.scores tr[data-score-name='helpful']")
    row.wait_for()
    cells = row.locator("td")
    assert [cells.nth(i).inner_text() for i in range(3)] == ["helpful", "1", "thumbs up"]
    assert "fixed my address" in cells.nth(3).inner_text()
    bar = root.locator(".bar").evaluate("e => parseFloat(e.style.width)")
    assert bar == pytest.approx(100, abs=0.01)  # the axis ends with the trace, not the score


@browser_test
@needs_chromium
def test_cost_shows_beside_tokens_on_a_trace_its_llm_span_and_an_experiment(
    page: Any, store: Store
) -> None:
    """A trace's head shows its tokens and cost; its LLM span shows the cost with the prompt
    and completion parts; an experiment sums the cost of the cases that have one (a card
    saying how many were priced) and an unpriced case's cost stays blank, never $0."""
    open_page(page, f"/traces/{0x5A3:032x}#span={2:016x}")
    assert page.locator("#trace-tokens").inner_text() == "530 in · 22 out tokens"
    assert page.locator("#trace-cost").inner_text() == "$0.0015"
    facts = page.locator("#span-panel dl.kv").nth(1)
    facts.wait_for()
    assert "$0.0015 (prompt $0.0012 · completion $0.00031)" in facts.inner_text()

    open_page(page, f"/traces/{0x5B2:032x}")
    assert page.locator("#trace-cost").count() == 0  # unknown model: no cost, not $0
    assert page.locator("#trace-tokens").inner_text() == "355 in · 18 out tokens"

    full = store.get_experiment(TOKENS_EXPERIMENT)
    assert full is not None
    assert (full["cost_usd"], full["costed_cases"]) == (0.015, 1)
    open_page(page, f"/experiments/{TOKENS_EXPERIMENT}")
    card = page.locator(".card[data-cost]")
    assert card.locator(".v").inner_text() == "$0.0150"
    assert "1 of 2 cases priced" in card.inner_text()
    costs = page.locator("table.cases tbody td.cost")
    assert [costs.nth(i).inner_text() for i in range(2)] == ["$0.0150", ""]
    open_page(page, "/experiments")
    row = page.locator(f"tr[data-experiment-id='{TOKENS_EXPERIMENT}'] td.cost")
    assert row.inner_text() == "$0.0150"
