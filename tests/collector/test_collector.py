"""The collector: OTLP/HTTP in (looptrace's and the OpenTelemetry SDK's), limits, auth, the
JSON API, and durability of what it acknowledged. Every test talks to a real uvicorn server."""

from __future__ import annotations

import contextlib
import gzip
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from collector_support import NOW, PB, request_body, running_collector, wire_span
from looptrace import _otlp
from looptrace._store import Store, span_from_row
from looptrace._wire import WireEvent, WireLink
from looptrace.collector.decode import decode_request
from store_support import serve_subprocess


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    return tmp_path / "collector.db"


def read_store(path: Path) -> Store:
    return Store(path)


@pytest.mark.parametrize("encoding", ["protobuf", "json"])
@pytest.mark.parametrize("compression", ["none", "gzip", "zstd"])
def test_looptrace_requests_land_field_for_field(
    store_path: Path, encoding: str, compression: str
) -> None:
    """A request in either encoding and any compression is stored, and every span reads back
    exactly as the codec decodes it (attributes of every type, events, links, status)."""
    spans = [
        wire_span(
            0xABC,
            1,
            name="root",
            kind=2,
            attributes=[
                ("s", "x"),
                ("i", 7),
                ("f", 0.25),
                ("b", False),
                ("l", ["a", "b"]),
                ("input.value", '{"a": 1}'),
            ],
            events=[WireEvent("exception", NOW + 5, [("exception.type", "ValueError")])],
            status=2,
            message="boom",
        ),
        wire_span(0xABC, 2, parent=1, name="child", links=[WireLink(0xDEF, 9, "k=v", [("r", 1)])]),
    ]
    raw = request_body(spans, encoding)
    body, content_encoding = _otlp.compress(raw, compression)
    headers = {"content-type": _otlp.content_type(encoding)}
    if content_encoding:
        headers["content-encoding"] = content_encoding
    with running_collector(store_path) as url:
        response = httpx.post(f"{url}/v1/traces", content=body, headers=headers)
    assert response.status_code == 200
    expected = decode_request(raw, _otlp.content_type(encoding))
    with read_store(store_path) as store:
        rows = store.get_trace(f"{0xABC:032x}")
    assert sorted((span_from_row(r) for r in rows), key=lambda s: s.span_id) == sorted(
        expected, key=lambda s: s.span_id
    )


def test_opentelemetry_sdk_exporter_lands_field_for_field(store_path: Path) -> None:
    """The OpenTelemetry SDK's own OTLP/HTTP exporter (protobuf, gzip) sends to the collector,
    and each span reads back with the SDK's ids, name, kind, times, attributes, events, status
    and resource."""
    from opentelemetry.exporter.otlp.proto.http import Compression
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import SpanKind, Status, StatusCode

    with running_collector(store_path) as url:
        provider = TracerProvider(resource=Resource.create({"service.name": "otel-app"}))
        exporter = OTLPSpanExporter(endpoint=f"{url}/v1/traces", compression=Compression.Gzip)
        memory = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        provider.add_span_processor(SimpleSpanProcessor(memory))
        tracer = provider.get_tracer("sdk-test", "1.2.3")
        with tracer.start_as_current_span("parent", kind=SpanKind.SERVER) as parent:
            parent.set_attribute("http.route", "/x")
            parent.set_attribute("retries", 3)
            with tracer.start_as_current_span("child") as child:
                child.add_event("cache miss", {"key": "k1"})
                child.set_status(Status(StatusCode.ERROR, "failed"))
        provider.shutdown()
    sent = {f"{s.context.span_id:016x}": s for s in memory.get_finished_spans()}
    trace_id = f"{next(iter(sent.values())).context.trace_id:032x}"
    with read_store(store_path) as store:
        rows = {r["span_id"]: r for r in store.get_trace(trace_id)}
    assert rows.keys() == sent.keys()
    for span_id, s in sent.items():
        row = rows[span_id]
        assert row["name"] == s.name
        assert row["kind"] == s.kind.value + 1  # the SDK's enum is 0-based, OTLP's 1-based
        assert (row["start_ns"], row["end_ns"]) == (s.start_time, s.end_time)
        assert row["parent_span_id"] == (f"{s.parent.span_id:016x}" if s.parent else None)
        assert row["attributes"] == dict(s.attributes or {})
        assert [(e["name"], e["time_ns"], e["attributes"]) for e in row["events"]] == [
            (e.name, e.timestamp, dict(e.attributes or {})) for e in s.events
        ]
        assert row["status_code"] == s.status.status_code.value
        assert row["status_message"] == (s.status.description or "")
        assert row["resource"]["service.name"] == "otel-app"
        assert (row["scope_name"], row["scope_version"]) == ("sdk-test", "1.2.3")


