"""The collector's memory and redirect bounds, against `looptrace serve` on 127.0.0.1: a request
of a million tiny spans, a decompression bomb, many large uploads at once, a trace read past its
cap, and a redirect that must stay on the collector's own origin."""

from __future__ import annotations

import gzip
import os
import threading
from pathlib import Path

import httpx

from collector_support import (
    PB,
    linux_only,
    peak_rss_mb,
    request_body,
    running_collector,
    wire_span,
)
from looptrace import _otlp
from looptrace._store import Store
from looptrace.collector.app import DEFAULT_MAX_PENDING_BYTES
from store_support import serve_subprocess


def post_gzip_measured(tmp_path: Path, body: bytes) -> tuple[httpx.Response, float, int]:
    """POST a gzip body to a fresh `looptrace serve`: its answer, how much the collector's
    peak memory grew (MiB), and the status of a small request sent after it."""
    with serve_subprocess(tmp_path / "t.db") as (proc, url):
        before = peak_rss_mb(proc.pid)
        answer = httpx.post(
            f"{url}/v1/traces",
            content=body,
            headers={**PB, "content-encoding": "gzip"},
            timeout=120,
        )
        grew = peak_rss_mb(proc.pid) - before
        after = httpx.post(f"{url}/v1/traces", content=request_body([wire_span(8, 1)]), headers=PB)
    return answer, grew, after.status_code


def many_tiny_spans(n: int) -> bytes:
    """One gzip OTLP request of ``n`` minimal spans (the same span, repeated)."""
    chunk = _otlp.encode_span(wire_span(7, 1, attributes=[]), "protobuf")
    resource = _otlp.Resource([("service.name", "svc")], "looptrace", "0.1.0")
    return gzip.compress(_otlp.encode_request([chunk] * n, resource, "protobuf"), 1)


@linux_only
def test_a_million_tiny_spans_get_413_and_cost_little(tmp_path: Path) -> None:
    """A 1,000,000-span request (small once compressed, under the decompressed limit) is
    refused with a clear 413 once it passes the per-request span cap: the collector's peak
    memory grows by far less than decoding it all would take (2.5 million such spans took
    3.7 GB), and the collector keeps serving."""
    answer, grew, after = post_gzip_measured(tmp_path, many_tiny_spans(1_000_000))
    assert answer.status_code == 413
    assert b"more than 50000 spans" in answer.content
    assert grew < 300, f"peak RSS grew by {grew:.0f} MiB"
    assert after == 200


@linux_only
def test_a_decompression_bomb_costs_at_most_the_limit(tmp_path: Path) -> None:
    """A gzip body inflating past the 128 MiB decompressed limit is refused (413) having held
    about the limit, not twice it."""
    bomb = gzip.compress(bytes(200 * 1024 * 1024), 9)
    answer, grew, after = post_gzip_measured(tmp_path, bomb)
    assert answer.status_code == 413
    assert grew < 128 * 1.3, f"peak RSS grew by {grew:.0f} MiB"
    assert after == 200


