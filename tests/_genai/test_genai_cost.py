"""An LLM call's cost in USD (``llm.cost.*``): the real ``openai`` and ``anthropic`` clients
against the fake API on 127.0.0.1, the spans read back from a real OTLP server, each figure
checked against genai-prices' own calculation for the same usage."""

from __future__ import annotations

import datetime
import subprocess
import sys
import threading
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import anthropic
import openai
import pytest
from genai_prices import Usage, calc_price, data_snapshot, types

import looptrace
from fake_llm_server import USAGE_IN, FakeLlmServer, attributes
from genai_support import llm, otlp, received
from looptrace import _semconv as sc
from looptrace import _state
from looptrace._capture.spans import Deferred, SpanKind
from looptrace._capture.start import start_span
from looptrace._genai import _cost
from otlp_server import OtlpTestServer

__all__ = ["llm", "otlp"]  # fixtures, used by name

API_KEY = "sk-test-secret-key"
MESSAGES = [{"role": "user", "content": "Say hello"}]
COSTS = (sc.LLM_COST_PROMPT, sc.LLM_COST_COMPLETION, sc.LLM_COST_TOTAL)


@pytest.fixture
def instrumented() -> Iterator[None]:
    looptrace.instrument_openai()
    looptrace.instrument_anthropic()
    yield
    looptrace.uninstrument_openai()
    looptrace.uninstrument_anthropic()


def openai_client(llm: FakeLlmServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=llm.openai_url, api_key=API_KEY, max_retries=0)


def anthropic_client(llm: FakeLlmServer) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=llm.anthropic_url, api_key=API_KEY, max_retries=0)


def expected(model: str, provider: str, **usage: int) -> tuple[float, float, float]:
    """genai-prices' own figures for ``usage``, as the span carries them (USD floats)."""
    calc = calc_price(Usage(**usage), model, provider_id=provider)
    return (float(calc.input_price), float(calc.output_price), float(calc.total_price))


def costs(attrs: dict[str, Any]) -> tuple[float, ...]:
    return tuple(attrs[key] for key in COSTS)


