"""The collector's network edges, against a real uvicorn on 127.0.0.1 under asyncio and uvloop:
every legal ``Content-Encoding`` framing decodes (multi-member gzip, zlib deflate, zstd of
several frames), malformed framings get 400 and bombs 413 in bounded memory, the decode slots
stay free for the next request, and without a token only requests addressed to this machine
(by their ``Host``) are answered."""

from __future__ import annotations

import concurrent.futures
import gzip
import importlib.util
import signal
import struct
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from collector_support import (
    PB,
    linux_only,
    peak_rss_mb,
    request_body,
    running_collector,
    wire_span,
)
from looptrace.collector import viewer
from looptrace.collector.bodies import MAX_MEMBERS
from store_support import serve_subprocess

zstandard = pytest.importorskip("zstandard")

LIMIT = 1024 * 1024  # the decompressed limit of the collectors started here


@pytest.fixture(
    params=[
        "asyncio",
        pytest.param(
            "uvloop",
            marks=pytest.mark.skipif(
                importlib.util.find_spec("uvloop") is None, reason="uvloop is not installed"
            ),
        ),
    ]
)
def loop(request: pytest.FixtureRequest) -> str:
    """uvicorn's event loop: asyncio's own, and uvloop (what uvicorn picks when installed)."""
    return str(request.param)


@pytest.fixture
def collector(tmp_path: Path, loop: str) -> Iterator[str]:
    """A token-less collector with a 1 MiB decompressed limit, on ``loop``. Its budget of
    request bodies held at once (3 MiB) is less than what a test sends in all: a refused
    request that kept its share would turn later ones into 429s."""
    with running_collector(
        tmp_path / "edges.db", loop=loop, max_decompressed_bytes=LIMIT, max_pending_bytes=3 * LIMIT
    ) as url:
        yield url


def post(url: str, body: bytes, encoding: str | None, timeout: float = 30) -> httpx.Response:
    headers = dict(PB)
    if encoding:
        headers["content-encoding"] = encoding
    return httpx.post(f"{url}/v1/traces", content=body, headers=headers, timeout=timeout)


def still_serving(url: str, trace: int) -> bool:
    """A valid request after the others is answered 200 and its span is readable: the decode
    slots are free and nothing was left spinning."""
    answer = post(url, request_body([wire_span(trace, 1)]), None, timeout=10)
    found = httpx.get(f"{url}/api/traces/{trace:032x}", timeout=10)
    return answer.status_code == 200 and found.status_code == 200


def stored_spans(url: str) -> int:
    return int(httpx.get(f"{url}/api/stats", timeout=10).json()["spans"])


def zstd(data: bytes) -> bytes:
    return bytes(zstandard.ZstdCompressor().compress(data))


def skippable_frame(payload: bytes) -> bytes:
    return struct.pack("<II", 0x184D2A50, len(payload)) + payload


def members(raw: bytes, parts: int, pack: Callable[[bytes], bytes] = gzip.compress) -> bytes:
    """``raw`` cut into ``parts`` pieces, each compressed on its own, the results concatenated."""
    step = -(-len(raw) // parts)
    return b"".join(pack(raw[i : i + step]) for i in range(0, len(raw), step))


def two_requests() -> bytes:
    """Two OTLP requests of 60 spans each in one body: protobuf concatenation merges them."""
    first = request_body(
        [wire_span(0xA1, s + 1, attributes=[("pad", "x" * 300)]) for s in range(60)]
    )
    second = request_body([wire_span(0xA2, s + 1) for s in range(60)])
    return first + second


def test_every_legal_framing_decodes(collector: str) -> None:
    """gzip of one member and of several (the empty member included, and members past the
    decompressor's output chunk, the body that used to spin for ever), zlib deflate, and zstd
    of one frame or several with skippable frames between them: each is answered 200 and all
    120 spans of the body are stored, then a plain request is still served."""
    raw = two_requests()
    big = request_body(
        [wire_span(0xB0, s + 1, attributes=[("pad", "y" * 1000)]) for s in range(300)]
    )
    assert len(big) > 256 * 1024  # two members, each past the 256 KiB output chunk
    bodies = {
        "identity": (raw, None),
        "gzip, one member": (gzip.compress(raw), "gzip"),
        "gzip, two members": (members(raw, 2), "gzip"),
        "gzip, seven members and an empty one": (gzip.compress(b"") + members(raw, 7), "gzip"),
        "x-gzip, two members": (members(raw, 2), "x-gzip"),
        "deflate (zlib)": (zlib.compress(raw), "deflate"),
        "zstd, one frame": (zstd(raw), "zstd"),
        "zstd, three frames and skippable ones": (
            skippable_frame(b"meta") + members(raw, 3, zstd) + skippable_frame(b""),
            "zstd",
        ),
    }
    for name, (body, encoding) in bodies.items():
        answer = post(collector, body, encoding)
        assert answer.status_code == 200, (name, answer.content)
    spans_each = 120
    assert stored_spans(collector) == spans_each  # the same spans, stored once
    big_answer = post(collector, gzip.compress(big[:200_000] + big[200_000:]), "gzip")
    assert big_answer.status_code == 200
    big_two = post(collector, gzip.compress(big[:300_000]) + gzip.compress(big[300_000:]), "gzip")
    assert big_two.status_code == 200, big_two.content
    assert stored_spans(collector) == spans_each + 300
    assert still_serving(collector, 0xC1)


def test_more_multi_member_bodies_than_decode_slots_are_all_answered(collector: str) -> None:
    """Eight two-member gzip bodies whose members inflate past one output chunk, sent at once
    (more than the decode slots): all are answered 200, and a request after them too."""
    big = request_body(
        [wire_span(0xD0, s + 1, attributes=[("pad", "z" * 1000)]) for s in range(300)]
    )
    body = gzip.compress(big[:300_000]) + gzip.compress(big[300_000:])
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: post(collector, body, "gzip", timeout=30), range(8)))
    assert [a.status_code for a in answers] == [200] * 8
    assert still_serving(collector, 0xC2)


