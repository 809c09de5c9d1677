"""How long looptrace holds the application's event loop at a time, in CPU, under large payloads.

A 1 ms ticker late by more than 2 ms is what ``scenario_large_payloads`` counts; on a shared
2-core VM the untraced program's own worst tick is often later than that (the loop's thread
waited for a CPU, or the hypervisor ran another guest), so the tick cannot tell what tracing
adds to the worst stall. This scenario measures the cause instead: every step of every task on
the loop, in CPU time of the loop's thread (``time.thread_time``, which does not count time the
thread was preempted or waiting for the GIL), split by whose coroutine the task runs: looptrace's
(the flusher, its senders) or the application's. A tick falls due at most once per step, so no
tick is made later by tracing than tracing's longest step.

The steps are observed through the loop's task factory (public asyncio API): each task's
coroutine is wrapped so that every ``send``/``throw`` into it is timed. Callbacks that are not
task steps (a transport sending what the kernel's socket buffer did not take at first, a
protocol receiving an answer) are not seen: each is bounded by one socket buffer's worth of
copying.

Each round is a fresh process, so the steps of a process's first large payload (patterns
compiled, caches filled) count as a user meets them: 100 calls of a traced coroutine each
passing a ~165 KB structure-heavy dict, then (a separate round) a 2.5 MB base64 string, sent
to a local OTLP sink in another process.

    .venv/bin/python benchmarks/scenario_loop_steps.py [--rounds 5] [--old SRC]

``--old SRC`` runs the looptrace in ``SRC`` (a checkout's ``src``) in alternate rounds, to
compare two commits.
"""

from __future__ import annotations

import argparse
import asyncio
import collections.abc
import os
import statistics
import time
from collections.abc import Coroutine, Generator
from typing import Any

import orjson

from scenario_large_payloads import Sink, in_process, string_payload, structure_payload

CALLS = 100
_thread_time = time.thread_time


class Timed(collections.abc.Coroutine):  # type: ignore[type-arg]
    """A coroutine that records the CPU time of each step of the one it wraps."""

    __slots__ = ("_coro", "_steps")

    def __init__(self, coro: Coroutine[Any, Any, Any], steps: list[float]) -> None:
        self._coro = coro
        self._steps = steps

    def send(self, value: Any) -> Any:
        start = _thread_time()
        try:
            return self._coro.send(value)
        finally:
            self._steps.append(_thread_time() - start)

    def throw(self, *args: Any) -> Any:
        start = _thread_time()
        try:
            return self._coro.throw(*args)
        finally:
            self._steps.append(_thread_time() - start)

    def close(self) -> None:
        self._coro.close()

    def __await__(self) -> Generator[Any, None, Any]:
        return self._coro.__await__()


def _is_looptrace(coro: Any) -> bool:
    code = getattr(coro, "cr_code", None)
    return code is not None and f"{os.sep}looptrace{os.sep}" in code.co_filename


def one_round(kind: str, url: str) -> dict[str, Any]:
    """One process's run: looptrace's task steps and the application's, in seconds of CPU."""
    import looptrace

    looptrace.configure(endpoint=url, service_name="bench")
    payload = structure_payload(165_000) if kind == "structure" else string_payload(2_500_000)
    ours: list[float] = []
    theirs: list[float] = []

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        steps = ours if _is_looptrace(coro) else theirs
        return asyncio.Task(Timed(coro, steps), loop=loop, **kwargs)

    @looptrace.traced
    async def handle(request: Any) -> str:
        return "ok"

    async def main() -> None:
        asyncio.get_running_loop().set_task_factory(factory)
        app = asyncio.create_task(application())
        await app

    async def application() -> None:
        for _ in range(CALLS):
            await handle(payload)
            await asyncio.sleep(0.01)  # the application doing other things between requests
        await looptrace.flush(timeout=120)
        await looptrace.shutdown(timeout=30)

    asyncio.run(main())
    return {"ours": ours, "theirs": theirs}


def summary(steps: list[float]) -> dict[str, float]:
    ms = sorted(s * 1e3 for s in steps)
    return {
        "steps": len(ms),
        "max": ms[-1] if ms else 0.0,
        "p99": ms[int(len(ms) * 0.99)] if ms else 0.0,
        "over1": sum(1 for s in ms if s > 1.0),
        "over2": sum(1 for s in ms if s > 2.0),
        "total": sum(ms),
    }


def run(rounds: int, old: str | None) -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    new_src = os.path.join(os.path.dirname(here), "src")
    trees = [("new", new_src)] + ([("old", old)] if old else [])
    sink = Sink()
    try:
        for kind in ("structure", "string"):
            print(
                f"\nlooptrace's task steps on the application's loop, {kind} payloads, "
                f"{CALLS} calls, {rounds} rounds (CPU ms of the loop's thread)"
            )
            print(
                f"{'':<12}{'steps':>7}{'max':>8}{'p99':>8}{'>1 ms':>7}{'>2 ms':>7}{'all':>8}   app max"
            )
            got: dict[str, list[dict[str, float]]] = {}
            for r in range(rounds):
                for name, src in trees if r % 2 == 0 else trees[::-1]:
                    result = in_process(__file__, ["--round", kind, sink.url], src, here)
                    ours, theirs = summary(result["ours"]), summary(result["theirs"])
                    got.setdefault(name, []).append(ours)
                    print(
                        f"{name + ' #' + str(r + 1):<12}{ours['steps']:>7.0f}{ours['max']:>8.2f}"
                        f"{ours['p99']:>8.2f}{ours['over1']:>7.0f}{ours['over2']:>7.0f}"
                        f"{ours['total']:>8.1f}{theirs['max']:>10.2f}",
                        flush=True,
                    )
            print("medians (worst round's max in brackets):")
            for name, rows in got.items():
                print(
                    f"  {name:<10}{statistics.median(x['steps'] for x in rows):>7.0f}"
                    f"{statistics.median(x['max'] for x in rows):>8.2f}"
                    f"{statistics.median(x['p99'] for x in rows):>8.2f}"
                    f"{statistics.median(x['over1'] for x in rows):>7.0f}"
                    f"{statistics.median(x['over2'] for x in rows):>7.0f}"
                    f"{statistics.median(x['total'] for x in rows):>8.1f}"
                    f"   [{max(x['max'] for x in rows):.2f}]"
                )
    finally:
        sink.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--old", metavar="SRC", help="alternate with the looptrace in SRC")
    parser.add_argument("--round", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.round:
        print(orjson.dumps(one_round(*args.round)).decode())
        return
    run(args.rounds, args.old)


if __name__ == "__main__":
    main()
