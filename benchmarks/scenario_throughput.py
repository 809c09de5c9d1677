"""Scenario (b): end-to-end throughput and CPU per span, capture plus export.

One asyncio program makes N calls (each records an input and an output, the same facts in
every mode), yielding to the loop every 100 calls, then waits until everything is delivered to a
local OTLP server (running in a child process, so its CPU is not counted; it decodes what it
received only when asked for counts, after each run, so it does not compete with the process
being measured for the machine's cores: on a 2-core VM that competition inflated the CPU time
of whichever client sent fastest). CPU is
``time.process_time()`` of the whole process (every thread: the flusher, the exporter's worker,
compression), minus the same loop without tracing.

Two shapes of call: one span each, and an outer span with a child (the child carries the
input and output): 2N spans, the shape of a traced function that calls another.

Modes, side by side in one run: no tracing; looptrace (the defaults); OpenTelemetry SDK
(TracerProvider + BatchSpanProcessor + OTLP/HTTP protobuf exporter, with max_queue_size raised
to 2N so it does not drop any span and the CPU figure covers all of them).

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


def looptrace_nested(i: int) -> None:
    with looptrace.span("outer"):
        looptrace_one(i)


def otel_one_factory(tracer: Any) -> Callable[[int], None]:
    def one(i: int) -> None:
        with tracer.start_as_current_span("step") as s:
            s.set_attribute("input.value", json.dumps({"question": "what is 2+2?", "i": i}))
            s.set_attribute("input.mime_type", "application/json")
            s.set_attribute("output.value", json.dumps({"answer": 4}))
            s.set_attribute("output.mime_type", "application/json")

    return one


def otel_nested_factory(tracer: Any) -> Callable[[int], None]:
    one = otel_one_factory(tracer)

    def nested(i: int) -> None:
        with tracer.start_as_current_span("outer"):
            one(i)

    return nested


def measure(run: Callable[[], Any]) -> tuple[float, float]:
    gc.collect()
    c0, w0 = time.process_time(), time.perf_counter()
    run()
    return time.process_time() - c0, time.perf_counter() - w0


def main() -> None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    Result = tuple[float, float, int]  # CPU s, wall s, spans received
    with OtlpServerProcess(defer_decode=True) as server:
        looptrace.configure(endpoint=server.endpoint)
        provider = TracerProvider()
        provider.add_span_processor(
            BatchSpanProcessor(OTLPSpanExporter(endpoint=server.endpoint), max_queue_size=2 * N)
        )
        tracer = provider.get_tracer("bench")

        def run_none() -> None:
            asyncio.run(produce(none_one))

        def looptrace_runner(one: Callable[[int], None]) -> Callable[[], None]:
            def run() -> None:
                async def go() -> None:
                    await produce(one)
                    result = await looptrace.flush(60)
                    assert result.ok, result

                asyncio.run(go())

            return run

        def otel_runner(one: Callable[[int], None]) -> Callable[[], None]:
            def run() -> None:
                asyncio.run(produce(one))
                provider.force_flush(60_000)

            return run

        shapes = (
            ("one span per call", 1, looptrace_one, otel_one_factory(tracer)),
            ("outer + child per call", 2, looptrace_nested, otel_nested_factory(tracer)),
        )
        tables: list[tuple[str, int, dict[str, list[Result]]]] = []
        for label, spans, lt_one, otel_one in shapes:
            modes = (
                ("none", run_none),
                ("looptrace", looptrace_runner(lt_one)),
                ("otel", otel_runner(otel_one)),
            )
            results: dict[str, list[Result]] = {name: [] for name, _ in modes}
            for _, run in modes:  # warm-up (imports, connections, code caches), not measured
                run()
            for _ in range(ROUNDS):
                for name, run in modes:
                    server.clear()
                    cpu, wall = measure(run)
                    received = server.stats()["accepted_spans"] if name != "none" else 0
                    results[name].append((cpu, wall, received))
            tables.append((label, spans, results))
        provider.shutdown()
        looptrace.shutdown_sync()

    for label, spans, results in tables:
        cpu_none, wall_none, _ = min(results["none"])
        total = N * spans
        print(f"\nthroughput, {label}: {total} spans per run, best of {ROUNDS} (CPU = all threads)")
        print(
            f"{'mode':<20} {'CPU us/span':>12} {'wall s':>8} {'spans/s end-to-end':>19} "
            f"{'delivered':>10}"
        )
        per_span = {}
        for name, mode in (("looptrace", "looptrace"), ("otel", "OpenTelemetry SDK")):
            cpu, wall, received = min(results[name])
            per_span[name] = (cpu - cpu_none) / total * 1e6
            print(
                f"{mode:<20} {per_span[name]:>12.1f} {wall:>8.3f} {received / wall:>19,.0f} "
                f"{received:>10}"
            )
        print(f"{'no tracing (loop)':<20} {cpu_none / total * 1e6:>12.1f} {wall_none:>8.3f}")
        ratio = per_span["otel"] / per_span["looptrace"]
        # The design's goal is 5 us a span where OpenTelemetry measured 49.7: in proportion,
        # since this machine's speed moves from day to day, 9.9x.
        print(f"OpenTelemetry SDK / looptrace CPU per span: {ratio:.1f}x (goal 9.9x)")


if __name__ == "__main__":
    main()
