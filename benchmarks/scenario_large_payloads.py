"""Large payloads, side by side in one run: does tracing them stall the event loop?

Part 1 (the threshold): how long the loop is blocked to serialize + encode one span inline,
versus to hand it to the worker pool (prepare + pickle), as the payload grows, for
string-heavy and structure-heavy payloads.

Part 2 (the scenario): 100 calls of a traced coroutine, each carrying a 2.5 MB base64 string,
then 100 carrying a ~165 KB structure-heavy dict, for looptrace with offload, looptrace
inline-only, the OpenTelemetry SDK (BatchSpanProcessor + OTLP/HTTP exporter) recording the
same attributes, and LangSmith's SDK (``@traceable`` with its client's background thread, as
shipped) when ``langsmith`` is installed: it sends to a mock of LangSmith's API in another
process (``GET /info``, ``POST /runs/multipart`` with zstd, as the real service offers, and
``POST /runs/batch``), which counts the runs it receives. The OTLP sink keeps connections alive
(HTTP/1.1), as OTLP receivers do, so no client pays a connection per request. A ticker measures event-loop lag every millisecond; the producer's per-call
time is measured around each ``await``. The OTLP sink runs in a separate process (decoding
250 MB of protobuf in this one would steal the GIL and blur the numbers). A control row, "bytes
moved, no tracing", runs the untraced baseline while another process sends the same requests:
the sink shares this machine's two CPUs, and receiving 250 MB costs the loop something that a
backend on another machine would not.

    .venv/bin/python benchmarks/scenario_large_payloads.py [--calls 100] [--rounds 3]
        [--only string|structure] [--skip-threshold]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import gzip
import http.server
import os
import pickle
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from typing import Any

import orjson

TICK = 0.001


# --------------------------------------------------------------------------- the sink process


def sink_main() -> None:
    """A minimal OTLP/HTTP receiver: decodes every request, counts spans, GET /count.

    It runs only when a core is idle (SCHED_IDLE): in production the backend is on another
    machine, and on two shared cores its decoding would otherwise be charged to whichever
    client is measured (the no-tracing baseline sends nothing, so it would never pay it).
    With nice 19 it still held the loop's core for a few milliseconds at a time."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        os.nice(19)
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    count = [0]
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        # Keep-alive, as OTLP receivers (the Collector, `looptrace serve`) do: an HTTP/1.0
        # sink closes every connection, and each client paid a connection per request.
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            # In reads of 256 KiB: one recv of a 2.5 MB body is a system call the kernel
            # (built without preemption here) runs to the end, so even at SCHED_IDLE the sink
            # held a core for a millisecond or more when a client's loop wanted it. A
            # backend on another machine costs the client nothing.
            left = int(self.headers["Content-Length"])
            parts = []
            while left > 0:
                part = self.rfile.read(min(left, 256 * 1024))
                if not part:
                    break
                parts.append(part)
                left -= len(part)
            body = b"".join(parts)
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            req = ExportTraceServiceRequest()
            req.ParseFromString(body)
            n = sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)
            with lock:
                count[0] += n
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_GET(self) -> None:
            with lock:
                payload = str(count[0]).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(server.server_address[1], flush=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sys.stdin.read()  # until the parent closes our stdin


def sender_main(port: int, path: str, calls: int) -> None:
    """Post the request body in ``path`` ``calls`` times, one after another, at most one per
    10 ms: the requests of the 100 large spans, from another process and without anything
    looptrace does. Runs SCHED_IDLE, as looptrace's workers do; starts on a line from stdin."""
    import http.client

    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        os.nice(19)
    with open(path, "rb") as f:
        body = f.read()
    conn = http.client.HTTPConnection("127.0.0.1", port)
    sys.stdin.readline()
    for _ in range(calls):
        started = time.perf_counter()
        conn.request("POST", "/v1/traces", body, {"Content-Type": "application/x-protobuf"})
        conn.getresponse().read()
        time.sleep(max(0.0, 0.01 - (time.perf_counter() - started)))


def langsmith_sink_main() -> None:
    """A mock of LangSmith's ingestion API: ``GET /info`` (multipart and zstd enabled, as the
    service answers), ``POST /runs/multipart`` and ``POST /runs/batch``; GET /count says how
    many distinct runs arrived. Runs SCHED_IDLE, as the OTLP sink does."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        os.nice(19)
    import re

    runs: set[bytes] = set()
    lock = threading.Lock()
    part_name = re.compile(rb'name="(?:post|patch)\.([0-9a-f-]{36})"')
    info = orjson.dumps(
        {
            "version": "0.10.0",
            "instance_flags": {"zstd_compression_enabled": True},
            # The service's answer (the client's own defaults, spelled out).
            "batch_ingest_config": {
                "use_multipart_endpoint": True,
                "size_limit": 100,
                "size_limit_bytes": 20 * 1024 * 1024,
                "scale_up_nthreads_limit": 32,
                "scale_up_qsize_trigger": 200,
                "scale_down_nempty_trigger": 4,
            },
        }
    )

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                parts = []
                while True:
                    size = int(self.rfile.readline().split(b";")[0], 16)
                    if size == 0:
                        self.rfile.readline()
                        break
                    parts.append(self.rfile.read(size))
                    self.rfile.readline()
                data = b"".join(parts)
            else:
                data = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.headers.get("Content-Encoding") == "zstd":
                import zstandard

                data = zstandard.ZstdDecompressor().decompressobj().decompress(data)
            elif self.headers.get("Content-Encoding") == "gzip":
                data = gzip.decompress(data)
            return data

        def answer(self, payload: bytes, status: int = 200) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def do_POST(self) -> None:
            data = self.body()
            if self.path.endswith("/runs/multipart"):
                found = set(part_name.findall(data))
            elif self.path.endswith("/runs/batch"):
                batch = orjson.loads(data)
                found = {
                    str(run["id"]).encode()
                    for run in batch.get("post", []) + batch.get("patch", [])
                }
            else:
                found = set()
            with lock:
                runs.update(found)
            self.answer(b"{}", 202)

        def do_GET(self) -> None:
            if self.path.endswith("/info"):
                self.answer(info)
                return
            with lock:
                payload = str(len(runs)).encode()
            self.answer(payload)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(server.server_address[1], flush=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sys.stdin.read()


class Sink:
    def __init__(self, mode: str = "--sink") -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, mode],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())
        self.url = f"http://127.0.0.1:{self.port}/v1/traces"

    def count(self) -> int:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/count") as r:
            return int(r.read())

    def wait_for(self, n: int, timeout: float = 120.0) -> int:
        deadline = time.monotonic() + timeout
        got = self.count()
        while got < n and time.monotonic() < deadline:
            time.sleep(0.05)
            got = self.count()
        return got

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=10)


# --------------------------------------------------------------------------- payloads


def string_payload(size: int) -> dict[str, Any]:
    """A bare base64 string (part 1's threshold table)."""
    raw = random.Random(1).randbytes(size * 3 // 4)
    return {"image": base64.b64encode(raw).decode(), "prompt": "describe this image"}


def structure_payload(size: int) -> dict[str, Any]:
    """Rows of records (part 1's threshold table)."""
    rng = random.Random(2)
    rows = []
    total = 0
    while total < size:
        row = {
            "id": len(rows),
            "name": f"item-{len(rows)}",
            "score": rng.random(),
            "tags": ["a", "b", "c"],
            "meta": {"created": "2024-01-01T00:00:00Z", "ok": True, "rank": rng.randint(0, 99)},
        }
        rows.append(row)
        total += len(orjson.dumps(row))
    return {"rows": rows, "model": "m"}


def _request(credentials: bool) -> dict[str, Any]:
    """What an LLM call's request carries besides its messages: the user, the session, headers
    with an API key (renamed in the clean variant) and sampling settings."""
    key, auth = ("api_key", "Authorization") if credentials else ("api_name", "Accept")
    return {
        "model": "gpt-4o-2024-08-06",
        "temperature": 0.2,
        "max_tokens": 1024,
        "user": "user-8812",
        "session": "conv-42",
        "headers": {auth: "Bearer sk-live-123", key: "sk-live-456", "X-Request-Id": "req-1"},
        "metadata": {"tenant": "acme", "feature": "support-bot"},
    }


def chat_payload(size: int, credentials: bool = True) -> dict[str, Any]:
    """A retrieval-augmented chat turn, about ``size`` bytes of JSON: a system prompt, the
    conversation so far (user and assistant messages, assistant tool calls with their JSON
    arguments, tool results), retrieved documents with scores and metadata, the request's
    settings (``user``, ``session``, headers with an API key: ``credentials=False`` renames
    the key that names a credential) and usage with token counts."""
    rng = random.Random(3)
    words = [
        "the",
        "order",
        "shipped",
        "late",
        "because",
        "the",
        "warehouse",
        "ran",
        "out",
        "of",
        "boxes",
        "again",
    ]

    def text(n: int) -> str:
        return " ".join(rng.choice(words) for _ in range(n))

    messages: list[dict[str, Any]] = [{"role": "system", "content": text(120)}]
    documents: list[dict[str, Any]] = []
    turn = 0
    while len(orjson.dumps({"messages": messages, "documents": documents})) < size - 1_000:
        call_id = f"call_{turn:04d}"
        messages += [
            {"role": "user", "content": text(40)},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {
                            "name": "search_orders",
                            "arguments": orjson.dumps({"query": text(6), "limit": 5}).decode(),
                        },
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call_id, "content": text(60)},
            {"role": "assistant", "content": text(50)},
        ]
        for k in range(4):
            documents.append(
                {
                    "id": f"doc-{turn}-{k}",
                    "title": text(6),
                    "url": f"https://kb.example.com/articles/{turn * 4 + k}",
                    "score": round(rng.random(), 4),
                    "text": text(45),
                    "metadata": {"source": "kb", "page": k, "chunk": turn, "lang": "en"},
                }
            )
        turn += 1
    return {
        "messages": messages,
        "documents": documents,
        "request": _request(credentials),
        "usage": {"prompt_tokens": 31_250, "completion_tokens": 412, "total_tokens": 31_662},
    }


def image_payload(size: int, credentials: bool = True) -> dict[str, Any]:
    """A multimodal chat request carrying one image as a base64 data URL (``size`` bytes of
    it), with the request's settings and usage as :func:`chat_payload` has them."""
    raw = random.Random(1).randbytes(size * 3 // 4)
    image = "data:image/png;base64," + base64.b64encode(raw).decode()
    return {
        "messages": [
            {"role": "system", "content": "You describe product photos for the catalogue."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Describe this photo in two sentences."},
                    {"type": "image_url", "image_url": {"url": image, "detail": "high"}},
                ],
            },
        ],
        "request": _request(credentials),
        "usage": {"prompt_tokens": 1_105, "completion_tokens": 61, "total_tokens": 1_166},
    }


# --------------------------------------------------------------------------- part 1


def threshold_table() -> None:
    from looptrace import _otlp, _serialize
    from looptrace._capture.spans import Span
    from looptrace._config import Config
    from looptrace._offload.parent import Offloader

    cfg = Config()
    off = Offloader(workers=1)

    def span_with(payload: Any) -> Span:
        s = Span("s", 1, 2, 0, 1)
        s.end_ns = 2
        s.inputs = payload
        return s

    def best(fn: Any, n: int) -> float:
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times) * 1e3

    async def pool_wall(span: Span, n: int) -> float:
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            await off.encode(span, cfg, "protobuf")
            times.append(time.perf_counter() - t0)
        return min(times) * 1e3

    print("\nPart 1: loop time per span, inline vs handing to the pool (best of N, ms)")
    print(f"{'payload':<11}{'JSON bytes':>12}{'inline':>10}{'pool: loop':>12}{'pool: wall':>12}")
    for kind, make in (("string", string_payload), ("structure", structure_payload)):
        for size in (16_000, 64_000, 256_000, 1_000_000, 2_500_000):
            span = span_with(make(size))
            n = 20 if size < 1_000_000 else 8
            inline = best(
                lambda span=span: _otlp.encode_span(_serialize.to_wire(span, cfg), "protobuf"), n
            )

            def handoff(span: Span = span) -> None:
                # What the loop does to hand a span over: the hooks, the walk that lifts its
                # large values out (the pool's thread copies those) and the pickle of the rest.
                from looptrace._offload.parent import _Lifter

                wire, inputs, output, pol, cap = _serialize.prepare(span, cfg)
                lifter = _Lifter()
                inputs = (inputs[0], lifter.lift(inputs[1]))
                pickle.dumps((wire, inputs, output, pol, cap, "protobuf"), protocol=5)

            loop_ms = best(handoff, n)
            wall = asyncio.run(pool_wall(span, n))
            jbytes = len(_serialize.to_json(span.inputs, cfg))
            print(f"{kind:<11}{jbytes:>12,}{inline:>10.2f}{loop_ms:>12.2f}{wall:>12.2f}")
    off.shutdown(wait=True)


# --------------------------------------------------------------------------- part 2


# What each late tick was made of, for the row being measured: (lag, the loop's thread ran,
# it waited for a CPU), seconds, as the kernel's scheduler counts them. The rest is "other".
STALLS: list[tuple[float, float, float]] = []
# How long the last row's final flush took, from the last call's end to everything sent and
# answered (seconds).
FLUSH = [0.0]


class _SchedStat:
    """This thread's time on a CPU and time runnable but waiting, from the kernel (Linux)."""

    def __init__(self) -> None:
        try:
            self.fd = os.open(f"/proc/self/task/{threading.get_native_id()}/schedstat", os.O_RDONLY)
        except OSError:
            self.fd = -1

    def read(self) -> tuple[float, float]:
        if self.fd < 0:
            return 0.0, 0.0
        fields = os.pread(self.fd, 64, 0).split()
        return int(fields[0]) / 1e9, int(fields[1]) / 1e9

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)


