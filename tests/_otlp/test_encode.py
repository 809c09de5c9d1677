"""The flusher's per-span step: the direct protobuf route gives the general route's bytes, and
the walk that plans it never lets a secret key through unscanned."""

from __future__ import annotations

import datetime
import json
import uuid
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import looptrace
from looptrace import _otlp, _serialize
from looptrace._capture.spans import UNSET, CallSite, Event, RemoteChildSpan, ScopedSpan, Span
from looptrace._config import Config
from looptrace._otlp.span_encoder import CLEAN, HOOKED, LARGE, OFFLOAD, SpanEncoder
from looptrace._serialize import REDACTED, to_wire
from looptrace._serialize.policy import Policy
from looptrace.collector.decode import decode_request
from looptrace.testing import capture_spans
from steps_support import run_steps

CFG = Config()


def general(span: Span, cfg: Config = CFG) -> bytes:
    return _otlp.encode_span(to_wire(span, cfg), "protobuf")


def plan(span: Span, cfg: Config = CFG) -> int:
    return SpanEncoder(cfg).plan(span)


def direct(span: Span, cfg: Config = CFG) -> bytes:
    enc = SpanEncoder(cfg)
    return enc.encode(span, enc.plan(span))


def decoded(chunk: bytes) -> dict[str, Any]:
    """The span's attributes, read back through the real request decoder."""
    resource = _otlp.default_resource(CFG)
    body = _otlp.encode_request([chunk], resource, "protobuf")
    (span,) = decode_request(body, _otlp.PROTOBUF_CONTENT_TYPE, None)
    return dict(span.attributes)


def make_span(**fields: Any) -> Span:
    scope = fields.pop("scope", None)
    if scope is not None:
        remote = fields.pop("remote", False)
        span: Span = ScopedSpan(
            "step", 0x1234, 0x42, fields.pop("parent", 0), 1_000, None, "", 1, scope, remote
        )
        span.end_ns = 5_000
        for name, value in fields.items():
            setattr(span, name, value)
        return span
    cls = RemoteChildSpan if fields.pop("remote", False) else Span
    span = cls("step", 0x1234, 0x42, fields.pop("parent", 0), 1_000)
    span.end_ns = 5_000
    for name, value in fields.items():
        setattr(span, name, value)
    return span


SITE = CallSite(
    "answer",
    "Agent.answer",
    "app.agents",
    attributes={"span.type": "llm", "api_key": "sk-123", "model": "m-1", "cfg": {"t": 0.5}},
)


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"inputs": {"question": "what is 2+2?", "i": 7}, "output": {"answer": 4}},
        {"inputs": {"q": "é ☃ \U0001f600"}, "output": "plain text", "parent": 0x99},
        {"inputs": {"messages": [{"role": "user", "content": "hi"}]}, "output": None},
        {"site": SITE, "inputs": {"x": 1}, "output": [1, 2]},
        {"site": SITE, "attributes": {"tokens": 12, "note": "n", "password": "p"}},
        {"site": SITE, "attributes": {"model": "override"}, "inputs": {"x": 1}},
        {"attributes": {"list": [1, 2], "nested": {"token": "t"}}, "output": 3},
        {"inputs": {"auth": {"Authorization": "Bearer x"}}, "output": {"password": "p"}},
        {"inputs": {"when": datetime.datetime(2026, 1, 2), "id": uuid.UUID(int=5)}},
        {"inputs": {"lone": "\ud800"}, "output": {"big": 1 << 70}},
        {"inputs": {"arr": np.arange(5)}, "output": {1: "non-string key"}},
        {"status_code": 2, "status_message": "boom", "trace_state": "k=v"},
        {"remote": True, "parent": 7},
        {"inputs": {"a": "x" * 300_000}, "output": {"b": "y" * 300_000}},
        {"inputs": {"rows": [{"id": i} for i in range(400)]}},
        {"scope": ("opentelemetry.instrumentation.httpx", "0.5"), "attributes": {"k": "v"}},
        {"scope": ("lib", ""), "remote": True, "parent": 9},
    ],
    ids=lambda f: ",".join(f) or "bare",
)
def test_direct_route_gives_the_general_bytes(fields: dict[str, Any]) -> None:
    """Whatever the span holds (decorator attributes with a secret, its own attributes, one
    overriding the decorator's, nested secrets, values orjson refuses, a payload over the
    per-span cap), the direct route writes exactly what to_wire + encode_span writes."""
    span = make_span(**dict(fields))
    assert direct(span) == general(span)
    # A span of another instrumentation scope says so, by either route.
    assert getattr(direct(span), "scope", None) == getattr(general(span), "scope", None)
    assert getattr(direct(span), "scope", None) == fields.get("scope")
    # ...and it did write them itself, except where a span overrides its decorator's attribute.
    written = SpanEncoder(CFG)._encode_pb(span, plan(span))
    overrides = span.attributes is not None and "model" in span.attributes
    assert (written is None) is overrides


