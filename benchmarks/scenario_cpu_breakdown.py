"""Where the CPU per span goes: capture plus export, taken apart.

The throughput scenario's span (a ``span()`` block with an input and an output), 20,000 of
them, each stage timed alone in this process (best of 5, microseconds per span):

- capture alone: the spans handed to a sink that drops them;
- the flusher alone: the real pipeline over an exporter whose chunks cost nothing to make or
  send, so what remains is the buffer, the batches, the slices and the homes;
- the exporter's steps: the size estimate (made when a span is queued), the planning walk,
  the span's encoding, the request's assembly and its compression (in a background thread,
  off the loop; none for this loopback endpoint unless LOOPTRACE_COMPRESSION names one);
- the whole: the real pipeline and exporter, requests kept in memory instead of sent.

    .venv/bin/python benchmarks/scenario_cpu_breakdown.py
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable, Sequence, Sized
from typing import Any

import looptrace
from looptrace import _export, _otlp, _serialize, _state
from looptrace._capture.spans import Span
from looptrace._export.exporter import SENT, Outcome, Slices
from looptrace._export.memory import InMemoryExporter
from looptrace._otlp.span_encoder import SpanEncoder
from looptrace._transport import InMemoryTransport
from looptrace._transport.settings import HttpSettings, wire_compression

N = 20_000
ROUNDS = 5
CHUNK = b"x" * 226  # what the real encoder makes of this span, in bytes


def one(i: int) -> None:
    with looptrace.span("step") as s:
        s.set_inputs({"question": "what is 2+2?", "i": i})
        s.set_output({"answer": 4})


async def produce() -> None:
    for i in range(N):
        one(i)
        if i % 100 == 99:
            await asyncio.sleep(0)


async def produce_and_flush() -> None:
    await produce()
    result = await looptrace.flush(60)
    assert result.ok, result


async def baseline() -> None:
    for i in range(N):
        inputs, output = {"question": "what is 2+2?", "i": i}, {"answer": 4}
        del inputs, output
        if i % 100 == 99:
            await asyncio.sleep(0)


class _Drop:
    def on_start(self, span: Span) -> None:
        pass

    def on_end(self, span: Span) -> None:
        pass


class _Keep(_Drop):
    def __init__(self) -> None:
        self.spans: list[Span] = []

    def on_end(self, span: Span) -> None:
        self.spans.append(span)


class _FreeExporter(InMemoryExporter):
    """Chunks that cost nothing to make or to send: the pipeline's own cost is what is left."""

    def loaded_cheaply(self) -> bool:
        return True

    def load(self) -> None:
        pass

    def estimate(self, span: Span) -> int:
        return len(CHUNK)

    async def encode(self, spans: Sequence[Span]) -> list[Sized | None]:
        # The real exporters' loop: one chunk per span, a pause whenever a slice is used up.
        slices = Slices()
        chunks: list[Sized | None] = []
        for _ in spans:
            chunks.append(CHUNK)
            if slices.due():
                await slices.pause()
        return chunks

    def encode_open(self, span: Span) -> Sized:
        return CHUNK

    async def export(self, chunks: Sequence[Sized]) -> Outcome:
        return SENT


def best_us(run: Callable[[], Any]) -> float:
    times = []
    for _ in range(ROUNDS):
        gc.collect()
        start = time.process_time()
        run()
        times.append(time.process_time() - start)
    return min(times) / N * 1e6


def main() -> None:
    cfg = looptrace.configure(endpoint="http://127.0.0.1:9/v1/traces")
    base = best_us(lambda: asyncio.run(baseline()))
    rows: list[tuple[str, float]] = []

    _state.sink = _Drop()
    rows.append(("capture alone", best_us(lambda: asyncio.run(produce())) - base))

    free = _export.Pipeline(cfg, exporter=_FreeExporter(cfg))
    _export.install(free)
    asyncio.run(produce_and_flush())
    flusher = best_us(lambda: asyncio.run(produce_and_flush())) - base - rows[0][1]
    rows.append(("the flusher alone (buffer, batches, slices)", flusher))

    keep = _Keep()
    _state.sink = keep
    for i in range(N):
        one(i)
    spans = keep.spans
    encoder = SpanEncoder(cfg)
    flags = [encoder.plan(s) for s in spans]
    chunks = [encoder.encode(s, f) for s, f in zip(spans, flags, strict=True)]
    resource = _otlp.default_resource(cfg)
    bodies = [
        _otlp.encode_request(chunks[i : i + 2048], resource, "protobuf") for i in range(0, N, 2048)
    ]

    def timed(fn: Callable[[], Any]) -> float:
        return best_us(fn)

    rows.append(
        ("size estimate (on queueing)", timed(lambda: [_serialize.estimate_size(s) for s in spans]))
    )
    rows.append(("planning walk", timed(lambda: [encoder.plan(s) for s in spans])))
    rows.append(
        (
            "encoding",
            timed(lambda: [encoder.encode(s, f) for s, f in zip(spans, flags, strict=True)]),
        )
    )
    rows.append(
        (
            "request assembly",
            timed(
                lambda: [
                    _otlp.encode_request(chunks[i : i + 2048], resource, "protobuf")
                    for i in range(0, N, 2048)
                ]
            ),
        )
    )
    # What the pipeline applies to this endpoint: none to loopback (compression "auto").
    compression = wire_compression(cfg.compression, HttpSettings.from_config(cfg).loopback)
    rows.append(
        (
            f"compression: {compression} (background thread)",
            timed(lambda: [_otlp.compress(b, compression) for b in bodies]),
        )
    )

    transport = InMemoryTransport()
    _export.install(_export.Pipeline(cfg, transport_factory=lambda: transport))
    asyncio.run(produce_and_flush())
    whole = best_us(lambda: asyncio.run(produce_and_flush())) - base
    looptrace.shutdown_sync(5)

    print(
        f"CPU per span, {N} spans, best of {ROUNDS} (us; {len(chunks[0])} bytes encoded per span)"
    )
    for name, value in rows:
        print(f"  {name:<46}{value:6.2f}")
    print(f"  {'sum of the parts':<46}{sum(v for _, v in rows):6.2f}")
    print(f"  {'the whole, requests kept in memory':<46}{whole:6.2f}")


if __name__ == "__main__":
    main()