async def ticker(stop: asyncio.Event, lags: list[float]) -> None:
    stat = _SchedStat()
    last = time.perf_counter()
    ran0, waited0 = stat.read()
    while not stop.is_set():
        await asyncio.sleep(TICK)
        now = time.perf_counter()
        ran1, waited1 = stat.read()
        lag = max(now - last - TICK, 0.0)
        lags.append(lag)
        if lag > TICK:
            STALLS.append((lag, min(ran1 - ran0, lag), min(waited1 - waited0, lag)))
        last = now
        ran0, waited0 = ran1, waited1
    stat.close()


async def drive(
    call: Any, payload: Any, calls: int, finish: Any
) -> tuple[list[float], list[float]]:
    lags: list[float] = []
    per_call: list[float] = []
    stop = asyncio.Event()
    tick = asyncio.create_task(ticker(stop, lags))
    await asyncio.sleep(0.05)
    for _ in range(calls):
        t0 = time.perf_counter()
        await call(payload)
        per_call.append(time.perf_counter() - t0)
        await asyncio.sleep(0.01)  # the application doing other things between requests
    t0 = time.perf_counter()
    await finish()
    FLUSH[0] = time.perf_counter() - t0
    stop.set()
    await tick
    return lags, per_call


def looptrace_run(
    url: str, payload: Any, calls: int, offload: bool
) -> tuple[list[float], list[float]]:
    import looptrace

    looptrace.configure(endpoint=url, offload=offload, service_name="bench")

    @looptrace.traced
    async def handle(request: Any) -> str:
        return "ok"

    async def finish() -> None:
        await looptrace.flush(timeout=120)

    async def main() -> tuple[list[float], list[float]]:
        result = await drive(handle, payload, calls, finish)
        await looptrace.shutdown(timeout=30)
        return result

    return asyncio.run(main())


