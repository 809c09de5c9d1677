"""Search and housekeeping in the viewer: the trace list's search box (text and ``key=value``
attributes, in the address, combined with the other filters), ``/api/traces?q=&attr=``, and
deleting a trace or an experiment, behind the collector's token.

Browser tests drive Debian's headless chromium (skipped with a reason when it is absent)
against a collector with a token; every wait is on a condition in the page, generously bounded.
"""

from __future__ import annotations

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
    TIMEOUT_MS,
    browser_test,
    needs_chromium,
    new_tab,
    open_page,
)

uvicorn = pytest.importorskip("uvicorn")
pytest.importorskip("starlette")

from looptrace.collector import viewer  # noqa: E402

TOKEN = "search-test-token"
NOW = time.time_ns()


SEARCH_TRACE = f"{0x5EA1:032x}"
ITEMS_TRACE = f"{0x5EA2:032x}"
PAYMENT_TRACE = f"{0x5EA3:032x}"
DOOMED_TRACE = f"{0x5EA4:032x}"
EXPERIMENT = f"{0xE5EA:032x}"


def _span(trace: int, name: str, start: int, service: str, **kw: Any) -> DecodedSpan:
    return decoded_span(
        trace,
        1,
        None,
        name,
        NOW - start * 10**6,
        NOW - start * 10**6 + 10**6,
        attributes=kw.get("attributes", {}),
        events=kw.get("events", []),
        status=kw.get("status", 0),
        message=kw.get("message", ""),
        resource={"service.name": service},
    )


def _spans() -> list[DecodedSpan]:
    exp = {sc.EXPERIMENT_ID: EXPERIMENT, sc.EXPERIMENT_NAME: "doomed-experiment"}
    return [
        _span(0x5EA1, "GET /search", 1, "api", attributes={"http.route": "/search"}),
        _span(0x5EA2, "GET /items", 2, "api", attributes={"http.route": "/items"}),
        _span(
            0x5EA3,
            "charge",
            3,
            "billing",
            status=2,
            message="card declined by issuer",
            attributes={"http.route": "/search"},
        ),
        _span(0x5EA4, "doomed", 4, "api"),
        _span(0xE5EA, "case 0", 5, "api", attributes={**exp, sc.CASE_INDEX: 0}),
        _span(0xE5EB, "case 1", 6, "api", attributes={**exp, sc.CASE_INDEX: 1}),
    ]


@pytest.fixture(scope="module")
def store_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("search") / "traces.db"
    with Store(path) as store:
        store.write(_spans())
    return path


@pytest.fixture(scope="module")
def base_url(store_path: Path) -> Iterator[str]:
    """The collector with the viewer and a token, on uvicorn at an ephemeral port."""
    with running_collector(store_path, token=TOKEN, extra_routes=viewer.routes()) as url:
        yield url


@pytest.fixture
def page(browser: Any, base_url: str) -> Iterator[Any]:
    """A fresh tab holding the token's cookie; the test fails on a script error."""
    with new_tab(browser, base_url) as tab:
        open_page(tab, f"/?token={TOKEN}")
        yield tab


def _auth() -> dict[str, str]:
    return {"authorization": f"Bearer {TOKEN}"}


def _listed(page: Any) -> list[str]:
    return sorted(
        page.eval_on_selector_all("tr[data-trace-id]", "rows => rows.map(r => r.dataset.traceId)")
    )


def test_api_searches_by_text_and_attribute(base_url: str) -> None:
    """``/api/traces`` takes ``q`` (words of names, values, errors) and ``attr=key=value``
    (repeatable), with the other filters; a malformed ``attr`` is a 400 that says why."""

    def ids(params: list[tuple[str, str]]) -> list[str]:
        answer = httpx.get(f"{base_url}/api/traces", params=params, headers=_auth())
        assert answer.status_code == 200, answer.text
        return sorted(t["trace_id"] for t in answer.json()["traces"])

    assert ids([("q", "declined")]) == [PAYMENT_TRACE]
    assert ids([("attr", "http.route=/search")]) == [SEARCH_TRACE, PAYMENT_TRACE]
    assert ids([("attr", "http.route=/search"), ("service", "api")]) == [SEARCH_TRACE]
    assert ids([("attr", "http.route=/search"), ("q", "charge")]) == [PAYMENT_TRACE]
    assert ids([("q", "get"), ("status", "ok")]) == [SEARCH_TRACE, ITEMS_TRACE]
    bad = httpx.get(f"{base_url}/api/traces", params={"attr": "novalue"}, headers=_auth())
    assert bad.status_code == 400
    assert "attr must be key=value" in bad.json()["error"]