@linux_only
def test_concurrent_uploads_share_one_byte_budget(tmp_path: Path) -> None:
    """32 uploads of 30 MB at once (960 MB) are admitted within one shared budget of request
    bodies: those past it get 429 with Retry-After (which OTLP exporters retry), and the
    collector's memory grows by about the budget, not by all of them."""
    payload = os.urandom(30 * 1024 * 1024)
    answers: list[httpx.Response] = []
    lock = threading.Lock()
    with serve_subprocess(tmp_path / "t.db") as (proc, url):
        before = peak_rss_mb(proc.pid)

        def upload() -> None:
            answer = httpx.post(f"{url}/v1/traces", content=payload, headers=PB, timeout=120)
            with lock:
                answers.append(answer)

        threads = [threading.Thread(target=upload) for _ in range(32)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
        grew = peak_rss_mb(proc.pid) - before
    statuses = sorted(a.status_code for a in answers)
    busy = [a for a in answers if a.status_code == 429]
    assert len(answers) == 32
    assert busy and all(a.headers["retry-after"] == "1" for a in busy)
    assert set(statuses) <= {400, 429}  # admitted junk is decoded and refused
    budget_mb = DEFAULT_MAX_PENDING_BYTES / (1024 * 1024)
    assert grew < budget_mb + 150, f"peak RSS grew by {grew:.0f} MiB"


def test_a_trace_read_past_its_cap_is_marked_truncated(tmp_path: Path) -> None:
    """``/api/traces/<id>`` returns at most the read cap of spans (in start order) and says
    ``truncated``; ``limit`` asks for fewer; a trace within the cap is not truncated."""
    path = tmp_path / "t.db"
    body = request_body([wire_span(0x51, s + 1) for s in range(30)])
    with running_collector(path, max_trace_spans=10) as url:
        assert httpx.post(f"{url}/v1/traces", content=body, headers=PB).status_code == 200
        small = request_body([wire_span(0x52, s + 1) for s in range(4)])
        assert httpx.post(f"{url}/v1/traces", content=small, headers=PB).status_code == 200
        capped = httpx.get(f"{url}/api/traces/{0x51:032x}").json()
        fewer = httpx.get(f"{url}/api/traces/{0x51:032x}", params={"limit": 5}).json()
        whole = httpx.get(f"{url}/api/traces/{0x52:032x}").json()
        too_many = httpx.get(f"{url}/api/traces/{0x51:032x}", params={"limit": 11})
    with Store(path) as store:
        first = [s["span_id"] for s in store.get_trace(f"{0x51:032x}")][:10]
    assert [s["span_id"] for s in capped["spans"]] == first and capped["truncated"] is True
    assert len(fewer["spans"]) == 5 and fewer["truncated"] is True
    assert len(whole["spans"]) == 4 and whole["truncated"] is False
    assert too_many.status_code == 400


def test_redirects_stay_on_the_collectors_origin(tmp_path: Path) -> None:
    """Opening ``//evil.example/?token=T`` (or ``/\\\\evil.example``) sets the cookie and
    redirects to a path on the collector itself, never to another site."""
    with running_collector(tmp_path / "t.db", token="T0k") as url:
        answers = [
            httpx.get(f"{url}//evil.example/?token=T0k"),
            httpx.get(f"{url}/%5Cevil.example/x?token=T0k&y=1"),
        ]
    for answer in answers:
        assert answer.status_code == 303
        location = answer.headers["location"]
        assert location.startswith("/") and not location.startswith(("//", "/\\\\"))
    assert answers[0].headers["location"] == "/evil.example/"


def test_a_request_head_sent_a_byte_at_a_time_is_cut_off(tmp_path: Path) -> None:
    """A client that sends its request line and headers slowly (slowloris) is disconnected
    once the header timeout passes, on a new connection and on a kept-alive one after an
    answer; a client that sends a whole head in time is served."""
    import socket
    import time

    from looptrace.collector.app import header_timeout_protocol

    def dripped_until_closed(sock: socket.socket) -> float:
        started = time.monotonic()
        sock.settimeout(0.05)
        for byte in b"GET /api/stats HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200:
            try:
                sock.sendall(bytes([byte]))
                if sock.recv(1024) == b"":
                    return time.monotonic() - started
            except TimeoutError:
                continue
            except OSError:
                return time.monotonic() - started
        return float("inf")

    with running_collector(tmp_path / "t.db", http=header_timeout_protocol(0.5)) as url:
        port = int(url.rsplit(":", 1)[1])
        fresh = socket.create_connection(("127.0.0.1", port))
        with fresh:
            assert dripped_until_closed(fresh) < 5
        kept = socket.create_connection(("127.0.0.1", port))
        with kept:
            kept.sendall(b"GET /api/stats HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            kept.settimeout(5)
            assert kept.recv(65536).startswith(b"HTTP/1.1 200")
            assert dripped_until_closed(kept) < 5
        assert httpx.get(f"{url}/api/stats").status_code == 200