def baseline_run(payload: Any, calls: int) -> tuple[list[float], list[float]]:
    """No tracing at all: the lag the machine itself causes (other processes, the sink)."""

    async def handle(request: Any) -> str:
        return "ok"

    async def finish() -> None:
        await asyncio.sleep(0.2)

    return asyncio.run(drive(handle, payload, calls, finish))


def transfer_run(port: int, payload: Any, calls: int, tmp: str) -> tuple[list[float], list[float]]:
    """No tracing in this process, while another process (not looptrace) sends the same 100
    requests to the sink: what moving 250 MB to a receiver on the same two CPUs costs this
    process's loop, even when another process sends. The looptrace rows pay it too; a backend
    on another machine would not."""
    from looptrace import _otlp, _serialize
    from looptrace._capture.spans import Span
    from looptrace._config import Config

    cfg = Config()
    span = Span("handle", 1, 2, 0, 1)
    span.end_ns = 2
    span.inputs = {"request": payload}
    chunk = _otlp.encode_span(_serialize.to_wire(span, cfg), "protobuf")
    path = os.path.join(tmp, "request.bin")
    with open(path, "wb") as f:
        f.write(_otlp.encode_request([chunk], _otlp.default_resource(cfg), "protobuf"))
    sender = subprocess.Popen(
        [sys.executable, __file__, "--send", str(port), path, str(calls)],
        stdin=subprocess.PIPE,
        text=True,
    )
    assert sender.stdin is not None
    time.sleep(0.5)  # its imports, before the clock starts
    sender.stdin.write("go\n")
    sender.stdin.flush()

    async def handle(request: Any) -> str:
        return "ok"

    async def finish() -> None:
        await asyncio.to_thread(sender.wait)

    try:
        return asyncio.run(drive(handle, payload, calls, finish))
    finally:
        sender.kill()
        sender.wait()


