"""The OpenAI Agents SDK's traces as looptrace spans: real agents, the SDK's real OpenAI models
against a fake API on 127.0.0.1, the spans read back from a real OTLP server."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import agents
import openai
import pytest
from agents import (
    Agent,
    GuardrailFunctionOutput,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    input_guardrail,
)
from agents.tracing import TracingProcessor, custom_span
from agents_support import ScriptedLlm, atree

import looptrace
from fake_llm_server import USAGE_IN, attributes
from genai_support import otlp
from looptrace.integrations import openai_agents
from looptrace.integrations.openai_agents import (
    instrument_openai_agents,
    uninstrument_openai_agents,
)
from otlp_server import OtlpTestServer

__all__ = ["otlp"]  # a fixture, used by name

REPLY = "Sunny in Paris"


class Recorder(TracingProcessor):
    """Stands for the SDK's own exporter to OpenAI: it records what it is given."""

    def __init__(self) -> None:
        self.spans: list[str] = []

    def on_trace_start(self, trace: Any) -> None:
        pass

    def on_trace_end(self, trace: Any) -> None:
        pass

    def on_span_start(self, span: Any) -> None:
        pass

    def on_span_end(self, span: Any) -> None:
        self.spans.append(span.span_data.type)

    def shutdown(self) -> None:
        pass

    def force_flush(self) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    """The SDK's processors are this recorder alone (no test reaches OpenAI's endpoint)."""
    recorder = Recorder()
    agents.set_trace_processors([recorder])
    yield recorder
    uninstrument_openai_agents()
    agents.set_trace_processors([])


@pytest.fixture
def llm() -> Iterator[ScriptedLlm]:
    with ScriptedLlm(reply=REPLY) as server:
        yield server


@pytest.fixture
def instrumented(recorder: Recorder) -> None:
    """looptrace's processor alone (the recorder fixture undoes it)."""
    instrument_openai_agents(keep_openai_export=False)


def chat_model(llm: ScriptedLlm, name: str = "gpt-4o-mini") -> OpenAIChatCompletionsModel:
    client = openai.AsyncOpenAI(base_url=llm.openai_url, api_key="sk-test", max_retries=0)
    return OpenAIChatCompletionsModel(model=name, openai_client=client)


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    with looptrace.span("weather lookup"):
        return f"sunny in {city}"


