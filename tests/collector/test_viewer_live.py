"""Live mode: the trace list and an open trace follow the store while they are open, through
``GET /api/changes`` (SQLite's change counter), with a toggle that pauses them.

Spans are posted to the running collector over OTLP/HTTP (JSON) while a headless chromium
shows the page; every wait is on a condition in the page, with a generous bound.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from collector_support import running_collector
from looptrace import _semconv as sc
from looptrace._store import Store
from viewer_support import (
    TIMEOUT_MS,
    browser_test,
    needs_chromium,
    open_page,
)

uvicorn = pytest.importorskip("uvicorn")
pytest.importorskip("starlette")

from looptrace.collector import live, viewer  # noqa: E402
from looptrace.collector.app import create_app  # noqa: E402

# Generous: the page polls once a second; a busy CI machine may take many times that.


def _attr(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    return {"key": key, "value": {"stringValue": str(value)}}


def otlp_json(spans: list[dict[str, Any]], service: str = "live-test") -> bytes:
    """An OTLP/HTTP JSON request body holding ``spans`` (dicts of trace, span, parent, name,
    start, end, attributes)."""
    return orjson.dumps(
        {
            "resourceSpans": [
                {
                    "resource": {"attributes": [_attr("service.name", service)]},
                    "scopeSpans": [
                        {
                            "scope": {"name": "live-test"},
                            "spans": [
                                {
                                    "traceId": s["trace"],
                                    "spanId": s["span"],
                                    **({"parentSpanId": s["parent"]} if s.get("parent") else {}),
                                    "name": s["name"],
                                    "kind": 1,
                                    "startTimeUnixNano": str(s["start"]),
                                    "endTimeUnixNano": str(s["end"]),
                                    "attributes": [
                                        _attr(k, v) for k, v in s.get("attributes", {}).items()
                                    ],
                                    "status": {},
                                }
                                for s in spans
                            ],
                        }
                    ],
                }
            ]
        }
    )


def post(base_url: str, spans: list[dict[str, Any]]) -> None:
    """Post spans to the collector; returns once they are committed (the collector's 200)."""
    answer = httpx.post(
        f"{base_url}/v1/traces",
        content=otlp_json(spans),
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text


_counter = iter(range(1, 10**6))


def new_trace_id() -> str:
    return f"{0x11FE000 + next(_counter):032x}"


def span(
    trace: str, n: int, name: str, *, parent: int | None = None, running: bool = False
) -> dict[str, Any]:
    """A span of ``trace`` numbered ``n``: finished 1 ms after it started, or (``running``)
    an in-progress snapshot, as looptrace sends for a span still open."""
    start = time.time_ns() - 10**9 + n * 10**6
    return {
        "trace": trace,
        "span": f"{n:016x}",
        "parent": None if parent is None else f"{parent:016x}",
        "name": name,
        "start": start,
        "end": start + (1 if running else 10**6),
        "attributes": {sc.IN_PROGRESS: True} if running else {},
    }


@pytest.fixture(scope="module")
def store_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("live") / "traces.db"
    with Store(path) as store:
        store.stats()
    return path


@pytest.fixture(scope="module")
def base_url(store_path: Path) -> Iterator[str]:
    """The collector with the viewer on uvicorn at an ephemeral port."""
    with running_collector(store_path, extra_routes=viewer.routes()) as url:
        yield url


def _open(page: Any, path: str) -> None:
    open_page(page, path)
    # Live once its first look at the store is answered: what is written after shows.
    page.wait_for_selector("#live-toggle.on")
    page.wait_for_selector("body[data-live='ready']")
    # Marks this document: still there later means the page was never reloaded.
    page.evaluate("window.__sameDocument = true")


# --------------------------------------------------------------------------------------------
# the API


def test_the_cursor_moves_only_when_the_store_changes(
    base_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/api/changes answers the same cursor while nothing is written, and another one once
    spans are committed; with a trace named, it carries that trace's summary."""
    # Every request reads the counter (no shared 100 ms window), so the answer is exact.
    monkeypatch.setattr(live, "CHECK_INTERVAL", 0.0)
    first = httpx.get(f"{base_url}/api/changes").json()
    assert first["changed"] is True
    again = httpx.get(f"{base_url}/api/changes", params={"cursor": first["cursor"]}).json()
    assert again == {"cursor": first["cursor"], "changed": False}

    trace = new_trace_id()
    post(base_url, [span(trace, 1, "written")])
    after = httpx.get(
        f"{base_url}/api/changes", params={"cursor": first["cursor"], "trace": trace}
    ).json()
    assert after["changed"] is True
    assert after["cursor"] != first["cursor"]
    assert after["trace"]["trace_id"] == trace
    assert after["trace"]["span_count"] == 1


def test_a_write_by_another_connection_moves_the_cursor(store_path: Path) -> None:
    """The watcher sees commits made through any connection to the file (a program writing
    to the store directly, not through the collector); it opens nothing until first asked."""
    watcher = live.ChangeWatcher(store_path)
    try:
        assert watcher._conn is None
        before = watcher.cursor()
        with Store(store_path) as other:
            from store_support import decoded_span

            other.write([decoded_span(0x7E57, 1, None, "direct", 1, 2)])
        deadline = time.monotonic() + 10
        while watcher.cursor() == before:
            assert time.monotonic() < deadline, "the cursor never moved after a commit"
            time.sleep(live.CHECK_INTERVAL)
    finally:
        watcher.close()


def test_ingest_opens_nothing_for_live_mode_when_nobody_watches(tmp_path: Path) -> None:
    """With no viewer polling, posting spans leaves the change watcher untouched: ingest pays
    nothing for live mode."""
    from starlette.testclient import TestClient

    app = create_app(tmp_path / "quiet.db")
    with TestClient(app, base_url="http://127.0.0.1") as client:
        trace = new_trace_id()
        answer = client.post(
            "/v1/traces",
            content=otlp_json([span(trace, 1, "quiet")]),
            headers={"content-type": "application/json"},
        )
        assert answer.status_code == 200
        assert app.state.changes._conn is None
        assert client.get("/api/changes").json()["changed"] is True
        assert app.state.changes._conn is not None


# --------------------------------------------------------------------------------------------
# in the browser


@browser_test
@needs_chromium
def test_a_new_trace_appears_in_the_list_without_reloading(page: Any, base_url: str) -> None:
    """With the list open, a trace posted to the collector shows up at the top of the list,
    in the same document (no reload)."""
    _open(page, "/")
    trace = new_trace_id()
    post(base_url, [span(trace, 1, "arrived live")])
    row = page.locator(f"table.traces tbody tr[data-trace-id='{trace}']")
    row.wait_for(timeout=TIMEOUT_MS)
    assert "arrived live" in row.inner_text()
    assert page.evaluate("window.__sameDocument") is True


@browser_test
@needs_chromium
def test_an_open_trace_grows_as_its_spans_arrive(page: Any, base_url: str) -> None:
    """A trace opened while its root is still running gains rows as its children arrive, and
    stops saying "running" once the root's final record comes, without a reload; the span
    selected stays selected."""
    trace = new_trace_id()
    post(base_url, [span(trace, 1, "root", running=True)])
    _open(page, f"/traces/{trace}#span={1:016x}")
    rows = page.locator(".wf-row")
    assert rows.count() == 1
    assert "running" in page.locator(".wf-row .dur").first.inner_text()

    post(base_url, [span(trace, 2, "child one", parent=1)])
    page.locator(".wf-row", has_text="child one").wait_for(timeout=TIMEOUT_MS)
    post(base_url, [span(trace, 3, "child two", parent=1)])
    page.locator(".wf-row", has_text="child two").wait_for(timeout=TIMEOUT_MS)
    assert rows.count() == 3

    post(base_url, [span(trace, 1, "root")])
    page.wait_for_function(
        "() => !document.querySelector('.wf-row .dur').textContent.includes('running')",
        timeout=TIMEOUT_MS,
    )
    assert page.locator(f".wf-row.selected[data-span-id='{1:016x}']").count() == 1
    assert page.evaluate("window.__sameDocument") is True


@browser_test
@needs_chromium
def test_the_toggle_pauses_live_updates_and_is_remembered(page: Any, base_url: str) -> None:
    """Paused, the page asks the collector nothing and a new trace does not appear; the
    choice survives a reload; resumed, the trace appears."""
    _open(page, "/")
    polls: list[str] = []
    page.on("request", lambda r: polls.append(r.url) if "/api/changes" in r.url else None)
    page.click("#live-toggle")
    page.wait_for_selector("#live-toggle:not(.on)")
    assert "paused" in page.inner_text("#live-toggle")
    polls.clear()

    trace = new_trace_id()
    post(base_url, [span(trace, 1, "while paused")])
    # An absence needs a window: three poll intervals in which a live page would have asked.
    page.wait_for_timeout(3000)
    assert polls == []
    assert page.locator(f"tr[data-trace-id='{trace}']").count() == 0

    page.reload()
    page.wait_for_selector("body[data-ready='1']")
    page.wait_for_selector("#live-toggle:not(.on)")
    page.evaluate("window.__sameDocument = true")
    later = new_trace_id()
    post(base_url, [span(later, 1, "after resume")])
    # Resumed, the list catches up with what came while it was paused.
    page.click("#live-toggle")
    page.wait_for_selector("#live-toggle.on")
    page.locator(f"tr[data-trace-id='{later}']").wait_for(timeout=TIMEOUT_MS)
    assert page.evaluate("window.__sameDocument") is True