def otel_run(url: str, payload: Any, calls: int) -> tuple[list[float], list[float]]:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url)))
    tracer = provider.get_tracer("bench")

    async def handle(request: Any) -> str:
        # OpenTelemetry attributes must be primitives: the caller serializes (with orjson,
        # the fastest choice such a user has).
        with tracer.start_as_current_span("handle") as span:
            span.set_attribute("input.value", orjson.dumps({"request": request}).decode())
            span.set_attribute("input.mime_type", "application/json")
            span.set_attribute("output.value", '"ok"')
            return "ok"

    async def finish() -> None:
        await asyncio.to_thread(provider.force_flush, 120_000)

    try:
        return asyncio.run(drive(handle, payload, calls, finish))
    finally:
        provider.shutdown()


def has_langsmith() -> bool:
    try:
        import langsmith  # noqa: F401
    except ImportError:
        return False
    return True


def _langsmith(url: str) -> tuple[Any, Any, Any]:
    """LangSmith's SDK as shipped: its client (whose background thread batches runs to the mock
    API, which offers zstd multipart as the service does), ``@traceable`` on the handler, and
    the final flush."""
    import langsmith

    os.environ["LANGSMITH_TRACING"] = "true"
    client = langsmith.Client(api_url=url, api_key="bench", auto_batch_tracing=True)

    @langsmith.traceable(client=client, name="handle", project_name="bench")
    async def handle(request: Any) -> str:
        return "ok"

    async def finish() -> None:
        await asyncio.to_thread(client.flush)

    return client, handle, finish


