"""Scenario (b): end-to-end throughput and CPU per span, capture plus export.

One asyncio program ends N spans (inputs and output recorded on each, the same facts in every
mode), yielding to the loop every 100 spans, then waits until everything is delivered to a
local OTLP server (running in a child process, so its CPU is not counted; it decodes what it
received only when asked for counts, after each run, so it does not compete with the process
being measured for the machine's cores: on a 2-core VM that competition inflated the CPU time
of whichever client sent fastest). CPU is
``time.process_time()`` of the whole process (every thread: the flusher, the exporter's worker,
compression), minus the same loop without tracing.

Modes, side by side in one run: no tracing; looptrace (protobuf + gzip, the defaults);
OpenTelemetry SDK (TracerProvider + BatchSpanProcessor + OTLP/HTTP protobuf exporter, with
max_queue_size raised to N so it does not drop any span and the CPU figure covers all of them).

    .venv/bin/python benchmarks/scenario_throughput.py [N]
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))

import looptrace
from otlp_server import OtlpServerProcess

N = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
ROUNDS = 3


async def produce(one: Callable[[int], None]) -> None:
    for i in range(N):
        one(i)
        if i % 100 == 99:
            await asyncio.sleep(0)


def none_one(i: int) -> None:
    inputs = {"question": "what is 2+2?", "i": i}
    output = {"answer": 4}
    del inputs, output


def looptrace_one(i: int) -> None:
    with looptrace.span("step") as s:
        s.set_inputs({"question": "what is 2+2?", "i": i})
        s.set_output({"answer": 4})


def otel_one_factory(tracer: Any) -> Callable[[int], None]:
    def one(i: int) -> None:
        with tracer.start_as_current_span("step") as s:
            s.set_attribute("input.value", json.dumps({"question": "what is 2+2?", "i": i}))
            s.set_attribute("input.mime_type", "application/json")
            s.set_attribute("output.value", json.dumps({"answer": 4}))
            s.set_attribute("output.mime_type", "application/json")

    return one


def measure(run: Callable[[], Any]) -> tuple[float, float]:
    gc.collect()
    c0, w0 = time.process_time(), time.perf_counter()
    run()
    return time.process_time() - c0, time.perf_counter() - w0


def main() -> None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    results: dict[str, list[tuple[float, float, int]]] = {"none": [], "looptrace": [], "otel": []}
    with OtlpServerProcess(defer_decode=True) as server:
        looptrace.configure(endpoint=server.endpoint)
        provider = TracerProvider()
        provider.add_span_processor(
            BatchSpanProcessor(OTLPSpanExporter(endpoint=server.endpoint), max_queue_size=N)
        )
        otel_one = otel_one_factory(provider.get_tracer("bench"))

        def run_none() -> None:
            asyncio.run(produce(none_one))

        def run_looptrace() -> None:
            async def go() -> None:
                await produce(looptrace_one)
                result = await looptrace.flush(60)
                assert result.ok, result

            asyncio.run(go())

        def run_otel() -> None:
            asyncio.run(produce(otel_one))
            provider.force_flush(60_000)

        # Warm-up (imports, connections, code caches), not measured.
        N_saved = N
        for run in (run_none, run_looptrace, run_otel):
            run()
        for _ in range(ROUNDS):
            for name, run in (("none", run_none), ("looptrace", run_looptrace), ("otel", run_otel)):
                server.clear()
                cpu, wall = measure(run)
                received = server.stats()["accepted_spans"] if name != "none" else 0
                results[name].append((cpu, wall, received))
        provider.shutdown()
        looptrace.shutdown_sync()
        assert N_saved == N

    def best(name: str) -> tuple[float, float, int]:
        return min(results[name])

    cpu_none, wall_none, _ = best("none")
    print(f"throughput: {N} spans per run, best of {ROUNDS} (CPU = all threads of the process)")
    print(
        f"{'mode':<20} {'CPU us/span':>12} {'wall s':>8} {'spans/s end-to-end':>19} {'delivered':>10}"
    )
    per_span = {}
    for name, label in (("looptrace", "looptrace"), ("otel", "OpenTelemetry SDK")):
        cpu, wall, received = best(name)
        per_span[name] = (cpu - cpu_none) / N * 1e6
        print(
            f"{label:<20} {per_span[name]:>12.1f} {wall:>8.3f} {received / wall:>19,.0f} "
            f"{received:>10}"
        )
    print(f"{'no tracing (loop)':<20} {cpu_none / N * 1e6:>12.1f} {wall_none:>8.3f}")
    print(
        f"OpenTelemetry SDK / looptrace CPU per span: {per_span['otel'] / per_span['looptrace']:.1f}x "
        "(goal >= 5x)"
    )


if __name__ == "__main__":
    main()
