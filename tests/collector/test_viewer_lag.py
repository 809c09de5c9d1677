"""The /lag page in a real browser: its chart's ticks and clock, its colours and breaks, its
filters, and its cards reading the API's named figures.

Uses Debian's chromium through Playwright, as ``test_viewer.py`` does (its ``browser`` fixture).
"""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("playwright")
pytest.importorskip("uvicorn")

from collector_support import running_collector
from looptrace._store import Store
from looptrace.collector import viewer
from store_support import decoded_span
from viewer_support import browser_test, needs_chromium, new_tab, open_page

# An old run (two processes of "svc", four 100 ms windows each) and, minutes later, a recent
# one (one process of "other"): three processes, two runs.
OLD = 1_795_000_000_000_000_000  # ns since the epoch: 2026-11-18, past what a JS number holds
RECENT = time.time_ns() - 60_000_000_000


def _summary(n: int, start: int, ms: int, service: str, instance: str, p99: float) -> Any:
    return decoded_span(
        0x9000 + n,
        1,
        None,
        "looptrace.loop.lag",
        start,
        start + ms * 1_000_000,
        attributes={
            "looptrace.loop.lag.p99_ms": p99,
            "looptrace.loop.lag.max_ms": p99 * 1.5,
            "looptrace.loop.lag.worst_stall_ms": p99 * 1.2,
            "looptrace.loop.lag.worst_stall_cause": f"handler (/app/{service}.py:{n})",
            "looptrace.loop.lag.unscheduled_ms": 2.0,
            "looptrace.loop.lag.count": 50,
            "looptrace.loop.lag.window_ms": float(ms),
        },
        resource={"service.name": service, "service.instance.id": instance},
    )


@pytest.fixture(scope="module")
def lag_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    path = tmp_path_factory.mktemp("lag") / "lag.db"
    spans = []
    n = 0
    for instance, base_p99 in (("proc-a-0001", 3.7), ("proc-b-0002", 21.3)):
        for w in range(4):
            spans.append(_summary(n, OLD + w * 100_000_000, 100, "svc", instance, base_p99 + w))
            n += 1
    for w in range(5):
        spans.append(_summary(n, RECENT + w * 100_000_000, 100, "other", "proc-c-0003", 40.0 + w))
        n += 1
    with Store(path) as store:
        store.write(spans)
    with running_collector(path, extra_routes=viewer.routes()) as url:
        yield url


@pytest.fixture
def tab(browser: Any, lag_url: str) -> Iterator[Any]:
    with new_tab(browser, lag_url, timezone_id="UTC") as page:
        yield page


def _texts(page: Any, selector: str) -> list[str]:
    return [(t or "").strip() for t in page.locator(selector).all_text_contents()]


@browser_test
@needs_chromium
def test_the_lag_chart_ticks_are_round_distinct_and_on_a_24_hour_clock(tab: Any) -> None:
    """Each run on the time axis starts with its clock time, on the 24-hour clock the other pages
    use, then round offsets from it, no two alike; the lag axis ticks at round steps (1, 2 or 5
    times a power of ten) from zero."""
    open_page(tab, "/lag")
    xs = _texts(tab, "#lag-chart text.x-tick")
    # Each run's ticks: its clock time, then offsets from it, every one different.
    runs: list[list[str]] = []
    for x in xs:
        if re.fullmatch(r"\d\d:\d\d(:\d\d)?", x):
            runs.append([])
        runs[-1].append(x)
    assert len(runs) == 2 and all(len(r) >= 2 for r in runs), xs
    assert all(len(r) == len(set(r)) for r in runs), xs
    assert not [x for x in xs if re.search(r"AM|PM", x, re.I)], xs
    clocks = [x for x in xs if re.fullmatch(r"\d\d:\d\d(:\d\d)?", x)]
    old = time.strftime("%H:%M:%S", time.gmtime(OLD / 1e9))
    recent = time.strftime("%H:%M:%S", time.gmtime(RECENT / 1e9))
    assert clocks == [old, recent], xs
    ys = [float(y.removesuffix(" ms")) for y in _texts(tab, "#lag-chart text.y-tick")]
    step = ys[1] - ys[0]
    assert ys[0] == 0 and step > 0
    mantissa = step / 10 ** int(f"{step:e}".split("e")[1])
    assert round(mantissa, 6) in (1.0, 2.0, 5.0), ys
    assert all(abs(b - a - step) < 1e-9 for a, b in itertools.pairwise(ys)), ys


@browser_test
@needs_chromium
def test_runs_minutes_apart_keep_their_width_and_each_process_has_its_colour(tab: Any) -> None:
    """Two runs minutes apart are two segments of the axis with a break between them, each
    wide enough to read (not two vertical lines); three processes are three colours."""
    open_page(tab, "/lag")
    chart = tab.locator("#lag-chart")
    assert chart.locator("g.axis-break").count() == 1
    by_series: dict[str, list[float]] = {}
    colours: dict[str, set[str]] = {}
    for dot in chart.locator("circle.dot-p99").all():
        key = dot.get_attribute("data-series") or ""
        by_series.setdefault(key, []).append(float(dot.get_attribute("cx") or 0))
        colours.setdefault(key, set()).add(dot.get_attribute("class") or "")
    assert len(by_series) == 3
    assert len({next(iter(c)) for c in colours.values()}) == 3, colours
    for key, xs in by_series.items():
        assert max(xs) - min(xs) > 60, (key, xs)
    legend = tab.locator("#lag-chart .legend .process").all_inner_texts()
    assert len(legend) == 3


@browser_test
@needs_chromium
def test_the_lag_page_filters_by_service_and_time(tab: Any) -> None:
    """The service filter keeps that service's processes; "last 15 minutes" keeps the recent
    run; the choices stay selected in the form, and the cards follow the filter."""
    open_page(tab, "/lag?service=svc")
    series = {
        d.get_attribute("data-series") for d in tab.locator("#lag-chart circle.dot-p99").all()
    }
    assert series == {"svc proc-a-0001", "svc proc-b-0002"}
    assert tab.locator("#lag-filters select[name=service]").input_value() == "svc"
    open_page(tab, "/lag?range=900")
    dots = tab.locator("#lag-chart circle.dot-p99")
    assert dots.count() == 5
    assert {d.get_attribute("data-series") for d in dots.all()} == {"other proc-c-0003"}
    assert tab.locator("#lag-filters select[name=range]").input_value() == "900"
    assert tab.locator("#lag-chart g.axis-break").count() == 0


@browser_test
@needs_chromium
def test_the_cards_show_the_api_s_named_figures(tab: Any, lag_url: str) -> None:
    """The cards read /api/lag's figures: the worst stall with its cause, the worst window's p99
    lag with that window's length, and the time the process was not scheduled."""
    import httpx

    figures = httpx.get(f"{lag_url}/api/lag?limit=500&worst=20", timeout=10).json()["figures"]
    open_page(tab, "/lag")
    stall = tab.locator(".card[data-figure=worst-stall]")
    assert stall.locator(".v").inner_text() == f"{figures['worst_stall_ms']:.2f} ms"
    assert figures["worst_stall_cause"] in stall.inner_text()
    p99 = tab.locator(".card[data-figure=p99-lag]")
    assert p99.locator(".v").inner_text() == f"{figures['p99_lag_ms']:.2f} ms"
    assert "100.0 ms window" in p99.inner_text()
    paused = tab.locator(".card[data-figure=not-scheduled] .v").inner_text()
    assert paused == f"{figures['unscheduled_ms']:.2f} ms"
