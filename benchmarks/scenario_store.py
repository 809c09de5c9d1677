"""Scenario: the local store, the default destination (no endpoint configured).

One asyncio program ends N traced calls (an input and an output recorded on each), yielding
to the loop every 100 calls, then flushes into a fresh SQLite store. Reported per span: the
process's CPU (every thread: the flusher, the store's writer) and the wall time from the first
call to the end of the flush, each minus the same loop without tracing.

The same program sending over OTLP/HTTP to a local server in a child process (``otlp``, its
CPU not counted) is the row to compare with: what the store costs per span against the OTLP
path. That server only answers; the row ``otlp+serve`` sends to ``looptrace serve`` in a child
process instead, which stores the same spans in its own SQLite store, and counts that
process's CPU for the run too (Unix: from its resource usage once it exits). It is the same
work as the local store's, done by a collector: what keeping the spans costs on this machine
either way.

Old commit against new, in one run: ``--compare OLD_SRC NEW_SRC`` runs each measurement in a
child process with that ``src`` directory first on the path, alternating, and prints medians.

Three more rows, each its own option:

``--writer``: ``Store.write`` alone (the search index included), batches of 512 and 4,096
spans of the shapes a traced program makes, into a fresh store: spans/s and CPU per span.

``--collector``: end to end through ``looptrace serve``'s receiver and store writer: the
collector runs in this process (uvicorn in a thread) and a child process posts OTLP/HTTP
protobuf requests of 512 spans from 4 connections at once, as fast as they are answered.
Reported: spans/s from the first request to the last answer (every answer after the commit)
and the collector's CPU per span.

``--instructions``: ``Store.write``'s instructions per span under ``valgrind --tool=callgrind``
(batches of 512 spans of ``--writer``'s shapes; the difference between 6,000 and 2,000 spans
written, so opening the store and making the spans cancel out). Instruction counts do not move
with the machine's load, so a change of a few percent shows where timings cannot.

``--tight``: a traced program making 50,000 spans/s for 4 s in a tight loop (a call, and a
yield to the loop every 100 calls, paced to the rate) into the local store; reported: spans
made, stored, and dropped by reason.

    .venv/bin/python benchmarks/scenario_store.py [--n 20000] [--rounds 5]
    .venv/bin/python benchmarks/scenario_store.py --writer --collector --tight
    .venv/bin/python benchmarks/scenario_store.py --instructions
    git worktree add --detach /tmp/old <commit>
    .venv/bin/python benchmarks/scenario_store.py --compare /tmp/old/src src
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _measure(n: int, traced: bool, endpoint: str | None = None) -> tuple[float, float]:
    import looptrace

    with tempfile.TemporaryDirectory() as tmp:
        looptrace.configure(
            store_path=str(Path(tmp) / "bench.db"),
            endpoint=endpoint,
            flush_interval=0.2,
            disabled=not traced,
        )

        @looptrace.traced
        def handle(question: str, i: int) -> dict[str, int]:
            return {"answer": 4, "i": i}

        async def main() -> None:
            for i in range(n):
                handle("what is 2+2?", i)
                if i % 100 == 99:
                    await asyncio.sleep(0)
            if traced:
                result = await looptrace.flush(60)
                assert result.ok, result

        cpu, wall = time.process_time(), time.perf_counter()
        asyncio.run(main())
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        looptrace.shutdown_sync(10)
        return cpu, wall


def _child(src: str, n: int, traced: bool, endpoint: str | None = None) -> tuple[float, float]:
    env = {**os.environ, "PYTHONPATH": src}
    extra = ([] if traced else ["--untraced"]) + ([] if endpoint is None else ["--to", endpoint])
    out = subprocess.run(
        [sys.executable, __file__, "--one", "--n", str(n), *extra],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    cpu, wall = json.loads(out.strip().splitlines()[-1])
    return cpu, wall


def _serve(src: str, store: Path) -> tuple[subprocess.Popen[str], int]:
    """``looptrace serve`` on ``store`` in a child process, and the port it listens on."""
    serve = subprocess.Popen(
        [sys.executable, "-m", "looptrace", "--store", str(store), *_SERVE_ARGS],
        env={**os.environ, "PYTHONPATH": src},
        stderr=subprocess.PIPE,
        text=True,
    )
    assert serve.stderr is not None
    line = serve.stderr.readline()
    return serve, int(line.split("http://localhost:")[1].split()[0])


_SERVE_ARGS = ("serve", "--port", "0", "--no-viewer")


def _stop(serve: subprocess.Popen[str]) -> float:
    """Stop ``serve``; its CPU from start to exit (Unix: its resource usage)."""
    serve.terminate()
    _, _, usage = os.wait4(serve.pid, 0)  # type: ignore[attr-defined]
    serve.returncode = 0
    return float(usage.ru_utime + usage.ru_stime)


def _through_serve(src: str, n: int) -> tuple[float, float]:
    """The OTLP row into ``looptrace serve`` (a child process on a fresh store): the client's
    CPU plus the collector's over the run, and the client's wall time. The collector has
    stored every span before the client's flush returns (it answers after the commit)."""
    with tempfile.TemporaryDirectory() as tmp:
        serve, port = _serve(src, Path(tmp) / "s.db")
        try:
            cpu, wall = _child(src, n, True, f"http://127.0.0.1:{port}/v1/traces")
        finally:
            serve_cpu = _stop(serve)
    # Its startup (interpreter, imports, opening the store) is not the spans' cost: measured
    # alone by _serve_idle_cpu and taken off.
    return cpu + serve_cpu - _serve_idle_cpu(src), wall


