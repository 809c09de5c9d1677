"""Side by side in one run: what a traced call costs the caller, with the exporter running.

Compares the same function called plain, with ``@looptrace.traced`` (real pipeline sending to a
local OTLP server), and with an OpenTelemetry SDK span doing the same job (inputs and output
recorded as JSON attributes, BatchSpanProcessor + OTLP/HTTP exporter to the same server).
Prints per-call microseconds, the cost added per span, and the ratios; then the first traced
call of a fresh process against its hundredth (``scenario_first_call.py``).
"""

from __future__ import annotations

import asyncio
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))

import looptrace

CALLS = 20_000
ROUNDS = 7


def work(a: int, b: str) -> int:
    return a + len(b)


async def awork(a: int, b: str) -> int:
    return a + len(b)


def otel_tracer(url: str) -> tuple[Any, Any]:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url)))
    return provider, provider.get_tracer("bench")


def otel_wrap(tracer: Any, fn: Callable[..., Any]) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """What a user of the OpenTelemetry SDK writes to record the same facts."""

    def sync(a: int, b: str) -> int:
        with tracer.start_as_current_span("work") as span:
            span.set_attribute("input.value", json.dumps({"a": a, "b": b}))
            out = fn(a, b)
            span.set_attribute("output.value", json.dumps(out))
            return out  # type: ignore[no-any-return]

    async def asyn(a: int, b: str) -> int:
        with tracer.start_as_current_span("awork") as span:
            span.set_attribute("input.value", json.dumps({"a": a, "b": b}))
            out = await fn(a, b)
            span.set_attribute("output.value", json.dumps(out))
            return out  # type: ignore[no-any-return]

    return sync, asyn


def time_sync(fn: Callable[[int, str], Any]) -> float:
    gc.collect()
    start = time.perf_counter()
    for i in range(CALLS):
        fn(i, "payload")
    return (time.perf_counter() - start) / CALLS * 1e6


def time_async(fn: Callable[[int, str], Any]) -> float:
    async def many() -> float:
        start = time.perf_counter()
        for i in range(CALLS):
            await fn(i, "payload")
        return (time.perf_counter() - start) / CALLS * 1e6

    gc.collect()
    return asyncio.run(many())


def main() -> None:
    from otlp_server import OtlpServerProcess

    # The server runs in another process so its CPU never counts against the caller.
    with OtlpServerProcess(defer_decode=True) as server:
        looptrace.configure(endpoint=server.endpoint, service_name="bench")
        provider, tracer = otel_tracer(server.endpoint)
        o_sync, o_async = otel_wrap(tracer, work)[0], otel_wrap(tracer, awork)[1]
        lt_sync, lt_async = looptrace.traced(work), looptrace.traced(awork)
        results: dict[str, list[float]] = {}
        for _ in range(ROUNDS):
            for label, fn, timer in (
                ("sync plain", work, time_sync),
                ("sync looptrace", lt_sync, time_sync),
                ("sync OpenTelemetry", o_sync, time_sync),
                ("async plain", awork, time_async),
                ("async looptrace", lt_async, time_async),
                ("async OpenTelemetry", o_async, time_async),
            ):
                results.setdefault(label, []).append(timer(fn))
            looptrace.flush_sync(timeout=30)
            provider.force_flush()
        provider.shutdown()
        stats = looptrace.statistics()
        looptrace.shutdown_sync(timeout=10)

    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"\nCaller cost per call, median of {ROUNDS} rounds x {CALLS} calls (microseconds)\n")
    print(f"{'case':<22}{'per call':>10}{'added':>10}")
    for kind in ("sync", "async"):
        base = med[f"{kind} plain"]
        for who in ("plain", "looptrace", "OpenTelemetry"):
            v = med[f"{kind} {who}"]
            print(f"{kind + ' ' + who:<22}{v:>10.2f}{v - base:>10.2f}")
        lt = med[f"{kind} looptrace"] - base
        ot = med[f"{kind} OpenTelemetry"] - base
        print(f"{kind}: OpenTelemetry adds {ot / lt:.1f}x what looptrace adds per span\n")
    print(f"looptrace exported {stats.spans_sent} spans, dropped {dict(stats.dropped)}")

    # The first traced call of a process against its hundredth (scenario_first_call.py), in
    # fresh processes: what is left of looptrace's start-up inside the user's first call.
    import scenario_first_call

    print()
    rounds = 5
    here = str(Path(__file__).parent.parent / "src")
    scenario_first_call.report(scenario_first_call.measure(rounds, {"now": here}), rounds)


if __name__ == "__main__":
    main()
