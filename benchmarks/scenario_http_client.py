"""What one export request costs the application's loop: looptrace's HTTP/1.1 client (h11 over
the loop's transports, every endpoint reached directly) against httpx (an endpoint behind a
proxy) and, given ``--old-src``, the client of another checkout, side by side in one run.

Each round, each client runs in a fresh process and sends the same body to the tests' OTLP
server (a process of its own, so its CPU is not counted) over one kept-alive connection, one
request after another, twice: once alone, for the loop thread's CPU per request
(``time.thread_time``, what makes the application's timers late), once beside a 1 ms ticker,
for the loop's lag (how late the ticker woke, summed over the run, per request, and the worst
wake-up). Bodies: a structure-heavy request (~16 KB of small protobuf fields) and a 2.5 MB one.
Clients alternate round by round; medians, spreads, and ratios to httpx.

    .venv/bin/python benchmarks/scenario_http_client.py [--rounds 5] [--old-src /tmp/old/src]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
NEW_SRC = str(HERE.parent / "src")
HEADERS = {"Content-Type": "application/x-protobuf"}


def _structure_body() -> bytes:
    # Many short length-delimited fields, as an encoded batch of small spans is.
    field = b"\x0a\x10" + b"key.name.abcdefg" + b"\x12\x08" + b"value-01"
    return field * (16_000 // len(field))


BODIES: dict[str, tuple[bytes, int]] = {
    "structure 16 KB": (_structure_body(), 300),
    "2.5 MB": (b"QUJD" * 625_000, 20),
}


def _client(kind: str, url: str) -> Any:
    """The client ``kind`` of whichever looptrace is first on the import path."""
    if kind == "httpx":
        try:
            from looptrace._transport.proxy import HttpxClient
            from looptrace._transport.settings import HttpSettings
        except ImportError:  # a checkout from before the transport package
            from looptrace._net import HttpSettings  # type: ignore[no-redef]

            from looptrace._transport import (  # type: ignore[attr-defined,no-redef]
                _HttpxClient as HttpxClient,
            )
        return HttpxClient(HttpSettings(url))
    try:
        from looptrace._transport.http11 import Http11Pool
        from looptrace._transport.settings import HttpSettings
    except ImportError:
        from looptrace._http1 import Http1Pool as Http11Pool  # type: ignore[no-redef]
        from looptrace._net import HttpSettings  # type: ignore[no-redef]
    return Http11Pool(HttpSettings(url))


async def _measure(kind: str, url: str, body: bytes, requests: int) -> dict[str, float]:
    client = _client(kind, url)
    try:
        await client.post(body, dict(HEADERS))  # the connection, opened before timing
        started = time.thread_time()
        for _ in range(requests):
            answer = await asyncio.wait_for(client.post(body, dict(HEADERS)), 60)
            assert answer.status == 200, answer
        cpu_us = (time.thread_time() - started) / requests * 1e6

        lags: list[float] = []
        done = False

        async def ticker() -> None:
            while not done:
                before = time.perf_counter()
                await asyncio.sleep(0.001)
                lags.append(max(0.0, time.perf_counter() - before - 0.001))

        tick = asyncio.create_task(ticker())
        await asyncio.sleep(0.01)
        lags.clear()
        for _ in range(requests):
            answer = await asyncio.wait_for(client.post(body, dict(HEADERS)), 60)
            assert answer.status == 200, answer
        done = True
        await tick
        return {
            "cpu_us": cpu_us,
            "lag_us": sum(lags) / requests * 1e6,
            "max_ms": max(lags, default=0.0) * 1e3,
        }
    finally:
        await client.aclose()


def _child(kind: str, url: str, body_name: str) -> None:
    body, requests = BODIES[body_name]
    print(json.dumps(asyncio.run(_measure(kind, url, body, requests))))


def _in_process(src: str, kind: str, url: str, body_name: str) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", kind, url, body_name],
        env={**os.environ, "PYTHONPATH": src},
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    ).stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--old-src", help="another checkout's src: its client is a row too")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(*args.child)
        return
    sys.path.insert(0, str(HERE.parent / "tests"))
    from otlp_server import OtlpServerProcess

    clients = {"looptrace h11": (NEW_SRC, "pool"), "httpx": (NEW_SRC, "httpx")}
    if args.old_src:
        clients = {"looptrace old": (args.old_src, "pool"), **clients}
    with OtlpServerProcess(defer_decode=True) as server:
        print(
            f"loop CPU per request (us), loop lag per request (us), worst lag (ms): "
            f"median (min-max) of {args.rounds} alternating rounds"
        )
        for body_name in BODIES:
            got: dict[str, list[dict[str, float]]] = {name: [] for name in clients}
            for _ in range(args.rounds):
                for name, (src, kind) in clients.items():
                    got[name].append(_in_process(src, kind, server.endpoint, body_name))
            medians = {
                name: {k: statistics.median(r[k] for r in runs) for k in runs[0]}
                for name, runs in got.items()
            }
            print(f"\n{body_name}")
            print(f"  {'':<15}{'CPU us':>20}{'lag us':>20}{'worst ms':>18}")
            for name, runs in got.items():
                cells = []
                for key, fmt in (("cpu_us", ".0f"), ("lag_us", ".0f"), ("max_ms", ".1f")):
                    values = [r[key] for r in runs]
                    spread = f"({min(values):{fmt}}-{max(values):{fmt}})"
                    cells.append(f"{medians[name][key]:>7{fmt}} {spread:<12}")
                print(f"  {name:<15}" + "".join(cells))
            base = medians["httpx"]
            for name in clients:
                if name == "httpx":
                    continue
                print(
                    f"  {name} / httpx: CPU {medians[name]['cpu_us'] / base['cpu_us']:.2f}, "
                    f"lag {medians[name]['lag_us'] / max(base['lag_us'], 1e-9):.2f}"
                )
            if args.old_src:
                new, old = medians["looptrace h11"], medians["looptrace old"]
                print(
                    f"  h11 / old: CPU {new['cpu_us'] / old['cpu_us']:.2f}, "
                    f"lag {new['lag_us'] / max(old['lag_us'], 1e-9):.2f}"
                )


if __name__ == "__main__":
    main()