_IDLE: dict[str, float] = {}


def _serve_idle_cpu(src: str) -> float:
    """``looptrace serve``'s CPU from start to stop with nothing sent (median of 3)."""
    if src not in _IDLE:
        samples = []
        for _ in range(3):
            with tempfile.TemporaryDirectory() as tmp:
                serve, _ = _serve(src, Path(tmp) / "s.db")
                samples.append(_stop(serve))
        _IDLE[src] = statistics.median(samples)
    return _IDLE[src]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--compare", nargs=2, metavar=("OLD_SRC", "NEW_SRC"))
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--untraced", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--to", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--post", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--writer", action="store_true", help="Store.write alone")
    parser.add_argument("--collector", action="store_true", help="through looptrace serve")
    parser.add_argument("--tight", action="store_true", help="50,000 spans/s from a tight loop")
    parser.add_argument(
        "--instructions", action="store_true", help="Store.write's instructions per span"
    )
    parser.add_argument("--write-only", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(_measure(args.n, not args.untraced, args.to)))
        return
    if args.post:
        _post_all(args.post, args.n)
        return
    if args.write_only is not None:
        _write_only(args.write_only)
        return
    if args.instructions:
        _instructions_row()
        return
    if args.writer or args.collector or args.tight:
        if args.writer:
            _writer_rows(max(args.n, 50_000))
        if args.collector:
            _collector_row(max(args.n, 100_000))
        if args.tight:
            _tight_row()
        return
    here = str(Path(__file__).resolve().parent.parent / "src")
    sources = (
        {"old": args.compare[0], "new": args.compare[1]} if args.compare else {"looptrace": here}
    )
    names = ("none", *sources, "otlp") + (() if args.compare else ("otlp+serve",))
    rows: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from otlp_server import OtlpServerProcess

    first = next(iter(sources.values()))
    with OtlpServerProcess(defer_decode=True) as server:
        for _ in range(args.rounds):
            rows["none"].append(_child(first, args.n, traced=False))
            for name, src in sources.items():
                rows[name].append(_child(src, args.n, traced=True))
            rows["otlp"].append(_child(first, args.n, True, server.endpoint))
            if "otlp+serve" in rows:
                rows["otlp+serve"].append(_through_serve(first, args.n))
    base_cpu = statistics.median(c for c, _ in rows["none"])
    base_wall = statistics.median(w for _, w in rows["none"])
    print(f"{args.n} traced calls into the local store, medians of {args.rounds} rounds")
    print(f"{'row':<12}{'CPU us/span':>14}{'wall us/span':>14}   CPU per round (us/span)")
    for name, samples in rows.items():
        cpu = statistics.median(c for c, _ in samples)
        wall = statistics.median(w for _, w in samples)
        if name != "none":
            cpu, wall = cpu - base_cpu, wall - base_wall
        spread = ", ".join(
            f"{(c - (base_cpu if name != 'none' else 0)) / args.n * 1e6:.1f}" for c, _ in samples
        )
        print(f"{name:<12}{cpu / args.n * 1e6:>14.2f}{wall / args.n * 1e6:>14.2f}   {spread}")