def langsmith_run(url: str, payload: Any, calls: int) -> tuple[list[float], list[float]]:
    """LangSmith's ``@traceable`` on the same coroutine."""
    client, handle, finish = _langsmith(url)
    try:
        return asyncio.run(drive(handle, payload, calls, finish))
    finally:
        client.cleanup()


def _steal_ms() -> float:
    """CPU time the hypervisor gave to other guests (all CPUs), from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        return int(fields[8]) * 1000 / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def _waited_ms() -> float:
    """How long this thread (the loop's) was runnable but waiting for a CPU."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as f:
            return int(f.read().split()[1]) / 1e6
    except (OSError, IndexError, ValueError):
        return 0.0


class Row:
    """One run's figures."""

    def __init__(
        self,
        lags: list[float],
        per_call: list[float],
        delivered: int,
        steal: float,
        waited: float,
        cpu: float,
    ) -> None:
        stalls = [lag for lag in lags if lag > TICK]
        per_call_us = sorted(x * 1e6 for x in per_call)
        self.max_ms = max(lags) * 1e3
        self.total_ms = sum(stalls) * 1e3
        self.ran_ms = sum(ran for _, ran, _ in STALLS) * 1e3
        self.stall_wait_ms = sum(min(w, lag - ran) for lag, ran, w in STALLS) * 1e3
        self.other_ms = self.total_ms - self.ran_ms - self.stall_wait_ms
        self.p50_ms = statistics.median(lags) * 1e3
        self.p95_us = per_call_us[int(len(per_call_us) * 0.95) - 1]
        self.delivered = delivered
        self.flush_s = FLUSH[0]
        self.steal = steal
        self.waited = waited
        self.cpu = cpu

    def line(self, name: str, calls: int) -> str:
        parts = f"{self.ran_ms:.0f}/{self.stall_wait_ms:.0f}/{self.other_ms:.0f}"
        return (
            f"{name:<26}{self.max_ms:>9.1f}{self.total_ms:>11.1f}{parts:>16}{self.p50_ms:>9.2f}"
            f"{self.p95_us:>11.1f}{self.delivered:>6}/{calls}{self.flush_s:>9.3f}"
            f"{self.steal:>9.0f}{self.waited:>9.1f}{self.cpu:>9.0f}"
        )


HEADER = (
    f"{'':<26}{'max ms':>9}{'total ms':>11}{'ran/wait/other':>16}{'p50 ms':>9}{'p95 us':>11}"
    f"{'delivered':>10}{'flush s':>9}{'steal':>9}{'waited':>9}{'cpu ms':>9}"
)


PAYLOADS = {
    "string": "2.5 MB image (base64 data URL) in a chat request",
    "structure": "~165 KB chat turn (messages, tool calls, documents, usage)",
}


def scenario(calls: int, rounds: int, only: str | None = None, inline: bool = False) -> None:
    """Each row ``rounds`` times, interleaved, so that a burst of noise on a shared machine hits
    one round of every row rather than every round of one. The structure rows run the chat
    payload with its secret-looking keys (``api_key``, ``Authorization``, masked) and, in the
    same rounds, with them renamed ("clean"), for their ratio. ``flush s`` is the final flush:
    from the last call's end until everything was sent and answered. ``steal`` is the CPU time
    (ms, both CPUs) the hypervisor gave to other guests during the row; ``ran/wait/other``
    splits the total lag by what the loop's thread did during the late ticks, as the kernel's
    scheduler counts it: it ran (this process's Python, tracing's included), it waited for a
    CPU (behind other tasks: the worker, the sink, kernel threads), or neither: it slept past
    its timer or waited for the GIL, or its CPU did interrupt work (the network receive, which
    on loopback the kernel does for the sink) or was not running at all (the host had not yet
    woken the halted vCPU); ``waited`` the time the loop's thread spent runnable but waiting
    for a CPU over the whole row; ``cpu ms`` the CPU time of this process, all its threads
    (the application's and the tracer's; not the worker's or the sink's). A round with much
    steal says little."""
    sink = Sink()
    ls_sink = Sink("--langsmith-sink") if has_langsmith() else None
    ls_url = f"http://127.0.0.1:{ls_sink.port}" if ls_sink is not None else ""
    if ls_sink is None:
        print("langsmith is not installed: its row is skipped (pip install langsmith)")
    tmp = tempfile.mkdtemp(prefix="looptrace-bench-")
    try:
        print(f"\nPart 2: {calls} traced calls per row, 1 ms ticker on the loop, {rounds} rounds")
        for kind, label in PAYLOADS.items():
            if only is not None and kind != only:
                continue
            if kind == "string":
                payload = image_payload(2_500_000)
                clean = None
            else:
                payload = chat_payload(165_000)
                clean = chat_payload(165_000, credentials=False)
            runs: list[tuple[str, Any, Sink, Any]] = [
                ("no tracing (baseline)", lambda p: baseline_run(p, calls), sink, payload),
            ]
            if kind == "string":
                runs.append(
                    (
                        "bytes moved, no tracing",
                        lambda p: transfer_run(sink.port, p, calls, tmp),
                        sink,
                        payload,
                    )
                )
            runs.append(
                ("looptrace", lambda p: looptrace_run(sink.url, p, calls, True), sink, payload)
            )
            if clean is not None:
                runs.append(
                    (
                        "looptrace, keys renamed",
                        lambda p: looptrace_run(sink.url, p, calls, True),
                        sink,
                        clean,
                    )
                )
            if inline:
                runs.append(
                    (
                        "looptrace (inline only)",
                        lambda p: looptrace_run(sink.url, p, calls, False),
                        sink,
                        payload,
                    )
                )
            runs.append(
                ("OpenTelemetry SDK", lambda p: otel_run(sink.url, p, calls), sink, payload)
            )
            if ls_sink is not None:
                runs.append(
                    (
                        "LangSmith SDK",
                        lambda p: langsmith_run(ls_url, p, calls),
                        ls_sink,
                        payload,
                    )
                )
            print(f"\n{label}  (lag: max, total of ticks late by > 1 ms, median; producer p95)")
            print(HEADER)
            rows: dict[str, list[Row]] = {}
            for r in range(rounds):
                for name, run, row_sink, row_payload in runs:
                    before = row_sink.count()
                    STALLS.clear()
                    FLUSH[0] = 0.0
                    steal, waited, cpu = _steal_ms(), _waited_ms(), time.process_time()
                    lags, per_call = run(row_payload)
                    steal, waited = _steal_ms() - steal, _waited_ms() - waited
                    cpu = (time.process_time() - cpu) * 1e3
                    expected = 0 if name.startswith("no tracing") else calls
                    delivered = row_sink.wait_for(before + expected, timeout=60) - before
                    row = Row(lags, per_call, delivered, steal, waited, cpu)
                    rows.setdefault(name, []).append(row)
                    print(row.line(f"{name} #{r + 1}", calls), flush=True)
            print(
                f"median of {rounds} rounds: max ms, total ms, p95 us, flush s; and the"
                " least-noisy round (least steal):"
            )
            for name, got in rows.items():
                quiet = min(got, key=lambda row: row.steal)
                print(
                    f"  {name:<26}"
                    f"{statistics.median(g.max_ms for g in got):>7.1f}"
                    f"{statistics.median(g.total_ms for g in got):>9.1f}"
                    f"{statistics.median(g.p95_us for g in got):>9.1f}"
                    f"{statistics.median(g.flush_s for g in got):>8.3f}   quiet: "
                    f"{quiet.max_ms:.1f} / {quiet.total_ms:.1f} / {quiet.p95_us:.1f}"
                    f" (steal {quiet.steal:.0f})"
                )
            if "looptrace, keys renamed" in rows:
                keyed = statistics.median(g.total_ms for g in rows["looptrace"])
                renamed = statistics.median(g.total_ms for g in rows["looptrace, keys renamed"])
                print(
                    f"  looptrace total lag, with keys / renamed: {keyed / max(renamed, 1e-9):.2f}x"
                )
    finally:
        sink.close()
        if ls_sink is not None:
            ls_sink.close()
        shutil.rmtree(tmp, ignore_errors=True)


# --------------------------------------------------------------------------- part 3


async def burst(call: Any, spans: int, finish: Any) -> tuple[list[float], float, float]:
    """``spans`` small traced calls as fast as the loop runs them (yielding every 100), then the
    final flush; the ticker's lags over both, the emission's and the flush's wall time."""
    lags: list[float] = []
    stop = asyncio.Event()
    tick = asyncio.create_task(ticker(stop, lags))
    await asyncio.sleep(0.05)
    t0 = time.perf_counter()
    for i in range(spans):
        await call({"question": "where is my order?", "i": i})
        if i % 100 == 99:
            await asyncio.sleep(0)
    t1 = time.perf_counter()
    await finish()
    t2 = time.perf_counter()
    stop.set()
    await tick
    return lags, t1 - t0, t2 - t1


def flush_looptrace(url: str, spans: int) -> tuple[list[float], float, float]:
    import looptrace

    looptrace.configure(endpoint=url, service_name="bench")

    @looptrace.traced
    async def handle(request: Any) -> str:
        return "ok"

    async def finish() -> None:
        await looptrace.flush(timeout=120)

    async def main() -> tuple[list[float], float, float]:
        result = await burst(handle, spans, finish)
        await looptrace.shutdown(timeout=30)
        return result

    return asyncio.run(main())


def flush_none(spans: int) -> tuple[list[float], float, float]:
    async def handle(request: Any) -> str:
        return "ok"

    async def finish() -> None:
        pass

    return asyncio.run(burst(handle, spans, finish))


def flush_otel(url: str, spans: int) -> tuple[list[float], float, float]:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url)))
    tracer = provider.get_tracer("bench")

    async def handle(request: Any) -> str:
        with tracer.start_as_current_span("handle") as span:
            span.set_attribute("input.value", orjson.dumps({"request": request}).decode())
            span.set_attribute("output.value", '"ok"')
            return "ok"

    async def finish() -> None:
        await asyncio.to_thread(provider.force_flush, 120_000)

    try:
        return asyncio.run(burst(handle, spans, finish))
    finally:
        provider.shutdown()


