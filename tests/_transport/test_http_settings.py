"""One set of HTTP settings for every request: a backend that needs a private CA, a client
certificate or a proxy gets large spans (encoded by a worker process) exactly as it gets small
ones."""

from __future__ import annotations

import http.server
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme

import looptrace
from loop_matrix import loop_kind  # noqa: F401
from otlp_server import OtlpTestServer

# TLS, client certificates and proxies under asyncio, its debug mode and uvloop.
pytestmark = pytest.mark.usefixtures("loop_kind")

LARGE = "QUJD" * 200_000  # over the threshold set below: a worker serializes and encodes it


@pytest.fixture(autouse=True)
def _a_worker_takes_the_large_span(monkeypatch: pytest.MonkeyPatch) -> None:
    """The workers' side of each setting is what these tests check; by default a worker takes
    only payloads from 4 MiB."""
    monkeypatch.setenv("LOOPTRACE_OFFLOAD_THRESHOLD_BYTES", str(256 * 1024))


@looptrace.traced
def handle(request: Any) -> int:
    return len(request)


def one_small_one_large() -> None:
    handle("small")
    handle(LARGE)


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


def _server_context(ca: trustme.CA, client_ca: trustme.CA | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(ctx)
    if client_ca is not None:
        ctx.verify_mode = ssl.CERT_REQUIRED
        client_ca.configure_trust(ctx)
    return ctx


async def test_a_private_ca_from_the_otel_variable_serves_both_processes(
    ca: trustme.CA, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``OTEL_EXPORTER_OTLP_CERTIFICATE`` names the CA that verifies the backend: both spans
    arrive, the large one encoded by a worker."""
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    with OtlpTestServer(tls=_server_context(ca)) as server:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", str(ca_file))
        looptrace.configure(endpoint=server.endpoint, flush_interval=0.05)
        one_small_one_large()
        assert (await looptrace.flush(timeout=30)).ok
        assert server.accepted_span_count == 2
        assert looptrace.statistics().offload.offloaded == 1


async def test_without_the_ca_neither_process_sends(ca: trustme.CA) -> None:
    """The same backend without its CA configured: certifi's bundle does not trust it, so
    nothing is sent to it, and the failure is reported."""
    with OtlpTestServer(tls=_server_context(ca)) as server:
        looptrace.configure(
            endpoint=server.endpoint, flush_interval=0.05, retry_budget=0.3, spool=False
        )
        one_small_one_large()
        result = await looptrace.flush(timeout=30)
        assert not result.ok
        assert server.request_count == 0
        stats = looptrace.statistics()
        assert stats.dropped["retries_exhausted"] == 2
        assert "certificate" in (stats.last_error or "").lower()


async def test_a_client_certificate_reaches_the_backend_from_both_processes(
    ca: trustme.CA, tmp_path: Path
) -> None:
    """A backend that requires a client certificate (mutual TLS) accepts both spans when the
    certificate and key are configured."""
    client_ca = trustme.CA()
    client = client_ca.issue_cert("looptrace-client")
    cert, key, ca_file = tmp_path / "client.pem", tmp_path / "client.key", tmp_path / "ca.pem"
    client.cert_chain_pems[0].write_to_path(str(cert))
    client.private_key_pem.write_to_path(str(key))
    ca.cert_pem.write_to_path(str(ca_file))
    with OtlpTestServer(tls=_server_context(ca, client_ca)) as server:
        looptrace.configure(
            endpoint=server.endpoint,
            flush_interval=0.05,
            certificate=str(ca_file),
            client_certificate=str(cert),
            client_key=str(key),
        )
        one_small_one_large()
        assert (await looptrace.flush(timeout=30)).ok
        assert server.accepted_span_count == 2
        assert looptrace.statistics().offload.offloaded == 1


class _Proxy:
    """A forward proxy on 127.0.0.1 that is also the backend: it records the absolute URL of
    each request it is asked to forward, and answers it itself."""

    def __init__(self) -> None:
        self.targets: list[str] = []
        self.authorizations: list[str | None] = []
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                owner.targets.append(self.path)
                owner.authorizations.append(self.headers.get("Authorization"))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def proxy() -> Iterator[_Proxy]:
    p = _Proxy()
    yield p
    p.close()


async def test_both_processes_go_through_the_proxy_from_the_environment(
    proxy: _Proxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``HTTP_PROXY`` routes requests to a remote backend through the proxy, a large span that
    a worker encoded included (the backend's name does not resolve here: only the proxy can
    deliver)."""
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    endpoint = "http://otlp.backend.invalid:4318/v1/traces"
    looptrace.configure(endpoint=endpoint, flush_interval=0.05, compression="none")
    one_small_one_large()
    assert (await looptrace.flush(timeout=30)).ok
    assert proxy.targets and set(proxy.targets) == {endpoint}
    assert looptrace.statistics().offload.offloaded == 1


async def test_a_headers_provider_applies_through_the_proxy_too(
    proxy: _Proxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The headers provider is asked before each request on the httpx route as on the direct
    one: each request through the proxy carries the token it returned then."""
    from looptrace._transport import HttpTransport
    from looptrace._transport.settings import HttpSettings

    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    tokens = iter(range(10))

    async def provider() -> dict[str, str]:
        return {"Authorization": f"Bearer t{next(tokens)}"}

    settings = HttpSettings("http://otlp.backend.invalid:4318/v1/traces", headers_provider=provider)
    assert settings.proxied()
    transport = HttpTransport(settings)
    try:
        statuses = [(await transport.send(b"{}", {})).status for _ in range(2)]
    finally:
        await transport.aclose()
    assert statuses == [200, 200]
    assert proxy.authorizations == ["Bearer t0", "Bearer t1"]


def test_plain_http_to_this_machine_loads_no_ca_bundle() -> None:
    """Plain HTTP to a loopback address never negotiates TLS (no proxy applies there), so the
    client is built without loading a CA bundle; HTTPS, or plain HTTP to another machine
    (whose proxy may speak TLS), gets the verifying context."""
    from looptrace._transport.settings import HttpSettings

    def verify(url: str) -> object:
        return HttpSettings.from_config(looptrace.Config.from_env(endpoint=url)).verify()

    assert verify("http://127.0.0.1:4318/v1/traces") is False
    assert verify("http://localhost:4318/v1/traces") is False
    for url in ("https://127.0.0.1:4318/v1/traces", "http://collector.example:4318/v1/traces"):
        context = verify(url)
        assert isinstance(context, ssl.SSLContext)
        assert context.verify_mode == ssl.CERT_REQUIRED