def test_delete_goes_through_the_token_and_is_never_a_get(base_url: str, store_path: Path) -> None:
    """Without the token a DELETE is refused (401) and deletes nothing; a GET never deletes;
    with it the trace goes, and deleting it again is a 404."""
    trace = f"{0x5EAF:032x}"
    with Store(store_path) as store:
        store.write([_span(0x5EAF, "to delete", 7, "api")])
    url = f"{base_url}/api/traces/{trace}"
    assert httpx.delete(url).status_code == 401
    assert httpx.get(url, headers=_auth()).status_code == 200
    answer = httpx.delete(url, headers=_auth())
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"deleted": {"traces": [trace]}}
    assert httpx.get(url, headers=_auth()).status_code == 404
    assert httpx.delete(url, headers=_auth()).status_code == 404
    unknown = httpx.delete(f"{base_url}/api/experiments/nope", headers=_auth())
    assert unknown.status_code == 404


@browser_test
@needs_chromium
def test_the_search_box_filters_the_list_from_the_address(page: Any) -> None:
    """Typing in the search box and submitting puts ``q`` in the address and lists only the
    matching traces; an attribute ``key=value`` and the service filter narrow it further; the
    address alone (a shared link) shows the same list."""
    search = page.locator("#trace-search")
    search.fill("declined")
    search.press("Enter")
    page.wait_for_url("**/?*q=declined*")
    page.wait_for_function(
        "() => document.querySelectorAll('tr[data-trace-id]').length === 1", timeout=TIMEOUT_MS
    )
    assert _listed(page) == [PAYMENT_TRACE]
    assert page.locator("#trace-search").input_value() == "declined"

    open_page(page, "/")
    page.locator("input[name='attr']").first.fill("http.route=/search")
    page.locator("select[name='service']").select_option("api")
    page.locator("#trace-search").press("Enter")
    page.wait_for_url("**/?*attr=http.route*")
    page.wait_for_function(
        "() => document.querySelectorAll('tr[data-trace-id]').length === 1", timeout=TIMEOUT_MS
    )
    assert _listed(page) == [SEARCH_TRACE]
    shared = page.url

    open_page(page, shared)
    assert _listed(page) == [SEARCH_TRACE]
    assert page.locator("input[name='attr']").first.input_value() == "http.route=/search"


@browser_test
@needs_chromium
def test_a_trace_and_an_experiment_are_deleted_from_their_pages(
    page: Any, store_path: Path
) -> None:
    """The trace page's "Delete trace" asks first, deletes the trace through the API and goes
    back to the list, where the trace is gone; the experiment page's "Delete experiment" does
    the same for the experiment and every trace of it."""
    dialogs: list[str] = []

    def accept(dialog: Any) -> None:
        dialogs.append(dialog.message)
        dialog.accept()

    page.on("dialog", accept)
    open_page(page, f"/traces/{DOOMED_TRACE}")
    page.locator("button[data-delete='trace']").click()
    page.wait_for_url(lambda url: url.rstrip("/").count("/") == 2)  # back at "/"
    page.wait_for_selector("body[data-ready='1']")
    assert DOOMED_TRACE not in _listed(page)
    assert dialogs and "Delete this trace" in dialogs[0]
    with Store(store_path) as store:
        assert store.get_trace_summary(DOOMED_TRACE) is None

    open_page(page, f"/experiments/{EXPERIMENT}")
    page.locator("button[data-delete='experiment']").click()
    page.wait_for_url("**/experiments")
    page.wait_for_selector("body[data-ready='1']")
    with Store(store_path) as store:
        assert store.list_experiments() == []
        assert store.list_traces(experiment=EXPERIMENT) == []
