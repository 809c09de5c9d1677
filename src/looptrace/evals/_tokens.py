"""A case's LLM token usage: the sums of ``gen_ai.usage.*`` over the spans of its trace."""

from __future__ import annotations

from looptrace import Span

from ._internals import add_end_hook, remove_end_hook, semconv

# Token usage of the cases running now, by trace id: [input, output]. The end hook that fills
# it is installed only while a case runs, and costs other spans one dict lookup.
_case_tokens: dict[int, list[int]] = {}


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


def _watch_tokens(trace_id: int) -> None:
    if not _case_tokens:
        add_end_hook(_count_tokens)
    _case_tokens.setdefault(trace_id, [0, 0])


def _unwatch_tokens(trace_id: int) -> tuple[int, int]:
    counts = _case_tokens.pop(trace_id, None)
    if not _case_tokens:
        remove_end_hook(_count_tokens)
    return (counts[0], counts[1]) if counts is not None else (0, 0)
