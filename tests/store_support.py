"""Build the spans a receiver would decode, for tests and benchmarks that fill a store directly;
run `looptrace serve` in a child process for those that go over HTTP."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from looptrace._wire import DecodedSpan


def decoded_span(
    trace: int,
    span: int,
    parent: int | None,
    name: str,
    start_ns: int,
    end_ns: int,
    *,
    attributes: dict[str, Any] | None = None,
    events: list[dict[str, Any]] | None = None,
    status: int = 0,
    message: str = "",
    resource: dict[str, Any] | None = None,
    scope: tuple[str, str] = ("test", "0"),
) -> DecodedSpan:
    """A DecodedSpan with integer ids (formatted as OTLP hex); ``end_ns`` 0 is in progress."""
    return DecodedSpan(
        trace_id=f"{trace:032x}",
        span_id=f"{span:016x}",
        parent_span_id=None if parent is None else f"{parent:016x}",
        name=name,
        kind=1,
        start_ns=start_ns,
        end_ns=end_ns,
        attributes=dict(attributes or {}),
        events=list(events or []),
        links=[],
        status_code=status,
        status_message=message,
        trace_state="",
        resource=dict(resource or {"service.name": "test"}),
        scope_name=scope[0],
        scope_version=scope[1],
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serve_subprocess(
    store: Path, timeout: float = 30.0
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """`looptrace serve --no-viewer` in a child process writing to ``store``: yields the process
    and its base URL once /api/stats answers; killed on leaving."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "looptrace.cli", "serve", "--port", str(port), "--no-viewer"],
        env={**os.environ, "LOOPTRACE_STORE": str(store)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if httpx.get(f"{url}/api/stats", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("looptrace serve did not start")
            time.sleep(0.02)
        yield proc, url
    finally:
        proc.kill()
        proc.wait()
