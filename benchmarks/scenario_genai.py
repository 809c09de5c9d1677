"""LLM call instrumentation, side by side in one run: what it adds per call, and whether a large
prompt stalls the event loop.

The real ``openai`` client talks to the fake API of ``tests/fake_llm_server.py``, run in a
process of its own that also accepts (and discards) the spans. Two clients, one instrumented
(``instrument_openai(client)``) and one not. Part 1: the same call on each, alternating call by
call; each round's figure is the median per-call time, and the added cost is the median over
rounds of (instrumented - plain). Part 2: calls carrying a 2 MB prompt on an asyncio loop with
a 1 ms ticker, on each client in alternating rounds; the worst tick lag (how late the ticker
woke) for each, and the wrapper's own caller-path time for such a call, measured alone.

Part 1 runs twice: with spans dropped at the sink (what the caller pays: the wrapper, the span,
the hand-off) and with the real pipeline exporting from this process (serialization and sending
compete with the caller for the GIL and the two cores, as they would in production).

``--pricing`` times instead what working out one call's cost takes in the flusher, looptrace's
against genai-prices' own calculation, in alternating rounds.

    /work/venv-genai/bin/python benchmarks/scenario_genai.py [--rounds 15] [--calls 200]
    /work/venv-genai/bin/python benchmarks/scenario_genai.py --pricing
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai

import looptrace
from looptrace import _state

TICK = 0.001
TESTS = Path(__file__).resolve().parent.parent / "tests"
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Say hello"},
]


@contextlib.contextmanager
def spans_dropped() -> Iterator[None]:
    """Ended spans go nowhere: what is left is the caller's own cost (kept in memory instead,
    the growing heap's garbage collections would be charged to the instrumented calls)."""
    saved = _state.sink
    _state.sink = _state.NullSink()
    try:
        yield
    finally:
        _state.sink = saved


