"""Recovery after an outage, side by side in one run: looptrace against the OpenTelemetry SDK.

The backend (an OTLP/HTTP sink in another process) answers 503 for the first 3 s of the run
while the application emits 2,000 spans evenly over those 3 s, then answers 200 again; with
``--retry-after 2`` it answers 429 with ``Retry-After: 2`` instead (a rate limit), and the
spans are emitted over the outage plus the Retry-After (5 s), so that a client that honours the
header can have delivered the backlog before emission ends; the row then also says how late the
first request after each 429 came, past the time its Retry-After allowed (negative: early, the
header not honoured). Per row:
how long after the last span was emitted the last one arrived, how many requests the backend
was handling at once while it failed (once the first failure was answered), how many spans
never arrived and how many arrived twice. Rounds alternate the rows.

    .venv/bin/python benchmarks/scenario_outage.py [--rounds 3] [--spans 2000] [--outage 3]
        [--retry-after 2]
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from typing import Any


def sink_main() -> None:
    """Answers 503 until the deadline set by ``GET /fail/<seconds>`` (429 with ``Retry-After``
    after ``GET /fail/<seconds>/<retry after>``), then 200; ``GET /stats`` reports what it saw
    since."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    lock = threading.Lock()
    state: dict[str, Any] = {}

    def reset(seconds: float, retry_after: str | None = None) -> None:
        state.update(
            retry_after=retry_after,
            due=None,
            late=[],
            fail_until=time.monotonic() + seconds,
            first_failure_answered=None,
            active=0,
            most_while_failing=0,
            seen={},
            last_accepted=0.0,
        )

    reset(0.0)

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            with lock:
                if state["due"] is not None:
                    state["late"].append(time.monotonic() - state["due"])
                    state["due"] = None
                state["active"] += 1
                failing = time.monotonic() < state["fail_until"]
                if failing and state["first_failure_answered"] is not None:
                    state["most_while_failing"] = max(state["most_while_failing"], state["active"])
            try:
                if failing:
                    status = 503 if state["retry_after"] is None else 429
                else:
                    status = 200
                    if self.headers.get("Content-Encoding") == "gzip":
                        import gzip

                        body = gzip.decompress(body)
                    request = ExportTraceServiceRequest.FromString(body)
                    with lock:
                        for rs in request.resource_spans:
                            for ss in rs.scope_spans:
                                for span in ss.spans:
                                    key = (span.trace_id, span.span_id)
                                    state["seen"][key] = state["seen"].get(key, 0) + 1
                        state["last_accepted"] = time.time()
                self.send_response(status)
                if status == 429:
                    self.send_header("Retry-After", state["retry_after"])
                    with lock:
                        state["due"] = time.monotonic() + float(state["retry_after"])
                self.send_header("Content-Length", "0")
                self.end_headers()
            finally:
                with lock:
                    state["active"] -= 1
                    if failing and state["first_failure_answered"] is None:
                        state["first_failure_answered"] = time.monotonic()

        def do_GET(self) -> None:
            with lock:
                if self.path.startswith("/fail/"):
                    fields = self.path.split("/")[2:]
                    reset(float(fields[0]), fields[1] if len(fields) > 1 else None)
                seen = state["seen"]
                stats = {
                    "unique": len(seen),
                    "twice": sum(1 for n in seen.values() if n > 1),
                    "most_while_failing": state["most_while_failing"],
                    "last_accepted": state["last_accepted"],
                    "late": state["late"],
                }
            payload = json.dumps(stats).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sys.stdin.read()


def row_main(kind: str, url: str, spans: int, seconds: float) -> None:
    """Emit ``spans`` spans over ``seconds`` through ``kind``; print when emission ended."""
    if kind == "looptrace":
        import looptrace

        looptrace.configure(endpoint=url, service_name="bench", retry_budget=120)

        def emit(i: int) -> None:
            with looptrace.span(f"s{i}"):
                pass

        def finish() -> None:
            looptrace.flush_sync(timeout=120)

    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url)))
        tracer = provider.get_tracer("bench")

        def emit(i: int) -> None:
            with tracer.start_as_current_span(f"s{i}"):
                pass

        def finish() -> None:
            provider.force_flush(120_000)
            provider.shutdown()

    start = time.monotonic()
    for i in range(spans):
        emit(i)
        time.sleep(max(0.0, start + (i + 1) * seconds / spans - time.monotonic()))
    print(time.time(), flush=True)
    finish()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sink", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--row", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--spans", type=int, default=2000)
    parser.add_argument("--outage", type=float, default=3.0)
    parser.add_argument(
        "--retry-after", help="answer 429 with this Retry-After (seconds) instead of 503"
    )
    parser.add_argument(
        "--emit", type=float, help="seconds of emission (default: the outage, plus the Retry-After)"
    )
    args = parser.parse_args()
    if args.sink:
        sink_main()
        return
    if args.row:
        kind, url, spans, seconds = args.row
        row_main(kind, url, int(spans), float(seconds))
        return
    sink = subprocess.Popen(
        [sys.executable, __file__, "--sink"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert sink.stdout is not None
    base = f"http://127.0.0.1:{int(sink.stdout.readline())}"

    def get(path: str) -> dict[str, Any]:
        with urllib.request.urlopen(base + path) as r:
            return json.loads(r.read())  # type: ignore[no-any-return]

    failing = "503" if args.retry_after is None else f"429 with Retry-After: {args.retry_after}"
    fail_path = f"/fail/{args.outage}" + (
        "" if args.retry_after is None else f"/{args.retry_after}"
    )
    emit = args.emit or args.outage + float(args.retry_after or 0)
    late_column = args.retry_after is not None
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs: {args.spans} spans over "
        f"{emit:g} s; the backend answers {failing} for {args.outage:g} s, then 200"
    )
    print(
        f"{'':<22}{'last span after emission (s)':>30}{'at once while failing':>24}{'lost':>7}"
        f"{'twice':>7}" + (f"{'retries past Retry-After (ms)':>32}" if late_column else "")
    )
    results: dict[str, list[float]] = {}
    try:
        for r in range(args.rounds):
            for kind in ("looptrace", "OpenTelemetry SDK"):
                get(fail_path)
                out = subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--row",
                        "looptrace" if kind == "looptrace" else "otel",
                        base + "/v1/traces",
                        str(args.spans),
                        str(emit),
                    ],
                    capture_output=True,
                    text=True,
                    timeout=300,
                    env={k: v for k, v in os.environ.items() if not k.startswith("LOOPTRACE_")},
                )
                emitted = float(out.stdout.split()[0])
                stats = get("/stats")
                after = stats["last_accepted"] - emitted if stats["unique"] else float("nan")
                results.setdefault(kind, []).append(after)
                late = ", ".join(f"{x * 1000:.0f}" for x in stats["late"]) or "-"
                print(
                    f"{kind + ' #' + str(r + 1):<22}{after:>30.3f}{stats['most_while_failing']:>24}"
                    f"{args.spans - stats['unique']:>7}{stats['twice']:>7}"
                    + (f"{late:>32}" if late_column else ""),
                    flush=True,
                )
        for kind, got in results.items():
            print(f"median {kind:<15}{statistics.median(got):>30.3f}")
    finally:
        assert sink.stdin is not None
        sink.stdin.close()
        sink.wait(10)


if __name__ == "__main__":
    main()
