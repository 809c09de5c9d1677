"""The first traced call of a process against its hundredth, side by side in one run.

Each round starts a fresh interpreter that imports looptrace, decorates a coroutine (as a module
does at import time), then awaits it 100 times on one event loop, timing each call; spans go to
a local store in a temporary folder, or (the second row) to an OTLP endpoint: the tests' OTLP
server, in a process of its own; the third row reads the settings before the loop runs, as a
``looptrace.configure()`` at import does. The first call pays what is left of looptrace's
start-up on the loop (reading the settings, building the pipeline, starting the flusher); the
last column is each call's time as a multiple of the hundredth's.

    .venv/bin/python benchmarks/scenario_first_call.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))

from otlp_server import OtlpServerProcess

CHILD = """
import asyncio, json, os, time
import looptrace

@looptrace.traced
async def handle(request):
    return request

if os.environ.get("BENCH_READ_SETTINGS_FIRST"):
    looptrace.get_config()  # the settings read at import, before the loop runs

async def main():
    times = []
    for i in range(100):
        started = time.perf_counter()
        await handle({"i": i})
        times.append(time.perf_counter() - started)
    await looptrace.flush(timeout=10)
    print(json.dumps({"first": times[0], "second": times[1], "hundredth": times[99]}))

asyncio.run(main())
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    rows: dict[tuple[str, str], list[float]] = {}
    with OtlpServerProcess(defer_decode=True) as server, tempfile.TemporaryDirectory() as tmp:
        endpoint = server.endpoint
        base = {k: v for k, v in os.environ.items() if not k.startswith("LOOPTRACE_")}
        for r in range(args.rounds):
            # Alternating, so that a burst of noise hits a round of each destination.
            for where, extra in (
                ("local store", {"LOOPTRACE_STORE": os.path.join(tmp, f"store-{r}.db")}),
                ("OTLP endpoint", {"LOOPTRACE_ENDPOINT": endpoint}),
                (
                    "store, settings",
                    {
                        "LOOPTRACE_STORE": os.path.join(tmp, f"store-s-{r}.db"),
                        "BENCH_READ_SETTINGS_FIRST": "1",
                    },
                ),
            ):
                out = subprocess.run(
                    [sys.executable, "-c", CHILD],
                    env={**base, **extra},
                    capture_output=True,
                    text=True,
                    check=True,
                    timeout=120,
                ).stdout
                for key, value in json.loads(out).items():
                    rows.setdefault((where, key), []).append(value * 1e6)
    print(f"caller's time per traced call in a fresh process, {args.rounds} processes (us)")
    print("('store, settings': the settings read before the loop, as a configure() at import does)")
    print(f"{'destination':<16}{'call':<12}{'median':>10}{'max':>10}{'x 100th':>10}")
    for (where, key), values in rows.items():
        hundredth = statistics.median(rows[(where, "hundredth")])
        ratio = statistics.median(values) / hundredth if hundredth else float("nan")
        print(
            f"{where:<16}{key:<12}{statistics.median(values):>10.1f}{max(values):>10.1f}"
            f"{ratio:>10.0f}"
        )


if __name__ == "__main__":
    main()