def start_server() -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [sys.executable, str(TESTS / "fake_llm_server.py")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def compare(
    name: str, fn: Callable[[Any], Any], plain: Any, traced: Any, rounds: int, calls: int
) -> tuple[float, float, float]:
    """Median per-call time of ``fn(plain)`` and ``fn(traced)``, calls alternating one by one
    (the order flipping every pair) so the machine's drifting load hits both alike; the added
    cost is the median over rounds of the difference of the two medians."""
    per_round: list[tuple[float, float]] = []
    for _ in range(rounds):
        times: dict[bool, list[float]] = {False: [], True: []}
        with looptrace.span("bench"):
            for i in range(calls):
                for on in (False, True) if i % 2 == 0 else (True, False):
                    client = traced if on else plain
                    t0 = time.perf_counter()
                    fn(client)
                    times[on].append(time.perf_counter() - t0)
        per_round.append((statistics.median(times[False]), statistics.median(times[True])))
    p = statistics.median(r[0] for r in per_round) * 1e6
    t = statistics.median(r[1] for r in per_round) * 1e6
    added = sorted((r[1] - r[0]) * 1e6 for r in per_round)
    a = statistics.median(added)
    print(
        f"  {name:<28} plain {p:8.1f} us  instrumented {t:8.1f} us  "
        f"added {a:6.1f} us (rounds: {added[0]:.1f} .. {added[-1]:.1f})"
    )
    return p, t, a


def _chunk(delta: dict[str, Any], reason: str | None = None, usage: Any = None) -> Any:
    return openai.types.chat.ChatCompletionChunk.model_validate(
        {
            "id": "c",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "gpt-4o",
            "choices": [] if usage else [{"index": 0, "delta": delta, "finish_reason": reason}],
            "usage": usage,
        }
    )


def caller_path_costs(prompt: str, repeat: int = 2000) -> tuple[float, float]:
    """What the wrapper itself does on the caller's path, without the network or the SDK
    around it (median us): a plain call carrying ``prompt`` (start the span, build the
    attributes, record the response, end the span), and a streamed one whose 8 chunks come
    from a list (the same, plus the proxy and the per-chunk bookkeeping), over iterating the
    list bare."""
    from looptrace._genai import _core, _openai

    kwargs: dict[str, Any] = {"model": "gpt-4o", "messages": [{"role": "user", "content": prompt}]}
    # The resource a call is made on: its client's base_url gives server.address / server.port.
    resource = openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="sk-bench").chat.completions
    response = openai.types.chat.ChatCompletion.model_validate(
        {
            "id": "c",
            "object": "chat.completion",
            "created": 0,
            "model": "gpt-4o",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "hi"},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
    )
    chunks = [_chunk({"role": "assistant", "content": ""})]
    chunks += [_chunk({"content": w}) for w in ["Hello", "from", "the", "fake", "model"]]
    chunks += [
        _chunk({}, "stop"),
        _chunk({}, usage={"prompt_tokens": 1, "completion_tokens": 5, "total_tokens": 6}),
    ]
    stream_kwargs = {**kwargs, "stream": True}
    plain, streamed, bare = [], [], []
    with spans_dropped(), looptrace.span("bench"):
        for _ in range(repeat):
            t0 = time.perf_counter()
            call = _openai._begin_chat(resource, kwargs)
            _openai._done_chat(call, kwargs, response)
            t1 = time.perf_counter()
            for _ in iter(chunks):
                pass
            t2 = time.perf_counter()
            call = _openai._begin_chat(resource, stream_kwargs)
            for _ in _core.SyncStream(iter(chunks), _openai._ChatStream(call)):
                pass
            t3 = time.perf_counter()
            plain.append(t1 - t0)
            bare.append(t2 - t1)
            streamed.append(t3 - t2)
    bare_us = statistics.median(bare)
    return statistics.median(plain) * 1e6, (statistics.median(streamed) - bare_us) * 1e6


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
    plain_lags, traced_lags = [], []

    async def main() -> None:
        url = f"http://127.0.0.1:{port}/v1"
        plain = openai.AsyncOpenAI(base_url=url, api_key="sk-bench", max_retries=0)
        traced = openai.AsyncOpenAI(base_url=url, api_key="sk-bench", max_retries=0)
        looptrace.instrument_openai(traced)
        for client in (plain, traced):  # imports, connections, the pipeline's workers
            await stall_run(client, prompt, 2)
        for i in range(rounds):
            for on in (False, True) if i % 2 == 0 else (True, False):
                lags = traced_lags if on else plain_lags
                lags.append(await stall_run(traced if on else plain, prompt, calls))
        await plain.close()
        await traced.close()

    asyncio.run(main())
    p, t = statistics.median(plain_lags), statistics.median(traced_lags)
    print(
        f"  2 MB prompt, {rounds} rounds x {calls} calls, worst tick lag (median of rounds / "
        f"max): plain {p:.2f} / {max(plain_lags):.2f} ms  instrumented {t:.2f} / "
        f"{max(traced_lags):.2f} ms"
    )
    print(
        f"    rounds: plain {[round(x, 2) for x in plain_lags]}"
        f"  instrumented {[round(x, 2) for x in traced_lags]}"
    )
    offload = looptrace.statistics().offload
    print(
        f"    spans serialized in a worker process: {offload.offloaded}"
        f" (fallbacks to inline: {sum(offload.fallbacks.values())})"
    )
    cost, _ = caller_path_costs(prompt)
    print(f"  the wrapper's own work on the caller's path for a 2 MB prompt: {cost:.1f} us")
    return p, t


