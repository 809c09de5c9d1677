"""Scenario: the local store, the default destination (no endpoint configured).

One asyncio program ends N traced calls (an input and an output recorded on each), yielding
to the loop every 100 calls, then flushes into a fresh SQLite store. Reported per span: the
process's CPU (every thread: the flusher, the store's writer) and the wall time from the first
call to the end of the flush, each minus the same loop without tracing.

Old commit against new, in one run: ``--compare OLD_SRC NEW_SRC`` runs each measurement in a
child process with that ``src`` directory first on the path, alternating, and prints medians.

    .venv/bin/python benchmarks/scenario_store.py [--n 20000] [--rounds 5]
    git worktree add --detach /tmp/old <commit>
    .venv/bin/python benchmarks/scenario_store.py --compare /tmp/old/src src
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _measure(n: int, traced: bool) -> tuple[float, float]:
    import looptrace

    with tempfile.TemporaryDirectory() as tmp:
        looptrace.configure(
            store_path=str(Path(tmp) / "bench.db"), flush_interval=0.2, disabled=not traced
        )

        @looptrace.traced
        def handle(question: str, i: int) -> dict[str, int]:
            return {"answer": 4, "i": i}

        async def main() -> None:
            for i in range(n):
                handle("what is 2+2?", i)
                if i % 100 == 99:
                    await asyncio.sleep(0)
            if traced:
                result = await looptrace.flush(60)
                assert result.ok, result

        cpu, wall = time.process_time(), time.perf_counter()
        asyncio.run(main())
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        looptrace.shutdown_sync(10)
        return cpu, wall


def _child(src: str, n: int, traced: bool) -> tuple[float, float]:
    env = {**os.environ, "PYTHONPATH": src}
    out = subprocess.run(
        [sys.executable, __file__, "--one", "--n", str(n)] + ([] if traced else ["--untraced"]),
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    cpu, wall = json.loads(out.strip().splitlines()[-1])
    return cpu, wall


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--compare", nargs=2, metavar=("OLD_SRC", "NEW_SRC"))
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--untraced", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(_measure(args.n, not args.untraced)))
        return
    here = str(Path(__file__).resolve().parent.parent / "src")
    sources = (
        {"old": args.compare[0], "new": args.compare[1]} if args.compare else {"looptrace": here}
    )
    rows: dict[str, list[tuple[float, float]]] = {name: [] for name in ("none", *sources)}
    for _ in range(args.rounds):
        rows["none"].append(_child(next(iter(sources.values())), args.n, traced=False))
        for name, src in sources.items():
            rows[name].append(_child(src, args.n, traced=True))
    base_cpu = statistics.median(c for c, _ in rows["none"])
    base_wall = statistics.median(w for _, w in rows["none"])
    print(f"{args.n} traced calls into the local store, medians of {args.rounds} rounds")
    print(f"{'row':<12}{'CPU us/span':>14}{'wall us/span':>14}   CPU per round (us/span)")
    for name, samples in rows.items():
        cpu = statistics.median(c for c, _ in samples)
        wall = statistics.median(w for _, w in samples)
        if name != "none":
            cpu, wall = cpu - base_cpu, wall - base_wall
        spread = ", ".join(
            f"{(c - (base_cpu if name != 'none' else 0)) / args.n * 1e6:.1f}" for c, _ in samples
        )
        print(f"{name:<12}{cpu / args.n * 1e6:>14.2f}{wall / args.n * 1e6:>14.2f}   {spread}")


if __name__ == "__main__":
    main()
