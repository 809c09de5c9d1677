"""Real OpenTelemetry instrumentation packages from the registry, with looptrace as the
provider: httpx, the aiohttp client, Starlette (through its ASGI middleware) and sqlite3. Each
test checks parents, one trace id, the instrumentation's attributes, and that every span
arrives exactly once at a real OTLP server on 127.0.0.1, looptrace's own requests never among
them."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import looptrace
from looptrace._store import Store
from otel_support import Arrived, arrived, by_name, otel
from otlp_server import OtlpTestServer
from pipeline_support import FAST_RETRY, checked_server, install_pipeline
from store_support import free_port

__all__ = ["otel"]

pytestmark = pytest.mark.usefixtures("otel")


@pytest.fixture
def server() -> Iterator[OtlpTestServer]:
    with checked_server() as srv:
        yield srv


@pytest.fixture
def echo() -> Iterator[str]:
    """An HTTP server on 127.0.0.1 answering each GET with the traceparent it was sent."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"traceparent": self.headers.get("traceparent")}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@contextlib.contextmanager
def serving(app: object) -> Iterator[str]:
    """``app`` behind uvicorn on 127.0.0.1, in a thread of its own (so in a context of its
    own: a request's trace comes only from its headers)."""
    import uvicorn

    port = free_port()
    uv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not uv.started:
            assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        uv.should_exit = True
        thread.join(10)


def traceparent_of(span: Arrived) -> str:
    return f"00-{span.trace_id:032x}-{span.span_id:016x}-01"


async def test_httpx_requests_are_children_and_looptrace_own_requests_are_not_traced(
    server: OtlpTestServer, echo: str
) -> None:
    """httpx is instrumented for every client in the process, looptrace's exporter's included:
    the application's requests are spans under the caller, with the traceparent they sent;
    looptrace's POSTs to the OTLP server are not traced at all."""
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

    instrumentor = HTTPXClientInstrumentor()
    instrumentor.instrument()
    try:
        install_pipeline(server, retry=FAST_RETRY)

        @looptrace.traced(name="fetch both")
        async def fetch_both() -> list[str]:
            async with httpx.AsyncClient() as client:
                first = (await client.get(f"{echo}/a")).json()["traceparent"]
            # In a thread (asyncio.to_thread carries the context): the same parent.
            second = await asyncio.to_thread(fetch_sync, f"{echo}/b")
            return [first, second]

        def fetch_sync(url: str) -> str:
            with httpx.Client() as sync_client:
                return str(sync_client.get(url).json()["traceparent"])

        sent = await fetch_both()
        assert (await looptrace.flush(5)).ok
        for i in range(3):  # more export requests, each through the instrumented httpx
            with looptrace.span(f"after {i}"):
                pass
            assert (await looptrace.flush(5)).ok
    finally:
        instrumentor.uninstrument()
    spans = arrived(server)
    names = sorted(s.span.name for s in spans)
    assert names == ["GET", "GET", "after 0", "after 1", "after 2", "fetch both"]
    root = next(s for s in spans if s.span.name == "fetch both")
    gets = [s for s in spans if s.span.name == "GET"]
    assert {s.parent_id for s in gets} == {root.span_id}
    assert {s.trace_id for s in gets} == {root.trace_id}
    assert sorted(sent) == sorted(traceparent_of(s) for s in gets)
    for get in gets:
        assert get.span.kind == 3  # CLIENT
        assert get.scope[0] == "opentelemetry.instrumentation.httpx"
        assert (
            get.attributes.get("http.response.status_code", get.attributes.get("http.status_code"))
            == 200
        )
    assert server.request_count >= 4


async def test_aiohttp_client_requests_are_children(server: OtlpTestServer, echo: str) -> None:
    import aiohttp
    from opentelemetry.instrumentation.aiohttp_client import AioHttpClientInstrumentor

    instrumentor = AioHttpClientInstrumentor()
    instrumentor.instrument()
    try:
        install_pipeline(server, retry=FAST_RETRY)

        @looptrace.traced(name="call service")
        async def call_service() -> str:
            async with (
                aiohttp.ClientSession() as session,
                session.get(f"{echo}/items/7") as response,
            ):
                assert response.status == 200
                return str((await response.json())["traceparent"])

        sent = await call_service()
        assert (await looptrace.flush(5)).ok
    finally:
        instrumentor.uninstrument()
    spans = by_name(server)
    assert set(spans) == {"call service", "GET"}
    get, root = spans["GET"], spans["call service"]
    assert (get.parent_id, get.trace_id) == (root.span_id, root.trace_id)
    assert sent == traceparent_of(get)
    assert get.scope[0] == "opentelemetry.instrumentation.aiohttp_client"
    assert (
        get.attributes.get("http.response.status_code", get.attributes.get("http.status_code"))
        == 200
    )


