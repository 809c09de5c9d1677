"""A case's LLM usage: the sums of ``gen_ai.usage.*`` and of ``llm.cost.total`` over the spans
of its trace."""

from __future__ import annotations

from typing import Any

from looptrace import Span

from ._internals import Deferred, add_end_hook, remove_end_hook, semconv


class CaseCost(Deferred):
    """The USD cost of a case's LLM calls: the sum of the ``llm.cost.total`` of those that have
    one, None when none has. A call's cost may itself be worked out at export (a price-table
    lookup costs about a millisecond), so the sum is too: on the flusher when the case span is
    exported, or when the result is read, whichever comes first (each call's price is worked
    out once)."""

    __slots__ = ("parts", "total")

    def __init__(self, parts: list[Any]) -> None:
        self.parts = parts
        self.total: float | None = None

    def resolve(self) -> float | None:
        if self.total is not None or not self.parts:
            return self.total
        total: float | None = None
        for part in self.parts:
            value = part.resolve() if isinstance(part, Deferred) else part
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                total = (total or 0.0) + float(value)
        self.total = total
        if total is not None:
            self.parts = []  # the sum is kept; the calls' prices need not be
        return total

    def __repr__(self) -> str:
        return f"<case cost {self.total if self.total is not None else 'not worked out'}>"


# Usage of the cases running now, by trace id: [input tokens, output tokens, cost parts]. The
# end hook that fills it is installed only while a case runs, and costs other spans one dict
# lookup.
_case_tokens: dict[int, list[Any]] = {}


def _count_tokens(span: Span) -> None:
    counts = _case_tokens.get(span.trace_id)
    if counts is None:
        return
    attributes = span.attributes
    if not attributes:
        return
    value = attributes.get(semconv.GENAI_INPUT_TOKENS)
    if type(value) is int:
        counts[0] += value
    value = attributes.get(semconv.GENAI_OUTPUT_TOKENS)
    if type(value) is int:
        counts[1] += value
    cost = attributes.get(semconv.LLM_COST_TOTAL)
    if cost is not None:
        counts[2].append(cost)  # kept as it is: a deferred price is worked out later


def _watch_tokens(trace_id: int) -> None:
    if not _case_tokens:
        add_end_hook(_count_tokens)
    _case_tokens.setdefault(trace_id, [0, 0, []])


def _unwatch_tokens(trace_id: int) -> tuple[int, int, CaseCost | None]:
    counts = _case_tokens.pop(trace_id, None)
    if not _case_tokens:
        remove_end_hook(_count_tokens)
    if counts is None:
        return (0, 0, None)
    return (counts[0], counts[1], CaseCost(counts[2]) if counts[2] else None)
