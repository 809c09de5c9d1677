"""The event loops the client is tested under, as anyio tests its own: asyncio, asyncio in debug
mode, and uvloop (what uvicorn runs when it is installed). A test module takes the matrix with

    from loop_matrix import loop_kind  # noqa: F401
    pytestmark = pytest.mark.usefixtures("loop_kind")

and every loop its tests create, by ``asyncio.run``, pytest-asyncio or looptrace's own flusher
thread, is then of that kind. uvloop is skipped only where it cannot be imported (Windows).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

LOOP_KINDS = ("asyncio", "asyncio-debug", "uvloop")


@pytest.fixture(params=LOOP_KINDS)
def loop_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Which event loop this test's loops are: the policy that makes them, and asyncio's debug
    mode (read from the environment by every new loop) on or off."""
    kind: str = request.param
    policy: asyncio.AbstractEventLoopPolicy
    if kind == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        policy = uvloop.EventLoopPolicy()
    else:
        policy = asyncio.DefaultEventLoopPolicy()
    if kind == "asyncio-debug":
        monkeypatch.setenv("PYTHONASYNCIODEBUG", "1")
    else:
        monkeypatch.delenv("PYTHONASYNCIODEBUG", raising=False)
    previous = asyncio.get_event_loop_policy()
    asyncio.set_event_loop_policy(policy)
    try:
        yield kind
    finally:
        asyncio.set_event_loop_policy(previous)
