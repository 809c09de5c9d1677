"""How fast the viewer answers on a store of 100,000 traces (150,000 spans, and one trace of
10,001 spans).

Fills a fresh store through ``Store.write`` (DecodedSpan objects, as the collector writes them),
starts the collector with the viewer on 127.0.0.1, then times:

* the JSON API calls the pages make (median of several requests, server already warm);
* whole page loads in headless chromium, from navigation to the page marking itself ready
  (``body[data-ready]``: data fetched and drawn), when /usr/bin/chromium exists.

Run: ``.venv/bin/python benchmarks/scenario_viewer.py`` (about half a minute).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import uvicorn

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))

from looptrace import _semconv as sc
from looptrace._store import Store
from looptrace._wire import DecodedSpan
from looptrace.collector import viewer
from looptrace.collector.app import create_app
from store_support import decoded_span

TRACES = 100_000
SPANS_PER_TRACE = 6  # for the newest DEEP_TRACES traces; the rest are single spans
DEEP_TRACES = 10_000
BIG_TRACE = 0xB16  # a fan-out: 1 root, 100 batches of 99 items
BIG_BATCHES, BIG_ITEMS = 100, 99
EXPERIMENT_CASES = 200
LAG_SUMMARIES = 300
REPEATS = 15
CHROMIUM = Path("/usr/bin/chromium")


def _span(
    trace: int,
    span: int,
    parent: int | None,
    name: str,
    start: int,
    end: int,
    attributes: dict[str, Any],
    status: int = 0,
) -> DecodedSpan:
    return decoded_span(
        trace,
        span,
        parent,
        name,
        start,
        end,
        attributes=attributes,
        status=status,
        resource={"service.name": "bench"},
        scope=("bench", "0"),
    )


def fill(store: Store) -> float:
    """Write the store; returns seconds taken."""
    t0 = time.perf_counter()
    base = time.time_ns() - TRACES * 10**9
    experiment = f"{0xE0:032x}"
    batch: list[DecodedSpan] = []
    for t in range(1, TRACES + 1):
        start = base + t * 10**9
        in_exp = t <= EXPERIMENT_CASES
        root_attrs: dict[str, Any] = {sc.INPUT_VALUE: f'{{"job": {t}}}', sc.OUTPUT_VALUE: '"done"'}
        if in_exp:
            root_attrs.update(
                {
                    sc.EXPERIMENT_ID: experiment,
                    sc.EXPERIMENT_NAME: "bench",
                    sc.CASE_INDEX: t - 1,
                    sc.SCORE_PREFIX + "accuracy": float(t % 3 != 0),
                }
            )
        batch.append(
            _span(
                t,
                1,
                None,
                f"job-{t % 50}",
                start,
                start + 40_000_000,
                root_attrs,
                status=2 if t % 97 == 0 else 0,
            )
        )
        for s in range(2, (SPANS_PER_TRACE if t > TRACES - DEEP_TRACES else 1) + 1):
            s_start = start + s * 5_000_000
            batch.append(
                _span(
                    t,
                    s,
                    1,
                    f"step-{s}",
                    s_start,
                    s_start + 4_000_000,
                    {sc.LOOP_LAG_MAX_MS: float(s), sc.INPUT_VALUE: f'{{"s": {s}}}'},
                )
            )
        if len(batch) >= 6000:
            store.write(batch)
            batch = []
    for i in range(LAG_SUMMARIES):
        start = base + i * 10**9
        batch.append(
            _span(
                TRACES + 1 + i,
                1,
                None,
                "looptrace.loop.lag",
                start,
                start + 10**9,
                {
                    "looptrace.loop.lag.p99_ms": 1.0 + i % 7,
                    "looptrace.loop.lag.max_ms": 2.0 + i % 11,
                },
            )
        )
    store.write(batch)
    store.write(big_trace(base))
    return time.perf_counter() - t0


def big_trace(base: int) -> list[DecodedSpan]:
    spans = [_span(BIG_TRACE, 1, None, "fan-out", base, base + 10**9, {})]
    for b in range(BIG_BATCHES):
        b0 = base + b * 10**7
        spans.append(_span(BIG_TRACE, 2 + b, 1, f"batch {b}", b0, b0 + 9 * 10**6, {}))
        for i in range(BIG_ITEMS):
            t = b0 + i * 90_000
            spans.append(
                _span(BIG_TRACE, 1000 + b * 1000 + i, 2 + b, f"item {b}.{i}", t, t + 80_000, {})
            )
    return spans


def serve(path: Path) -> tuple[uvicorn.Server, threading.Thread, str]:
    app = create_app(path, extra_routes=viewer.routes())
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("the collector did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    return server, thread, f"http://127.0.0.1:{port}"


def time_api(base: str, paths: list[tuple[str, str]]) -> list[tuple[str, float, float]]:
    out = []
    with httpx.Client(base_url=base) as client:
        for label, path in paths:
            client.get(path).raise_for_status()
            times = []
            for _ in range(REPEATS):
                t0 = time.perf_counter()
                client.get(path).raise_for_status()
                times.append((time.perf_counter() - t0) * 1e3)
            out.append((label, statistics.median(times), max(times)))
    return out


def time_pages(base: str, paths: list[tuple[str, str]]) -> list[tuple[str, float, float, float]]:
    from playwright.sync_api import sync_playwright

    out = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=str(CHROMIUM),
            args=[
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        for label, path in paths:
            walls, inside = [], []
            for _ in range(REPEATS // 3 + 1):
                t0 = time.perf_counter()
                page.goto(base + path)
                page.wait_for_selector("body[data-ready='1']")
                walls.append((time.perf_counter() - t0) * 1e3)
                inside.append(float(page.get_attribute("body", "data-ready-ms") or "nan"))
            # The first load of each page warms the browser's cache; it is left out.
            out.append(
                (
                    label,
                    statistics.median(inside[1:]),
                    max(inside[1:]),
                    statistics.median(walls[1:]),
                )
            )
        browser.close()
    return out


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "traces.db"
        with Store(path) as store:
            seconds = fill(store)
            stats = store.stats()
        print(
            f"store: {stats['traces']:,} traces, {stats['spans']:,} spans, "
            f"{stats['bytes'] / 2**20:.1f} MiB, filled in {seconds:.1f} s"
        )
        server, thread, base = serve(path)
        mid = f"{TRACES - DEEP_TRACES // 2:032x}"
        big = f"{BIG_TRACE:032x}"
        experiment = f"{0xE0:032x}"
        api = time_api(
            base,
            [
                ("trace list, first page", "/api/traces?limit=51"),
                ("trace list, page at offset 90,000", "/api/traces?limit=51&offset=90000"),
                ("trace list, service filter", "/api/traces?limit=51&service=bench"),
                ("trace list, min duration 30 ms", "/api/traces?limit=51&min_duration_ms=30"),
                ("trace list, last hour", "/api/traces?limit=51&range=3600"),
                ("trace list, name filter", "/api/traces?limit=51&name=job-7"),
                ("trace list, status=error", "/api/traces?limit=51&status=error"),
                ("trace list, experiment filter", f"/api/traces?limit=51&experiment={experiment}"),
                ("one trace (6 spans)", f"/api/traces/{mid}"),
                ("one trace (10,001 spans)", f"/api/traces/{big}"),
                ("experiments", "/api/experiments?limit=200"),
                (f"one experiment ({EXPERIMENT_CASES} cases)", f"/api/experiments/{experiment}"),
                ("lag summaries", "/api/lag?limit=500&worst=20"),
            ],
        )
        print(f"\nJSON API (median and max of {REPEATS} requests, ms)")
        print(f"{'request':<36}{'median':>9}{'max':>9}")
        for label, med, worst in api:
            print(f"{label:<36}{med:>9.1f}{worst:>9.1f}")
        if CHROMIUM.exists():
            pages = time_pages(
                base,
                [
                    ("traces", "/"),
                    ("traces, page at offset 90,000", "/?offset=90000"),
                    ("traces, filtered by service", "/?service=bench&min_duration_ms=30"),
                    ("one trace", f"/traces/{mid}"),
                    ("one trace of 10,001 spans", f"/traces/{big}"),
                    ("experiments", "/experiments"),
                    (f"one experiment ({EXPERIMENT_CASES} cases)", f"/experiments/{experiment}"),
                    ("lag", "/lag"),
                ],
            )
            print("\npage load in chromium, ms: navigation start to page drawn, measured in the")
            print("page (median, max); 'driver' adds the Playwright round trips, seen from Python")
            print(f"{'page':<36}{'median':>9}{'max':>9}{'driver':>9}")
            for label, med, worst, wall in pages:
                print(f"{label:<36}{med:>9.1f}{worst:>9.1f}{wall:>9.1f}")
        else:
            print("\n(no /usr/bin/chromium: page loads not measured)", file=sys.stderr)
        server.should_exit = True
        thread.join(10)
    experiment_at_scale()


SCALE_CASES = 10_000
LIVE_TRIALS = 7


def experiment_at_scale() -> None:
    """An experiment of 10,000 cases (5,000 dataset rows run twice, two child spans each, with
    task and scorer errors) and three earlier runs of it: the experiment page's answers (time
    and size), its first paint in chromium, and how long live mode takes to show a new trace
    written by another connection to the store."""
    sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
    from experiment_support import experiment_spans

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "experiments.db"
        now = time.time_ns()
        exp = f"{0xE10:032x}"
        t0 = time.perf_counter()
        with Store(path) as store:
            for run in range(3):
                store.write(
                    experiment_spans(
                        f"{0xE00 + run:032x}",
                        "scale",
                        now - (5 - run) * 3600 * 10**9,
                        SCALE_CASES // 2,
                        repetitions=2,
                        score=lambda i, rep: (i % 10) / 10,
                        children=0,
                    )
                )
            spans = experiment_spans(
                exp,
                "scale",
                now - 3600 * 10**9,
                SCALE_CASES // 2,
                repetitions=2,
                score=lambda i, rep: (i % 10) / 10 if i % 7 else 0.0,
                task_errors=frozenset(range(0, SCALE_CASES // 2, 499)),
                scorer_errors={3: ("exact", "judge"), 7: ("judge",)},
                children=2,
                input_chars=300,
            )
            for k in range(0, len(spans), 5000):
                store.write(spans[k : k + 5000])
        print(
            f"\nexperiment at scale: {SCALE_CASES:,} cases ({len(spans):,} spans) and three "
            f"earlier runs, filled in {time.perf_counter() - t0:.1f} s"
        )
        server, thread, base = serve(path)
        paths = [
            ("cases 1-100 with the summary", f"/api/experiments/{exp}"),
            ("cases at offset 9,900", f"/api/experiments/{exp}?offset=9900"),
            ("scorer errors only", f"/api/experiments/{exp}?filter=scorer_error"),
            ("trend over the last runs", f"/api/experiments/{exp}/trend"),
            ("experiment list (four of them)", "/api/experiments"),
            ("live: nothing changed", "/api/changes?cursor=none"),
        ]
        with httpx.Client(base_url=base) as client:
            sizes = {label: len(client.get(p).content) for label, p in paths}
        print(f"JSON API (median and max of {REPEATS} requests, ms; answer size)")
        print(f"{'request':<36}{'median':>9}{'max':>9}{'bytes':>10}")
        for label, med, worst in time_api(base, paths):
            print(f"{label:<36}{med:>9.1f}{worst:>9.1f}{sizes[label]:>10,}")
        if CHROMIUM.exists():
            for label, med, worst, wall in time_pages(
                base, [(f"experiment page, {SCALE_CASES:,} cases", f"/experiments/{exp}")]
            ):
                print(
                    f"first paint: {label}: median {med:.0f} ms, max {worst:.0f} ms (driver {wall:.0f})"
                )
            print(f"live: a new trace in the open list, median and max of {LIVE_TRIALS}: ", end="")
            print("{:.0f} ms, {:.0f} ms".format(*live_latency(base, path)))
        server.should_exit = True
        thread.join(10)


def live_latency(base: str, path: Path) -> tuple[float, float]:
    """Milliseconds from a commit by another connection to the row in the open trace list."""
    from playwright.sync_api import sync_playwright

    out = []
    with sync_playwright() as pw, Store(path) as writer:
        browser = pw.chromium.launch(
            executable_path=str(CHROMIUM), args=["--headless", "--no-sandbox"]
        )
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto(base + "/")
        page.wait_for_selector("#live-toggle.on")
        for trial in range(LIVE_TRIALS):
            trace = 0x11FE0000 + trial
            start = time.time_ns()
            t0 = time.perf_counter()
            writer.write([decoded_span(trace, 1, None, f"live {trial}", start, start + 1000)])
            page.wait_for_selector(f"tr[data-trace-id='{trace:032x}']", timeout=30_000)
            out.append((time.perf_counter() - t0) * 1e3)
        browser.close()
    return statistics.median(out), max(out)


SEARCH_TRACES = 100_000


def search_at_scale() -> None:
    """Search at 100,000 traces (three spans each: a route, a user among 1,000, a request id of
    its own, one trace in 100 failing with an error message): the store's fill time with the
    search index, then ``/api/traces`` answering attribute and text searches, alone and with
    other filters (median and max of several requests, ms; how many traces matched)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "search.db"
        base = time.time_ns() - SEARCH_TRACES * 10**9
        t0 = time.perf_counter()
        with Store(path) as store:
            batch: list[DecodedSpan] = []
            for t in range(1, SEARCH_TRACES + 1):
                start = base + t * 10**9
                failed = t % 100 == 0
                batch.append(
                    _span(
                        0x5000000 + t,
                        1,
                        None,
                        f"GET /r/{t % 20}",
                        start,
                        start + 20_000_000,
                        {
                            "http.route": f"/r/{t % 20}",
                            "user.id": f"u-{t % 1000}",
                            "request.id": f"req-{t:08d}",
                        },
                        status=2 if failed else 0,
                    )
                )
                for s in (2, 3):
                    batch.append(
                        _span(
                            0x5000000 + t,
                            s,
                            1,
                            "db.query" if s == 2 else "render",
                            start + s * 10**6,
                            start + s * 10**6 + 10**6,
                            {"db.system": "sqlite"} if s == 2 else {"template": "page.html"},
                            status=2 if failed and s == 2 else 0,
                        )
                    )
                if failed:
                    batch[-2].status_message = f"database is locked after {t} retries"
                if len(batch) >= 6000:
                    store.write(batch)
                    batch = []
            store.write(batch)
            fill = time.perf_counter() - t0
            stats = store.stats()
        print(
            f"\nsearch at scale: {stats['traces']:,} traces, {stats['spans']:,} spans, "
            f"{stats['bytes'] / 2**20:.1f} MiB with the search index, filled in {fill:.1f} s "
            f"({stats['spans'] / fill:,.0f} spans/s through Store.write)"
        )
        server, thread, url = serve(path)
        queries = [
            ("attr, 100 matches (user.id=u-7)", "attr=user.id%3Du-7"),
            ("attr, 5,000 matches (http.route)", "attr=http.route%3D/r/3"),
            ("attr, one match (request.id)", "attr=request.id%3Dreq-00050000"),
            ("attr, no match", "attr=user.id%3Dnobody"),
            ("two attrs (route and user)", "attr=http.route%3D/r/7&attr=user.id%3Du-7"),
            ("text, 1,000 matches (locked)", "q=locked"),
            ("text, every trace (db)", "q=db"),
            ("text, a word prefix (retr)", "q=retr"),
            ("text + status=error + last day", "q=locked&status=error&range=86400"),
            (
                "attr + service + min duration",
                "attr=user.id%3Du-7&service=bench&min_duration_ms=10",
            ),
        ]
        paths = [(label, f"/api/traces?limit=51&{q}") for label, q in queries]
        with httpx.Client(base_url=url) as client:
            counts = {label: len(client.get(p).json()["traces"]) for label, p in paths}
        print(f"JSON API (median and max of {REPEATS} requests, ms; traces on the first page)")
        print(f"{'request':<36}{'median':>9}{'max':>9}{'listed':>8}")
        for label, med, worst in time_api(url, paths):
            print(f"{label:<36}{med:>9.1f}{worst:>9.1f}{counts[label]:>8}")
        if CHROMIUM.exists():
            for label, med, worst, wall in time_pages(
                url, [("traces, searched", "/?q=locked&attr=http.route%3D/r/0")]
            ):
                print(
                    f"page load: {label}: median {med:.0f} ms, max {worst:.0f} ms (driver {wall:.0f})"
                )
        server.should_exit = True
        thread.join(10)


if __name__ == "__main__":
    main()
    search_at_scale()
