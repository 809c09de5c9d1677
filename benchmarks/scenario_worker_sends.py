"""Large spans over OTLP/HTTP: does a worker process that sends the span itself beat one that
hands the encoded bytes back for the application's loop to send?

    A  the worker encodes the span and POSTs it with a blocking httpx client of its own,
       answering only with the status (the bytes never come back into the application)
    B  the worker encodes the span and hands the bytes back; the flusher sends them through
       the loop's HTTP/1.1 pool, batched with the other spans, like any span

Route A is gone from looptrace (this A/B is why: docs/performance.md). Both arms run the tree
of ``--ref``, by default the last commit that had it, extracted with ``git archive`` into a
temporary directory; B clears the exporter's worker destination after it loads, which is the
switch between the two routes there, and each arm counts the spans a worker sent, so a tree
where the switch does not work fails instead of measuring one route twice.

The program, in a fresh process per round: 100 calls of a traced coroutine, 10 ms apart,
each passing a ~2.5 MB chat transcript (its own string per call, with some non-ASCII text);
or, in its own rows, a ~165 KB structure-heavy request (chat messages, tool calls, a
``request`` dict with ``session``, ``user``, headers holding an ``api_key``, token counts),
which never goes to a worker (a control: both arms run the same code for it). Then
``await looptrace.flush()``. A 1 ms ticker task on the same loop measures, over the whole
window (calls and the final flush): the total lag (the sum of the lags of the ticks late by
more than 1 ms), the worst stall, the wall time until the flush returns (every span
acknowledged by the server), and the CPU of the application's process and of its workers.
The server is tests/otlp_server.py's OtlpServerProcess on 127.0.0.1 (answers at once, decodes
when counted), and counts that every span arrived.

Rounds alternate A B A B ..., each arm in a fresh process; the table gives the medians and
the ratio A/B of each pair.

    .venv/bin/python benchmarks/scenario_worker_sends.py [--pairs 6] [--calls 100]
        [--only string|structure] [--ref COMMIT]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

TICK = 0.001
# The last commit in which a worker process could send a large span itself.
DEFAULT_REF = "f31ac15"


# --------------------------------------------------------------------------- payloads

_TEXT = (
    "the a to of and in is that for it on with as was this be are by at from or have an not "
    "but which you they we can all will one has more their if about would there been when so "
    "model answer question context document retrieval embedding token latency request user "
    "assistant system tool function result error retry timeout database index vector query "
    "café résumé naïve déjà façade coöperate señor über straße"
)
_WORDS = _TEXT.split()


def transcript(size: int, seed: int) -> str:
    """A long chat transcript: alternating turns of prose, some of it non-ASCII (typographic
    quotes and accented words, as users' text has)."""
    rng = random.Random(seed)
    turns = []
    total = 0
    n = 0
    while total < size:
        who = "user" if n % 2 == 0 else "assistant"
        words = rng.choices(_WORDS, k=rng.randint(20, 160))
        text = " ".join(words).capitalize() + "."
        if n % 7 == 3:
            text = f"\u2019{text}\u2019"
        line = f"[{n:05d}] {who}: {text}\n"
        turns.append(line)
        total += len(line)
        n += 1
    return "".join(turns)


def structure_payload(seed: int) -> dict[str, Any]:
    """A ~165 KB agent request as an application passes it: chat messages with tool calls and
    their results, the request's metadata and headers (an API key), token counts."""
    rng = random.Random(seed)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a support agent. Use the tools when needed."}
    ]
    while len(orjson.dumps(messages)) < 150_000:
        i = len(messages)
        messages.append(
            {"role": "user", "content": " ".join(rng.choices(_WORDS, k=rng.randint(8, 40)))}
        )
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{i:04d}",
                        "type": "function",
                        "function": {
                            "name": rng.choice(["search_orders", "get_customer", "refund"]),
                            "arguments": orjson.dumps(
                                {"order_id": rng.randint(10_000, 99_999), "limit": 5}
                            ).decode(),
                        },
                    }
                ],
            }
        )
        messages.append(
            {
                "role": "tool",
                "tool_call_id": f"call_{i:04d}",
                "content": [
                    {"sku": f"SKU-{rng.randint(100, 999)}", "qty": rng.randint(1, 4), "ok": True}
                    for _ in range(rng.randint(1, 4))
                ],
            }
        )
    return {
        "messages": messages,
        "model": "gpt-4o-mini",
        "temperature": 0.2,
        "tools": [{"type": "function", "function": {"name": "search_orders"}}],
        "request": {
            "session": f"sess-{seed:08x}",
            "user": {"id": f"user-{seed}", "plan": "pro", "locale": "fr-FR"},
            "headers": {
                "api_key": "sk-live-0123456789abcdef",
                "user-agent": "shop-agent/2.3",
                "x-request-id": f"req-{seed}",
            },
        },
        "usage": {"prompt_tokens": 41_233, "completion_tokens": 812, "total_tokens": 42_045},
    }


