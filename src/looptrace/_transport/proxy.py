"""Requests through httpx, for an endpoint the environment routes through a proxy: tunnels,
proxy credentials and NO_PROXY rules are httpx's to apply. Every other endpoint is reached by
:mod:`~looptrace._transport.http11`, and this module (with httpx, httpcore and anyio, 100+ ms
of imports) is never loaded for it.
"""

from __future__ import annotations

from . import MAX_RESPONSE_BYTES, Response
from .settings import HttpSettings

__all__ = ["HttpxClient", "load_httpx"]


def load_httpx() -> None:
    """Import httpx with what it imports on its first request (its async backend)."""
    import anyio._backends._asyncio
    import anyio.streams.tls  # noqa: F401
    import httpcore  # noqa: F401
    import httpx  # noqa: F401


class HttpxClient:
    """One httpx client on the sending loop; the same ``post`` as the direct pool. Cancelled
    mid-request (the transport's timeout), httpx closes the connection it was using."""

    def __init__(self, settings: HttpSettings) -> None:
        load_httpx()  # here, off the loop, if start-up did not
        self.url = settings.url
        self.client = settings.async_client()

    async def post(self, body: bytes, headers: dict[str, str]) -> Response:
        import httpx

        try:
            async with self.client.stream("POST", self.url, content=body, headers=headers) as resp:
                detail = bytearray()
                async for part in resp.aiter_raw():
                    detail += part
                    if len(detail) >= MAX_RESPONSE_BYTES:
                        break  # leaving the block unread closes the connection
                answer = bytes(detail[:MAX_RESPONSE_BYTES])
                return Response(resp.status_code, resp.headers, answer)
        except httpx.TransportError as exc:
            # What every transport raises when nothing was answered, so that the exporter
            # need not import httpx for the endpoints that never use it.
            raise ConnectionError(f"{type(exc).__name__}: {exc}") from exc

    async def aclose(self) -> None:
        await self.client.aclose()
