"""What the spool costs, and what it saves at exit, side by side in one run.

CPU per span: a fresh process emits N spans (one small attribute each) and flushes them to a
healthy OTLP/HTTP sink in another process, with the spool off, on (the default: it writes
nothing while the backend answers) and durable (every batch written, fsynced and removed);
then with the backend down for the whole run and the buffer's budget small, so that the
spool takes the overflow during the run and the rest at exit. CPU is the process's own (all
its threads) from the first span to the end of the flush (the exit's, for the outage row).

Exit time: how long a process takes from the end of its main code to its end, with a backend
that refuses connections (never contacted before the exit; or known down, after one failed
flush) and with one that accepts connections and never answers, with the spool off (what
looptrace did before it had one) and on. Rounds alternate the rows.

    .venv/bin/python benchmarks/scenario_spool.py [--rounds 3] [--spans 20000]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))

CHILD = """
import atexit, json, os, sys, time
mode, count, flush_first = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
t = {}
def report():
    import looptrace
    print(json.dumps({
        "cpu_us": (time.process_time() - t["cpu"]) / count * 1e6,
        "spooled": looptrace.statistics().spooled,
        "dropped": looptrace.statistics().dropped_total,
    }), flush=True)
if mode == "exit":
    # Registered before looptrace's exit hook, so it runs after it: the CPU of the exit counts.
    atexit.register(report)
import looptrace
looptrace.configure()
if flush_first:
    with looptrace.span("probe"):
        pass
    looptrace.flush_sync(1)
t["cpu"] = time.process_time()
for i in range(count):
    with looptrace.span("work") as s:
        s.set_attribute("i", i)
if mode == "flush":
    looptrace.flush_sync(60)
    report()
else:
    # Registered after looptrace's exit hook: runs before it, so the end of main is now.
    atexit.register(lambda: print(json.dumps({"end": time.monotonic()}), flush=True))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child(
    script: str,
    endpoint: str,
    spool_dir: str,
    mode: str,
    count: int,
    extra: dict[str, str],
    flush_first: bool = False,
) -> tuple[dict[str, float], float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOOPTRACE_", "OTEL_"))}
    env.update(
        LOOPTRACE_ENDPOINT=endpoint, LOOPTRACE_SPOOL_DIR=spool_dir, LOOPTRACE_OFFLOAD="false"
    )
    env.update(extra)
    proc = subprocess.Popen(
        [sys.executable, script, mode, str(count), "1" if flush_first else "0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    out, _ = proc.communicate(timeout=120)
    ended = time.monotonic()
    merged: dict[str, float] = {}
    for line in out.splitlines():
        if line.startswith("{"):
            merged.update(json.loads(line))
    exit_s = ended - merged["end"] if "end" in merged else 0.0
    return merged, exit_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--spans", type=int, default=20_000)
    args = parser.parse_args()
    from otlp_server import OtlpServerProcess

    work = tempfile.mkdtemp(prefix="looptrace-spool-bench-")
    script = os.path.join(work, "child.py")
    with open(script, "w") as f:
        f.write(CHILD)
    spool_dir = os.path.join(work, "spool")
    down = f"http://127.0.0.1:{free_port()}/v1/traces"
    hang = socket.socket()
    hang.bind(("127.0.0.1", 0))
    hang.listen(512)  # connections complete in the kernel; nothing ever answers
    hanging = f"http://127.0.0.1:{hang.getsockname()[1]}/v1/traces"

    off = {"LOOPTRACE_SPOOL": "false"}
    on: dict[str, str] = {}
    durable = {"LOOPTRACE_SPOOL_DURABLE": "true"}
    small = {"LOOPTRACE_MAX_BUFFER_SPANS": "4000"}
    cpu: dict[str, list[float]] = {}
    exits: dict[str, list[float]] = {}
    kept: dict[str, list[tuple[float, float]]] = {}
    with OtlpServerProcess(defer_decode=True) as sink:
        rows = [
            ("no spool", sink.endpoint, off),
            ("spool (default)", sink.endpoint, on),
            ("spool, durable", sink.endpoint, durable),
        ]
        for _ in range(args.rounds):
            for name, endpoint, extra in rows:
                got, _ = child(script, endpoint, spool_dir, "flush", args.spans, extra)
                cpu.setdefault(name, []).append(got["cpu_us"])
            for name, extra in (
                ("backend down: spooled at exit", on),
                ("backend down, buffer 4,000: spilled", {**on, **small}),
            ):
                got, _ = child(script, down, spool_dir, "exit", args.spans, extra)
                cpu.setdefault(name, []).append(got["cpu_us"])
                kept.setdefault(name, []).append((got["spooled"], got["dropped"]))
            for label, endpoint, flush_first in (
                ("refused, never contacted", down, False),
                ("refused, known down", down, True),
                ("accepts, never answers", hanging, False),
            ):
                for mode, extra in (("today (no spool)", off), ("spool", on)):
                    _, took = child(script, endpoint, spool_dir, "exit", 1000, extra, flush_first)
                    exits.setdefault(f"{label}: {mode}", []).append(took)
    hang.close()
    print(f"CPU per span ({args.spans} spans, median of {args.rounds} fresh processes)")
    for name, values in cpu.items():
        line = f"  {name:38s} {statistics.median(values):6.2f} us"
        if name in kept:
            spooled = statistics.median(k[0] for k in kept[name])
            dropped = statistics.median(k[1] for k in kept[name])
            line += f"   spooled {spooled:.0f}, dropped {dropped:.0f}"
        print(line)
    print("Exit time, 1,000 spans unsent at the end of main (median)")
    for name, values in exits.items():
        print(f"  {name:44s} {statistics.median(values):6.3f} s")


if __name__ == "__main__":
    main()
