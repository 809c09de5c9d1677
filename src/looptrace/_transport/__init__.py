"""Where request bodies go: a small ``Transport`` protocol, the HTTP one, an in-memory one for
tests, and the retry policy that decides what a response means.

    Transport.send(body, headers) -> Response      (connection trouble raises OSError,
                                                    nothing else)
    RetryPolicy.classify(status) -> "ok" | "retry" | "split" | "reject"
    RetryPolicy.delay(attempt, retry_after) -> seconds (exponential, full jitter)

The pipeline owns the loop and the concurrency; a transport only sends one body at a time per
call and may be called concurrently.

    settings   HttpSettings: where and how (no asyncio)
    http11     the pool on the loop's own transports, h11 doing all HTTP/1.1 framing
    proxy      httpx, for an endpoint the environment routes through a proxy

asyncio, h11 and httpx are imported where they are used, never here: importing the settings
costs the standard library only.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import random
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol, TypeVar

from .._errors import RequestHeadersError as RequestHeadersError
from .settings import HttpSettings

if TYPE_CHECKING:
    import concurrent.futures

__all__ = [
    "MAX_RESPONSE_BYTES",
    "HttpTransport",
    "InMemoryTransport",
    "RequestHeadersError",
    "Response",
    "RetryPolicy",
    "Transport",
    "in_background",
    "load_client",
    "off_loop",
    "parse_retry_after",
]

# A backend's answer is a status and, at most, a short message: no more of its body than this
# is read, and the connection that carried a longer one is dropped, so a misbehaving backend,
# proxy or load balancer cannot grow the application's memory.
MAX_RESPONSE_BYTES = 64 * 1024


class Response(NamedTuple):
    """What a backend answered: the status, its headers and at most ``MAX_RESPONSE_BYTES``
    of its body."""

    status: int
    headers: Mapping[str, str]
    body: bytes


Verdict = Literal["ok", "retry", "split", "reject"]

# Statuses worth another try (the OTLP/HTTP spec's list plus the rest of 5xx).
_RETRYABLE = frozenset({408, 429, 500, 502, 503, 504})


T = TypeVar("T")

_background: concurrent.futures.ThreadPoolExecutor | None = None
_background_lock = threading.Lock()


def _lower_thread_priority() -> None:
    # On Linux a thread id is a scheduling entity of its own, so this lowers only this thread.
    # Elsewhere (macOS, the BSDs) setpriority takes a process id, and the thread's native id
    # would name another process, or fail: the thread keeps its priority there.
    if not sys.platform.startswith("linux"):
        return
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
    except (AttributeError, OSError):
        pass


def _forget_background() -> None:
    global _background
    _background = None  # its thread did not survive the fork


os.register_at_fork(after_in_child=_forget_background)


async def in_background(fn: Callable[..., T], *args: Any) -> T:
    """Run CPU-heavy export work (compressing a large body) on looptrace's own low-priority
    thread: zlib and zstd release the GIL, and the lowered priority keeps that work from taking
    a core the application's loop wants. Inline when threads can no longer start (exit)."""
    import asyncio
    import concurrent.futures

    global _background
    pool = _background
    if pool is None:
        with _background_lock:
            pool = _background
            if pool is None:
                pool = _background = concurrent.futures.ThreadPoolExecutor(
                    1, "looptrace-background", initializer=_lower_thread_priority
                )
    try:
        future = pool.submit(fn, *args)
    except RuntimeError:
        return fn(*args)
    return await asyncio.wrap_future(future)


