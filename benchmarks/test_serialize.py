"""Serializer micro-benchmarks (pytest-benchmark): the per-span costs the flusher pays."""

from __future__ import annotations

from typing import Any

import pytest

from looptrace import _otlp, _serialize
from looptrace._capture.spans import Span
from looptrace._config import Config
from looptrace._otlp.span_encoder import SpanEncoder
from scenario_large_payloads import string_payload, structure_payload

CFG = Config()


def span_with(inputs: Any, output: Any) -> Span:
    span = Span("work", 1, 2, 0, 1_000)
    span.end_ns = 2_000
    span.inputs = inputs
    span.output = output
    return span


def test_to_wire_small_span(benchmark: Any) -> None:
    """A span with three short arguments and a short output: the common case, through the
    general route (a WireSpan first, used for OTLP/JSON, events and links)."""
    span = span_with({"a": 1, "b": "hello", "c": [1, 2, 3]}, {"r": 1})
    benchmark(lambda: _otlp.encode_span(_serialize.to_wire(span, CFG), "protobuf"))


def test_plan_and_encode_small_span(benchmark: Any) -> None:
    """The same span as the flusher encodes it: the planning walk, then the direct route."""
    span = span_with({"a": 1, "b": "hello", "c": [1, 2, 3]}, {"r": 1})
    enc = SpanEncoder(CFG)
    benchmark(lambda: enc.encode(span, enc.plan(span)))


def test_to_json_small_value_with_secret_key(benchmark: Any) -> None:
    """The careful path: a small dict holding a key that must be redacted."""
    benchmark(_serialize.to_json, {"user": "a", "password": "p", "n": 1}, CFG)


@pytest.mark.parametrize(
    ("name", "make"),
    [
        ("string_2_5MB", lambda: string_payload(2_500_000)),
        ("structure_165KB", lambda: structure_payload(165_000)),
    ],
)
def test_to_wire_and_encode_large(benchmark: Any, name: str, make: Any) -> None:
    """Inline serialization + protobuf encoding of the scenario payloads."""
    span = span_with(make(), "ok")
    benchmark(lambda: _otlp.encode_span(_serialize.to_wire(span, CFG), "protobuf"))


def test_estimate_size(benchmark: Any) -> None:
    """estimate_size runs on the capture path: it must stay well under a microsecond or two."""
    span = span_with({"a": 1, "b": "x" * 2_500_000, "c": [1, 2, 3]}, "ok")
    benchmark(_serialize.estimate_size, span)


def test_plan_structure(benchmark: Any) -> None:
    """The bounded planning walk on a structure-heavy value stops at its node budget."""
    span = span_with(structure_payload(165_000), "ok")
    benchmark(SpanEncoder(CFG).plan, span)


def chat_payload() -> dict[str, Any]:
    """An LLM request: `max_tokens` mentions a redaction word, so a cheap pre-check is not
    enough and the scan has to decide."""
    messages = [{"role": "user", "content": "hello world " * 5, "name": f"u{i}"} for i in range(60)]
    return {"model": "gpt-4o", "max_tokens": 512, "temperature": 0.2, "messages": messages}


def documents_payload(size: int) -> dict[str, Any]:
    """Retrieved documents: long English text (it mentions tokens, sessions and API keys) under
    a few keys, and a little metadata."""
    text = (
        "The session token is sent with every API call; rotate the api key and the password "
        "when a secret may have leaked, and keep cookies out of logs. "
    ) * 8
    docs: list[dict[str, Any]] = []
    total = 0
    while total < size:
        doc = {
            "page_content": text,
            "metadata": {"source": f"docs/page-{len(docs)}.md", "page": len(docs), "score": 0.5},
        }
        docs.append(doc)
        total += len(text) + 80
    return {"query": "how do I rotate credentials?", "documents": docs}


def tools_payload() -> dict[str, Any]:
    """An agent's request: messages with tool calls (their arguments are JSON carried as text)
    and the tool schemas it offers."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": f"tool_{i}",
                "description": "Look something up in the knowledge base and return the rows.",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "query": {"type": "string", "description": "what to look for"},
                        "limit": {"type": "integer", "minimum": 1, "maximum": 50},
                    },
                    "required": ["query"],
                },
            },
        }
        for i in range(40)
    ]
    messages: list[dict[str, Any]] = []
    for i in range(40):
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{i}",
                        "type": "function",
                        "function": {"name": f"tool_{i}", "arguments": '{"query":"x","limit":5}'},
                    }
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": "row " * 40})
    return {"model": "gpt-4o", "max_tokens": 1024, "messages": messages, "tools": tools}


def ids_payload(n: int) -> dict[str, Any]:
    """Ids as keys: thousands of keys, none repeating (the scan's worst case)."""
    return {f"user-{i:06d}": {"n": i, "active": True} for i in range(n)}


SCAN_PAYLOADS = [
    ("chat_6KB", chat_payload),
    ("string_64KB", lambda: string_payload(64_000)),
    ("structure_165KB", lambda: structure_payload(165_000)),
    ("documents_165KB", lambda: documents_payload(165_000)),
    ("tools_40KB", tools_payload),
    ("ids_as_keys_150KB", lambda: ids_payload(5_000)),
]


@pytest.mark.parametrize(("name", "make"), SCAN_PAYLOADS)
def test_secret_key_scan(benchmark: Any, name: str, make: Any) -> None:
    """The check for a secret key in a value's JSON, run whenever the planning walk could not
    rule one out (a value beyond its node budget, or changed by a hook): the policy has seen
    values of this shape before (the steady state of a traced application)."""
    import orjson

    out = orjson.dumps(make())
    pol = _serialize.policy(CFG)
    assert not pol.maybe_secret(out)  # none of them holds a secret key
    benchmark(pol.maybe_secret, out)


@pytest.mark.parametrize(("name", "make"), SCAN_PAYLOADS)
def test_secret_key_scan_first_sight(benchmark: Any, name: str, make: Any) -> None:
    """The same check by a policy that has never seen a value (the first span of a shape, or
    a process that just started; ``re``'s cache of compiled patterns is emptied too)."""
    import re

    import orjson

    out = orjson.dumps(make())

    def fresh_policy() -> tuple[tuple[Any, bytes], dict[str, Any]]:
        re.purge()
        pol = _serialize.Policy(CFG.max_value_bytes, CFG.max_depth, CFG.redact, CFG.redact_keys)
        return (pol, out), {}

    result = benchmark.pedantic(
        lambda pol, out: pol.maybe_secret(out), setup=fresh_policy, rounds=200, warmup_rounds=2
    )
    assert result is False


@pytest.mark.parametrize(
    ("name", "make"),
    [
        ("structure_165KB", lambda: structure_payload(165_000)),
        ("documents_165KB", lambda: documents_payload(165_000)),
        ("tools_40KB", tools_payload),
    ],
)
def test_plan_and_encode_large(benchmark: Any, name: str, make: Any) -> None:
    """What the flusher does per span, as the scenario records it: ``handle(request)`` with
    the payload as its argument, planned then encoded straight to protobuf."""
    span = span_with({"request": make()}, "ok")
    enc = SpanEncoder(CFG)
    benchmark(lambda: enc.encode(span, enc.plan(span)))


def test_orjson_alone_structure(benchmark: Any) -> None:
    """The floor: one orjson call on the scenario's structure-heavy payload, no options."""
    import orjson

    payload = {"request": structure_payload(165_000)}
    benchmark(orjson.dumps, payload)
