"""Network helpers shared by the application's process and the worker processes.

Standard library only (and certifi's CA bundle): a worker imports this, and a worker's
start-up is mostly imports.
"""

from __future__ import annotations

import ipaddress
import ssl
import threading

__all__ = ["is_loopback", "ssl_context"]


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or address, IPv6 with or without brackets) is this machine
    only: where the collector may bind without a token, and where the worker sends in short
    steps because the receiver shares its CPUs."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


_ssl_lock = threading.Lock()
_ssl: ssl.SSLContext | None = None


def ssl_context() -> ssl.SSLContext:
    """One TLS context for the process, trusting certifi's bundle (what httpx trusts by
    default, so the parent's client and a worker's accept the same servers). Building one
    loads the CA bundle (35-150 ms of CPU here), and each event loop needs its own client: a
    program that calls asyncio.run many times (pytest, one loop per test) paid that for every
    loop. Like the clients' proxies, SSL_CERT_FILE and SSL_CERT_DIR are not read from the
    environment."""
    global _ssl
    with _ssl_lock:
        if _ssl is None:
            import certifi

            _ssl = ssl.create_default_context(cafile=certifi.where())
        return _ssl