def test_direct_route_counts_decorator_attributes_per_span() -> None:
    """A decorator's attributes are encoded once per call site, but what serializing them
    counts (a redaction, a truncation) is counted on every span that carries them, as the
    general route counts it."""
    _serialize.stats.clear()
    for _ in range(3):
        general(make_span(site=SITE))
    by_general = _serialize.stats["redactions"]
    _serialize.stats.clear()
    for _ in range(3):
        direct(make_span(site=SITE))
    assert _serialize.stats["redactions"] == by_general == 3
    assert decoded(direct(make_span(site=SITE)))["api_key"] == REDACTED
    # Any count the decorator's attributes cause (here a value cut to the cap) goes the same way.
    cfg = CFG.replace(max_value_bytes=200)
    site = CallSite("f", "f", "m", attributes={"doc": {"text": "x" * 1_000}})
    _serialize.stats.clear()
    for _ in range(3):
        general(make_span(site=site), cfg)
    by_general_counts = dict(_serialize.stats)
    _serialize.stats.clear()
    for _ in range(3):
        direct(make_span(site=site), cfg)
    assert dict(_serialize.stats) == by_general_counts
    assert by_general_counts


def test_hooks_run_once_and_their_result_is_scanned() -> None:
    """User hooks run once per span on the direct route, and what they return is still
    scanned for secret keys (the walk saw the values before the hook changed them)."""
    calls: list[Any] = []

    def hook(value: Any) -> Any:
        calls.append(value)
        return {"secret": "s", "kept": 1}

    cfg = CFG.replace(process_outputs=hook)
    span = make_span(output={"plain": 1})
    assert plan(span, cfg) & (CLEAN | HOOKED) == HOOKED
    attrs = decoded(direct(span, cfg))
    assert calls == [{"plain": 1}]
    assert attrs["output.value"] == '{"secret":"<redacted>","kept":1}'


def test_traced_calls_take_the_direct_route_end_to_end() -> None:
    """Spans from @traced and span() encode identically by both routes."""

    @looptrace.traced(attributes={"span.type": "tool"})
    def add(a: int, b: int, token: str = "") -> int:
        with looptrace.span("inner") as s:
            s.set_attribute("n", a)
        return a + b

    with capture_spans() as spans:
        add(1, 2)
        add(3, 4, token="t")
    assert len(spans) == 4
    for span in spans:
        assert direct(span) == general(span)
    assert decoded(direct(spans[-1]))["input.value"] == '{"a":3,"b":4,"token":"<redacted>"}'


# ----------------------------------------------------------------------------- plan


def test_plan_offloads_large_strings_only() -> None:
    """Large strings, bytes or arrays qualify; a structure of many small values never does,
    and the walk stops after its node budget (a big string hidden past it is not found)."""
    cfg = CFG.replace(offload_threshold_bytes=100_000)
    span = make_span(inputs={"image": "A" * 200_000})
    assert plan(span, cfg) & OFFLOAD
    assert not plan(span, cfg.replace(offload=False)) & OFFLOAD
    span.inputs = {"rows": [{"id": i, "name": f"n{i}"} for i in range(50_000)]}
    assert not plan(span, cfg) & OFFLOAD
    span.inputs = {"rows": [*range(10_000), "A" * 200_000]}
    assert not plan(span, cfg) & OFFLOAD
    span.inputs = UNSET
    span.output = [b"B" * 60_000, bytearray(60_000)]
    assert plan(span, cfg) & OFFLOAD
    span.output = np.zeros(20_000)
    assert plan(span, cfg) & OFFLOAD


@pytest.mark.parametrize(
    ("inputs", "clean"),
    [
        ({"question": "q", "messages": [{"role": "user", "content": "c"}]}, True),
        ({"max_tokens": 5, "tokenizer": "t", "when": datetime.date(2026, 1, 1)}, True),
        ({"outer": [{"inner": {"api_key": "k"}}]}, False),
        ({"obj": CallSite("f", "f", "m")}, False),  # an object: its keys are unknown
        ({1: "non-string key"}, False),
        ({"big": {f"k{i}": i for i in range(10_000)}}, False),  # past the walk's budget
        ({"rows": [[i] for i in range(300)]}, False),
    ],
)
def test_plan_says_clean_only_when_every_key_was_seen(inputs: Any, clean: bool) -> None:
    """CLEAN (skip the secret-key scan) needs every dict key seen, all strings, none secret."""
    assert bool(plan(make_span(inputs=inputs), CFG) & CLEAN) is clean


