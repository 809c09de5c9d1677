"""A small, real OTLP/HTTP receiver for tests: 127.0.0.1, ephemeral port, one thread per request.

It decodes every request with ``opentelemetry-proto`` (protobuf, or OTLP/JSON with hex ids),
records it, and can misbehave on purpose:

    with OtlpTestServer() as server:
        server.latency = 0.3                     # every request waits 300 ms
        server.fail_next(503, 503, 429, retry_after="1")  # the next three requests fail
        server.fail_for(2.0, status=503)         # a 503 storm for two seconds
        server.reset_next(1)                     # the next request's connection is reset
        ...
        assert server.wait_for_spans(320, timeout=5)
        server.span_names(), server.accepted_span_count, server.requests

Import it from other test files as ``from otlp_server import OtlpTestServer``.

Benchmarks pass ``defer_decode=True``: requests are answered 200 at once and decoded when counts
are asked for, so a fast client is not measured against a server that competes with it for the
machine's two cores while it runs.
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import gzip
import http.server
import json
import socket
import ssl
import struct
import sys
import threading
import time
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan

__all__ = ["Fault", "OtlpServerProcess", "OtlpTestServer", "Received"]


@dataclasses.dataclass
class Fault:
    """How to answer one request instead of 200."""

    status: int = 200
    retry_after: str | None = None
    reset: bool = False  # close the connection with RST instead of answering
    delay: float = 0.0  # extra latency for this request


@dataclasses.dataclass
class Received:
    """One request as the server saw it."""

    path: str
    headers: dict[str, str]
    body: bytes  # as sent (compressed)
    status: int  # what the server answered (0: connection reset)
    request: ExportTraceServiceRequest | None  # decoded; None when it did not decode
    error: str | None = None

    @property
    def spans(self) -> list[ProtoSpan]:
        if self.request is None:
            return []
        return [
            span for rs in self.request.resource_spans for ss in rs.scope_spans for span in ss.spans
        ]


def _hex_ids_to_base64(doc: Any) -> Any:
    # OTLP/JSON writes ids as hex; protobuf's json_format expects base64 for bytes fields.
    if isinstance(doc, dict):
        out = {}
        for key, value in doc.items():
            if key in ("traceId", "spanId", "parentSpanId") and isinstance(value, str):
                out[key] = base64.b64encode(bytes.fromhex(value)).decode() if value else ""
            else:
                out[key] = _hex_ids_to_base64(value)
        return out
    if isinstance(doc, list):
        return [_hex_ids_to_base64(v) for v in doc]
    return doc


def decode_body(body: bytes, content_type: str, content_encoding: str) -> ExportTraceServiceRequest:
    """Decode an OTLP/HTTP trace request body with opentelemetry-proto (raises on bad input)."""
    enc = content_encoding.lower().strip()
    if enc == "gzip":
        body = gzip.decompress(body)
    elif enc == "zstd":
        import zstandard

        body = zstandard.ZstdDecompressor().decompressobj().decompress(body)
    elif enc not in ("", "identity"):
        raise ValueError(f"unknown content-encoding {enc!r}")
    msg = ExportTraceServiceRequest()
    if content_type.startswith("application/json"):
        from google.protobuf import json_format

        json_format.Parse(json.dumps(_hex_ids_to_base64(json.loads(body))), msg)
    else:
        msg.ParseFromString(body)
    return msg


class OtlpTestServer:
    """A threaded HTTP server recording OTLP trace requests; see the module docstring."""

    def __init__(
        self,
        latency: float = 0.0,
        defer_decode: bool = False,
        idle_timeout: float | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.latency = latency
        # Serve HTTPS with this server-side context (the endpoint then says https).
        self.tls = tls
        self.defer_decode = defer_decode
        # Close a kept-alive connection after this long without a request, as servers do.
        self.idle_timeout = idle_timeout
        self.connections_opened = 0
        self.connections_closed = 0
        self._deferred: list[Received] = []
        self.requests: list[Received] = []
        self._faults: collections.deque[Fault] = collections.deque()
        self._storm_until = 0.0
        self._storm = Fault()
        self._cond = threading.Condition()
        self._accepted: dict[tuple[bytes, bytes], ProtoSpan] = {}
        self._accepted_records = 0
        self.gate = threading.Event()  # cleared by hold(): requests wait until release()
        self.gate.set()
        self._active = 0
        self.max_concurrency = 0  # the most requests the server was handling at once
        self.times: list[float] = []  # time.monotonic() of each request's arrival
        # (arrival, answered, status) of each request, for overlap checks.
        self.intervals: list[tuple[float, float, int]] = []
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    # -- lifecycle --
    def start(self) -> OtlpTestServer:
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # small answers must not wait for delayed ACKs
            timeout = owner.idle_timeout

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                with owner._cond:
                    owner.connections_opened += 1

            def finish(self) -> None:
                try:
                    super().finish()
                finally:
                    with owner._cond:
                        owner.connections_closed += 1
                        owner._cond.notify_all()

            def do_POST(self) -> None:
                owner._handle(self)

            def do_GET(self) -> None:
                # /stats: counts as JSON, for a server running in another process.
                with owner._cond:
                    owner._settle()
                    stats = {
                        "requests": len(owner.requests),
                        "accepted_spans": len(owner._accepted),
                        "accepted_records": owner._accepted_records,
                        "statuses": [r.status for r in owner.requests],
                    }
                if self.path.startswith("/latency/"):
                    owner.latency = float(self.path.rsplit("/", 1)[1])
                elif self.path == "/clear":
                    owner.clear()
                payload = json.dumps(stats).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        class Server(http.server.ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                # A client that gave up (timeout, shutdown deadline) is not the server's error.
                exc = sys.exc_info()[1]
                if not isinstance(exc, (BrokenPipeError, ConnectionResetError)):
                    super().handle_error(request, client_address)

        server = Server(("127.0.0.1", self.port), Handler)
        if self.tls is not None:
            server.socket = self.tls.wrap_socket(server.socket, server_side=True)
        server.daemon_threads = True
        self._server = server
        self.port = server.server_address[1]
        self._thread = threading.Thread(
            target=server.serve_forever, args=(0.02,), name="otlp-test-server", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening (the port is kept, so ``start()`` again brings the server back)."""
        self.gate.set()
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> OtlpTestServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def endpoint(self) -> str:
        """The full URL to configure as ``endpoint``."""
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}/v1/traces"

    url = endpoint

    # -- misbehaviour --
    def fail_next(self, *statuses: int, retry_after: str | None = None) -> None:
        """Answer the next requests with these statuses, in order."""
        with self._cond:
            self._faults.extend(Fault(s, retry_after) for s in statuses)

    def add_faults(self, *faults: Fault) -> None:
        with self._cond:
            self._faults.extend(faults)

    def reset_next(self, count: int = 1) -> None:
        """Reset the connection of the next ``count`` requests without answering."""
        with self._cond:
            self._faults.extend(Fault(reset=True) for _ in range(count))

    def fail_for(self, seconds: float, status: int = 503, retry_after: str | None = None) -> None:
        """Answer every request with ``status`` for the next ``seconds``."""
        with self._cond:
            self._storm = Fault(status, retry_after)
            self._storm_until = time.monotonic() + seconds

    def hold(self) -> None:
        """Keep every request waiting (unanswered) until :meth:`release`."""
        self.gate.clear()

    def release(self) -> None:
        self.gate.set()

    def wait_for_active(self, count: int, timeout: float = 5.0) -> bool:
        """Block until ``count`` requests are being handled at once (e.g. held)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._active < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def wait_for_closed(self, count: int, timeout: float = 5.0) -> bool:
        """Block until the server has closed ``count`` connections in all."""
        with self._cond:
            return self._cond.wait_for(lambda: self.connections_closed >= count, timeout)

    def end_storm(self) -> None:
        with self._cond:
            self._storm_until = 0.0

    # -- what arrived --
    @property
    def accepted_span_count(self) -> int:
        """Distinct (trace id, span id) pairs in requests answered 2xx (in-progress excluded)."""
        with self._cond:
            self._settle()
            return len(self._accepted)

    @property
    def accepted_record_count(self) -> int:
        """Span records in 2xx requests, duplicates and in-progress records included."""
        with self._cond:
            self._settle()
            return self._accepted_records

    def accepted_spans(self) -> list[ProtoSpan]:
        with self._cond:
            self._settle()
            return list(self._accepted.values())

    def span_names(self) -> list[str]:
        return sorted(s.name for s in self.accepted_spans())

    def all_records(self) -> list[ProtoSpan]:
        """Every span record of every 2xx request, in arrival order (in-progress ones too)."""
        with self._cond:
            self._settle()
            return [s for r in self.requests if 200 <= r.status < 300 for s in r.spans]

    @property
    def request_count(self) -> int:
        with self._cond:
            return len(self.requests)

    def statuses(self) -> list[int]:
        with self._cond:
            return [r.status for r in self.requests]

    def wait_for_spans(self, count: int, timeout: float = 5.0) -> bool:
        """Block until ``count`` distinct spans were accepted (True) or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                self._settle()
                if len(self._accepted) >= count:
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)

    def wait_for_requests(self, count: int, timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self.requests) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def _settle(self) -> None:
        """Decode deferred requests (under the lock); one that does not decode is marked 400."""
        for received in self._deferred:
            try:
                received.request = decode_body(
                    received.body,
                    received.headers.get("content-type", ""),
                    received.headers.get("content-encoding", ""),
                )
            except Exception as exc:
                received.status, received.error = 400, f"{type(exc).__name__}: {exc}"
                continue
            for span in received.spans:
                self._accepted_records += 1
                if not _is_in_progress(span):
                    self._accepted[(span.trace_id, span.span_id)] = span
        self._deferred.clear()

    def clear(self) -> None:
        with self._cond:
            self._deferred.clear()
            self.times.clear()
            self.requests.clear()
            self._accepted.clear()
            self._accepted_records = 0

    # -- the handler --
    def _next_fault(self) -> Fault:
        with self._cond:
            if self._faults:
                return self._faults.popleft()
            if time.monotonic() < self._storm_until:
                return self._storm
            return Fault()

    def _handle(self, h: http.server.BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        headers = {k.lower(): v for k, v in h.headers.items()}
        with self._cond:
            arrived = time.monotonic()
            self.times.append(arrived)
            self._active += 1
            self.max_concurrency = max(self.max_concurrency, self._active)
            self._cond.notify_all()
        status = 0
        try:
            status = self._answer(h, body, headers)
        finally:
            with self._cond:
                self._active -= 1
                self.intervals.append((arrived, time.monotonic(), status))
                self._cond.notify_all()

    def _answer(
        self, h: http.server.BaseHTTPRequestHandler, body: bytes, headers: dict[str, str]
    ) -> int:
        fault = self._next_fault()
        wait = self.latency + fault.delay
        if wait > 0:
            time.sleep(wait)  # a handler thread, never an event loop
        self.gate.wait(30)
        if fault.reset:
            with self._cond:
                self.requests.append(Received(h.path, headers, body, 0, None, "reset"))
                self._cond.notify_all()
            # SO_LINGER 0 makes close() send RST: the client sees a connection reset.
            h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            h.connection.close()
            h.close_connection = True
            return 0
        request: ExportTraceServiceRequest | None = None
        error = None
        status = fault.status
        if h.path != "/v1/traces":
            status, error = 404, "not found"
        elif self.defer_decode and status == 200:
            with self._cond:
                received = Received(h.path, headers, body, status, None)
                self.requests.append(received)
                self._deferred.append(received)
            h.send_response(200)
            h.send_header("Content-Length", "0")
            h.end_headers()
            return 200
        else:
            try:
                request = decode_body(
                    body,
                    headers.get("content-type", ""),
                    headers.get("content-encoding", ""),
                )
            except Exception as exc:
                status, error = 400, f"{type(exc).__name__}: {exc}"
        received = Received(h.path, headers, body, status, request, error)
        with self._cond:
            self.requests.append(received)
            if 200 <= status < 300:
                for span in received.spans:
                    self._accepted_records += 1
                    if not _is_in_progress(span):
                        self._accepted[(span.trace_id, span.span_id)] = span
            self._cond.notify_all()
        payload = b"" if error is None else error.encode()
        h.send_response(status)
        if fault.retry_after is not None:
            h.send_header("Retry-After", fault.retry_after)
        h.send_header("Content-Type", headers.get("content-type", "application/x-protobuf"))
        h.send_header("Content-Length", str(len(payload)))
        h.end_headers()
        h.wfile.write(payload)
        return status


class OtlpServerProcess:
    """An :class:`OtlpTestServer` in a child process, so its CPU does not count against the
    process being measured (benchmarks). ``stats()`` / ``clear()`` / ``set_latency()`` talk to
    it over HTTP."""

    def __init__(self, latency: float = 0.0, defer_decode: bool = False) -> None:
        self.latency = latency
        self.defer_decode = defer_decode
        self.port = 0
        self._proc: Any = None

    def __enter__(self) -> OtlpServerProcess:
        import subprocess
        import sys

        self._proc = subprocess.Popen(
            [sys.executable, __file__, str(self.latency), str(int(self.defer_decode))],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.port = int(self._proc.stdout.readline())
        return self

    def __exit__(self, *exc: object) -> None:
        self._proc.terminate()
        self._proc.wait(10)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/traces"

    def _get(self, path: str) -> dict[str, Any]:
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as r:
            result: dict[str, Any] = json.loads(r.read())
            return result

    def stats(self) -> dict[str, Any]:
        return self._get("/stats")

    def clear(self) -> None:
        self._get("/clear")

    def set_latency(self, seconds: float) -> None:
        self._get(f"/latency/{seconds}")

    def wait_for_spans(self, count: int, timeout: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.stats()["accepted_spans"] >= count:
                return True
            time.sleep(0.05)  # polling another process; benchmarks only
        return False


def _is_in_progress(span: ProtoSpan) -> bool:
    for kv in span.attributes:
        if kv.key == "looptrace.in_progress":
            return kv.value.bool_value
    return span.end_time_unix_nano == 0


if __name__ == "__main__":
    _server = OtlpTestServer(
        latency=float(sys.argv[1]) if len(sys.argv) > 1 else 0.0,
        defer_decode=len(sys.argv) > 2 and sys.argv[2] == "1",
    ).start()
    print(_server.port, flush=True)
    threading.Event().wait()