async def test_starlette_server_spans_continue_the_callers_trace(server: OtlpTestServer) -> None:
    """A request carrying looptrace's traceparent into a Starlette app instrumented with
    OpenTelemetry: the server span is the remote child of the caller, and a traced function
    inside the route is the server span's child."""
    from opentelemetry.instrumentation.starlette import StarletteInstrumentor
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    @looptrace.traced(name="lookup")
    async def lookup(item: int) -> dict[str, int]:
        return {"item": item}

    async def item(request: Request) -> JSONResponse:
        return JSONResponse(await lookup(int(request.path_params["item"])))

    app = Starlette(routes=[Route("/items/{item}", item)])
    StarletteInstrumentor.instrument_app(app)
    install_pipeline(server, retry=FAST_RETRY)
    with serving(app) as base_url:
        async with httpx.AsyncClient(base_url=base_url) as client:
            with looptrace.span("caller") as caller:
                response = await client.get("/items/5", headers=dict(looptrace.inject()))
    assert response.json() == {"item": 5}
    assert (await looptrace.flush(5)).ok
    spans = arrived(server)
    ids = [(s.trace_id, s.span_id) for s in spans]
    assert len(ids) == len(set(ids))
    assert {s.trace_id for s in spans} == {caller.trace_id}
    (server_span,) = [s for s in spans if s.span.kind == 2]  # SERVER
    assert server_span.span.name == "GET /items/{item}"
    assert server_span.parent_id == caller.span_id
    assert server_span.span.flags & 0x300 == 0x300  # the parent is remote, and OTLP says so
    assert server_span.scope[0] == "opentelemetry.instrumentation.starlette"
    assert server_span.attributes.get("http.route") == "/items/{item}"
    (lookup_span,) = [s for s in spans if s.span.name == "lookup"]
    assert lookup_span.parent_id == server_span.span_id
    # The middleware's own send/receive spans are the server span's children.
    for s in spans:
        if s.span.name not in ("caller", "lookup", server_span.span.name):
            assert s.parent_id == server_span.span_id, s.span.name


async def test_sqlite3_queries_are_children(server: OtlpTestServer, tmp_path: Path) -> None:
    from opentelemetry.instrumentation.sqlite3 import SQLite3Instrumentor

    instrumentor = SQLite3Instrumentor()
    instrumentor.instrument()
    try:
        install_pipeline(server, retry=FAST_RETRY)

        @looptrace.traced(name="count rows")
        def count_rows() -> int:
            connection = sqlite3.connect(tmp_path / "app.db")
            try:
                cursor = connection.cursor()
                cursor.execute("CREATE TABLE t (x INTEGER)")
                cursor.execute("INSERT INTO t VALUES (1), (2)")
                cursor.execute("SELECT count(*) FROM t")
                return int(cursor.fetchone()[0])
            finally:
                connection.close()

        assert count_rows() == 2
        assert (await looptrace.flush(5)).ok
    finally:
        instrumentor.uninstrument()
    spans = arrived(server)
    root = next(s for s in spans if s.span.name == "count rows")
    queries = [s for s in spans if s is not root]
    assert sorted(s.span.name for s in queries) == ["CREATE", "INSERT", "SELECT"]
    assert {(s.parent_id, s.trace_id) for s in queries} == {(root.span_id, root.trace_id)}
    select = next(s for s in queries if s.span.name == "SELECT")
    assert select.attributes.get("db.system", select.attributes.get("db.system.name")) == "sqlite"
    assert "SELECT count(*) FROM t" in str(
        select.attributes.get("db.statement", select.attributes.get("db.query.text"))
    )


async def test_the_local_store_own_queries_are_never_traced(tmp_path: Path) -> None:
    """With sqlite3 instrumented and no endpoint, looptrace writes to its SQLite store: those
    writes are not traced (a span per write would feed itself forever)."""
    from opentelemetry.instrumentation.sqlite3 import SQLite3Instrumentor

    instrumentor = SQLite3Instrumentor()
    instrumentor.instrument()
    store_path = tmp_path / "traces.db"
    try:
        looptrace.configure(store_path=str(store_path), flush_interval=0.05)
        for i in range(3):
            with looptrace.span(f"work {i}"):
                pass
            assert (await looptrace.flush(5)).ok
        looptrace.shutdown_sync()
    finally:
        instrumentor.uninstrument()
        looptrace.configure()
    store = Store(store_path)
    try:
        names = sorted(t["name"] for t in store.list_traces(limit=50))
    finally:
        store.close()
    assert names == ["work 0", "work 1", "work 2"]


def test_the_documented_example_runs_as_shown(tmp_path: Path) -> None:
    """docs/opentelemetry.md's example, run as a script: it prints 40 and stores one trace of
    the five spans its `looptrace show` output lists, nested as shown."""
    import os
    import re
    import subprocess
    import sys

    text = (Path(__file__).parents[2] / "docs" / "opentelemetry.md").read_text()
    match = re.search(r"```python\n(import sqlite3\n.*?)```", text, re.S)
    assert match is not None, "the example is missing from docs/opentelemetry.md"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOOPTRACE_", "OTEL_"))}
    env["LOOPTRACE_STORE"] = str(tmp_path / "store.db")
    done = subprocess.run(
        [sys.executable, "-c", match.group(1)], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "40\n"
    store = Store(tmp_path / "store.db")
    try:
        (summary,) = store.list_traces()
        rows = store.get_trace(summary["trace_id"])
    finally:
        store.close()
    spans = {s["name"]: s for s in rows}
    assert sorted(spans) == ["CREATE", "INSERT", "SELECT", "audit", "restock"]
    root = spans["restock"]["span_id"]
    assert [spans[n]["parent_span_id"] for n in ("CREATE", "INSERT", "audit")] == [root] * 3
    assert spans["SELECT"]["parent_span_id"] == spans["audit"]["span_id"]
    assert spans["audit"]["scope_name"] == "inventory"