def test_malformed_framings_get_400_and_change_nothing(collector: str) -> None:
    """Bytes after the last gzip member that are not a member (text, zero padding, half a
    header), a member cut short (the only one or the second), data after a zlib stream, raw
    deflate, and a zstd body with trailing bytes, a cut frame or a frame asking for a window
    past 8 MiB: each gets 400 with a message naming the encoding, nothing is stored, and a
    valid request afterwards is served."""
    raw = request_body([wire_span(0xE0, 1)])
    raw_deflate = zlib.compressobj(wbits=-15)
    big_window = zstandard.ZstdCompressor(
        compression_params=zstandard.ZstdCompressionParameters.from_level(19, window_log=24)
    ).compressobj()
    bodies = {
        "gzip + text": (gzip.compress(raw) + b"trailing garbage", "gzip", "gzip member"),
        "gzip + zeros": (gzip.compress(raw) + bytes(16), "gzip", "gzip member"),
        "gzip + half a header": (gzip.compress(raw) + b"\x1f", "gzip", "truncated gzip"),
        "gzip cut short": (gzip.compress(raw)[:-5], "gzip", "truncated gzip"),
        "second member cut short": (
            gzip.compress(raw) + gzip.compress(raw)[:-5],
            "gzip",
            "truncated gzip",
        ),
        "zlib + more": (zlib.compress(raw) + zlib.compress(raw), "deflate", "after the end"),
        "raw deflate": (raw_deflate.compress(raw) + raw_deflate.flush(), "deflate", "zlib"),
        "zlib cut short": (zlib.compress(raw)[:-3], "deflate", "truncated deflate"),
        "zstd + text": (zstd(raw) + b"trailing garbage", "zstd", "zstd"),
        "zstd cut short": (zstd(raw)[:-3], "zstd", "truncated zstd"),
        "second frame cut short": (zstd(raw) + zstd(raw)[:-3], "zstd", "truncated zstd"),
        "zstd window of 16 MiB": (
            big_window.compress(bytes(100)) + big_window.flush(),
            "zstd",
            "memory",
        ),
        "empty gzip body": (b"", "gzip", "truncated gzip"),
    }
    for name, (body, encoding, says) in bodies.items():
        answer = post(collector, body, encoding)
        assert answer.status_code == 400, (name, answer.status_code)
        assert says.encode() in answer.content, (name, answer.content)
    assert stored_spans(collector) == 0
    assert still_serving(collector, 0xC3)


def test_bombs_get_413_however_they_are_framed(collector: str) -> None:
    """Bodies that inflate past the decompressed limit get 413, in one member or frame, or
    spread over many that are each under it; so does a body of more members than the
    collector reads (each member costs a decompressor). A valid request is served after."""
    zeros = bytes(LIMIT + 1)
    many = bytes(LIMIT // 4)
    bodies = {
        "gzip": (gzip.compress(zeros), "gzip"),
        "gzip, five members under the limit each": (gzip.compress(many) * 5, "gzip"),
        "deflate": (zlib.compress(zeros), "deflate"),
        "zstd": (zstd(zeros), "zstd"),
        "zstd, five frames under the limit each": (zstd(many) * 5, "zstd"),
        "identity": (zeros, None),
    }
    for name, (body, encoding) in bodies.items():
        answer = post(collector, body, encoding)
        assert answer.status_code == 413, (name, answer.status_code)
        assert f"exceeds {LIMIT} bytes".encode() in answer.content, (name, answer.content)
    for encoding, empty in (("gzip", gzip.compress(b"")), ("zstd", zstd(b""))):
        answer = post(collector, empty * (MAX_MEMBERS + 1), encoding)
        assert answer.status_code == 413, encoding
        assert f"more than {MAX_MEMBERS}".encode() in answer.content
    assert stored_spans(collector) == 0
    assert still_serving(collector, 0xC4)


@linux_only
@pytest.mark.parametrize("encoding", ["gzip", "zstd"])
def test_a_bomb_of_many_members_costs_at_most_the_limit(tmp_path: Path, encoding: str) -> None:
    """`looptrace serve` (uvloop when installed) given a 200 MiB bomb cut into 8 MiB members or
    frames: 413, its peak memory grows by about the 128 MiB limit, not the bomb; a valid
    request is served after it; and SIGTERM still stops it."""
    member = gzip.compress(bytes(8 << 20), 9) if encoding == "gzip" else zstd(bytes(8 << 20))
    with serve_subprocess(tmp_path / "t.db") as (proc, url):
        before = peak_rss_mb(proc.pid)
        answer = post(url, member * 25, encoding, timeout=120)
        grew = peak_rss_mb(proc.pid) - before
        assert still_serving(url, 0xC5)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) is not None
    assert answer.status_code == 413
    assert grew < 128 * 1.3, f"peak RSS grew by {grew:.0f} MiB"


