"""The collector and the store: spans per second ingested from concurrent senders, and how long
`looptrace show` takes on a trace of 10,000 spans.

1. Ingest: `looptrace serve` runs in its own process on a fresh store. SENDERS threads post
   pre-encoded OTLP/HTTP requests (protobuf, gzip; SPANS_PER_REQUEST spans of ~10 attributes
   and ~200-byte input/output each) as fast as they are acknowledged. Every 200 means the
   batch is committed with synchronous=FULL. Reported: spans/s from the first send to the last
   acknowledgement, and request latency percentiles. Senders share the machine with the
   collector, so the figure is a floor.
2. Show: a 10,000-span trace (a root, 100 steps of 99 children each) is written into a store;
   then `looptrace show TRACE_ID` runs as a subprocess (what a user waits for, interpreter
   start included), and the store read + tree rendering are timed in-process.

    .venv/bin/python benchmarks/scenario_collector.py [--senders 4] [--requests 50]
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import redirect_stdout
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))

from looptrace import _otlp
from looptrace._store import Store
from looptrace._wire import DecodedSpan, WireSpan
from looptrace.collector.decode import decode_request
from store_support import serve_subprocess

NOW = time.time_ns()


def make_span(trace: int, span: int, parent: int) -> WireSpan:
    attributes = [
        ("code.function", "handle_request"),
        ("code.namespace", "app.handlers"),
        ("http.method", "POST"),
        ("http.route", "/v1/answer"),
        ("user.id", span % 1000),
        ("retries", 0),
        ("cache.hit", span % 3 == 0),
        ("score", 0.5),
        ("input.value", '{"question": "' + "q" * 180 + '"}'),
        ("output.value", '"' + "a" * 190 + '"'),
    ]
    start = NOW + span * 1000
    return WireSpan(trace, span, parent, "step", 1, start, start + 900, attributes, [], [], 0, "")


def request_bodies(senders: int, requests: int, per_request: int) -> list[list[bytes]]:
    resource = _otlp.Resource([("service.name", "bench")], "looptrace", "0.1.0")
    out = []
    for s in range(senders):
        bodies = []
        for r in range(requests):
            trace = (s + 1) * 1_000_000 + r
            chunks = [
                _otlp.encode_span(make_span(trace, i + 1, i if i else 0), "protobuf")
                for i in range(per_request)
            ]
            body, _ = _otlp.compress(_otlp.encode_request(chunks, resource, "protobuf"), "gzip")
            bodies.append(body)
        out.append(bodies)
    return out


def bench_ingest(senders: int, requests: int, per_request: int, workdir: Path) -> dict[str, float]:
    bodies = request_bodies(senders, requests, per_request)
    with serve_subprocess(workdir / "ingest.db") as (_, url):
        latencies: list[float] = []
        failures: list[int] = []
        lock = threading.Lock()
        start = threading.Barrier(senders + 1)
        headers = {"content-type": "application/x-protobuf", "content-encoding": "gzip"}

        def sender(mine: list[bytes]) -> None:
            with httpx.Client(timeout=60) as client:
                start.wait()
                for body in mine:
                    t0 = time.perf_counter()
                    status = client.post(
                        f"{url}/v1/traces", content=body, headers=headers
                    ).status_code
                    dt = time.perf_counter() - t0
                    with lock:
                        latencies.append(dt)
                        if status != 200:
                            failures.append(status)

        threads = [threading.Thread(target=sender, args=(b,)) for b in bodies]
        for t in threads:
            t.start()
        start.wait()
        t0 = time.perf_counter()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        stored = httpx.get(f"{url}/api/stats").json()["spans"]
    total = senders * requests * per_request
    latencies.sort()
    return {
        "spans": total,
        "stored": stored,
        "failures": len(failures),
        "wall_s": wall,
        "spans_per_s": total / wall,
        "p50_ms": statistics.median(latencies) * 1e3,
        "p99_ms": latencies[int(len(latencies) * 0.99) - 1] * 1e3,
    }


def bench_show(workdir: Path, rounds: int = 5) -> dict[str, float]:
    from looptrace.cli import render_tree

    path = workdir / "show.db"
    trace = 0x5150
    spans: list[DecodedSpan] = []
    resource = _otlp.Resource([("service.name", "bench")], "looptrace", "0.1.0")
    wires = [make_span(trace, 1, 0)]
    for step in range(100):
        step_id = 2 + step * 100
        wires.append(make_span(trace, step_id, 1))
        wires.extend(make_span(trace, step_id + 1 + c, step_id) for c in range(99))
    wires = wires[:10_000]
    body = _otlp.encode_request(
        [_otlp.encode_span(w, "protobuf") for w in wires], resource, "protobuf"
    )
    spans = decode_request(body, _otlp.PROTOBUF_CONTENT_TYPE)
    with Store(path) as store:
        t0 = time.perf_counter()
        for i in range(0, len(spans), 512):
            store.write(spans[i : i + 512])
        write_s = time.perf_counter() - t0
    trace_id = f"{trace:032x}"
    cli_times, inproc = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "looptrace.cli", "--store", str(path), "show", trace_id],
            capture_output=True,
            text=True,
            check=True,
        )
        cli_times.append(time.perf_counter() - t0)
        lines = proc.stdout.count("\n")
        t0 = time.perf_counter()
        with Store(path) as store:
            rows = store.get_tree(trace_id, preview=120)
        buf = io.StringIO()
        with redirect_stdout(buf):
            print("\n".join(render_tree(rows, 120)))
        inproc.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import looptrace.cli"], check=True)
    import_s = time.perf_counter() - t0
    return {
        "spans": len(spans),
        "lines": lines,
        "write_s": write_s,
        "cli_s": statistics.median(cli_times),
        "inproc_s": statistics.median(inproc),
        "import_s": import_s,
    }


def bench_stages(per_request: int, workdir: Path, requests: int = 20) -> dict[str, float]:
    """Where a collector request's time goes, one thread, in process: decode vs store write."""
    bodies = request_bodies(1, requests, per_request)[0]
    t0 = time.perf_counter()
    decoded = [decode_request(b, _otlp.PROTOBUF_CONTENT_TYPE, "gzip", 1 << 30) for b in bodies]
    decode_s = time.perf_counter() - t0
    with Store(workdir / "stages.db") as store:
        t0 = time.perf_counter()
        for spans in decoded:
            store.write(spans)
        write_s = time.perf_counter() - t0
    total = requests * per_request
    return {"decode": total / decode_s, "write": total / write_s}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--senders", type=int, default=4)
    parser.add_argument("--requests", type=int, default=50, help="requests per sender")
    parser.add_argument("--spans-per-request", type=int, default=500)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        ingest = bench_ingest(args.senders, args.requests, args.spans_per_request, workdir)
        show = bench_show(workdir)
        stages = bench_stages(args.spans_per_request, workdir)
    print(
        f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; python {sys.version.split()[0]}"
    )
    print()
    print("| collector ingest (OTLP/HTTP protobuf+gzip, synchronous=FULL) | value |")
    print("|---|---|")
    print(
        f"| senders x requests x spans | {args.senders} x {args.requests} x {args.spans_per_request} |"
    )
    print(
        f"| spans acknowledged / stored | {ingest['spans'] - ingest['failures'] * args.spans_per_request} / {ingest['stored']} |"
    )
    print(f"| wall | {ingest['wall_s']:.2f} s |")
    print(f"| **spans per second** | **{ingest['spans_per_s']:,.0f}** |")
    print(f"| request latency p50 / p99 | {ingest['p50_ms']:.0f} ms / {ingest['p99_ms']:.0f} ms |")
    print(f"| one thread, in process: decode (gzip + protobuf) | {stages['decode']:,.0f} spans/s |")
    print(
        f"| one thread, in process: store write (one fsync per request) | {stages['write']:,.0f} spans/s |"
    )
    print()
    print("| `looptrace show` on one trace | value |")
    print("|---|---|")
    print(f"| spans in the trace / lines printed | {show['spans']:,} / {show['lines']:,} |")
    print(f"| writing it (20 batches of 512) | {show['write_s']:.2f} s |")
    print(
        f"| **`looptrace show` wall (subprocess, median of 5)** | **{show['cli_s'] * 1e3:.0f} ms** |"
    )
    print(f"| of which interpreter + import | {show['import_s'] * 1e3:.0f} ms |")
    print(f"| read + render in-process (median of 5) | {show['inproc_s'] * 1e3:.0f} ms |")


if __name__ == "__main__":
    main()
