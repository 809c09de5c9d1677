"""Memory under a flood: 200,000 spans of 1 KB each against a backend that takes 1 s per request,
looptrace against the OpenTelemetry SDK, in one run.

Each row runs in a child process of its own (so peak RSS is its own): the program ends 200,000
spans, each carrying a 1 KB string attribute, as fast as it can (yielding to its loop every
1,000), gives the exporter a few seconds to deliver, and shuts down. Reported per row: peak RSS
above the process's baseline (taken after a warm-up span was sent), how many spans the backend
received, and where every other span went.

looptrace runs with a 16 MiB buffer (``--budget-mib``, ``LOOPTRACE_MAX_BUFFER_BYTES``; its
default is 256 MiB) and its defaults otherwise
(4 requests of at most 4 MiB in flight, the spool on, in a temporary folder). Its documented
memory bound (docs/pipeline.md, "Bounds") is the buffer's bytes plus what is in flight:
16 MiB + 4 x 4 MiB = 32 MiB; the row says whether the peak RSS growth stayed within it. What the
bound cannot hold goes to the spool during the flood (the backend cannot keep up), or is dropped
and counted (a producer faster than the spill): sent + spooled + dropped = 200,000. The
OpenTelemetry SDK runs with its defaults (BatchSpanProcessor, a queue of 2,048 spans); what it
drops it does not count.

    .venv/bin/python benchmarks/scenario_flood.py [--spans 200000] [--latency 1.0] [--budget-mib 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))

from otlp_server import OtlpServerProcess

DRAIN_SECONDS = 5.0
PAYLOAD = ("lorem ipsum dolor sit amet, consectetur adipiscing elit " * 20)[:1024]


def peak_rss_mib() -> float:
    scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB elsewhere
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**20


def child(mode: str, endpoint: str, spans: int, spool_dir: str, budget: int) -> None:
    out: dict[str, object] = {"mode": mode}
    if mode == "looptrace":
        import looptrace

        cfg = looptrace.configure(
            endpoint=endpoint, max_buffer_bytes=budget, spool_dir=Path(spool_dir)
        )
        out["bound_mib"] = (
            cfg.max_buffer_bytes + cfg.max_concurrent_requests * cfg.max_batch_bytes
        ) / 2**20
        # Warm-up (imports, connection) before the baseline: the flood is what is measured.
        with looptrace.span("warm-up"):
            pass
        looptrace.flush_sync(5)
        baseline = peak_rss_mib()

        async def go() -> None:
            for i in range(spans):
                with looptrace.span("flood") as s:
                    s.set_attribute("i", i)
                    s.set_attribute("payload", PAYLOAD)
                if i % 1000 == 999:
                    await asyncio.sleep(0)
            out["produce_s"] = time.perf_counter() - t0
            await looptrace.flush(DRAIN_SECONDS)

        t0 = time.perf_counter()
        asyncio.run(go())
        looptrace.shutdown_sync(5.0)
        stats = looptrace.statistics()
        out.update(
            sent=stats.spans_sent - 1,
            spooled=stats.spooled,
            dropped={k: v for k, v in stats.dropped.items() if v},
            spool_dropped={k: v for k, v in stats.spool.dropped.items() if v},
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
        baseline = peak_rss_mib()

        async def go_otel() -> None:
            for i in range(spans):
                with tracer.start_as_current_span("flood") as s:
                    s.set_attribute("i", i)
                    s.set_attribute("payload", PAYLOAD)
                if i % 1000 == 999:
                    await asyncio.sleep(0)
            out["produce_s"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        asyncio.run(go_otel())
        provider.force_flush(int(DRAIN_SECONDS * 1000))
        provider.shutdown()
    out["rss_growth_mib"] = peak_rss_mib() - baseline
    out["wall_s"] = time.perf_counter() - t0
    print(json.dumps(out))


def main() -> None:
    if len(sys.argv) == 7 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], int(sys.argv[6]))
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--spans", type=int, default=200_000)
    parser.add_argument("--latency", type=float, default=1.0)
    parser.add_argument("--budget-mib", type=int, default=16, help="looptrace's buffer budget")
    args = parser.parse_args()
    rows = []
    with OtlpServerProcess(latency=args.latency) as server, tempfile.TemporaryDirectory() as tmp:
        for mode in ("looptrace", "otel"):
            server.clear()
            proc = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--child",
                    mode,
                    server.endpoint,
                    str(args.spans),
                    tmp,
                    str(args.budget_mib * 2**20),
                ],
                capture_output=True,
                text=True,
                timeout=600,
                env={
                    **{k: v for k, v in os.environ.items() if not k.startswith("LOOPTRACE_")},
                    "PYTHONPATH": os.environ.get(
                        "PYTHONPATH", str(Path(__file__).parent.parent / "src")
                    ),
                },
            )
            if proc.returncode != 0:
                print(proc.stderr)
                raise SystemExit(1)
            data = json.loads(proc.stdout.strip().splitlines()[-1])
            time.sleep(args.latency * 2)  # let answers to abandoned requests land first
            data["received"] = server.stats()["accepted_spans"] - 1  # minus the warm-up span
            rows.append(data)
    print(
        f"flood: {args.spans:,} spans of 1 KB, backend latency {args.latency:g} s, "
        f"{DRAIN_SECONDS:g} s to drain; looptrace buffer {args.budget_mib} MiB"
    )
    print(
        f"{'':<18} {'produce s':>9} {'RSS growth MiB':>15} {'bound MiB':>10} {'received':>9}  "
        "where the rest went"
    )
    for d in rows:
        if d["mode"] == "looptrace":
            label, bound = "looptrace", f"{d['bound_mib']:.0f}"
            rest = {"spooled": d["spooled"], **d["dropped"]}  # type: ignore[dict-item]
            where = ", ".join(f"{k}={v:,}" for k, v in rest.items() if v) or "-"
            accounted = d["sent"] + d["spooled"] + sum(d["dropped"].values())  # type: ignore[union-attr]
            where += f" (sent + spooled + dropped = {accounted:,})"
            if d["spool_dropped"]:
                where += f"; the spool dropped {d['spool_dropped']}"
        else:
            label, bound = "OpenTelemetry SDK", "-"
            where = f"{args.spans - d['received']:,} lost, none counted"  # type: ignore[operator]
        print(
            f"{label:<18} {d['produce_s']:>9.2f} {d['rss_growth_mib']:>15.0f} {bound:>10} "
            f"{d['received']:>9,}  {where}"
        )


if __name__ == "__main__":
    main()
