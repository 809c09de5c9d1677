"""Scorers: any callable that judges a case, called the way its signature asks.

A scorer takes ``(input, output, expected)`` positionally, as many as it accepts, or any of
``input``, ``output``, ``expected``, ``metadata`` by name; it returns a number, a bool, a
:class:`Score`, a dict of named scores, an object with ``.score`` or ``.value``, or None.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from ._results import Score


class _Scorer:
    """A user scorer, with its name and a call that passes input/output/expected its way."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.name = _callable_name(fn)
        self.call = _adapt(fn)


_SCORER_ARGS = ("input", "output", "expected", "metadata")


def _adapt(fn: Callable[..., Any]) -> Callable[[Any, Any, Any, Any], Any]:
    """Call a scorer by parameter name when it names them (input, output, expected, metadata),
    else positionally as (input, output, expected), as many as it takes."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return lambda i, o, e, m: fn(i, o, e)
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return lambda i, o, e, m: fn(input=i, output=o, expected=e, metadata=m)
    named = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    required = [p.name for p in params if p.default is p.empty and p.kind is not p.VAR_POSITIONAL]
    if required and all(n in _SCORER_ARGS for n in required):
        wanted = [n for n in _SCORER_ARGS if n in named]

        def by_name(i: Any, o: Any, e: Any, m: Any) -> Any:
            values = {"input": i, "output": o, "expected": e, "metadata": m}
            return fn(**{n: values[n] for n in wanted})

        return by_name
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        count = 3
    else:
        count = min(
            3, sum(1 for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))
        )
    return lambda i, o, e, m: fn(*(i, o, e)[:count])


def _callable_name(fn: Any) -> str:
    target = getattr(fn, "func", fn)  # functools.partial
    name = getattr(target, "__name__", None)
    return name if isinstance(name, str) else type(target).__name__


def _normalize(default: str, value: Any) -> list[tuple[str, float | bool | Score]]:
    """A scorer's return value as (name, value) pairs; None means no score."""
    if value is None:
        return []
    if isinstance(value, Score):
        return [(value.name or default, value)]
    if isinstance(value, (bool, int, float)):
        return [(default, value)]
    if isinstance(value, Mapping):
        out: list[tuple[str, float | bool | Score]] = []
        for key, item in value.items():
            if isinstance(item, Mapping):
                raise TypeError(f"scorer {default!r} returned a nested dict under {key!r}")
            out.extend(_normalize(str(key), item))
        return out
    # A duck-typed result object (``.score``/``.value`` and maybe ``.comment``/``.name``).
    number = getattr(value, "score", getattr(value, "value", None))
    if isinstance(number, (bool, int, float)):
        name = getattr(value, "name", None)
        comment = getattr(value, "comment", None)
        return [
            (
                name if isinstance(name, str) and name else default,
                Score("", float(number), None if comment is None else str(comment)),
            )
        ]
    raise TypeError(
        f"scorer {default!r} returned {type(value).__name__}; expected a number, a bool, "
        "a dict of named scores, or a Score"
    )
