"""Datasets: the cases an experiment runs, from an iterable, an async iterable or a JSONL file."""

from __future__ import annotations

from collections.abc import AsyncIterable, Iterable, Mapping
from typing import Any, TypeVar

T = TypeVar("T")


def _unpack(item: Any) -> tuple[Any, Any, Mapping[str, Any] | None]:
    if isinstance(item, Mapping) and "input" in item:
        meta = item.get("metadata")
        return item["input"], item.get("expected"), meta if isinstance(meta, Mapping) else None
    return item, None, None


async def _aiter(dataset: Iterable[T] | AsyncIterable[T]) -> Any:
    if isinstance(dataset, AsyncIterable):
        async for item in dataset:
            yield item
    else:
        for item in dataset:
            yield item


def _read_jsonl(path: str) -> list[Any]:
    import orjson

    cases: list[Any] = []
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                cases.append(orjson.loads(line))
            except orjson.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not valid JSON ({exc})") from None
    return cases