def pricing(rounds: int, calls: int) -> None:
    """What working out one call's cost takes in the flusher: looptrace's (the affine form of a
    price without tiers) against genai-prices' own calculation, in alternating rounds, on
    chat-shaped token counts (cached input and reasoning output included), every call's
    counts different so no result is reused. Process CPU time, median over rounds."""
    import datetime

    import genai_prices

    from looptrace._genai import _cost

    assert _cost.load()
    start_ns = time.time_ns()
    when = datetime.datetime.fromtimestamp(start_ns / 1e9, datetime.timezone.utc)

    def counts(i: int) -> dict[str, int]:
        return {
            "input_tokens": 1_200 + i,
            "output_tokens": 300 + i % 97,
            "cache_read_tokens": 512 + i % 256,
            "output_reasoning_tokens": 64 + i % 31,
        }

    def ours(i: int) -> Any:
        return _cost.Price("openai", ("gpt-4o-mini",), None, counts(i), start_ns)._calculate()

    def theirs(i: int) -> Any:
        usage = genai_prices.Usage(**counts(i))
        return genai_prices.calc_price(
            usage, "gpt-4o-mini", provider_id="openai", genai_request_timestamp=when
        )

    calc = theirs(0)  # the same figures, or the comparison means nothing
    assert ours(0) == (float(calc.input_price), float(calc.output_price), float(calc.total_price))
    figures: dict[str, list[float]] = {"looptrace": [], "genai-prices": []}
    for r in range(rounds):
        order = [("looptrace", ours), ("genai-prices", theirs)]
        for name, fn in order if r % 2 == 0 else order[::-1]:
            c0 = time.process_time()
            for i in range(calls):
                fn(r * calls + i)
            figures[name].append((time.process_time() - c0) / calls * 1e6)
    a, b = (statistics.median(figures[k]) for k in ("looptrace", "genai-prices"))
    print(f"pricing one LLM call (gpt-4o-mini, {rounds} rounds x {calls} calls, CPU)")
    print(f"  looptrace     {a:7.1f} us")
    print(f"  genai-prices  {b:7.1f} us   ({b / a:.1f}x)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--stall-rounds", type=int, default=4)
    parser.add_argument("--stall-calls", type=int, default=10)
    parser.add_argument(
        "--pricing", action="store_true", help="only an LLM call's cost, worked out per call"
    )
    args = parser.parse_args()
    if args.pricing:
        pricing(args.rounds, args.calls)
        return
    proc, port = start_server()
    try:
        looptrace.configure(endpoint=f"http://127.0.0.1:{port}/v1/traces", service_name="bench")
        url = f"http://127.0.0.1:{port}/v1"
        plain = openai.OpenAI(base_url=url, api_key="sk-bench", max_retries=0)
        traced = openai.OpenAI(base_url=url, api_key="sk-bench", max_retries=0)
        looptrace.instrument_openai(traced)

        def chat(client: openai.OpenAI) -> Any:
            return client.chat.completions.create(model="gpt-4o", messages=MESSAGES)

        def stream(client: openai.OpenAI) -> Any:
            chunks = client.chat.completions.create(
                model="gpt-4o",
                messages=MESSAGES,
                stream=True,
                stream_options={"include_usage": True},
            )
            for _ in chunks:
                pass

        for fn in (chat, stream):  # warm up: connections, imports, the pipeline
            compare("(warm-up)", fn, plain, traced, 1, 20)
        print(
            f"caller cost per call, spans dropped at the sink ({args.rounds} rounds x"
            f" {args.calls} calls each way)"
        )
        with spans_dropped():
            compare("chat.completions.create", chat, plain, traced, args.rounds, args.calls)
            compare("... stream=True (8 chunks)", stream, plain, traced, args.rounds, args.calls)
        print("the same, spans exported over OTLP/HTTP from this process (export CPU included)")
        compare("chat.completions.create", chat, plain, traced, args.rounds, args.calls)
        compare("... stream=True (8 chunks)", stream, plain, traced, args.rounds, args.calls)
        plain_us, stream_us = caller_path_costs("Say hello")
        print("the wrapper's own caller-path work, measured alone (median of 2,000)")
        print(f"  chat.completions.create      {plain_us:6.1f} us")
        print(f"  ... stream=True (8 chunks)   {stream_us:6.1f} us")
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
