"""Helpers for tests of work done in steps: running a step generator to its result, and
counting the event loop's turns while something runs on it."""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from typing import Any, TypeVar

T = TypeVar("T")


def run_steps(steps: Generator[None, None, T]) -> tuple[T, int]:
    """What a generator that yields between its steps returns, and how many times it
    yielded on the way."""
    yields = 0
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value, yields  # type: ignore[no-any-return]
        yields += 1


class LoopTurns:
    """``async with LoopTurns() as turns:`` counts, in ``turns.count``, the turns another
    task got on the running loop (one per ``await asyncio.sleep(0)``) while the block ran."""

    def __init__(self) -> None:
        self.count = 0
        self._stop = False
        self._task: asyncio.Future[None] | None = None

    async def _spin(self) -> None:
        while not self._stop:
            await asyncio.sleep(0)
            self.count += 1

    async def __aenter__(self) -> LoopTurns:
        self._task = asyncio.ensure_future(self._spin())
        await asyncio.sleep(0)  # started before the block's work
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self._stop = True
        assert self._task is not None
        await self._task
