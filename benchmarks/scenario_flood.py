"""Scenario (c): a flood of 200,000 spans against a slow server (500 ms per request).

Each mode runs in its own child process (so peak RSS is its own): the program ends 200,000
spans as fast as it can (yielding every 1,000), then gives the exporter 5 s to deliver and shuts
down. Reported: peak RSS above the process's baseline, spans the server received, and every
drop by reason. looptrace runs with a 16 MB buffer budget (LOOPTRACE_MAX_BUFFER_BYTES), the
OpenTelemetry SDK with its defaults (BatchSpanProcessor, max_queue_size 2048).

    .venv/bin/python benchmarks/scenario_flood.py
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))

from otlp_server import OtlpServerProcess

SPANS = 200_000
LATENCY = 0.5
BUDGET = 16 * 1024 * 1024
DRAIN_SECONDS = 5.0


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def heap_peak_mb() -> float:
    return tracemalloc.get_traced_memory()[1] / 2**20


def child(mode: str, endpoint: str) -> None:
    import looptrace

    out: dict[str, object] = {"mode": mode}
    if mode == "looptrace":
        looptrace.configure(endpoint=endpoint, max_buffer_bytes=BUDGET)
        # Warm-up (imports, connection) before the baseline: the flood is what is measured.
        with looptrace.span("warm-up"):
            pass
        looptrace.flush_sync(5)
        tracemalloc.start()
        baseline = rss_mb()

        async def go() -> None:
            for i in range(SPANS):
                with looptrace.span("flood") as s:
                    s.set_attribute("i", i)
                if i % 1000 == 999:
                    await asyncio.sleep(0)
            out["produce_s"] = time.perf_counter() - t0
            out["max_queued_bytes"] = looptrace.statistics().queued_bytes
            await looptrace.flush(DRAIN_SECONDS)

        t0 = time.perf_counter()
        asyncio.run(go())
        result = looptrace.shutdown_sync(2.0)
        stats = looptrace.statistics()
        out.update(
            sent=stats.spans_sent - 1,
            dropped=dict(stats.dropped),
            requests=stats.requests_sent,
            shutdown_result_dropped=dict(result.dropped),
        )
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
        tracer = provider.get_tracer("flood")
        with tracer.start_as_current_span("warm-up"):
            pass
        provider.force_flush(5000)
        tracemalloc.start()
        baseline = rss_mb()

        async def go_otel() -> None:
            for i in range(SPANS):
                with tracer.start_as_current_span("flood") as s:
                    s.set_attribute("i", i)
                if i % 1000 == 999:
                    await asyncio.sleep(0)
            out["produce_s"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        asyncio.run(go_otel())
        provider.force_flush(int(DRAIN_SECONDS * 1000))
        provider.shutdown()
        out.update(sent=None, dropped=None)
    out["peak_rss_mb"] = rss_mb() - baseline
    out["peak_heap_mb"] = heap_peak_mb()
    out["wall_s"] = time.perf_counter() - t0
    print(json.dumps(out))


def main() -> None:
    if len(sys.argv) == 3:
        child(sys.argv[1], sys.argv[2])
        return
    rows = []
    with OtlpServerProcess(latency=LATENCY) as server:
        for mode in ("looptrace", "otel"):
            server.clear()
            proc = subprocess.run(
                [sys.executable, __file__, mode, server.endpoint],
                capture_output=True,
                text=True,
                timeout=120,
                env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent / "src")},
            )
            if proc.returncode != 0:
                print(proc.stderr)
                raise SystemExit(1)
            data = json.loads(proc.stdout.strip().splitlines()[-1])
            time.sleep(LATENCY * 2)  # let answers to abandoned requests land before counting
            data["received"] = server.stats()["accepted_spans"] - 1  # minus the warm-up span
            rows.append(data)
    print(
        f"flood: {SPANS:,} spans, server latency {LATENCY * 1000:.0f} ms, {DRAIN_SECONDS:.0f} s "
        f"to drain; looptrace buffer budget {BUDGET // 2**20} MB"
    )
    print(
        f"{'mode':<18} {'produce s':>9} {'peak heap MB':>12} {'peak RSS +MB':>13} {'received':>9} "
        f"{'counted drops':>40}"
    )
    for d in rows:
        label = "looptrace" if d["mode"] == "looptrace" else "OpenTelemetry SDK"
        if d["dropped"] is None:
            drops = f"{SPANS - d['received']:,} lost, none reported"
        else:
            drops = ", ".join(f"{k}={v:,}" for k, v in d["dropped"].items() if v) or "none"
        print(
            f"{label:<18} {d['produce_s']:>9.2f} {d['peak_heap_mb']:>12.1f} {d['peak_rss_mb']:>13.0f} "
            f"{d['received']:>9,} "
            f"{drops:>40}"
        )
        if d["dropped"] is not None:
            accounted = d["sent"] + sum(d["dropped"].values())
            print(
                f"{'':<18} sent {d['sent']:,} + dropped {sum(d['dropped'].values()):,} = "
                f"{accounted:,} (of {SPANS:,}); max queued bytes {d['max_queued_bytes']:,}"
            )


if __name__ == "__main__":
    main()