# --------------------------------------------------------------------------- one round


def _children_cpu() -> float:
    """CPU seconds of this process's live children (the worker processes), from /proc."""
    me = str(os.getpid())
    total = 0.0
    try:
        names = os.listdir("/proc")
    except OSError:
        return 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me:  # ppid
            total += (int(fields[11]) + int(fields[12])) / tick  # utime + stime
    return total


def _thread_sys() -> float:
    """System CPU seconds of the calling thread (Linux; 0 elsewhere)."""
    import resource

    who = getattr(resource, "RUSAGE_THREAD", None)
    return resource.getrusage(who).ru_stime if who is not None else 0.0


def row(route: str, kind: str, url: str, calls: int) -> dict[str, Any]:
    """One arm of one round, in this (fresh) process."""
    import looptrace
    from looptrace._export import otlp_http
    from looptrace._offload import parent

    load = otlp_http.OtlpHttpExporter.load
    deliver = parent.Offloader.deliver
    worker_sent = [0]

    def load_for_route(self: Any) -> None:
        load(self)
        if route == "B":
            if self.__dict__.get("_destination") is None:
                raise RuntimeError("this tree has no worker destination to clear")
            # With no destination, a worker hands the encoded span back (the route a custom
            # transport takes).
            self._destination = None

    async def counted_deliver(self: Any, *args: Any) -> Any:
        worker_sent[0] += 1
        return await deliver(self, *args)

    otlp_http.OtlpHttpExporter.load = load_for_route  # type: ignore[method-assign]
    parent.Offloader.deliver = counted_deliver  # type: ignore[method-assign]

    if kind == "string":
        base = transcript(2_500_000, 1)
        payloads: list[Any] = [f"[conversation {i}]\n{base}" for i in range(calls)]
    else:
        payloads = [structure_payload(i) for i in range(calls)]

    looptrace.configure(endpoint=url, service_name="bench-worker-sends")

    @looptrace.traced
    async def answer(question: str, context: Any) -> str:
        return "ok"

    async def main() -> dict[str, Any]:
        lags: list[float] = []
        stop = asyncio.Event()

        async def ticker() -> None:
            last = time.perf_counter()
            while not stop.is_set():
                await asyncio.sleep(TICK)
                now = time.perf_counter()
                lags.append(max(now - last - TICK, 0.0))
                last = now

        tick = asyncio.create_task(ticker())
        await asyncio.sleep(0.05)
        lags.clear()
        t0, loop0, loop_sys0, times0, kids0 = (
            time.perf_counter(),
            time.thread_time(),
            _thread_sys(),
            os.times(),
            _children_cpu(),
        )
        for payload in payloads:
            await answer("what did we agree on?", payload)
            await asyncio.sleep(0.01)  # the application doing other things between calls
        await looptrace.flush(timeout=120)
        wall, loop_cpu = time.perf_counter() - t0, time.thread_time() - loop0
        loop_sys = _thread_sys() - loop_sys0
        times, kids = os.times(), _children_cpu() - kids0
        stop.set()
        await tick
        stats = looptrace.statistics()
        await looptrace.shutdown(timeout=30)
        return {
            "total": sum(lag for lag in lags if lag > TICK) * 1e3,
            "max": max(lags) * 1e3,
            "wall": wall,
            "cpu": (times.user + times.system - times0.user - times0.system) * 1e3,
            "sys": (times.system - times0.system) * 1e3,
            "loop": loop_cpu * 1e3,
            "loop_sys": loop_sys * 1e3,
            "workers": kids * 1e3,
            "offloaded": stats.offload.offloaded,
            "worker_sent": worker_sent[0],
            "sent": stats.spans_sent,
        }

    return asyncio.run(main())