async def off_loop(fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn`` in the loop's default executor; inline when no executor can run any more
    (interpreter exit: the flusher still has to drain, and blocking its private loop is fine)."""
    import asyncio

    try:
        return await asyncio.to_thread(fn, *args)
    except RuntimeError as exc:
        if "shutdown" not in str(exc):
            raise
        return fn(*args)


class Transport(Protocol):
    """Sends one encoded OTLP request body. May be called concurrently."""

    async def send(self, body: bytes, headers: Mapping[str, str]) -> Response:
        """POST ``body``; raise ``OSError`` when nothing was answered."""
        ...

    async def aclose(self) -> None:
        """Release connections. Called once, on the loop that sent."""
        ...


def load_client(settings: HttpSettings) -> None:
    """Load now what building the first request's client will need (a start-up step): the
    client's modules (h11, or httpx's connection pool and async backend for an endpoint behind
    a proxy), the TLS context for an endpoint that needs it. Up to 100-250 ms of Python which,
    left to the thread that builds the client, would hold the GIL against the loop in 5 ms
    turns."""
    # The stdlib imports this submodule on first use, which for asyncio's default executor is
    # the first ``to_thread``: 2-3 ms on the application's loop at the first flush.
    import concurrent.futures.thread  # noqa: F401

    if settings.proxied():
        from .proxy import load_httpx

        load_httpx()
        settings.verify()
        return
    from . import http11  # noqa: F401

    if urllib.parse.urlsplit(settings.url).scheme == "https":
        settings.ssl_context()


class _Client(Protocol):
    async def post(self, body: bytes, headers: dict[str, str]) -> Response: ...

    async def aclose(self) -> None: ...


async def provided_headers(settings: HttpSettings) -> dict[str, str]:
    """What ``settings.headers_provider`` gives for one request, checked as configured headers
    are; :class:`RequestHeadersError` when it raises or gives what cannot be sent."""
    provider = settings.headers_provider
    if provider is None:
        return {}
    from .._config import check_header
    from .._errors import ConfigurationError

    try:
        got = provider()
        if not isinstance(got, Mapping):
            got = await got
        fields = dict(got)
        for name, value in fields.items():
            check_header(name, value)
    except ConfigurationError as exc:
        raise RequestHeadersError(f"headers_provider: {exc}") from None
    except Exception as exc:
        # The message only: a provider's error may quote the secret it failed to make.
        raise RequestHeadersError(f"headers_provider raised {type(exc).__name__}") from exc
    return fields


class HttpTransport:
    """OTLP/HTTP to ``settings.url``, over a client created on first use on the sending loop:
    :class:`~looptrace._transport.http11.Http11Pool` when the endpoint is reached directly,
    httpx when the environment names a proxy for it (:meth:`HttpSettings.proxied`).

    ``settings`` (or a URL, with ``headers``) says where and how: the same
    :class:`~looptrace._transport.settings.HttpSettings` a worker process builds its own client
    from. A client's connections belong to one event loop, so each flusher home (one loop) gets
    its own HttpTransport.
    """

    def __init__(
        self, settings: HttpSettings | str, headers: Mapping[str, str] | None = None
    ) -> None:
        if isinstance(settings, str):
            settings = HttpSettings(settings, tuple((headers or {}).items()))
        self.settings = settings
        self.url = settings.url
        self._client: _Client | None = None

    def __repr__(self) -> str:
        # Headers carry API keys: never show their values.
        return f"HttpTransport({self.settings!r})"

    async def send(self, body: bytes, headers: Mapping[str, str]) -> Response:
        """POST ``body``. ``settings.timeout`` bounds the whole request, the headers provider
        and the answer included (a server that answers a byte at a time does not hold it
        longer): past it, ``TimeoutError``, and the connection is aborted. At most
        ``MAX_RESPONSE_BYTES`` of the answer's body are read."""
        import asyncio

        client = self._client
        if client is None:
            # A client for an HTTPS endpoint loads the TLS trust store (tens to hundreds of
            # milliseconds): built in a worker thread, never on the loop.
            client = await off_loop(self._new_client)
            if self._client is None:
                self._client = client
            else:  # another send built one meanwhile
                await client.aclose()
                client = self._client
        request = self._post(client, body, headers)
        return await asyncio.wait_for(request, self.settings.timeout)

    async def _post(self, client: _Client, body: bytes, headers: Mapping[str, str]) -> Response:
        fields = await provided_headers(self.settings)
        fields.update(headers)
        return await client.post(body, fields)

    def _new_client(self) -> _Client:
        if self.settings.proxied():
            from .proxy import HttpxClient

            return HttpxClient(self.settings)
        from .http11 import Http11Pool

        return Http11Pool(self.settings)

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()


class InMemoryTransport:
    """Keeps every request; answers from a script of responses (default: 200).

    ``script`` items are ``Response`` objects, status ints, or exceptions to raise.
    """

    def __init__(self, script: list[Response | int | BaseException] | None = None) -> None:
        self.requests: list[tuple[bytes, dict[str, str]]] = []
        self.script: collections.deque[Response | int | BaseException] = collections.deque(
            script or ()
        )
        self.closed = False

    async def send(self, body: bytes, headers: Mapping[str, str]) -> Response:
        self.requests.append((body, dict(headers)))
        if self.script:
            item = self.script.popleft()
            if isinstance(item, BaseException):
                raise item
            if isinstance(item, int):
                return Response(item, {}, b"")
            return item
        return Response(200, {}, b"")

    async def aclose(self) -> None:
        self.closed = True


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter, bounded by ``max_delay`` and a total ``budget``.

    The ceiling also grows no faster than the outage: at most ``base_delay`` plus a fifth of
    how long the backend has been failing. A backend that comes back after a short outage is
    found again within a fraction of that outage; one that stays down is probed rarely."""

    base_delay: float = 0.1
    max_delay: float = 5.0
    budget: float = 60.0

    @staticmethod
    def classify(status: int) -> Verdict:
        """What to do with a batch answered with ``status``."""
        if 200 <= status < 300:
            return "ok"
        if status in _RETRYABLE or 500 <= status < 600:
            return "retry"
        if status == 413:
            return "split"
        return "reject"

    def delay(
        self, attempt: int, retry_after: float | None = None, failing_for: float | None = None
    ) -> float:
        """Seconds to wait before retry number ``attempt`` (0-based), the backend having
        failed for ``failing_for`` seconds (None: not known, no bound from it).

        Full jitter spreads clients that failed together; a server's Retry-After is a floor.
        """
        ceiling = min(self.max_delay, self.base_delay * (2 ** min(attempt, 32)))
        if failing_for is not None:
            ceiling = min(ceiling, self.base_delay + failing_for / 5)
        wait = random.uniform(0.0, ceiling)
        if retry_after is not None:
            wait = max(wait, retry_after)
        return wait


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or HTTP-date); None if absent/bad."""
    if value is None:
        return None
    value = value.strip()
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        import email.utils  # 20 ms of imports, for the rare HTTP-date form

        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if seconds != seconds:  # NaN
        return None
    return max(0.0, seconds)