def test_concurrent_senders_lose_nothing(store_path: Path) -> None:
    """Eight senders posting at once: every request is acknowledged and every span stored."""
    senders, requests, per_request = 8, 10, 50

    def send(n: int) -> list[int]:
        codes = []
        with httpx.Client() as client:
            for r in range(requests):
                trace = n * 1000 + r + 1
                body = request_body([wire_span(trace, s + 1) for s in range(per_request)])
                codes.append(client.post(f"{url}/v1/traces", content=body, headers=PB).status_code)
        return codes

    with running_collector(store_path) as url:
        results: list[list[int]] = []
        threads = [
            threading.Thread(target=lambda n=n: results.append(send(n))) for n in range(senders)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert sorted(c for codes in results for c in codes) == [200] * (senders * requests)
    with read_store(store_path) as store:
        assert store.stats()["spans"] == senders * requests * per_request
        assert store.stats()["traces"] == senders * requests


def test_malformed_bodies_get_400_and_change_nothing(store_path: Path) -> None:
    """Bad protobuf, bad JSON and a corrupt gzip body get a 400 whose message says what is
    wrong; an unknown media type gets a 415; nothing is written."""
    with running_collector(store_path) as url:
        bad_pb = httpx.post(f"{url}/v1/traces", content=b"\x0a\x05\x01", headers=PB)
        bad_json = httpx.post(
            f"{url}/v1/traces",
            content=b'{"resourceSpans": [',
            headers={"content-type": "application/json"},
        )
        bad_gzip = httpx.post(
            f"{url}/v1/traces", content=b"not gzip", headers={**PB, "content-encoding": "gzip"}
        )
        text = httpx.post(f"{url}/v1/traces", content=b"hi", headers={"content-type": "text/plain"})
        get = httpx.get(f"{url}/v1/traces")
        stats = httpx.get(f"{url}/api/stats").json()
    assert (bad_pb.status_code, bad_json.status_code, bad_gzip.status_code) == (400, 400, 400)
    assert bad_json.json()["message"]
    assert b"gzip" in bad_gzip.content
    assert text.status_code == 415
    assert "Content-Type" in text.json()["message"]
    assert get.status_code == 405
    assert stats["spans"] == 0


def test_oversized_bodies_and_bombs_are_refused(store_path: Path) -> None:
    """A body over the limit gets a 413 whether it declares its length or streams it; a small
    gzip or zstd body that inflates past the decompressed limit gets a 413; nothing is
    written, and the collector keeps serving."""
    import zstandard

    limit, inflated = 64 * 1024, 1024 * 1024
    big = request_body([wire_span(1, s + 1, attributes=[("pad", "x" * 1000)]) for s in range(100)])
    assert len(big) > limit
    zeros = b"\x00" * (inflated * 8)
    with running_collector(
        store_path, max_body_bytes=limit, max_decompressed_bytes=inflated
    ) as url:
        declared = httpx.post(f"{url}/v1/traces", content=big, headers=PB)

        def chunks() -> Iterator[bytes]:
            for i in range(0, len(big), 8192):
                yield big[i : i + 8192]

        streamed = httpx.post(f"{url}/v1/traces", content=chunks(), headers=PB)
        gzip_bomb = httpx.post(
            f"{url}/v1/traces",
            content=gzip.compress(zeros),
            headers={**PB, "content-encoding": "gzip"},
        )
        zstd_bomb = httpx.post(
            f"{url}/v1/traces",
            content=zstandard.ZstdCompressor().compress(zeros),
            headers={**PB, "content-encoding": "zstd"},
        )
        after = httpx.post(f"{url}/v1/traces", content=request_body([wire_span(2, 1)]), headers=PB)
        stats = httpx.get(f"{url}/api/stats").json()
    assert declared.status_code == 413
    assert streamed.status_code == 413
    assert (gzip_bomb.status_code, zstd_bomb.status_code) == (413, 413)
    assert b"decompressed body exceeds" in gzip_bomb.content
    assert after.status_code == 200
    assert stats["spans"] == 1


def test_token_is_required_on_every_request(store_path: Path) -> None:
    """With a token, a request without it (or with a wrong one) gets a 401, the receiver and
    the API alike; the bearer header or x-looptrace-token lets it in; a browser opening
    ?token= gets a cookie and is redirected to the address without the token."""
    body = request_body([wire_span(3, 1)])
    with running_collector(store_path, token="s3cret") as url:
        none = httpx.post(f"{url}/v1/traces", content=body, headers=PB)
        wrong = httpx.post(
            f"{url}/v1/traces", content=body, headers={**PB, "authorization": "Bearer nope"}
        )
        api = httpx.get(f"{url}/api/traces")
        bearer = httpx.post(
            f"{url}/v1/traces", content=body, headers={**PB, "authorization": "Bearer s3cret"}
        )
        header = httpx.get(f"{url}/api/traces", headers={"x-looptrace-token": "s3cret"})
        link = httpx.get(f"{url}/api/stats?token=s3cret&x=1")
        with_cookie = httpx.get(f"{url}/api/stats", cookies={"looptrace_token": "s3cret"})
    assert (none.status_code, wrong.status_code, api.status_code) == (401, 401, 401)
    assert "s3cret" not in none.text
    assert bearer.status_code == 200
    assert header.status_code == 200
    assert len(header.json()["traces"]) == 1
    assert link.status_code == 303
    assert link.headers["location"] == "/api/stats?x=1"
    assert "looptrace_token=s3cret" in link.headers["set-cookie"]
    assert with_cookie.status_code == 200


def test_json_api_shapes(store_path: Path) -> None:
    """The /api routes the viewer reads: trace list with filters, one trace with span
    previews, one complete span, experiments, one experiment, lag and stats; 404 for an
    unknown id and 400 for a bad parameter."""
    exp = "e" * 32
    spans = [
        wire_span(
            0x11,
            1,
            name="case 0",
            attributes=[
                ("looptrace.experiment.id", exp),
                ("looptrace.case.index", 0),
                ("looptrace.score.acc", 1.0),
                ("input.value", "x" * 3000),
            ],
        ),
        wire_span(0x11, 2, parent=1, name="step", attributes=[("looptrace.loop.lag_max_ms", 4.5)]),
        wire_span(
            0x22, 1, name="looptrace.loop.lag", attributes=[("looptrace.loop.lag.max_ms", 4.5)]
        ),
    ]
    with running_collector(store_path) as url:
        assert (
            httpx.post(f"{url}/v1/traces", content=request_body(spans), headers=PB).status_code
            == 200
        )
        traces = httpx.get(f"{url}/api/traces", params={"experiment": exp}).json()
        trace = httpx.get(f"{url}/api/traces/{0x11:032x}", params={"preview": 10}).json()
        span = httpx.get(f"{url}/api/traces/{0x11:032x}/spans/{1:016x}").json()
        experiments = httpx.get(f"{url}/api/experiments").json()
        experiment = httpx.get(f"{url}/api/experiments/{exp}").json()
        lag = httpx.get(f"{url}/api/lag").json()
        missing = httpx.get(f"{url}/api/traces/{'0' * 32}")
        bad = httpx.get(f"{url}/api/traces", params={"limit": "many"})
        bad_duration = httpx.get(f"{url}/api/traces", params={"min_duration_ms": "-1"})
        services = httpx.get(f"{url}/api/services").json()
        recent = httpx.get(f"{url}/api/traces", params={"range": "3600"}).json()
        ancient = httpx.get(f"{url}/api/traces", params={"until": "1"}).json()
    assert services == {"services": ["svc"]}
    assert {t["trace_id"] for t in recent["traces"]} == {f"{0x11:032x}"}
    assert ancient["traces"] == []
    assert bad_duration.status_code == 400
    assert "min_duration_ms" in bad_duration.json()["error"]
    assert [t["trace_id"] for t in traces["traces"]] == [f"{0x11:032x}"]
    assert traces["traces"][0]["span_count"] == 2
    assert trace["trace"]["name"] == "case 0"
    assert [s["name"] for s in trace["spans"]] == ["case 0", "step"]
    assert trace["spans"][0]["input"] == "x" * 10
    assert trace["spans"][0]["input_size"] == 3000
    assert span["span"]["attributes"]["input.value"] == "x" * 3000
    assert experiments["experiments"][0]["scores"]["acc"]["mean"] == 1.0
    assert experiment["cases"][0]["scores"] == {"acc": 1.0}
    assert lag["summaries"][0]["values"] == {"max_ms": 4.5}
    assert lag["worst_spans"][0]["name"] == "step"
    assert missing.status_code == 404
    assert bad.status_code == 400
    assert "limit" in bad.json()["error"]


@pytest.mark.slow
def test_killed_collector_keeps_everything_it_acknowledged(tmp_path: Path) -> None:
    """`looptrace serve` SIGKILLed while four senders post: every request that got a 200 is in
    the store afterwards, whole."""
    path = tmp_path / "killed.db"
    with serve_subprocess(path, timeout=20) as (proc, url):
        acked: list[int] = []
        lock = threading.Lock()
        enough = threading.Event()

        def sender(n: int) -> None:
            with httpx.Client(timeout=5) as client:
                for r in range(10_000):
                    trace = n * 100_000 + r + 1
                    body = request_body([wire_span(trace, s + 1) for s in range(20)])
                    try:
                        response = client.post(f"{url}/v1/traces", content=body, headers=PB)
                    except httpx.TransportError:
                        return
                    if response.status_code == 200:
                        with lock:
                            acked.append(trace)
                            if len(acked) >= 40:
                                enough.set()

        threads = [threading.Thread(target=sender, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        assert enough.wait(30), "the collector acknowledged too little before the deadline"
        proc.send_signal(signal.SIGKILL)
        for t in threads:
            t.join(30)
    with Store(path) as store:
        for trace in acked:
            rows = store.get_trace(f"{trace:032x}")
            assert len(rows) == 20, f"trace {trace} acknowledged but not stored whole"


@pytest.mark.parametrize("encoding", ["protobuf", "json"])
def test_looptrace_client_sends_to_the_collector(store_path: Path, encoding: str) -> None:
    """The real client (capture, pipeline, HTTP transport) pointed at the collector: every
    span lands and reads back exactly as the client serialized it, nested and failed ones too."""
    import looptrace
    from looptrace import _serialize, _state

    ended: list[Any] = []
    _state.add_hooks(end=ended.append)

    @looptrace.traced
    def leaf(n: int) -> int:
        if n == 2:
            raise ValueError("two")
        return n * 10

    @looptrace.traced
    def parent(items: list[int]) -> list[int]:
        out = []
        for n in items:
            with contextlib.suppress(ValueError):
                out.append(leaf(n))
        return out

    try:
        with running_collector(store_path) as url:
            cfg = looptrace.configure(
                endpoint=f"{url}/v1/traces", encoding=encoding, flush_interval=0.05
            )
            parent([1, 2, 3])
            result = looptrace.flush_sync(timeout=10)
    finally:
        _state.remove_hooks(end=ended.append)
    assert result.ok, result
    assert len(ended) == 4
    resource = _otlp.default_resource(cfg)
    expected = {}
    for span in ended:
        body = _otlp.encode_request(
            [_otlp.encode_span(_serialize.to_wire(span, cfg), encoding)], resource, encoding
        )
        (decoded,) = decode_request(body, _otlp.content_type(encoding))
        expected[decoded.span_id] = decoded
    trace_id = next(iter(expected.values())).trace_id
    with read_store(store_path) as store:
        stored = {r["span_id"]: span_from_row(r) for r in store.get_trace(trace_id)}
        summary = store.get_trace_summary(trace_id)
    assert stored == expected
    assert summary is not None
    assert summary["name"].endswith("parent")
    assert (summary["span_count"], summary["error_count"]) == (4, 1)


def test_serve_names_every_missing_part_of_the_server_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without opentelemetry-proto (or starlette, uvicorn) the collector refuses to start and
    names what to install; with the extra installed it starts."""
    import looptrace.collector as collector

    collector._require_server_extra()
    monkeypatch.setitem(collector._SERVER_EXTRA, "opentelemetry-proto", "no_such_module_here")
    with pytest.raises(collector.MissingServerExtra, match="needs opentelemetry-proto: install"):
        collector._require_server_extra()
    monkeypatch.setitem(collector._SERVER_EXTRA, "uvicorn", "no_such_module_either")
    with pytest.raises(collector.MissingServerExtra, match="needs uvicorn and opentelemetry-proto"):
        collector._require_server_extra()
