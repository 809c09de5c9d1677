"""Read by mypy only (``nox -s typecheck``): pins that decorating keeps each function's type.

A regression here (a decorator returning ``Callable[..., Any]``) shows as a mypy error, not at
run time. Nothing in this file is executed by pytest.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import assert_type

import looptrace


@looptrace.traced
def plain(a: int, b: str = "x") -> float:
    return float(a)


@looptrace.traced(name="renamed", capture_inputs=False)
async def coro(a: int) -> list[str]:
    return [str(a)]


@looptrace.traced
def gen(n: int) -> Iterator[int]:
    yield n


@looptrace.traced
async def agen(n: int) -> AsyncIterator[str]:
    yield str(n)


class Thing:
    @looptrace.traced
    def method(self, x: int) -> int:
        return x

    @looptrace.traced
    @classmethod
    def build(cls, x: int) -> Thing:
        return cls()

    @looptrace.traced
    @staticmethod
    def pure(x: int) -> bool:
        return x > 0


@looptrace.attributes(session_id="s", tags=["beta"])
def in_session(a: int) -> str:
    return str(a)


@looptrace.attributes(user_id="u", metadata={"plan": "pro"})
async def in_session_async(a: int) -> bytes:
    return b""


@looptrace.attributes(session_id="s")
def in_session_gen(n: int) -> Iterator[int]:
    yield n


@looptrace.traced(as_type="tool")
def tool(query: str) -> list[str]:
    return [query]


async def check() -> None:
    assert_type(plain(1), float)
    assert_type(plain(1, b="y"), float)
    assert_type(await coro(1), list[str])
    assert_type(gen(1), Iterator[int])
    assert_type(agen(1), AsyncIterator[str])
    assert_type(Thing().method(1), int)
    assert_type(Thing.build(1), Thing)
    assert_type(Thing.pure(1), bool)
    with looptrace.span("block") as s:
        assert_type(s, looptrace.Span)
    async with looptrace.span("block") as s2:
        assert_type(s2, looptrace.Span)
    assert_type(looptrace.current_span(), looptrace.Span)
    bound = looptrace.bind_context(plain)
    assert_type(bound(1), float)
    plain("wrong")  # type: ignore[arg-type]
    assert_type(looptrace.instrument_openai(), None)
    assert_type(looptrace.uninstrument_anthropic(object()), None)
    assert_type(in_session(1), str)
    assert_type(await in_session_async(1), bytes)
    assert_type(in_session_gen(1), Iterator[int])
    in_session("wrong")  # type: ignore[arg-type]
    assert_type(tool("q"), list[str])
    with looptrace.attributes(session_id="s", user_id="u", tags=("a",), metadata={"k": 1}):
        pass
    async with looptrace.attributes(tags=["a"]):
        pass
    with looptrace.span("step", as_type="agent") as s3:
        assert_type(looptrace.score(s3, "helpful", True), looptrace.SpanContext | None)
    looptrace.score(s3.context, "tone", label="warm", comment="why")
    looptrace.score("00-" + "a" * 32 + "-" + "b" * 16 + "-01", "x", 0.5)
    looptrace.score(s3, "x", "high")  # type: ignore[arg-type]