# -- Host ----------------------------------------------------------------------------------

LOCAL_HOSTS = ["127.0.0.1:{port}", "127.0.0.1", "localhost", "localhost:{port}", "[::1]:{port}"]
LOCAL_HOSTS += ["[::1]", "127.0.0.2:{port}", "LOCALHOST:{port}"]
FOREIGN_HOSTS = ["evil.example", "evil.example:{port}", "127.0.0.1.evil.example"]
FOREIGN_HOSTS += ["localhost.evil.example:{port}", "127.0.0.1@evil.example", "[::1"]
FOREIGN_HOSTS += ["127.0.0.1:{port}/x", "0.0.0.0:{port}"]


def routes(url: str, host: str) -> dict[str, int]:
    """The status of the OTLP receiver, the API and the viewer asked with ``Host: host``."""
    headers = {"host": host}
    body = request_body([wire_span(0xF0, 1)])
    return {
        "POST /v1/traces": httpx.post(
            f"{url}/v1/traces", content=body, headers={**PB, **headers}
        ).status_code,
        "GET /api/stats": httpx.get(f"{url}/api/stats", headers=headers).status_code,
        "GET /": httpx.get(f"{url}/", headers=headers).status_code,
    }


def test_without_a_token_only_this_machines_names_are_answered(tmp_path: Path, loop: str) -> None:
    """Without a token, a request whose Host names loopback (127.0.0.0/8, [::1], localhost,
    with or without a port) reaches every route; any other Host (a rebound DNS name, one
    that only starts like loopback, user info, a path, a malformed one) gets 403 on every
    route, the OTLP receiver, the API and the viewer alike, with a message saying why, and
    nothing is stored."""
    with running_collector(tmp_path / "h.db", loop=loop, extra_routes=viewer.routes()) as url:
        port = url.rsplit(":", 1)[1]
        for host in FOREIGN_HOSTS:
            assert routes(url, host.format(port=port)) == dict.fromkeys(
                ["POST /v1/traces", "GET /api/stats", "GET /"], 403
            ), host
        refused = httpx.get(f"{url}/api/stats", headers={"host": "evil.example"})
        assert stored_spans(url) == 0
        for host in LOCAL_HOSTS:
            assert routes(url, host.format(port=port)) == {
                "POST /v1/traces": 200,
                "GET /api/stats": 200,
                "GET /": 200,
            }, host
    assert "addressed to this machine" in refused.json()["error"]


def test_the_listening_host_is_answered_too(tmp_path: Path) -> None:
    """The name the collector was told to listen on (``allowed_hosts``, which ``serve`` sets
    from ``--host``) is answered as well as loopback; other names are still refused."""
    with running_collector(tmp_path / "h.db", allowed_hosts=["tracebox.internal"]) as url:
        port = url.rsplit(":", 1)[1]
        named = httpx.get(f"{url}/api/stats", headers={"host": f"tracebox.internal:{port}"})
        other = httpx.get(f"{url}/api/stats", headers={"host": "evil.example"})
    assert (named.status_code, other.status_code) == (200, 403)


def test_with_a_token_any_host_is_answered_with_the_token(tmp_path: Path) -> None:
    """With a token, the token is the protection: any Host is answered when it comes with the
    token, and refused (401) without it."""
    with running_collector(tmp_path / "h.db", token="T0k") as url:
        good = httpx.get(
            f"{url}/api/stats", headers={"host": "collector.example", "x-looptrace-token": "T0k"}
        )
        bad = httpx.get(f"{url}/api/stats", headers={"host": "collector.example"})
    assert (good.status_code, bad.status_code) == (200, 401)


def test_a_request_without_host_is_answered(collector: str) -> None:
    """An HTTP/1.0 request carries no Host (browsers always send one): it is answered."""
    import socket

    port = int(collector.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET /api/stats HTTP/1.0\r\n\r\n")
        head = sock.recv(65536)
    assert head.startswith(b"HTTP/1.1 200")
