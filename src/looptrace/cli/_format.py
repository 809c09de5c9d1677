"""Text for the terminal: durations, times, tables, and a trace as a tree of spans."""

from __future__ import annotations

import datetime
import math
from collections.abc import Iterator, Sequence
from typing import Any

from .. import _semconv as sc


def fmt_duration(ns: int | None) -> str:
    """A duration for people: 850us, 12.3ms, 1.24s, 3m05s."""
    if ns is None:
        return "running"
    if ns < 1_000_000:
        return f"{ns / 1000:.0f}us"
    if ns < 1_000_000_000:
        return f"{ns / 1e6:.1f}ms"
    if ns < 60_000_000_000:
        return f"{ns / 1e9:.2f}s"
    minutes, seconds = divmod(int(ns // 1_000_000_000), 60)
    return f"{minutes}m{seconds:02d}s"


def fmt_time(ns: int) -> str:
    """A wall-clock time in the local zone, to the second."""
    return datetime.datetime.fromtimestamp(ns / 1e9).strftime("%Y-%m-%d %H:%M:%S")


def fmt_cost(usd: float | None, uncosted: int = 0) -> str:
    """USD for people: blank when unknown (never $0 for "no price"), a "+" when some LLM calls
    had no known price and are left out of the sum."""
    if usd is None:
        return ""
    # Cents past a dollar, four decimals past a cent, two significant digits below that.
    if usd == 0:
        text = "$0"
    elif usd >= 1:
        text = f"${usd:.2f}"
    elif usd >= 0.01:
        text = f"${usd:.4f}"
    elif usd < 1e-8:
        text = "<$0.00000001"
    else:
        text = f"${usd:.{1 - math.floor(math.log10(usd))}f}"
    return text + ("+" if uncosted else "")


def fmt_tokens(tokens_in: int | None, tokens_out: int | None) -> str:
    """``in/out`` token counts, blank when neither is known."""
    if tokens_in is None and tokens_out is None:
        return ""
    return f"{tokens_in or 0}/{tokens_out or 0}"


def _is_score(span: dict[str, Any]) -> bool:
    return (span.get("attributes") or {}).get(sc.SPAN_TYPE) == sc.SPAN_TYPE_SCORE


def score_line(attrs: dict[str, Any]) -> str:
    """A score attached to a span: name, value and/or label, comment."""
    name = attrs.get(sc.GEN_AI_EVALUATION_NAME, "?")
    value = attrs.get(sc.GEN_AI_EVALUATION_SCORE_VALUE)
    label = attrs.get(sc.GEN_AI_EVALUATION_SCORE_LABEL)
    comment = attrs.get(sc.GEN_AI_EVALUATION_EXPLANATION)
    text = f"score {name}"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        text += f" = {value:g}"
    if label is not None:
        text += f" ({label})" if isinstance(value, (int, float)) else f" = {label}"
    if comment:
        text += f": {comment}"
    return text


def _clip(text: str | None, width: int) -> str:
    if text is None:
        return ""
    text = " ".join(text.split())
    return text if len(text) <= width else text[: max(0, width - 3)] + "..."


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    for row in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return "\n".join(lines)


def render_tree(spans: Sequence[dict[str, Any]], width: int = 100) -> Iterator[str]:
    """The span tree of one trace, one span per line (inputs and outputs below), parents before
    children, siblings by start time. Spans whose parent is missing are shown as roots."""
    # A score attached after the fact is a line under the span it scores, not a span of the tree.
    ids = {s["span_id"] for s in spans if not _is_score(s)}
    children: dict[str | None, list[dict[str, Any]]] = {}
    scores: dict[str | None, list[dict[str, Any]]] = {}
    for s in spans:  # already ordered by start time
        parent = s["parent_span_id"] if s["parent_span_id"] in ids else None
        (scores if _is_score(s) else children).setdefault(parent, []).append(s)
    # Iterative walk: a 10,000-deep chain must not hit the recursion limit.
    roots = children.get(None, [])
    for score in scores.get(None, ()):
        text = score_line(score.get("attributes") or {})
        yield _clip(f"{text}  (on span {score['parent_span_id']}, not in this trace)", width)
    stack = [(s, "", True, True) for s in reversed(roots)]
    while stack:
        span, prefix, last, is_root = stack.pop()
        branch = "" if is_root else ("└─ " if last else "├─ ")
        parts = [f"{prefix}{branch}{span['name']}", fmt_duration(span["duration_ns"])]
        # Only what needs attention: OpenTelemetry's OK and UNSET both read as fine.
        if span["status"] == "error":
            parts.append("ERROR")
        if span["lag_max_ms"] is not None:
            parts.append(f"lag {span['lag_max_ms']:.1f}ms")
        if span["status"] == "error" and span["status_message"]:
            parts.append(_clip(span["status_message"], 80))
        yield "  ".join(parts)
        child_prefix = prefix if is_root else prefix + ("   " if last else "│  ")
        kids = children.get(span["span_id"], [])
        detail = child_prefix + ("│    " if kids else "     ")
        room = max(20, width - len(detail) - 5)
        llm = _llm_line(span.get("attributes") or {})
        if llm:
            yield f"{detail}{_clip(llm, room + 5)}"
        for score in scores.get(span["span_id"], ()):
            yield f"{detail}{_clip(score_line(score.get('attributes') or {}), room + 5)}"
        if span["input"] is not None:
            yield f"{detail}in:  {_clip(span['input'], room)}"
        if span["output"] is not None:
            yield f"{detail}out: {_clip(span['output'], room)}"
        for event in span.get("events") or ():
            yield f"{detail}{_event_line(event, span['start_ns'], room)}"
        for i in range(len(kids) - 1, -1, -1):
            stack.append((kids[i], child_prefix, i == len(kids) - 1, False))


def _llm_line(attrs: dict[str, Any]) -> str:
    """For an LLM call (GenAI attributes, see docs/genai.md): model, tokens, first chunk."""
    model = attrs.get("gen_ai.response.model") or attrs.get("gen_ai.request.model")
    if not model or "gen_ai.operation.name" not in attrs:
        return ""
    text = f"llm: {attrs.get('gen_ai.provider.name', '?')} {model}"
    tokens_in = attrs.get("gen_ai.usage.input_tokens")
    tokens_out = attrs.get("gen_ai.usage.output_tokens")
    if tokens_in is not None or tokens_out is not None:
        text += f"  tokens {tokens_in if tokens_in is not None else '?'} in"
        text += f" / {tokens_out if tokens_out is not None else '?'} out"
    cost = attrs.get(sc.LLM_COST_TOTAL)
    if isinstance(cost, (int, float)) and not isinstance(cost, bool):
        text += f"  cost {fmt_cost(float(cost))}"
    first = attrs.get(sc.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK)  # seconds
    if isinstance(first, (int, float)) and not isinstance(first, bool):
        text += f"  first chunk {first * 1000:.1f}ms"
    reasons = attrs.get("gen_ai.response.finish_reasons")
    if isinstance(reasons, list) and reasons:
        text += f"  finish {','.join(str(r) for r in reasons)}"
    return text


def _event_line(event: dict[str, Any], span_start_ns: int, room: int) -> str:
    """One event of a span: when (from the span's start), its name, and what says most about
    it: a loop stall names the code that blocked (where, how long), an exception its type and
    message."""
    attrs = event.get("attributes") or {}
    when = event.get("time_ns") or span_start_ns
    text = f"event +{fmt_duration(max(0, when - span_start_ns))} {event.get('name', '')}"
    if "looptrace.loop.stall.duration_ms" in attrs:
        where = f"{attrs.get('code.filepath', '?')}:{attrs.get('code.lineno', '?')}"
        text += (
            f": {attrs.get('code.function', '?')} ({where}) blocked the loop for "
            f"{float(attrs['looptrace.loop.stall.duration_ms']):.1f}ms"
        )
    elif "exception.type" in attrs:
        text += f": {attrs['exception.type']}: {attrs.get('exception.message', '')}"
    return _clip(text, room + 5)
