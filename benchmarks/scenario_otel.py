"""Side by side in one run: what a span made through the OpenTelemetry API costs the caller
with looptrace as the provider, against a ``@looptrace.traced`` span and against the
OpenTelemetry SDK with its batch span processor (OTLP/HTTP exporter), all exporting to the same
local OTLP server.

The two OpenTelemetry rows run the same code (a span made current, two attributes set); the
traced rows record the call's arguments and result. ``traced, bridge on`` is a traced span once
the OpenTelemetry context is joined to looptrace's (what ``instrument_opentelemetry`` costs the
code that does not use the OpenTelemetry API). Rounds alternate; the table gives medians and the
spread (min-max) across rounds.
"""

from __future__ import annotations

import gc
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


def with_api(tracer: Any) -> Callable[[int, str], int]:
    def call(a: int, b: str) -> int:
        with tracer.start_as_current_span("work") as span:
            span.set_attribute("a", a)
            span.set_attribute("b", b)
            return work(a, b)

    return call


def time_calls(fn: Callable[[int, str], Any]) -> float:
    gc.collect()
    start = time.perf_counter()
    for i in range(CALLS):
        fn(i, "payload")
    return (time.perf_counter() - start) / CALLS * 1e6


def main() -> None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider as SdkProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from looptrace.otel import TracerProvider, _bridge
    from otlp_server import OtlpServerProcess

    with OtlpServerProcess(defer_decode=True) as server:
        looptrace.configure(endpoint=server.endpoint, service_name="bench")
        sdk = SdkProvider()
        sdk.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=server.endpoint)))
        sdk_call = with_api(sdk.get_tracer("bench"))
        ours = TracerProvider()  # joins the contexts; each round sets the bridge as it needs
        api_call = with_api(ours.get_tracer("bench"))
        traced = looptrace.traced(work)

        def bridge(on: bool) -> Callable[[], None]:
            return _bridge.install if on else _bridge.uninstall

        cases: list[tuple[str, Callable[[int, str], Any], Callable[[], None]]] = [
            ("plain", work, bridge(False)),
            ("traced", traced, bridge(False)),
            ("traced, bridge on", traced, bridge(True)),
            ("OTel API, looptrace provider", api_call, bridge(True)),
            ("OTel SDK, batch processor", sdk_call, bridge(False)),
        ]
        results: dict[str, list[float]] = {}
        for _ in range(ROUNDS):
            for label, fn, setup in cases:
                setup()
                results.setdefault(label, []).append(time_calls(fn))
            looptrace.flush_sync(timeout=30)
            sdk.force_flush()
        sdk.shutdown()
        stats = looptrace.statistics()
        looptrace.shutdown_sync(timeout=10)

    med = {k: statistics.median(v) for k, v in results.items()}
    base = med["plain"]
    print(f"\nCaller cost per call, median of {ROUNDS} rounds x {CALLS} calls (microseconds)\n")
    print(f"{'case':<30}{'per call':>10}{'added':>10}{'spread':>16}")
    for label, values in results.items():
        spread = f"{min(values) - base:.2f}-{max(values) - base:.2f}"
        print(f"{label:<30}{med[label]:>10.2f}{med[label] - base:>10.2f}{spread:>16}")
    traced_added = med["traced"] - base
    api_added = med["OTel API, looptrace provider"] - base
    sdk_added = med["OTel SDK, batch processor"] - base
    print(
        f"\nOTel API span with looptrace's provider: {api_added / traced_added:.2f}x a traced "
        f"span (goal <= 2x); the SDK's costs {sdk_added / api_added:.1f}x it (goal >= 10x)"
    )
    bridged = med["traced, bridge on"] - base
    print(f"a traced span with the bridge on: {bridged / traced_added:.2f}x one without")
    print(f"looptrace exported {stats.spans_sent} spans, dropped {dict(stats.dropped)}")


if __name__ == "__main__":
    main()