def test_a_priced_llm_span_is_clean_and_its_payloads_are_not_scanned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An LLM call's cost attributes are worked out at export (deferred values): they resolve
    to numbers and cannot hold a key, so they do not cost the span's messages the scan for
    secret keys. The encoded span is the same either way."""
    from looptrace._capture.spans import Deferred

    class Cost(Deferred):
        def resolve(self) -> float:
            return 0.25

    messages = [{"role": "user", "content": "Weather in Paris?"}]
    span = make_span(inputs=messages, output={"role": "assistant", "content": "sunny"})
    span.attributes = {"llm.cost.total": Cost(), "gen_ai.input.messages": messages}
    flags = plan(span, CFG)
    assert flags & CLEAN
    scanned: list[bytes] = []
    real = Policy.maybe_secret

    def watched(self: Policy, out: bytes, found: list[int] | None = None) -> bool:
        scanned.append(out)
        return real(self, out, found)

    monkeypatch.setattr(Policy, "maybe_secret", watched)
    enc = SpanEncoder(CFG)
    chunk = enc.encode(span, flags)
    assert scanned == []
    assert chunk == enc.encode(span, flags & ~CLEAN)
    assert scanned  # the scan this spares is the one an unclean span pays
    assert decoded(chunk)["llm.cost.total"] == 0.25
    assert json.loads(decoded(chunk)["gen_ai.input.messages"]) == messages

    # A secret key inside an attribute's value makes the span unclean, and it is masked.
    leaky = [{"role": "user", "content": "hi", "api_key": "sk-live"}]
    span.attributes = {"llm.cost.total": Cost(), "gen_ai.input.messages": leaky}
    flags = plan(span, CFG)
    assert not flags & CLEAN
    sent = json.loads(decoded(enc.encode(span, flags))["gen_ai.input.messages"])
    assert sent == [{"role": "user", "content": "hi", "api_key": REDACTED}]


def test_plan_walk_is_bounded_for_huge_flat_dicts() -> None:
    """The flusher runs the walk for every span: a dict of 100,000 values is not read item
    by item, only up to the walk's budget (and the span is then not CLEAN)."""

    class Probe:
        looked = 0

        def __getattr__(self, name: str) -> Any:
            Probe.looked += 1
            raise AttributeError(name)

    span = make_span(inputs={"huge": {str(i): Probe() for i in range(100_000)}})
    assert plan(span, CFG) == LARGE  # neither clean nor small: encoded in steps
    assert 0 < Probe.looked <= 256


def rows(n: int, **extra: Any) -> list[dict[str, Any]]:
    return [{"id": i, "name": f"item-{i}", "meta": {"rank": i % 7}, **extra} for i in range(n)]


def steps_of(enc: SpanEncoder, span: Span, flags: int) -> tuple[bytes, int]:
    """What :meth:`SpanEncoder.steps` returns, and how many times it yielded on the way."""
    return run_steps(enc.steps(span, flags))


@pytest.mark.parametrize(
    "fields",
    [
        {"inputs": {"rows": rows(3_000)}},
        {"inputs": {"rows": rows(3_000)}, "output": rows(400)},
        {"inputs": {"rows": [*rows(3_000), {"deep": {"api_key": "k"}}]}},
        {"inputs": {"rows": rows(3_000, password="p")}},
        {"inputs": {"rows": rows(3_000)}, "events": [Event("e", 3_000)]},
        {"output": {"big": {f"k{i}": i for i in range(5_000)}}},
    ],
    ids=["rows", "both", "deep-secret", "secret-rows", "events", "flat"],
)
def test_large_payloads_encode_in_steps_to_the_same_bytes(fields: dict[str, Any]) -> None:
    """A LARGE span written by ``steps`` (which yields between orjson's pass and the steps of
    the key scan) is byte for byte the span ``encode`` and the general route write, secrets
    redacted, and it did yield: once after orjson, then every 64 KiB of a scan that finds no
    secret key (one that finds one stops there), on the direct route or the general one."""
    span = make_span(**fields)
    enc = SpanEncoder(CFG)
    flags = enc.plan(span)
    assert flags & LARGE
    chunk, yields = steps_of(enc, span, flags)
    assert chunk == enc.encode(span, flags) == general(span)
    payload = orjson.dumps(fields.get("inputs", fields.get("output")))
    if b"api_key" in payload or b"password" in payload:
        assert yields >= 1
    else:
        assert yields >= 1 + len(payload) // (64 * 1024)
    attrs = decoded(chunk)
    assert '"k"' not in attrs.get("input.value", "") and '"p"' not in attrs.get("input.value", "")


