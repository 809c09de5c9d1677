"""pydantic-ai agents as looptrace spans, through looptrace's OpenTelemetry bridge: real
agents on pydantic-ai's own TestModel and on its OpenAI model against the fake API on
127.0.0.1, the spans read back from a real OTLP server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from agents_support import ScriptedLlm, atree, sent
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.models.test import TestModel
from pydantic_ai.providers.openai import OpenAIProvider

import looptrace
from fake_llm_server import USAGE_IN, attributes
from genai_support import otlp
from looptrace import _state
from looptrace.integrations import pydantic_ai as integration
from otlp_server import OtlpTestServer

__all__ = ["otlp"]  # a fixture, used by name


@pytest.fixture
def instrumented() -> Iterator[None]:
    assert integration.instrument_pydantic_ai() is True
    yield
    integration.uninstrument_pydantic_ai()
    looptrace.uninstrument_opentelemetry()


@pytest.fixture
def llm() -> Iterator[ScriptedLlm]:
    with ScriptedLlm(reply="Sunny in Paris") as server:
        yield server


def weather_agent(model: object) -> Agent[None, str]:
    agent: Agent[None, str] = Agent(model, name="forecaster", instructions="Be terse.")  # type: ignore[arg-type]

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """The weather in a city."""
        with looptrace.span("weather lookup"):
            return f"sunny in {city}"

    return agent


async def test_agent_run_spans_get_kinds_in_the_callers_trace(
    otlp: OtlpTestServer, instrumented: None, no_blocking: None
) -> None:
    """An agent run on TestModel: invoke_agent (AGENT) under the caller's span, its model
    requests (LLM, with tokens and messages) and its tool call (TOOL, with a span the tool's
    code made inside it), one trace."""
    with looptrace.span("caller"):
        result = await weather_agent(TestModel()).run("Weather in Paris?")
    assert "sunny" in result.output

    spans = await atree(otlp, 6)
    spans.assert_one_trace()
    agent = spans.one("invoke_agent forecaster")
    assert spans.parent_name(agent) == "caller"
    assert attributes(agent)["openinference.span.kind"] == "AGENT"
    chats = spans.named("chat test")
    assert len(chats) == 2
    for chat in chats:
        assert spans.parent(chat) is agent
        a = attributes(chat)
        assert a["openinference.span.kind"] == "LLM"
        assert a["gen_ai.usage.input_tokens"] > 0
        assert a["gen_ai.input.messages"][0]["role"] == "user"
    tool = spans.one("execute_tool get_weather")
    assert spans.parent(tool) is agent
    assert attributes(tool)["openinference.span.kind"] == "TOOL"
    assert spans.parent(spans.one("weather lookup")) is tool


async def test_openai_model_has_provider_server_tokens_and_cost(
    llm: ScriptedLlm, otlp: OtlpTestServer, instrumented: None
) -> None:
    """pydantic-ai's OpenAI model against an OpenAI-compatible server: its chat spans carry
    the provider, the model, the tokens the server reported, and a cost from the price
    table."""
    provider = OpenAIProvider(base_url=llm.openai_url, api_key="sk-test")
    model = OpenAIChatModel("gpt-4o-mini", provider=provider)
    with looptrace.span("caller"):
        result = await weather_agent(model).run("Weather in Paris?")
    assert result.output == "Sunny in Paris"

    spans = await atree(otlp, 6)
    spans.assert_one_trace()
    for chat in spans.named("chat gpt-4o-mini"):
        a = attributes(chat)
        assert a["gen_ai.provider.name"] == "openai"
        assert a["gen_ai.usage.input_tokens"] == USAGE_IN
        assert a["llm.cost.total"] > 0


async def test_a_tool_that_raises(otlp: OtlpTestServer, instrumented: None) -> None:
    """A tool that raises ends the run with its exception; the tool's span is failed, with
    the exception and error.type."""
    agent: Agent[None, str] = Agent(TestModel(), name="forecaster")

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """The weather in a city."""
        raise ConnectionError("weather service down")

    with pytest.raises(ConnectionError), looptrace.span("caller"):
        await agent.run("Weather in Paris?")
    spans = await atree(otlp, await sent(otlp))
    tool = spans.one("execute_tool get_weather")
    assert tool.status.code == 2
    assert attributes(tool)["error.type"] == "ConnectionError"
    assert "exception" in [e.name for e in tool.events]


async def test_uninstrument_stops_the_spans(otlp: OtlpTestServer) -> None:
    """After uninstrument_pydantic_ai(), an agent run records no span of pydantic-ai's (the
    tool's own span parents to the caller), and the end hook is gone."""
    integration.instrument_pydantic_ai()
    integration.uninstrument_pydantic_ai()
    try:
        assert integration._on_end not in _state.end_hooks
        with looptrace.span("caller"):
            await weather_agent(TestModel()).run("Weather in Paris?")
        spans = await atree(otlp, 2)
        assert spans.parent_name(spans.one("weather lookup")) == "caller"
    finally:
        looptrace.uninstrument_opentelemetry()