# --------------------------------------------------------------------------- the A/B


def tree_of(ref: str, into: str) -> str:
    """The ``src`` directory of ``ref``, extracted into ``into`` (read from git only)."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", ref, "src"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    return os.path.join(into, "src")


def in_fresh_process(src: str, args: list[str]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--row", *args],
        env={**os.environ, "PYTHONPATH": src},
        capture_output=True,
        text=True,
        timeout=600,
    )
    if out.returncode != 0:
        raise RuntimeError(f"round failed: {out.stderr[-2000:]}")
    result: dict[str, Any] = orjson.loads(out.stdout.strip().splitlines()[-1])
    return result


def ab(ref: str, pairs: int, calls: int, only: str | None) -> None:
    from otlp_server import OtlpServerProcess

    measures = (
        ("total", "total lag ms"),
        ("max", "worst stall ms"),
        ("wall", "wall s"),
        ("cpu", "app CPU ms"),
        ("sys", "  of it system ms"),
        ("loop", "loop thread CPU ms"),
        ("loop_sys", "  of it system ms"),
        ("workers", "workers' CPU ms"),
    )
    with tempfile.TemporaryDirectory() as tmp, OtlpServerProcess(defer_decode=True) as server:
        src = tree_of(ref, tmp)
        print(f"looptrace at {ref}; server {server.endpoint}; {calls} calls; {pairs} pairs")
        for kind in ("string", "structure"):
            if only is not None and kind != only:
                continue
            label = "~2.5 MB transcripts" if kind == "string" else "~165 KB structures"
            print(f"\n{label}: A = the worker sends, B = the worker hands the bytes back")
            print(
                f"{'round':<8}{'total ms':>10}{'max ms':>9}{'wall s':>8}{'app cpu':>9}"
                f"{'sys':>7}{'loop':>7}{'sys':>6}{'workers':>9}{'offloaded':>11}{'worker sent':>13}"
                f"{'delivered':>11}"
            )
            got: dict[str, list[dict[str, Any]]] = {"A": [], "B": []}
            for p in range(pairs):
                for route in ("A", "B"):
                    server.clear()
                    figures = in_fresh_process(src, [route, kind, server.endpoint, str(calls)])
                    figures["delivered"] = server.stats()["accepted_spans"]
                    got[route].append(figures)
                    print(
                        f"{route + ' #' + str(p + 1):<8}{figures['total']:>10.1f}"
                        f"{figures['max']:>9.1f}{figures['wall']:>8.2f}{figures['cpu']:>9.0f}"
                        f"{figures['sys']:>7.0f}{figures['loop']:>7.0f}{figures['loop_sys']:>6.0f}"
                        f"{figures['workers']:>9.0f}{figures['offloaded']:>11}"
                        f"{figures['worker_sent']:>13}"
                        f"{figures['delivered']:>7}/{calls}",
                        flush=True,
                    )
            print(f"\n{'measure':<20}{'A median':>10}{'B median':>10}   A/B per pair")
            for key, name in measures:
                a = [r[key] for r in got["A"]]
                b = [r[key] for r in got["B"]]
                ratios = [x / y if y else float("nan") for x, y in zip(a, b, strict=True)]
                print(
                    f"{name:<20}{statistics.median(a):>10.2f}{statistics.median(b):>10.2f}   "
                    + " ".join(f"{r:.2f}" for r in ratios)
                    + f"   (median {statistics.median(ratios):.2f}, A lower in "
                    f"{sum(r < 1 for r in ratios)} of {len(ratios)})"
                )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--row":
        route, kind, url, calls = sys.argv[2:6]
        print(orjson.dumps(row(route, kind, url, int(calls))).decode())
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--only", choices=["string", "structure"])
    parser.add_argument("--ref", default=DEFAULT_REF, help="a commit that has route A")
    args = parser.parse_args()
    ab(args.ref, args.pairs, args.calls, args.only)


if __name__ == "__main__":
    main()
