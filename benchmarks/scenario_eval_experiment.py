"""An evaluation against a slow backend: 40 examples x 8 spans, concurrency 4, 300 ms server latency.

Each example's task runs 8 traced steps in turn; each step awaits 10 ms and takes and returns a
128-byte payload. The same experiment runs three ways, side by side in one process:

- no tracing: ``looptrace.configure(disabled=True)``, same ``exp.run`` code;
- looptrace: spans flow through the normal pipeline to a local OTLP server (in a child process,
  so its CPU is not charged to the run) that answers every request after 300 ms; the wall time
  includes leaving the block (the final flush);
- OpenTelemetry SDK: the same spans (case root + 8 steps, payloads as JSON attributes) with a
  BatchSpanProcessor + OTLPSpanExporter to the same server, an asyncio.Semaphore for the
  concurrency, and ``force_flush()`` at the end, inside the timed region.

Prints the wall times (median of ROUNDS), looptrace's distance from the no-tracing wall in round
trips, and how many requests the server received per run. Run with
``.venv/bin/python benchmarks/scenario_eval_experiment.py``.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))

import looptrace

EXAMPLES = 40
STEPS = 8
CONCURRENCY = 4
STEP_SECONDS = 0.01
LATENCY = 0.3
ROUNDS = 5
PAYLOAD = "x" * 128

DATASET = [{"input": f"{i:03d}" + PAYLOAD[3:], "expected": i} for i in range(EXAMPLES)]


@looptrace.traced(name="step")
async def step(index: int, payload: str) -> str:
    await asyncio.sleep(STEP_SECONDS)
    return payload[::-1]


async def task(payload: str) -> str:
    for i in range(STEPS):
        payload = await step(i, payload)
    return payload


def same_length(output: str, input: str) -> bool:
    return len(output) == len(input)


async def run_looptrace(label: str) -> tuple[float, float, looptrace.ExperimentSummary]:
    """(wall including the final flush, time until the last case finished, summary)."""
    start = time.perf_counter()
    async with looptrace.experiment(label, quiet=True, progress=False) as exp:
        await exp.run(task, DATASET, scorers=[same_length], concurrency=CONCURRENCY)
        cases_done = time.perf_counter() - start
    wall = time.perf_counter() - start
    return wall, cases_done, exp.summary()


def run_otel(url: str) -> float:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url)))
    tracer = provider.get_tracer("bench")

    async def otel_step(index: int, payload: str) -> str:
        with tracer.start_as_current_span("step") as span:
            span.set_attribute("input.value", json.dumps({"index": index, "payload": payload}))
            await asyncio.sleep(STEP_SECONDS)
            out = payload[::-1]
            span.set_attribute("output.value", json.dumps(out))
            return out

    async def case(sem: asyncio.Semaphore, index: int, item: dict[str, Any]) -> None:
        async with sem:
            with tracer.start_as_current_span(f"case {index}") as span:
                span.set_attribute("input.value", json.dumps(item["input"]))
                payload = item["input"]
                for i in range(STEPS):
                    payload = await otel_step(i, payload)
                span.set_attribute("output.value", json.dumps(payload))
                span.set_attribute("looptrace.score.same_length", float(len(payload) == 128))

    async def main() -> float:
        sem = asyncio.Semaphore(CONCURRENCY)
        start = time.perf_counter()
        await asyncio.gather(*(case(sem, i, item) for i, item in enumerate(DATASET)))
        # Not on the loop's thread in real code either: force_flush blocks until exported.
        await asyncio.to_thread(provider.force_flush, 30_000)
        return time.perf_counter() - start

    try:
        return asyncio.run(main())
    finally:
        provider.shutdown()


def main() -> None:
    from otlp_server import OtlpServerProcess

    walls: dict[str, list[float]] = {"no tracing": [], "looptrace": [], "OpenTelemetry SDK": []}
    requests: dict[str, list[int]] = {"looptrace": [], "OpenTelemetry SDK": []}
    cases_done: list[float] = []
    spans: list[int] = []
    summaries: list[looptrace.ExperimentSummary] = []
    cold: dict[str, float] = {}
    with OtlpServerProcess(latency=LATENCY) as server:
        # Round 0 is the cold start (imports, first connection); it is shown apart and left out
        # of the medians.
        for round_ in range(ROUNDS + 1):
            looptrace.configure(disabled=True)
            wall, _done, _summary = asyncio.run(run_looptrace("eval-off"))
            off = wall

            server.clear()
            looptrace.configure(endpoint=server.endpoint, service_name="bench-eval")
            wall, done, summary = asyncio.run(run_looptrace("eval-on"))
            stats = server.stats()
            on, on_requests, on_spans = wall, stats["requests"], stats["accepted_spans"]

            server.clear()
            otel = run_otel(server.endpoint)
            if round_ == 0:
                cold = {"no tracing": off, "looptrace": on, "OpenTelemetry SDK": otel}
                continue
            walls["no tracing"].append(off)
            walls["looptrace"].append(on)
            walls["OpenTelemetry SDK"].append(otel)
            requests["looptrace"].append(on_requests)
            requests["OpenTelemetry SDK"].append(server.stats()["requests"])
            cases_done.append(done)
            spans.append(on_spans)
            summaries.append(summary)
        looptrace.shutdown_sync(timeout=10)

    med = {k: statistics.median(v) for k, v in walls.items()}
    base = med["no tracing"]
    print(
        f"\nEval: {EXAMPLES} examples x {STEPS} step spans, concurrency {CONCURRENCY}, "
        f"{STEP_SECONDS * 1000:.0f} ms per step, {len(PAYLOAD)}-byte payloads, "
        f"server latency {LATENCY * 1000:.0f} ms; median of {ROUNDS} warm runs\n"
    )
    print(
        f"{'run':<20}{'wall s':>9}{'- no tracing':>14}{'round trips':>13}"
        f"{'cold run s':>12}  requests per run"
    )
    for label in walls:
        wall = med[label]
        extra = wall - base
        reqs = requests.get(label)
        req_text = "-" if reqs is None else " ".join(str(r) for r in reqs)
        trips = "-" if label == "no tracing" else f"{extra / LATENCY:.2f}"
        print(f"{label:<20}{wall:>9.3f}{extra:>+14.3f}{trips:>13}{cold[label]:>12.3f}  {req_text}")
    last = summaries[-1]
    done = statistics.median(cases_done)
    print(
        f"\nlooptrace: last case done at {done:.3f} s ({done - base:+.3f} s vs the whole "
        f"no-tracing run), final flush {med['looptrace'] - done:.3f} s; spans delivered per run "
        f"{spans}; dropped {last.spans_dropped}, unsent {last.unsent}, worst loop lag "
        f"{statistics.median(s.worst_loop_lag_ms or 0 for s in summaries):.1f} ms (median), "
        f"backpressure waits {sum(s.backpressure_waits for s in summaries)}"
    )
    verdict = "within" if med["looptrace"] - base <= LATENCY else "NOT within"
    print(f"looptrace wall is {verdict} one round trip ({LATENCY:.1f} s) of the no-tracing wall")


if __name__ == "__main__":
    main()
