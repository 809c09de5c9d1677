"""LLM call instrumentation, side by side in one run: what it adds per call, and whether a large
prompt stalls the event loop.

The real ``openai`` client talks to the fake API of ``tests/fake_llm_server.py``, run in a
process of its own that also accepts (and discards) the spans. Part 1: the same calls with the
client instrumented and not, alternating in rounds; each round's figure is the median per-call
time, and the added cost is the median over rounds of (instrumented - plain). Part 2: calls
carrying a 2 MB prompt on an asyncio loop with a 1 ms ticker, instrumented and not; the worst
tick lag (how late the ticker woke) for each.

    /work/venv-genai/bin/python benchmarks/scenario_genai.py [--rounds 15] [--calls 200]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai

import looptrace

TICK = 0.001
TESTS = Path(__file__).resolve().parent.parent / "tests"
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Say hello"},
]


def start_server() -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [sys.executable, str(TESTS / "fake_llm_server.py")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def per_call(fn: Callable[[], Any], calls: int) -> float:
    """Median seconds per call over ``calls`` calls, under one parent span."""
    times = []
    with looptrace.span("bench"):
        for _ in range(calls):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def compare(name: str, fn: Callable[[], Any], rounds: int, calls: int) -> tuple[float, ...]:
    plain, traced, added = [], [], []
    for i in range(rounds):
        # Alternate which goes first, so drift in the machine's load hits both alike.
        order = (False, True) if i % 2 == 0 else (True, False)
        figures = {}
        for on in order:
            if on:
                looptrace.instrument_openai()
            try:
                figures[on] = per_call(fn, calls)
            finally:
                looptrace.uninstrument_openai()
        plain.append(figures[False])
        traced.append(figures[True])
        added.append(figures[True] - figures[False])
    p, t, a = (statistics.median(x) * 1e6 for x in (plain, traced, added))
    spread = (max(added) - min(added)) * 1e6
    print(
        f"  {name:<28} plain {p:8.1f} us  instrumented {t:8.1f} us  "
        f"added {a:6.1f} us (rounds spread {spread:.0f} us)"
    )
    return p, t, a


async def ticker(stop: asyncio.Event, lags: list[float]) -> None:
    last = time.perf_counter()
    while not stop.is_set():
        await asyncio.sleep(TICK)
        now = time.perf_counter()
        lags.append(max(now - last - TICK, 0.0))
        last = now


async def stall_run(client: openai.AsyncOpenAI, prompt: str, calls: int) -> float:
    """The worst ticker lag (ms) while ``calls`` calls carrying ``prompt`` run, and while the
    pipeline exports their spans afterwards."""
    lags: list[float] = []
    stop = asyncio.Event()
    tick = asyncio.create_task(ticker(stop, lags))
    await asyncio.sleep(0.05)
    messages = [{"role": "user", "content": prompt}]
    async with looptrace.span("bench"):
        for _ in range(calls):
            await client.chat.completions.create(model="gpt-4o", messages=messages)
            await asyncio.sleep(0.02)  # the application doing other things between calls
    await looptrace.flush(30)
    await asyncio.sleep(0.05)
    stop.set()
    await tick
    return max(lags) * 1e3


def stalls(port: int, rounds: int, calls: int) -> tuple[float, float]:
    prompt = "x" * (2 * 1024 * 1024)
    plain, traced = [], []

    async def main() -> None:
        client = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-bench", max_retries=0
        )
        await stall_run(client, "warm up", 3)  # imports, connections, the pipeline's start
        for i in range(rounds):
            for on in (False, True) if i % 2 == 0 else (True, False):
                if on:
                    looptrace.instrument_openai()
                try:
                    (traced if on else plain).append(await stall_run(client, prompt, calls))
                finally:
                    looptrace.uninstrument_openai()

    asyncio.run(main())
    p, t = statistics.median(plain), statistics.median(traced)
    print(
        f"  2 MB prompt, {calls} calls x {rounds} rounds: worst tick lag, median of rounds: "
        f"plain {p:.2f} ms  instrumented {t:.2f} ms  (max {max(plain):.2f} / {max(traced):.2f})"
    )
    return p, t


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--stall-rounds", type=int, default=4)
    parser.add_argument("--stall-calls", type=int, default=10)
    args = parser.parse_args()
    proc, port = start_server()
    try:
        looptrace.configure(endpoint=f"http://127.0.0.1:{port}/v1/traces", service_name="bench")
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-bench", max_retries=0
        )

        def chat() -> Any:
            return client.chat.completions.create(model="gpt-4o", messages=MESSAGES)

        def stream() -> Any:
            chunks = client.chat.completions.create(
                model="gpt-4o",
                messages=MESSAGES,
                stream=True,
                stream_options={"include_usage": True},
            )
            for _ in chunks:
                pass

        for fn in (chat, stream):
            per_call(fn, 20)  # warm up: connections, imports
        print(f"caller cost per call ({args.rounds} rounds x {args.calls} calls, medians)")
        compare("chat.completions.create", chat, args.rounds, args.calls)
        compare("... stream=True (6 chunks)", stream, args.rounds, args.calls)
        looptrace.flush_sync(30)
        print("event-loop stall (1 ms ticker)")
        stalls(port, args.stall_rounds, args.stall_calls)
        looptrace.shutdown_sync(10)
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(10)


if __name__ == "__main__":
    main()
