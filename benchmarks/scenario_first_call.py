"""The first traced call of a process against its hundredth, side by side in one run.

Each round starts a fresh interpreter that imports looptrace, decorates a coroutine (as a module
does at import time), then awaits it 100 times on one event loop, timing each call; spans go to
a local store in a temporary folder, or (the second row) to an OTLP endpoint: the tests' OTLP
server, in a process of its own; the third row reads the settings before the loop runs, as a
``looptrace.configure()`` at import does; the last, ``no tracing``, awaits the same coroutine
undecorated (what a first call costs Python itself). The first call pays what is left of
looptrace's start-up on the loop; the last column is each call's time as a multiple of the
hundredth's.

Wall time on a first call is mostly cold caches and pages, which move with the machine;
``--instructions`` counts, under ``valgrind --tool=callgrind``, the instructions of the first,
second and hundredth call alone (counting starts at a ``os.getppid()`` just before the call
and stops at a ``os.getpgrp()`` just after), a figure the machine's load does not move.

    .venv/bin/python benchmarks/scenario_first_call.py [--rounds 7] [--old OTHER/src]
    .venv/bin/python benchmarks/scenario_first_call.py --instructions [--old OTHER/src]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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

async def plain(request):
    return request

async def main():
    call = plain if os.environ.get("BENCH_UNTRACED") else handle
    times = []
    for i in range(100):
        started = time.perf_counter()
        await call({"i": i})
        times.append(time.perf_counter() - started)
    await looptrace.flush(timeout=10)
    print(json.dumps({"first": times[0], "second": times[1], "hundredth": times[99]}))

asyncio.run(main())
"""


ROWS = (
    ("local store", "store"),
    ("OTLP endpoint", "otlp"),
    ("store, settings", "settings"),
    ("no tracing", "untraced"),
)

# One call counted alone: instructions between a getppid() before it and a getpgrp() after.
COUNTED = """
import asyncio, os, sys
import looptrace

@looptrace.traced
async def handle(request):
    return request

WHICH = int(sys.argv[1])

async def main():
    for i in range(100):
        if i == WHICH:
            os.getppid()
        await handle({"i": i})
        if i == WHICH:
            os.getpgrp()
    os._exit(0)

asyncio.run(main())
"""


def measure(rounds: int, trees: dict[str, str | None]) -> dict[tuple[str, str, str], list[float]]:
    """Per (tree, destination, call): the caller's time in each fresh process (us). ``trees``
    maps a label to the ``src`` put first on the import path (None: the installed looptrace,
    or this checkout's when run from it); trees and destinations alternate round by round."""
    rows: dict[tuple[str, str, str], list[float]] = {}
    with OtlpServerProcess(defer_decode=True) as server, tempfile.TemporaryDirectory() as tmp:
        base = {k: v for k, v in os.environ.items() if not k.startswith("LOOPTRACE_")}
        for r in range(rounds):
            order = list(trees.items())
            if r % 2:
                order.reverse()
            for tree, src in order:
                # Alternating, so that a burst of noise hits a round of each destination.
                for where, kind in ROWS:
                    extra = {
                        "store": {"LOOPTRACE_STORE": os.path.join(tmp, f"{tree}-{r}.db")},
                        "otlp": {"LOOPTRACE_ENDPOINT": server.endpoint},
                        "settings": {
                            "LOOPTRACE_STORE": os.path.join(tmp, f"{tree}-s-{r}.db"),
                            "BENCH_READ_SETTINGS_FIRST": "1",
                        },
                        "untraced": {
                            "LOOPTRACE_STORE": os.path.join(tmp, f"{tree}-u-{r}.db"),
                            "BENCH_UNTRACED": "1",
                        },
                    }[kind]
                    env = {**base, **extra}
                    if src is not None:
                        env["PYTHONPATH"] = src
                    out = subprocess.run(
                        [sys.executable, "-c", CHILD],
                        env=env,
                        capture_output=True,
                        text=True,
                        check=True,
                        timeout=120,
                    ).stdout
                    for key, value in json.loads(out.strip().splitlines()[-1]).items():
                        rows.setdefault((tree, where, key), []).append(value * 1e6)
    return rows


def report(rows: dict[tuple[str, str, str], list[float]], rounds: int) -> None:
    print(f"caller's time per traced call in a fresh process, {rounds} processes (us)")
    print("('store, settings': the settings read before the loop, as a configure() at import does)")
    print(f"{'tree':<8}{'destination':<16}{'call':<12}{'median':>10}{'max':>10}{'x 100th':>10}")
    for (tree, where, key), values in rows.items():
        hundredth = statistics.median(rows[(tree, where, "hundredth")])
        ratio = statistics.median(values) / hundredth if hundredth else float("nan")
        print(
            f"{tree:<8}{where:<16}{key:<12}{statistics.median(values):>10.1f}"
            f"{max(values):>10.1f}{ratio:>10.1f}"
        )


def instructions(trees: dict[str, str | None]) -> None:
    """Instructions of the first, second and hundredth call, each counted alone, per tree
    (local store destination)."""
    if shutil.which("valgrind") is None:
        print("--instructions needs valgrind")
        return
    print("instructions per traced call, each call counted alone (local store)")
    print(f"{'tree':<8}{'first':>10}{'second':>10}{'hundredth':>11}{'first/100th':>13}")
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "counted.py")
        Path(script).write_text(COUNTED)
        base = {k: v for k, v in os.environ.items() if not k.startswith("LOOPTRACE_")}
        for tree, src in trees.items():
            counts = []
            for which in (0, 1, 99):
                out = os.path.join(tmp, f"cg-{tree}-{which}")
                env = {**base, "LOOPTRACE_STORE": os.path.join(tmp, f"{tree}-{which}.db")}
                if src is not None:
                    env["PYTHONPATH"] = src
                subprocess.run(
                    [
                        "valgrind",
                        "--tool=callgrind",
                        f"--callgrind-out-file={out}",
                        "--zero-before=os_getppid",
                        "--dump-before=os_getpgrp",
                        sys.executable,
                        script,
                        str(which),
                    ],
                    env=env,
                    capture_output=True,
                    check=True,
                    timeout=600,
                )
                (dump,) = [f for f in os.listdir(tmp) if f.startswith(f"cg-{tree}-{which}.")]
                text = Path(tmp, dump).read_text()
                counts.append(int(text.split("\nsummary: ", 1)[1].split()[0]))
            first, second, hundredth = counts
            print(f"{tree:<8}{first:>10,}{second:>10,}{hundredth:>11,}{first / hundredth:>13.1f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument(
        "--old", metavar="SRC", help="also run the looptrace in SRC (a checkout's src), alternating"
    )
    parser.add_argument(
        "--instructions", action="store_true", help="count instructions (valgrind) instead"
    )
    args = parser.parse_args()
    here = str(Path(__file__).parent.parent / "src")
    trees: dict[str, str | None] = {"now": here}
    if args.old:
        trees["old"] = args.old
    if args.instructions:
        instructions(trees)
        return
    report(measure(args.rounds, trees), args.rounds)


if __name__ == "__main__":
    main()
