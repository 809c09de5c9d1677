"""How looptrace talks HTTP: one settings object that the loop's own client and the httpx
route through a proxy are both built from, so a request goes out the same way on either.

Standard library at import (httpx and certifi on first use): a program that reaches its
backend directly never imports httpx.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import ssl
import threading
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Union

if TYPE_CHECKING:
    import httpx

    from .._config import Config

__all__ = ["HeadersProvider", "HttpSettings", "is_loopback", "wire_compression"]

HeadersProvider = Callable[[], Union[Mapping[str, str], Awaitable[Mapping[str, str]]]]
"""Called before each request, on the loop that sends it; the headers it returns (an API token
that refreshes, a signature) go over the configured ones. A coroutine function is awaited
within the request's timeout. It must not block: a token refreshed over the network is
refreshed by a coroutine, or by a thread of the application's, and read here."""

# On loopback the kernel runs the receiver's side of TCP inside the sender's system calls, and
# with its own sizing one send takes a whole 4 MB body: 1.6-2.3 ms of the sending thread's CPU
# on the benchmark machine. A quarter-megabyte send buffer (the kernel doubles it) caps a send
# at 512 KiB, 0.2-0.4 ms. On the application's loop that bounds each write step. A remote
# backend keeps the kernel's own sizing, which a long round
# trip needs.
LOOPBACK_SNDBUF = 256 * 1024


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or address, IPv6 with or without brackets) is this machine
    only: where the collector may bind without a token, and where requests never go through
    a proxy."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def wire_compression(choice: str, loopback: bool) -> str:
    """The compression of requests for the ``compression`` setting ``choice``, to a backend on
    this machine (``loopback``, :attr:`HttpSettings.loopback`) or not: ``"auto"`` is none to a
    loopback address and gzip anywhere else. On loopback the bytes never cross a network, and
    deflating them cost 1.5-3 us of CPU per span here (up to a fifth of all the CPU tracing a
    small span took), and the receiver on the same machine more CPU to inflate them."""
    if choice != "auto":
        return choice
    return "none" if loopback else "gzip"


@dataclasses.dataclass(frozen=True)
class HttpSettings:
    """Where and how OTLP/HTTP requests go. Picklable and hashable; its ``repr`` never shows
    header values (they carry API keys).

    TLS: ``certificate`` is the CA bundle that verifies the server (certifi's when None),
    ``certificate_dir`` a directory of CA certificates, ``client_certificate`` and
    ``client_key`` the client's own for mutual TLS. Proxies come from the environment
    (``HTTPS_PROXY``, ``HTTP_PROXY``, ``ALL_PROXY``, ``NO_PROXY``), except for a loopback
    endpoint, which is always reached directly.

    ``headers_provider`` (a :data:`HeadersProvider`) adds headers to each request, over
    ``headers``; it is asked before each request, on the sending loop."""

    url: str
    headers: tuple[tuple[str, str], ...] = dataclasses.field(default=(), repr=False)
    timeout: float = 10.0
    certificate: str | None = None
    certificate_dir: str | None = None
    client_certificate: str | None = None
    client_key: str | None = None
    max_connections: int = 8
    headers_provider: HeadersProvider | None = dataclasses.field(default=None, repr=False)

    def __repr__(self) -> str:
        return f"HttpSettings({self.url!r}, headers=<{len(self.headers)} redacted>)"

    @classmethod
    def from_config(cls, cfg: Config, url: str | None = None) -> HttpSettings:
        return cls(
            url=url or cfg.endpoint or "",
            headers=tuple(cfg.headers.items()),
            timeout=cfg.export_timeout,
            certificate=cfg.certificate,
            certificate_dir=cfg.certificate_dir,
            client_certificate=cfg.client_certificate,
            client_key=cfg.client_key,
            max_connections=cfg.max_concurrent_requests,
            headers_provider=cfg.headers_provider,
        )

    @property
    def loopback(self) -> bool:
        return is_loopback(urllib.parse.urlsplit(self.url).hostname or "")

    def proxied(self) -> bool:
        """Whether requests to this endpoint go through a proxy: the environment (or, on
        macOS and Windows, the system settings, as httpx reads them) names one for its scheme,
        and the endpoint is not on this machine. NO_PROXY is httpx's to apply: an endpoint it
        exempts still goes through httpx, which then connects directly."""
        if self.loopback:
            return False
        import urllib.request  # with http.client and email: not at a worker's start-up

        scheme = urllib.parse.urlsplit(self.url).scheme
        proxies = urllib.request.getproxies()
        return bool(proxies.get(scheme) or proxies.get("all"))

    def verify(self) -> ssl.SSLContext | bool:
        """What the HTTP client verifies TLS with: nothing for plain HTTP to this machine (no
        proxy applies there, so no TLS is ever negotiated, and loading a CA bundle would cost
        the first flush 35-150 ms of CPU, in a thread that holds the GIL against the
        application's loop); the shared context otherwise."""
        plain = urllib.parse.urlsplit(self.url).scheme == "http"
        if plain and self.loopback and self.client_certificate is None:
            return False
        return self.ssl_context()

    def ssl_context(self) -> ssl.SSLContext:
        """The TLS context for these settings, built once per process (loading a CA bundle
        costs 35-150 ms of CPU, and a program that runs many event loops needs a client per
        loop)."""
        key = (self.certificate, self.certificate_dir, self.client_certificate, self.client_key)
        with _ssl_lock:
            ctx = _ssl_contexts.get(key)
            if ctx is None:
                cafile = self.certificate
                if cafile is None and self.certificate_dir is None:
                    import certifi

                    cafile = certifi.where()
                ctx = ssl.create_default_context(cafile=cafile, capath=self.certificate_dir)
                if self.client_certificate is not None:
                    ctx.load_cert_chain(self.client_certificate, self.client_key)
                _ssl_contexts[key] = ctx
            return ctx

    def _client_options(self) -> dict[str, Any]:
        import httpx

        return {
            "headers": dict(self.headers),
            "timeout": httpx.Timeout(self.timeout),
            "limits": httpx.Limits(
                max_connections=self.max_connections,
                max_keepalive_connections=self.max_connections,
            ),
            # Proxies from the environment, as every OTLP exporter honours them; a loopback
            # endpoint is this machine, never worth a detour through a proxy.
            "trust_env": not self.loopback,
        }

    def async_client(self) -> httpx.AsyncClient:
        """The application's client (one per event loop)."""
        import httpx

        return httpx.AsyncClient(verify=self.verify(), **self._client_options())


_ssl_lock = threading.Lock()
_ssl_contexts: dict[tuple[str | None, ...], ssl.SSLContext] = {}
