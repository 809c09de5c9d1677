"""What one export request costs the application's loop: looptrace's HTTP/1.1 client (every
endpoint reached directly) against httpx (an endpoint behind a proxy), side by side in one run.

Each round, each client sends the same body to the tests' OTLP server (in a process of its own,
so its CPU is not counted) over one kept-alive connection, one request after another; the
figure is the loop thread's CPU time per request (``time.thread_time``), which is what makes
the application's timers late. Clients alternate round by round; medians and spreads.

    .venv/bin/python benchmarks/scenario_http_client.py [--rounds 5] [--requests 300]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))

from looptrace._http1 import Http1Pool
from looptrace._net import HttpSettings
from looptrace._transport import _HttpxClient
from otlp_server import OtlpServerProcess

HEADERS = {"Content-Type": "application/x-protobuf"}
BODIES = {"16 KB body": b"\x0a\x00" * 8_000, "1 MB body": b"\x0a\x00" * 500_000}


async def cpu_per_request(make: Callable[[], Any], body: bytes, requests: int) -> float:
    client = make()
    try:
        await client.post(body, dict(HEADERS))  # the connection, opened before timing
        started = time.thread_time()
        for _ in range(requests):
            answer = await asyncio.wait_for(client.post(body, dict(HEADERS)), 30)
            assert answer.status == 200, answer
        return (time.thread_time() - started) / requests * 1e6
    finally:
        await client.aclose()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    with OtlpServerProcess(defer_decode=True) as server:
        settings = HttpSettings(server.endpoint)
        clients: dict[str, Callable[[], Any]] = {
            "looptrace HTTP/1.1": lambda: Http1Pool(settings),
            "httpx": lambda: _HttpxClient(settings),
        }
        print(f"loop CPU per request, us: median (min-max) of {args.rounds} alternating rounds")
        for label, body in BODIES.items():
            got: dict[str, list[float]] = {name: [] for name in clients}
            for _ in range(args.rounds):
                for name, make in clients.items():
                    got[name].append(asyncio.run(cpu_per_request(make, body, args.requests)))
            ours, theirs = (statistics.median(got[name]) for name in clients)
            for name, values in got.items():
                print(
                    f"  {label:<11} {name:<20}{statistics.median(values):>7.0f}"
                    f"  ({min(values):.0f}-{max(values):.0f})"
                )
            print(f"  {label:<11} looptrace / httpx: {ours / theirs:.2f}")


if __name__ == "__main__":
    main()
