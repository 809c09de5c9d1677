"""What the collector's and the viewer's tests share: the collector app under uvicorn on an
ephemeral port, spans and OTLP request bodies to post to it, and its peak memory."""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from looptrace import _otlp
from looptrace._wire import WireSpan
from looptrace.collector.app import create_app

PB = {"content-type": "application/x-protobuf"}
NOW = time.time_ns()


@contextlib.contextmanager
def running_collector(
    store_path: Path, http: Any = "auto", loop: str = "auto", **options: Any
) -> Iterator[str]:
    """The collector app under uvicorn in a background thread, on an ephemeral port
    (``http``: uvicorn's HTTP protocol, as ``looptrace serve`` may choose its own; ``loop``:
    uvicorn's event loop, ``"auto"`` being uvloop whenever it is installed)."""
    app = create_app(store_path, **options)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(
            app, log_level="warning", access_log=False, lifespan="on", http=http, loop=loop
        )
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30  # a bound for a loaded machine, not a pause
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the collector did not start")
        time.sleep(0.005)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def wire_span(trace: int, span: int, parent: int = 0, name: str = "op", **extra: Any) -> WireSpan:
    return WireSpan(
        trace,
        span,
        parent,
        name,
        extra.get("kind", 1),
        NOW + span,
        NOW + span + 1000,
        extra.get("attributes", [("k", "v")]),
        extra.get("events", []),
        extra.get("links", []),
        extra.get("status", 0),
        extra.get("message", ""),
    )


def request_body(spans: list[WireSpan], encoding: str = "protobuf") -> bytes:
    resource = _otlp.Resource([("service.name", "svc"), ("host.cpus", 2)], "looptrace", "0.1.0")
    return _otlp.encode_request([_otlp.encode_span(w, encoding) for w in spans], resource, encoding)


linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="peak RSS from /proc/<pid>/status"
)


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident set (VmHWM), in MiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")