async def test_openai_cost_with_cached_and_reasoning_tokens(
    llm: FakeLlmServer, otlp: OtlpTestServer, instrumented: None
) -> None:
    """An OpenAI call to a priced model carries ``llm.cost.prompt``, ``.completion`` and
    ``.total`` in USD, equal to genai-prices' price of its usage with the cached input and the
    reasoning output tokens (chat plain and streamed, responses); the cached tokens make the
    prompt cheaper, as the table prices them. The fake API answers with a snapshot name the
    table does not know (``gpt-4o-mini-2024``), so the model asked for prices the call."""
    llm.cached_tokens, llm.reasoning_tokens = 5, 3
    api = openai_client(llm)
    async with looptrace.span("caller"):
        await api.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
        stream = await api.chat.completions.create(
            model="gpt-4o-mini",
            messages=MESSAGES,
            stream=True,
            stream_options={"include_usage": True},
        )
        [c async for c in stream]
        await api.responses.create(model="gpt-4.1-mini", input="Say hello")
    await looptrace.flush(5)
    spans = received(otlp, 4)
    out = len(llm.pieces())
    usage = {
        "input_tokens": USAGE_IN,
        "output_tokens": out,
        "cache_read_tokens": 5,
        "output_reasoning_tokens": 3,
    }
    chats = [attributes(s) for s in spans.values() if s.name == "chat gpt-4o-mini"]
    assert len(chats) == 1  # both chat calls share a name: received() keeps one per name
    for attrs, model in (
        (chats[0], "gpt-4o-mini"),
        (attributes(spans["chat gpt-4.1-mini"]), "gpt-4.1-mini"),
    ):
        assert attrs[sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == 5
        assert costs(attrs) == expected(model, "openai", **usage)
        uncached = expected(model, "openai", input_tokens=USAGE_IN, output_tokens=out)
        assert attrs[sc.LLM_COST_PROMPT] < uncached[0]
        assert attrs[sc.LLM_COST_COMPLETION] == uncached[1]
        assert attrs[sc.LLM_COST_TOTAL] == pytest.approx(
            attrs[sc.LLM_COST_PROMPT] + attrs[sc.LLM_COST_COMPLETION]
        )
    streamed = [a for a in map(attributes, otlp.accepted_spans()) if a.get("gen_ai.request.stream")]
    assert len(streamed) == 1
    assert costs(streamed[0]) == expected("gpt-4o-mini", "openai", **usage)


async def test_anthropic_cost_with_cache_reads_and_writes(
    llm: FakeLlmServer, otlp: OtlpTestServer, instrumented: None
) -> None:
    """An Anthropic call's cost counts its cache reads and cache writes at the table's prices
    for them (plain and streamed): equal to genai-prices' price of the same usage, and unlike
    the price of as many uncached input tokens."""
    llm.cached_tokens, llm.cache_creation_tokens = 5, 7
    api = anthropic_client(llm)
    async with looptrace.span("caller"):
        await api.messages.create(model="claude-sonnet-4-6", max_tokens=10, messages=MESSAGES)
        async with api.messages.stream(
            model="claude-haiku-4-5", max_tokens=10, messages=MESSAGES
        ) as s:
            await s.get_final_message()
    await looptrace.flush(5)
    spans = received(otlp, 3)
    total_in = USAGE_IN + 5 + 7
    out = len(llm.pieces())
    for name, model in (
        ("chat claude-sonnet-4-6", "claude-sonnet-4-6"),
        ("chat claude-haiku-4-5", "claude-haiku-4-5"),
    ):
        attrs = attributes(spans[name])
        assert attrs[sc.GEN_AI_USAGE_INPUT_TOKENS] == total_in
        want = expected(
            model,
            "anthropic",
            input_tokens=total_in,
            output_tokens=out,
            cache_read_tokens=5,
            cache_write_tokens=7,
        )
        assert costs(attrs) == want
        plain = expected(model, "anthropic", input_tokens=total_in, output_tokens=out)
        assert attrs[sc.LLM_COST_PROMPT] != plain[0]


@pytest.fixture
def reasoning_table() -> Iterator[None]:
    """A genai-prices table (its own types) in which OpenAI's ``reasoner`` prices reasoning
    output apart from other output, as some providers' models do."""
    model = types.ModelInfo(
        id="reasoner",
        match=types.ClauseEquals(equals="reasoner"),
        prices=types.ModelPrice(
            input_mtok=Decimal("1"), output_mtok=Decimal("10"), output_reasoning_mtok=Decimal("2")
        ),
    )
    provider = types.Provider(
        id="openai", name="OpenAI", api_pattern=r"https://api\.openai\.com", models=[model]
    )
    data_snapshot.set_custom_snapshot(
        data_snapshot.DataSnapshot(providers=[provider], from_auto_update=False)
    )
    yield
    data_snapshot.set_custom_snapshot(None)


async def test_reasoning_tokens_are_priced_as_the_table_says(
    llm: FakeLlmServer, otlp: OtlpTestServer, instrumented: None, reasoning_table: None
) -> None:
    """Reasoning tokens go to the price table as such: where it prices them apart, the
    completion costs what genai-prices says for that split, not what as many plain output
    tokens cost."""
    llm.reasoning_tokens = 3
    api = openai_client(llm)
    async with looptrace.span("caller"):
        await api.chat.completions.create(model="reasoner", messages=MESSAGES)
    await looptrace.flush(5)
    attrs = attributes(received(otlp, 2)["chat reasoner"])
    out = len(llm.pieces())
    want = expected(
        "reasoner", "openai", input_tokens=USAGE_IN, output_tokens=out, output_reasoning_tokens=3
    )
    assert costs(attrs) == want
    assert (
        attrs[sc.LLM_COST_COMPLETION]
        < expected("reasoner", "openai", input_tokens=USAGE_IN, output_tokens=out)[1]
    )


async def test_unknown_model_has_no_cost(
    llm: FakeLlmServer, otlp: OtlpTestServer, instrumented: None
) -> None:
    """A model the price table does not know gets no ``llm.cost.*`` attribute at all (no
    guess, no zero), with its token counts still there; so does a model of another provider's
    table called through this SDK."""
    async with looptrace.span("caller"):
        await openai_client(llm).chat.completions.create(model="no-such-model", messages=MESSAGES)
        await anthropic_client(llm).messages.create(
            model="gpt-4o-mini", max_tokens=10, messages=MESSAGES
        )
    await looptrace.flush(5)
    spans = received(otlp, 3)
    for name in ("chat no-such-model", "chat gpt-4o-mini"):
        attrs = attributes(spans[name])
        assert attrs[sc.GEN_AI_USAGE_INPUT_TOKENS] >= USAGE_IN
        assert not set(COSTS) & attrs.keys()


async def test_the_price_is_worked_out_at_export_not_on_the_call(
    llm: FakeLlmServer, otlp: OtlpTestServer, instrumented: None
) -> None:
    """The call's path records what the price needs and looks nothing up: the span that
    ends holds deferred values with no price worked out; the flusher works it out."""
    ended: list[Any] = []

    def keep(span: Any) -> None:
        if span.name.startswith("chat "):
            ended.append(dict(span.attributes))

    _state.add_hooks(end=keep)
    try:
        async with looptrace.span("caller"):
            await openai_client(llm).chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
    finally:
        _state.remove_hooks(end=keep)
    (at_end,) = ended
    parts = [at_end[key] for key in COSTS]
    assert all(isinstance(p, Deferred) and p.price.result is None for p in parts)
    await looptrace.flush(5)
    attrs = attributes(received(otlp, 2)["chat gpt-4o-mini"])
    assert costs(attrs) == expected(
        "gpt-4o-mini", "openai", input_tokens=USAGE_IN, output_tokens=len(llm.pieces())
    )
    assert parts[0].price.result == costs(attrs)


def test_attach_records_without_a_lookup(monkeypatch: pytest.MonkeyPatch) -> None:
    """``attach`` (on the call's path) only reads the span's attributes: the price is worked
    out on the first ``resolve``, once, and shared by the three attributes."""
    calls: list[str] = []
    real = data_snapshot.DataSnapshot.find_provider_model

    def counting(self: Any, model_ref: str, *args: Any) -> Any:
        calls.append(model_ref)
        return real(self, model_ref, *args)

    assert _cost.load()
    monkeypatch.setattr(data_snapshot.DataSnapshot, "find_provider_model", counting)
    span = start_span(
        "chat gpt-4o-mini",
        {
            sc.GEN_AI_PROVIDER_NAME: "openai",
            sc.GEN_AI_REQUEST_MODEL: "gpt-4o-mini",
            sc.GEN_AI_RESPONSE_MODEL: "gpt-4o-mini-2024-07-18",
            sc.GEN_AI_USAGE_INPUT_TOKENS: 1000,
            sc.GEN_AI_USAGE_OUTPUT_TOKENS: 200,
        },
        None,
        SpanKind.CLIENT,
    )
    _cost.attach(span)
    span.end()
    parts = [span.attributes[k] for k in COSTS]  # type: ignore[index]
    assert calls == []
    values = [p.resolve() for p in parts]
    assert calls == ["gpt-4o-mini-2024-07-18"]  # the dated snapshot answered: priced by it
    assert tuple(values) == expected(
        "gpt-4o-mini-2024-07-18", "openai", input_tokens=1000, output_tokens=200
    )


def test_no_fetch_and_no_import_until_instrumented() -> None:
    """``import looptrace`` does not import genai-prices; ``instrument_openai()`` does, and
    loads the table there; genai-prices' background updater (the one part of it that
    fetches prices over the network) is never started."""
    code = (
        "import sys, threading, looptrace\n"
        "print('genai_prices' in sys.modules)\n"
        "looptrace.instrument_openai()\n"
        "from genai_prices import data_snapshot\n"
        "print('genai_prices' in sys.modules, data_snapshot._bundled_snapshot.cache_info().currsize)\n"
        "print(sorted(t.name for t in threading.enumerate() if 'genai' in t.name))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:3] == ["False", "True 1", "[]"]


def test_without_genai_prices_one_line_names_the_install_command() -> None:
    """Without genai-prices, instrumenting says once, in one line, that the cost needs it and
    how to install it; calls are traced without cost attributes."""
    code = (
        "import sys\n"
        "sys.modules['genai_prices'] = None\n"  # what an environment without it imports
        "import looptrace\n"
        "looptrace.instrument_openai()\n"
        "looptrace.instrument_anthropic()\n"
        "from looptrace._genai import _cost\n"
        "print(_cost.ready)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
    lines = [line for line in out.stderr.splitlines() if "genai-prices" in line]
    assert len(lines) == 1, out.stderr
    assert "pip install" in lines[0] and "genai" in lines[0]


def test_no_thread_fetches_prices_after_calls(
    llm: FakeLlmServer, otlp: OtlpTestServer, instrumented: None
) -> None:
    """After priced calls and an export, no genai-prices updater thread runs and the prices
    in use are the package's own table."""
    api = openai.OpenAI(base_url=llm.openai_url, api_key=API_KEY, max_retries=0)
    with looptrace.span("caller"):
        api.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
    received(otlp, 2)
    assert not [t for t in threading.enumerate() if t.name.startswith("genai_prices")]
    assert data_snapshot.get_snapshot().from_auto_update is False


def test_every_price_in_the_table_comes_out_as_genai_prices_works_it_out() -> None:
    """For every model of every provider in genai-prices' table, with plain and with cached,
    cache-written and reasoning tokens, the cost a span carries is exactly genai-prices' own
    calculation, whether looptrace priced it through its affine form (a price without tiers)
    or through genai-prices (tiers); and the affine form is what most prices take."""
    assert _cost.load()
    snapshot = data_snapshot.get_snapshot()
    start_ns = 1_780_000_000 * 10**9
    when = datetime.datetime.fromtimestamp(start_ns / 1e9, datetime.timezone.utc)
    shapes = (
        {"input_tokens": 1_234, "output_tokens": 56},
        {
            "input_tokens": 250_000,
            "output_tokens": 9_000,
            "cache_read_tokens": 120_000,
            "cache_write_tokens": 4_000,
            "output_reasoning_tokens": 7_000,
        },
    )
    _cost._affines.clear()
    compared = 0
    for provider in snapshot.providers:
        for model in provider.models:
            for counts in shapes:
                try:
                    calc = model.calc_price(Usage(**counts), provider, genai_request_timestamp=when)
                except Exception:
                    continue  # the table cannot price these kinds for this model
                want = (float(calc.input_price), float(calc.output_price), float(calc.total_price))
                price = _cost.Price(provider.id, (model.id,), None, dict(counts), start_ns)
                try:
                    found = snapshot.find_provider_model(model.id, None, provider.id, None)[1]
                except LookupError:
                    continue  # the model answers to references other than its id
                if found is not model:
                    continue  # another model of the provider answers to this id first
                assert price._calculate() == want, (provider.id, model.id, counts)
                compared += 1
    affine = sum(1 for _, fit in _cost._affines.values() if fit is not None)
    assert compared > 2_000
    assert affine > len(_cost._affines) * 0.8