def _spans(n: int, first_trace: int = 0) -> list[Any]:
    """``n`` spans shaped as a traced program makes them (a function's attributes, a JSON
    input and output), one trace per 10 spans: a root and nine children."""
    from looptrace._wire import DecodedSpan

    now = time.time_ns()
    resource = {
        "service.name": "bench",
        "service.instance.id": "0123456789abcdef0123456789abcdef",
        "telemetry.sdk.language": "python",
        "telemetry.sdk.name": "looptrace",
        "telemetry.sdk.version": "0.1.0",
    }
    out = []
    for i in range(n):
        trace, child = divmod(i, 10)
        out.append(
            DecodedSpan(
                trace_id=f"{first_trace + trace + 1:032x}",
                span_id=f"{child + 1:016x}",
                parent_span_id=None if child == 0 else f"{1:016x}",
                name="handle" if child == 0 else "lookup",
                kind=1,
                start_ns=now + i * 1000,
                end_ns=now + i * 1000 + 500,
                attributes={
                    "code.function": "handle" if child == 0 else "lookup",
                    "code.namespace": "app.routes",
                    "openinference.span.kind": "CHAIN",
                    "input.mime_type": "application/json",
                    "output.mime_type": "application/json",
                    "input.value": f'{{"question":"what is 2+2?","i":{i}}}',
                    "output.value": f'{{"answer":4,"i":{i}}}',
                },
                events=[],
                links=[],
                status_code=0,
                status_message="",
                trace_state="",
                resource=resource,
                scope_name="looptrace",
                scope_version="0.1.0",
            )
        )
    return out


def _writer_rows(n: int) -> None:
    from looptrace._store import Store

    spans = _spans(n)
    print(f"Store.write alone, {n} spans (10 per trace), search index included")
    print(f"{'batch':<10}{'spans/s':>12}{'CPU us/span':>14}")
    for batch in (512, 4096):
        with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp) / "w.db") as store:
            store.stats()
            cpu, wall = time.process_time(), time.perf_counter()
            for i in range(0, n, batch):
                store.write(spans[i : i + batch])
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        print(f"{batch:<10}{n / wall:>12,.0f}{cpu / n * 1e6:>14.1f}")


_SMALL, _LARGE = 2000, 6000


def _write_only(n: int) -> None:
    from looptrace._store import Store

    # As many spans made whatever the number written: only the writing differs between runs.
    spans = _spans(_LARGE)
    with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp) / "i.db") as store:
        store.stats()
        for i in range(0, n, 512):
            store.write(spans[i : i + 512])


def _instructions_row() -> None:
    counts = []
    for n in (_SMALL, _LARGE):
        out = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--callgrind-out-file=/dev/null",
                sys.executable,
                __file__,
                "--write-only",
                str(n),
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stderr
        counts.append(int(out.split("Collected : ")[1].split()[0]))
    per_span = (counts[1] - counts[0]) / (_LARGE - _SMALL)
    print(f"Store.write, batches of 512: {per_span:,.0f} instructions per span")