def test_hooked_and_json_spans_take_the_general_routes_steps() -> None:
    """A span whose hook rewrites its payload, or that goes out as OTLP/JSON, is written by
    the general route, in steps when the JSON is long and in one when the hook made it short;
    ``steps`` gives ``encode``'s bytes either way, and runs the hook once."""
    span = make_span(inputs={"rows": rows(3_000)})
    calls: list[int] = []

    def count(v: Any) -> Any:
        calls.append(1)
        return {"n": len(v["rows"])}

    def keep(v: Any) -> Any:
        calls.append(1)
        return {"kept": v}

    for cfg, long in (
        (CFG.replace(process_inputs=count), False),
        (CFG.replace(process_inputs=keep), True),
        (CFG.replace(encoding="json"), True),
    ):
        enc = SpanEncoder(cfg)
        flags = enc.plan(span)
        calls.clear()
        chunk, yields = steps_of(enc, span, flags)
        assert len(calls) == (1 if cfg.process_inputs else 0)
        assert chunk == enc.encode(span, flags)
        assert (yields > 2) is long


def test_property_own_attributes_from_cached_pieces_match_the_general_route() -> None:
    """Hypothesis: a span's own attributes (a model, an operation, token counts, a secret key,
    long values) give the general route's bytes, in the span's order, whether a value was met
    before (its encoded piece reused) or not, under the default value cap and a small one."""
    keys = st.sampled_from(
        ["gen_ai.request.model", "gen_ai.operation.name", "api_key", "note", "n", "Authorization"]
    )
    values = (
        st.sampled_from(["gpt-4o", "chat", "x" * 40, "y" * 200, "é☃", "<redacted>"])
        | st.integers(0, 3)
        | st.booleans()
    )
    # Without redaction every value's piece is cached, secret keys' included: a policy that
    # redacts must not reuse those.
    configs = [CFG, CFG.replace(max_value_bytes=16), CFG.replace(redact=False)]

    @settings(max_examples=300, deadline=None)
    @given(st.dictionaries(keys, values, max_size=6), st.sampled_from(configs))
    def check(attributes: dict[str, Any], cfg: Config) -> None:
        for _ in range(2):  # the second time, every short value has been met before
            span = make_span(attributes=dict(attributes), inputs={"q": "hi"})
            assert direct(span, cfg) == general(span, cfg)
            if cfg.redact:
                secrets = [k for k in attributes if _serialize.policy(cfg).is_secret(k)]
                assert all(decoded(direct(span, cfg))[k] == REDACTED for k in secrets)

    check()


def test_property_direct_route_matches_and_never_leaks_a_secret() -> None:
    """Hypothesis: for arbitrary nested inputs, the direct route gives the general route's
    bytes, and every value under a secret key reaches the wire redacted."""
    pol = _serialize.policy(CFG)
    leaves = (
        st.none()
        | st.booleans()
        | st.integers(min_value=-(2**70), max_value=2**70)
        | st.floats(allow_nan=True)
        | st.text(max_size=20)
        | st.binary(max_size=20)
        | st.datetimes()
    )
    keys = st.sampled_from(["a", "password", "max_tokens", "X-Api-Key", "tokens", "n"]) | st.text(
        max_size=8
    )
    values = st.recursive(
        leaves,
        lambda children: (
            st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=4)
        ),
        max_leaves=30,
    )

    def assert_redacted(node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if pol.is_secret(k):
                    assert v == REDACTED
                else:
                    assert_redacted(v)
        elif isinstance(node, list):
            for v in node:
                assert_redacted(v)

    @settings(max_examples=200, deadline=None)
    @given(values)
    def check(value: Any) -> None:
        span = make_span(inputs={"v": value}, output=value)
        chunk = direct(span)
        assert chunk == general(span)
        attrs = decoded(chunk)
        assert_redacted(json.loads(str(attrs["input.value"])))
        assert_redacted(json.loads(str(attrs["output.value"])))

    check()
