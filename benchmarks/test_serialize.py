"""Serializer micro-benchmarks (pytest-benchmark): the per-span costs the flusher pays."""

from __future__ import annotations

from typing import Any

import pytest

from looptrace import _otlp, _serialize
from looptrace._capture.spans import Span
from looptrace._config import Config
from looptrace._encode import SpanEncoder
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


@pytest.mark.parametrize(
    ("name", "make"),
    [
        ("chat_6KB", chat_payload),
        ("string_64KB", lambda: string_payload(64_000)),
        ("structure_165KB", lambda: structure_payload(165_000)),
    ],
)
def test_secret_key_scan(benchmark: Any, name: str, make: Any) -> None:
    """The check for a secret key in a value's JSON, run whenever the planning walk could not
    rule one out (a value beyond its node budget, or changed by a hook)."""
    import orjson

    out = orjson.dumps(make())
    pol = _serialize.policy(CFG)
    assert not pol.maybe_secret(out)  # none of them holds a secret key
    benchmark(pol.maybe_secret, out)