def flush_langsmith(url: str, spans: int) -> tuple[list[float], float, float]:
    client, handle, finish = _langsmith(url)
    try:
        return asyncio.run(burst(handle, spans, finish))
    finally:
        client.cleanup()


def final_flush(spans: int, rounds: int) -> None:
    """The final flush after a burst of small spans, each client in turn, ``rounds`` times:
    how long it takes (from the burst's end to everything sent and answered), what the ticker
    saw over the burst and the flush, and how many spans arrived."""
    sink = Sink()
    ls_sink = Sink("--langsmith-sink") if has_langsmith() else None
    try:
        runs: list[tuple[str, Any, Sink | None]] = [
            ("no tracing", lambda: flush_none(spans), None),
            ("looptrace", lambda: flush_looptrace(sink.url, spans), sink),
            ("OpenTelemetry SDK", lambda: flush_otel(sink.url, spans), sink),
        ]
        if ls_sink is not None:
            url = f"http://127.0.0.1:{ls_sink.port}"
            runs.append(("LangSmith SDK", lambda: flush_langsmith(url, spans), ls_sink))
        print(f"\nPart 3: the final flush after {spans:,} small spans, {rounds} rounds")
        print(
            f"{'':<24}{'emit s':>8}{'flush s':>9}{'max ms':>9}{'total ms':>10}"
            f"{'delivered':>12}{'cpu ms':>9}"
        )
        got: dict[str, list[tuple[float, float, float, float, int]]] = {}
        for r in range(rounds):
            for name, run, row_sink in runs:
                before = row_sink.count() if row_sink is not None else 0
                cpu = time.process_time()
                lags, emit_s, flush_s = run()
                cpu = (time.process_time() - cpu) * 1e3
                delivered = (
                    row_sink.wait_for(before + spans, timeout=60) - before
                    if row_sink is not None
                    else 0
                )
                total = sum(lag for lag in lags if lag > TICK) * 1e3
                got.setdefault(name, []).append(
                    (emit_s, flush_s, max(lags, default=0.0) * 1e3, total, delivered)
                )
                print(
                    f"{name + ' #' + str(r + 1):<24}{emit_s:>8.3f}{flush_s:>9.3f}"
                    f"{max(lags, default=0.0) * 1e3:>9.1f}{total:>10.1f}"
                    f"{delivered:>7}/{spans}{cpu:>9.0f}",
                    flush=True,
                )
        print(f"median of {rounds} rounds: emit s, flush s, max ms, total ms, delivered")
        for name, rows in got.items():
            print(
                f"  {name:<22}"
                + "".join(f"{statistics.median(row[i] for row in rows):>10.3f}" for i in range(4))
                + f"{statistics.median(row[4] for row in rows):>10.0f}"
            )
    finally:
        sink.close()
        if ls_sink is not None:
            ls_sink.close()