def test_importing_looptrace_imports_no_framework() -> None:
    """``import looptrace`` (and reading its public names) loads no agent framework, nor
    looptrace's integration modules."""
    code = (
        "import sys, looptrace\n"
        "looptrace.instrument_openai, looptrace.instrument_opentelemetry\n"
        "names = ('agents', 'langchain_core', 'langgraph', 'pydantic_ai', 'litellm',\n"
        "         'looptrace.integrations')\n"
        "print(sorted(n for n in names if n in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


async def test_agent_run_is_a_tree_in_the_callers_trace(
    llm: ScriptedLlm, otlp: OtlpTestServer, instrumented: None, no_blocking: None
) -> None:
    """An agent run that calls a tool is one trace under the caller's span: the workflow,
    the agent (invoke_agent), its two LLM calls (chat, with model, server, tokens and
    messages) and the tool (execute_tool), with a span the tool's code made inside the tool's
    span; no span twice, none left open; the session and user of looptrace.attributes() on
    each."""
    agent = Agent(
        name="forecaster", instructions="Be terse.", tools=[get_weather], model=chat_model(llm)
    )
    with looptrace.attributes(session_id="s-1", user_id="u-1"), looptrace.span("caller"):
        result = await Runner.run(agent, "Weather in Paris?")
    assert result.final_output == REPLY

    spans = await atree(otlp, 10)
    for span in spans.spans:  # looptrace.attributes() reaches every step of the run
        assert attributes(span)["session.id"] == "s-1", span.name
        assert attributes(span)["user.id"] == "u-1", span.name
    spans.assert_one_trace()
    workflow = spans.one("Agent workflow")
    assert spans.parent_name(workflow) == "caller"
    agent_span = spans.one("invoke_agent forecaster")
    assert spans.parent_name(agent_span) == "run Agent workflow"
    assert spans.parent_name(spans.one("run Agent workflow")) == "Agent workflow"
    chats = spans.named("chat gpt-4o-mini")
    assert len(chats) == 2
    tool = spans.one("execute_tool get_weather")
    assert spans.parent_name(spans.one("weather lookup")) == "execute_tool get_weather"
    for span in (*chats, tool):
        # Each step is inside the agent, however many task/turn spans the SDK puts between.
        ancestor = spans.parent(span)
        while ancestor is not None and ancestor.name != "invoke_agent forecaster":
            ancestor = spans.parent(ancestor)
        assert ancestor is agent_span, span.name

    a = attributes(agent_span)
    assert a["gen_ai.operation.name"] == "invoke_agent"
    assert a["gen_ai.agent.name"] == "forecaster"
    assert a["openinference.span.kind"] == "AGENT"
    assert a["looptrace.agent.tools"] == ["get_weather"]

    t = attributes(tool)
    assert t["gen_ai.operation.name"] == "execute_tool"
    assert t["gen_ai.tool.name"] == "get_weather"
    assert t["openinference.span.kind"] == "TOOL"
    assert t["gen_ai.tool.call.arguments"] == {"city": "Paris"}
    assert t["gen_ai.tool.call.result"] == "sunny in Paris"

    first, second = sorted(chats, key=lambda s: s.start_time_unix_nano)
    c = attributes(first)
    assert first.kind == 3  # CLIENT
    assert c["gen_ai.operation.name"] == "chat"
    assert c["gen_ai.provider.name"] == "openai"
    assert c["gen_ai.request.model"] == "gpt-4o-mini"
    assert c["openinference.span.kind"] == "LLM"
    assert c["server.address"] == "127.0.0.1"
    assert c["server.port"] == llm.port
    assert c["gen_ai.usage.input_tokens"] == USAGE_IN
    assert c["gen_ai.usage.output_tokens"] == len(REPLY.split())
    assert c["gen_ai.input.messages"][0] == {
        "role": "system",
        "parts": [{"type": "text", "content": "Be terse."}],
    }
    assert c["gen_ai.output.messages"][0]["parts"][0]["type"] == "tool_call"
    assert "llm.cost.total" in c  # gpt-4o-mini is in the price table
    out = attributes(second)["gen_ai.output.messages"]
    assert out[0]["parts"] == [{"type": "text", "content": REPLY}]


async def test_a_tool_that_raises_is_recorded_on_the_tools_span(
    llm: ScriptedLlm, otlp: OtlpTestServer, instrumented: None
) -> None:
    """A tool's exception, which the SDK turns into a message to the model, marks the
    tool's span failed, with error.type; the run goes on."""

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        raise ConnectionError("weather service down")

    agent = Agent(name="forecaster", tools=[get_weather], model=chat_model(llm))
    with looptrace.span("caller"):
        result = await Runner.run(agent, "Weather in Paris?")
    assert result.final_output == REPLY

    spans = await atree(otlp, 9)
    tool = spans.one("execute_tool get_weather")
    assert tool.status.code == 2  # ERROR
    assert "Error running tool" in tool.status.message
    assert attributes(tool)["error.type"].startswith("Error running tool")
    assert spans.one("invoke_agent forecaster").status.code != 2


async def test_a_tool_error_that_ends_the_run_carries_the_exception(
    llm: ScriptedLlm, otlp: OtlpTestServer, instrumented: None
) -> None:
    """A tool whose error is not sent back to the model ends the run: the exception reaches
    the caller unchanged, and the tool's span records it with its type."""

    @function_tool(failure_error_function=None)
    def get_weather(city: str) -> str:
        """The weather in a city."""
        raise ConnectionError("weather service down")

    agent = Agent(name="forecaster", tools=[get_weather], model=chat_model(llm))
    with (
        pytest.raises(agents.UserError, match="weather service down"),
        looptrace.span("caller"),
    ):
        await Runner.run(agent, "Weather in Paris?")
    spans = await atree(otlp, 7)
    tool = spans.one("execute_tool get_weather")
    assert tool.status.code == 2
    assert attributes(tool)["error.type"] == "agents.UserError"
    assert [e.name for e in tool.events] == ["exception"]
    assert spans.one("caller").status.code == 2
    for span in spans.spans:
        assert span.end_time_unix_nano, span.name


async def test_a_custom_model_recording_responses_items_gets_their_messages(
    otlp: OtlpTestServer, instrumented: None
) -> None:
    """A model of the user's own that records its call in a generation span with Responses
    API items (a function call, the tool's output) rather than chat messages: the LLM spans'
    messages say who spoke and what was called, not a role of "None" with nothing in it."""
    from agents import ModelResponse, Usage
    from agents.models.interface import Model
    from agents.tracing import generation_span
    from openai.types.responses import (
        ResponseFunctionToolCall,
        ResponseOutputMessage,
        ResponseOutputText,
    )

    class Scripted(Model):
        async def get_response(
            self, system_instructions: Any, input: Any, *a: Any, **k: Any
        ) -> Any:
            called = any(
                isinstance(i, dict) and i.get("type") == "function_call_output" for i in input
            )
            output: list[Any]
            if called:
                text = ResponseOutputText(type="output_text", text=REPLY, annotations=[])
                output = [
                    ResponseOutputMessage(
                        id="m", type="message", role="assistant", status="completed", content=[text]
                    )
                ]
            else:
                output = [
                    ResponseFunctionToolCall(
                        type="function_call",
                        call_id="c1",
                        name="get_weather",
                        arguments='{"city": "Paris"}',
                    )
                ]
            with generation_span(model="gpt-4o-mini", input=input[-1:]) as span:
                span.span_data.output = [o.model_dump() for o in output]
            return ModelResponse(output=output, usage=Usage(), response_id=None)

        def stream_response(self, *a: Any, **k: Any) -> Any:
            raise NotImplementedError

    agent = Agent(name="forecaster", tools=[get_weather], model=Scripted())
    with looptrace.span("caller"):
        result = await Runner.run(agent, "Weather in Paris?")
    assert result.final_output == REPLY

    spans = await atree(otlp, 10)
    first, second = sorted(spans.named("chat gpt-4o-mini"), key=lambda s: s.start_time_unix_nano)
    assert attributes(first)["gen_ai.input.messages"] == [
        {"role": "user", "parts": [{"type": "text", "content": "Weather in Paris?"}]}
    ]
    assert attributes(first)["gen_ai.output.messages"] == [
        {
            "role": "assistant",
            "parts": [
                {
                    "type": "tool_call",
                    "id": "c1",
                    "name": "get_weather",
                    "arguments": '{"city": "Paris"}',
                }
            ],
        }
    ]
    assert attributes(second)["gen_ai.input.messages"] == [
        {
            "role": "tool",
            "parts": [{"type": "tool_call_response", "id": "c1", "response": "sunny in Paris"}],
        }
    ]
    out = attributes(second)["gen_ai.output.messages"]
    assert [m["role"] for m in out] == ["assistant"]
    assert out[0]["parts"] == [{"type": "text", "content": REPLY}]


async def test_responses_model_handoff_guardrail_and_custom_spans(
    llm: ScriptedLlm, otlp: OtlpTestServer, instrumented: None
) -> None:
    """A run with an input guardrail, a handoff to a second agent that answers through the
    Responses API, inside a trace of the user's with a custom span: each becomes its span
    (guardrail, handoff, chat via the Responses API, the custom span's data), the SDK's group
    id is the session, all in the caller's trace."""
    client = openai.AsyncOpenAI(base_url=llm.openai_url, api_key="sk-test", max_retries=0)

    @input_guardrail
    def polite(ctx: Any, agent: Any, input: Any) -> GuardrailFunctionOutput:
        return GuardrailFunctionOutput(output_info="ok", tripwire_triggered=False)

    expert = Agent(name="expert", model=OpenAIResponsesModel(model="gpt-4o", openai_client=client))
    triage = Agent(
        name="triage", model=chat_model(llm), input_guardrails=[polite], handoffs=[expert]
    )
    with looptrace.span("caller"), agents.trace("support", group_id="conversation-7"):
        with custom_span("lookup", {"customer": 42}):
            pass
        result = await Runner.run(triage, "hello")
    assert result.final_output == REPLY

    spans = await atree(otlp, 12)
    spans.assert_one_trace()
    w = spans.attrs("support")
    assert w["gen_ai.conversation.id"] == "conversation-7"
    assert w["session.id"] == "conversation-7"
    assert spans.attrs("lookup")["looptrace.framework.data"] == {"customer": 42}
    guard = spans.attrs("guardrail polite")
    assert guard["openinference.span.kind"] == "GUARDRAIL"
    assert guard["looptrace.guardrail.triggered"] is False
    handoff = spans.attrs("handoff triage -> expert")
    assert handoff["looptrace.handoff.to"] == "expert"
    assert spans.parent_name(spans.one("invoke_agent expert")) == "run Agent workflow"
    chat = spans.one("chat gpt-4o-2024")  # named after the model that answered
    assert spans.parent_name(chat) != "invoke_agent triage"
    c = attributes(chat)
    assert c["gen_ai.response.model"] == "gpt-4o-2024"
    assert c["gen_ai.usage.input_tokens"] == USAGE_IN
    assert c["gen_ai.output.messages"][0]["parts"][0]["content"] == REPLY


async def test_keep_openai_export_adds_beside_the_sdks_exporter(
    recorder: Recorder, llm: ScriptedLlm, otlp: OtlpTestServer
) -> None:
    """``keep_openai_export=True`` leaves the SDK's own processor in place (it still gets
    every span) and ``False`` replaces it until uninstrument puts it back."""
    processor = instrument_openai_agents()
    assert openai_agents._current_processors() == [recorder, processor]
    instrument_openai_agents()
    assert openai_agents._current_processors() == [recorder, processor]
    uninstrument_openai_agents()
    assert openai_agents._current_processors() == [recorder]

    instrument_openai_agents(keep_openai_export=False)
    assert openai_agents._current_processors() == [processor]
    uninstrument_openai_agents()
    assert openai_agents._current_processors() == [recorder]

    instrument_openai_agents()
    agent = Agent(name="forecaster", model=chat_model(llm))
    result = await Runner.run(agent, "hi")
    assert result.final_output == REPLY
    assert "agent" in recorder.spans and "generation" in recorder.spans
    spans = await atree(otlp, 5)
    assert spans.one("invoke_agent forecaster")


async def test_uninstrument_stops_recording(
    llm: ScriptedLlm, otlp: OtlpTestServer, instrumented: None
) -> None:
    """After uninstrument_openai_agents(), an agent run records no looptrace span."""
    uninstrument_openai_agents()
    agent = Agent(name="forecaster", model=chat_model(llm))
    with looptrace.span("caller"):
        await Runner.run(agent, "hi")
    spans = await atree(otlp, 1)
    assert spans.names() == ["caller"]


async def test_concurrent_runs_each_nest_under_their_caller(
    llm: ScriptedLlm, otlp: OtlpTestServer, instrumented: None
) -> None:
    """Agent runs gathered concurrently, each under its own caller span, stay apart: each
    agent span is in its caller's trace."""
    agent = Agent(name="forecaster", tools=[get_weather], model=chat_model(llm))

    async def one(i: int) -> None:
        with looptrace.span(f"caller {i}"):
            await Runner.run(agent, "Weather in Paris?")

    await asyncio.gather(*(one(i) for i in range(3)))
    spans = await atree(otlp, 3 * 10)
    for i in range(3):
        caller = spans.one(f"caller {i}")
        mine = [s for s in spans.spans if s.trace_id == caller.trace_id]
        assert len(mine) == 10
        assert len([s for s in mine if s.name == "invoke_agent forecaster"]) == 1


def test_shutdown_and_flush_return_at_once() -> None:
    """The SDK's exit-time shutdown returns at once (nothing of looptrace's can hold the
    process's exit), and force_flush from a thread without a loop sends what ended."""
    processor = openai_agents.Processor()
    processor.shutdown(timeout=0.0)
    assert processor.enabled is False
    processor.force_flush()


@pytest.mark.parametrize("usage", [True, False])
async def test_streamed_run_nests_under_the_caller(
    llm: ScriptedLlm, otlp: OtlpTestServer, instrumented: None, usage: bool
) -> None:
    """``Runner.run_streamed``, whose loop the SDK runs in a task of its own: the run's spans
    are still one tree under the caller's span, the streamed LLM calls with their tokens (and
    none where the provider reported none: the SDK's zeros are not recorded)."""
    agent = Agent(
        name="forecaster",
        tools=[get_weather],
        model=chat_model(llm),
        model_settings=ModelSettings(include_usage=usage),
    )
    with looptrace.span("caller"):
        result = Runner.run_streamed(agent, "Weather in Paris?")
        events = [event async for event in result.stream_events()]
    assert events
    assert result.final_output == REPLY

    spans = await atree(otlp, 10)
    spans.assert_one_trace()
    assert spans.parent_name(spans.one("Agent workflow")) == "caller"
    assert spans.parent_name(spans.one("weather lookup")) == "execute_tool get_weather"
    chats = spans.named("chat gpt-4o-mini")
    assert len(chats) == 2
    for chat in chats:
        if usage:
            assert attributes(chat)["gen_ai.usage.input_tokens"] == USAGE_IN
        else:
            assert "gen_ai.usage.input_tokens" not in attributes(chat)