def _post_all(url: str, n: int) -> None:
    """The client side of ``--collector``: OTLP protobuf bodies of 512 spans, made first,
    posted from 4 connections at once; prints the seconds from the first to the last answer."""
    import threading

    import httpx

    from looptrace import _otlp
    from looptrace._config import Config
    from looptrace._wire import WireSpan

    cfg = Config()
    resource = _otlp.default_resource(cfg)
    bodies = []
    now = time.time_ns()
    for start in range(0, n, 512):
        wires = []
        for i in range(start, min(n, start + 512)):
            trace, child = divmod(i, 10)
            wires.append(
                WireSpan(
                    trace_id=trace + 1,
                    span_id=child + 1,
                    parent_span_id=0 if child == 0 else 1,
                    name="handle" if child == 0 else "lookup",
                    kind=1,
                    start_ns=now + i * 1000,
                    end_ns=now + i * 1000 + 500,
                    attributes=[
                        ("code.function", "handle" if child == 0 else "lookup"),
                        ("code.namespace", "app.routes"),
                        ("input.value", f'{{"question":"what is 2+2?","i":{i}}}'),
                        ("output.value", f'{{"answer":4,"i":{i}}}'),
                    ],
                    events=[],
                    links=[],
                    status_code=0,
                    status_message="",
                )
            )
        encoded = [_otlp.encode_span(w, "protobuf") for w in wires]
        bodies.append(_otlp.encode_request(encoded, resource, "protobuf"))
    queue = list(reversed(bodies))
    lock = threading.Lock()
    failed: list[int] = []

    def client() -> None:
        with httpx.Client(timeout=120) as http:
            while True:
                with lock:
                    if not queue:
                        return
                    body = queue.pop()
                answer = http.post(
                    url, content=body, headers={"content-type": "application/x-protobuf"}
                )
                if answer.status_code != 200:
                    failed.append(answer.status_code)

    wall = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps({"wall": time.perf_counter() - wall, "failed": len(failed)}))


def _collector_row(n: int) -> None:
    import threading

    import uvicorn

    from looptrace.collector.app import create_app

    with tempfile.TemporaryDirectory() as tmp:
        app = create_app(Path(tmp) / "c.db")
        server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
        )
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        cpu = time.process_time()
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--n",
                str(n),
                "--post",
                f"http://127.0.0.1:{port}/v1/traces",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        cpu = time.process_time() - cpu
        server.should_exit = True
        thread.join(30)
        result = json.loads(out.strip().splitlines()[-1])
        from looptrace._store import Store

        with Store(Path(tmp) / "c.db") as store:
            stored = store.stats()["spans"]
    # The client's CPU (a child process) is not counted; its encoding is done before the clock.
    print(f"through the collector, {n} spans in requests of 512 from 4 connections")
    print(
        f"  {n / result['wall']:,.0f} spans/s, collector CPU {cpu / n * 1e6:.1f} us/span, "
        f"stored {stored}, failed requests {result['failed']}"
    )


def _tight_row(rate: int = 50_000, seconds: float = 4.0) -> None:
    import looptrace
    from looptrace._store import Store

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.db"
        looptrace.configure(store_path=str(path), endpoint=None)

        @looptrace.traced
        def handle(question: str, i: int) -> dict[str, int]:
            return {"answer": 4, "i": i}

        async def main() -> int:
            made = 0
            start = time.perf_counter()
            while True:
                elapsed = time.perf_counter() - start
                if elapsed >= seconds:
                    return made
                # Paced: never ahead of the rate; a loop that falls behind shows in "made".
                due = min(int(elapsed * rate) + 100, int(seconds * rate))
                while made < due:
                    handle("what is 2+2?", made)
                    made += 1
                await asyncio.sleep(0)

        made = asyncio.run(main())
        result = looptrace.shutdown_sync(120)
        stats = looptrace.statistics()
        with Store(path) as store:
            stored = store.stats()["spans"]
    dropped = {k: v for k, v in stats.dropped.items() if v}
    print(f"tight loop at {rate:,} spans/s for {seconds:g} s into the local store")
    print(
        f"  made {made:,} ({made / seconds:,.0f}/s), stored {stored:,}, dropped {dropped or 0}"
        + ("" if result.ok else f", shutdown: {result}")
    )


if __name__ == "__main__":
    main()