def one_row(kind: str, payload_kind: str, url: str, calls: int) -> None:
    """One row in this process, its figures printed as JSON (for the old-against-new run)."""
    payload = image_payload(2_500_000) if payload_kind == "string" else chat_payload(165_000)
    STALLS.clear()
    waited, cpu = _waited_ms(), time.process_time()
    if kind == "baseline":
        lags, per_call = baseline_run(payload, calls)
    else:
        lags, per_call = looptrace_run(url, payload, calls, True)
    waited, cpu = _waited_ms() - waited, (time.process_time() - cpu) * 1e3
    row = Row(lags, per_call, 0, 0.0, waited, cpu)
    figures = {
        "max": row.max_ms,
        "total": row.total_ms,
        "ran": row.ran_ms,
        "wait": row.stall_wait_ms,
        "other": row.other_ms,
        "p95": row.p95_us,
        "waited": row.waited,
        "cpu": row.cpu,
        "flush": row.flush_s,
    }
    print(orjson.dumps(figures).decode())


def in_process(script: str, args: list[str], *path: str) -> dict[str, Any]:
    """The JSON that ``script`` prints last, run with ``args`` in a fresh process whose
    import path starts with ``path`` (a checkout's ``src`` first: the looptrace it runs)."""
    out = subprocess.run(
        [sys.executable, script, *args],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(path)},
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    ).stdout
    result: dict[str, Any] = orjson.loads(out.strip().splitlines()[-1])
    return result


