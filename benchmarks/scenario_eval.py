"""Scenario (a): an evaluation of 40 examples x 8 spans, concurrency 4, 128-byte payloads,
against an OTLP server that takes 300 ms per request. Side by side in one run: no tracing,
looptrace, and the OpenTelemetry SDK (BatchSpanProcessor + OTLP/HTTP exporter, defaults).

Each mode's wall time runs from the first example to "everything delivered" (looptrace:
``await looptrace.flush()``; OpenTelemetry: ``provider.force_flush()``), and the server counts the
requests. The goal: looptrace's wall <= no-tracing wall + one round trip.

    .venv/bin/python benchmarks/scenario_eval.py
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))

import looptrace
from otlp_server import OtlpServerProcess

EXAMPLES = 40
SPANS_PER_EXAMPLE = 8  # one case span + 7 steps
CONCURRENCY = 4
PAYLOAD = "x" * 128
STEP_SECONDS = 0.01  # each step awaits this long (a fast model call)
LATENCY = 0.3

SpanFactory = Callable[[str, str], Any]


def no_span(name: str, payload: str) -> Any:
    return contextlib.nullcontext()


@contextlib.contextmanager
def looptrace_span(name: str, payload: str) -> Any:
    with looptrace.span(name) as s:
        s.set_inputs({"text": payload})
        yield
        s.set_output(payload)


def otel_span_factory(tracer: Any) -> SpanFactory:
    @contextlib.contextmanager
    def make(name: str, payload: str) -> Any:
        with tracer.start_as_current_span(name) as s:
            s.set_attribute("input.value", json.dumps({"text": payload}))
            s.set_attribute("input.mime_type", "application/json")
            yield
            s.set_attribute("output.value", json.dumps(payload))
            s.set_attribute("output.mime_type", "application/json")

    return make


async def example(i: int, make: SpanFactory) -> None:
    with make(f"case-{i}", PAYLOAD):
        for step in range(SPANS_PER_EXAMPLE - 1):
            with make(f"step-{step}", PAYLOAD):
                await asyncio.sleep(STEP_SECONDS)


async def evaluation(make: SpanFactory) -> None:
    sem = asyncio.Semaphore(CONCURRENCY)

    async def one(i: int) -> None:
        async with sem:
            await example(i, make)

    await asyncio.gather(*(one(i) for i in range(EXAMPLES)))


async def run_none() -> float:
    t0 = time.perf_counter()
    await evaluation(no_span)
    return time.perf_counter() - t0


async def run_looptrace() -> tuple[float, Any]:
    t0 = time.perf_counter()
    await evaluation(looptrace_span)
    result = await looptrace.flush(30)
    return time.perf_counter() - t0, result


async def run_otel(provider: Any, tracer: Any) -> float:
    t0 = time.perf_counter()
    await evaluation(otel_span_factory(tracer))
    provider.force_flush(30_000)
    return time.perf_counter() - t0


def main() -> None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    total = EXAMPLES * SPANS_PER_EXAMPLE
    rows = []
    with OtlpServerProcess(latency=LATENCY) as server:
        looptrace.configure(endpoint=server.endpoint)
        # Warm up imports and connections for both SDKs (not measured).
        asyncio.run(run_looptrace())
        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=server.endpoint)))
        tracer = provider.get_tracer("bench")
        asyncio.run(run_otel(provider, tracer))

        server.clear()
        wall_none = asyncio.run(run_none())
        rows.append(("no tracing", wall_none, 0, 0))

        server.clear()
        wall_lt, result = asyncio.run(run_looptrace())
        stats = server.stats()
        assert result.ok, result
        rows.append(("looptrace", wall_lt, stats["requests"], stats["accepted_spans"]))

        server.clear()
        wall_otel = asyncio.run(run_otel(provider, tracer))
        stats = server.stats()
        rows.append(("OpenTelemetry SDK", wall_otel, stats["requests"], stats["accepted_spans"]))
        provider.shutdown()
        looptrace.shutdown_sync()

    print(
        f"eval: {EXAMPLES} examples x {SPANS_PER_EXAMPLE} spans, concurrency {CONCURRENCY}, "
        f"{len(PAYLOAD)}-byte payloads, server latency {LATENCY * 1000:.0f} ms"
    )
    print(f"{'mode':<20} {'wall s':>8} {'vs none':>9} {'requests':>9} {'spans recv':>11}")
    for name, wall, requests, spans in rows:
        extra = f"+{(wall - wall_none) * 1000:.0f} ms" if name != "no tracing" else "-"
        received = f"{spans}/{total}" if name != "no tracing" else "-"
        print(f"{name:<20} {wall:>8.3f} {extra:>9} {requests:>9} {received:>11}")
    print(
        f"looptrace overhead: {(wall_lt - wall_none) * 1000:.0f} ms "
        f"({(wall_lt - wall_none) / LATENCY:.2f} round trips); goal <= 1 round trip"
    )


if __name__ == "__main__":
    main()