def old_against_new(old_src: str, calls: int, rounds: int, only: str | None = None) -> None:
    """The offload row of the code in ``old_src`` (a checkout's ``src``) against this
    checkout's, and the untraced baseline, alternating in fresh processes round by round, all
    sending to one sink."""
    new_src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    sink = Sink()
    try:
        for payload_kind in ("string", "structure"):
            if only is not None and payload_kind != only:
                continue
            print(f"\nold against new, {payload_kind} payloads, {calls} calls, {rounds} rounds")
            print(
                f"{'':<16}{'max ms':>9}{'total ms':>10}{'ran/wait/other':>16}{'p95 us':>9}"
                f"{'waited':>9}{'cpu ms':>9}{'delivered':>11}{'flush s':>9}"
            )
            got: dict[str, list[dict[str, float]]] = {}
            trees = [("old", old_src, "looptrace"), ("new", new_src, "looptrace")]
            for r in range(rounds):
                # The two trees swap places every round: in a fixed order the second always ran
                # right after the first had sent the sink 250 MB, and an effect of the order
                # could not be told from one of the code.
                for name, src, kind in [
                    ("no tracing", new_src, "baseline"),
                    *(trees if r % 2 == 0 else trees[::-1]),
                ]:
                    before = sink.count()
                    figures = in_process(
                        __file__,
                        ["--row", kind, payload_kind, sink.url, "--calls", str(calls)],
                        src,
                    )
                    expected = 0 if kind == "baseline" else calls
                    figures["delivered"] = sink.wait_for(before + expected, 60) - before
                    got.setdefault(name, []).append(figures)
                    split = f"{figures['ran']:.0f}/{figures['wait']:.0f}/{figures['other']:.0f}"
                    print(
                        f"{name + ' #' + str(r + 1):<16}{figures['max']:>9.1f}"
                        f"{figures['total']:>10.1f}{split:>16}{figures['p95']:>9.1f}"
                        f"{figures['waited']:>9.1f}{figures['cpu']:>9.0f}"
                        f"{figures['delivered']:>8}/{expected}{figures['flush']:>9.3f}",
                        flush=True,
                    )
            print("medians:")
            for name, rows in got.items():
                split = "/".join(
                    f"{statistics.median(x[k] for x in rows):.0f}" for k in ("ran", "wait", "other")
                )
                print(
                    f"  {name:<14}{statistics.median(x['max'] for x in rows):>9.1f}"
                    f"{statistics.median(x['total'] for x in rows):>10.1f}{split:>16}"
                    f"{statistics.median(x['p95'] for x in rows):>9.1f}"
                    f"{statistics.median(x['waited'] for x in rows):>9.1f}"
                    f"{statistics.median(x['cpu'] for x in rows):>9.0f}"
                    f"{statistics.median(x['flush'] for x in rows):>20.3f}"
                )
    finally:
        sink.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sink", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--langsmith-sink", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--send", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--skip-threshold", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--row", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument(
        "--old", metavar="SRC", help="compare the offload row with the looptrace in SRC"
    )
    parser.add_argument(
        "--only",
        choices=["string", "structure", "flush"],
        help="one payload kind (part 2 and --old), or only part 3",
    )
    parser.add_argument("--inline", action="store_true", help="add a row without offload")
    parser.add_argument("--spans", type=int, default=40_000, help="part 3's burst")
    args = parser.parse_args()
    if args.row:
        one_row(*args.row, args.calls)
        return
    if args.old:
        old_against_new(args.old, args.calls, args.rounds, args.only)
        return
    if args.sink:
        sink_main()
        return
    if args.langsmith_sink:
        langsmith_sink_main()
        return
    if args.send:
        port, path, calls = args.send
        sender_main(int(port), path, int(calls))
        return
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    if not args.skip_threshold and args.only is None:
        threshold_table()
    if args.only != "flush":
        scenario(args.calls, args.rounds, args.only, args.inline)
    if args.only in (None, "flush"):
        final_flush(args.spans, args.rounds)


if __name__ == "__main__":
    main()
