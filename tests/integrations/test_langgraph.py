"""LangGraph runs as looptrace spans: a real graph with parallel branches, a prebuilt tool
agent on langchain-core's fake chat model, the spans read back from a real OTLP server."""

from __future__ import annotations

import operator
import warnings
from collections.abc import Iterator
from typing import Annotated, Any, TypedDict

import pytest
from agents_support import atree, sent
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langchain_support import REPLY, USAGE, ChatModel, model
from langgraph.graph import END, START, StateGraph

import looptrace
from fake_llm_server import attributes
from genai_support import otlp
from looptrace.integrations.langchain import instrument_langchain, uninstrument_langchain
from otlp_server import OtlpTestServer

__all__ = ["otlp"]  # a fixture, used by name


class State(TypedDict):
    city: str
    notes: Annotated[list[str], operator.add]


async def forecast(state: State) -> dict[str, Any]:
    reply = await model().ainvoke(f"Weather in {state['city']}?")
    return {"notes": [reply.content]}


def history(state: State) -> dict[str, Any]:
    with looptrace.span("archive lookup"):
        return {"notes": ["rained yesterday"]}


def summarize(state: State) -> dict[str, Any]:
    return {"notes": ["done"]}


def graph() -> Any:
    builder = StateGraph(State)
    builder.add_node("forecast", forecast)
    builder.add_node("history", history)
    builder.add_node("summarize", summarize)
    builder.add_edge(START, "forecast")
    builder.add_edge(START, "history")
    builder.add_edge(["forecast", "history"], "summarize")
    builder.add_edge("summarize", END)
    return builder.compile()


@pytest.fixture
def instrumented() -> Iterator[None]:
    instrument_langchain()
    yield
    uninstrument_langchain()


def node(spans: Any, name: str) -> Any:
    """The span of the graph node ``name`` (the one carrying the node attribute)."""
    found = [s for s in spans.named(name) if attributes(s).get("looptrace.langgraph.node") == name]
    assert len(found) == 1, spans.names()
    return found[0]


@pytest.mark.parametrize("mode", ["ainvoke", "astream"])
async def test_graph_nodes_nest_under_the_graph_in_the_callers_trace(
    otlp: OtlpTestServer, instrumented: None, no_blocking: None, mode: str
) -> None:
    """A graph run (``ainvoke`` or ``astream``) is one span under the caller's; each node,
    the two parallel ones included, is a span under it carrying its node name and step; the
    LLM call inside a node and a span the node's code made nest under that node."""
    with looptrace.span("caller"):
        if mode == "ainvoke":
            result = await graph().ainvoke({"city": "Paris", "notes": []})
            assert sorted(result["notes"]) == sorted([REPLY, "rained yesterday", "done"])
        else:
            updates = [u async for u in graph().astream({"city": "Paris", "notes": []})]
            assert len(updates) == 3

    spans = await atree(otlp, await sent(otlp))
    spans.assert_one_trace()
    root = spans.one("LangGraph")
    assert spans.parent_name(root) == "caller"
    assert attributes(root)["openinference.span.kind"] == "CHAIN"
    steps = {}
    for name in ("forecast", "history", "summarize"):
        span = node(spans, name)
        assert spans.parent(span) is root, name
        steps[name] = attributes(span)["looptrace.langgraph.step"]
    assert steps["forecast"] == steps["history"] < steps["summarize"]
    assert spans.parent(spans.one("chat gpt-4o-mini")) is node(spans, "forecast")
    assert spans.parent(spans.one("archive lookup")) is node(spans, "history")


class ToolModel(ChatModel):
    """The fake chat model, able to be given tools (it answers as scripted either way)."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


async def test_prebuilt_agent_with_a_tool(otlp: OtlpTestServer, instrumented: None) -> None:
    """LangGraph's prebuilt tool-calling agent: the model's tool call becomes an execute_tool
    span (with the call id) under the tools node, both LLM calls are LLM spans under the agent
    node, all in one trace under the caller."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from langgraph.prebuilt import create_react_agent

    @tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return f"sunny in {city}"

    call = {"name": "get_weather", "args": {"city": "Paris"}, "id": "call_1", "type": "tool_call"}
    chat = ToolModel(
        messages=iter(
            [
                AIMessage(content="", tool_calls=[call], usage_metadata=USAGE),  # type: ignore[arg-type]
                AIMessage(content=REPLY, usage_metadata=USAGE),  # type: ignore[arg-type]
            ]
        )
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        agent = create_react_agent(chat, [get_weather])
    with looptrace.span("caller"):
        result = await agent.ainvoke({"messages": [("user", "Weather in Paris?")]})
    assert result["messages"][-1].content == REPLY

    spans = await atree(otlp, await sent(otlp))
    spans.assert_one_trace()
    tool_span = spans.one("execute_tool get_weather")
    t = attributes(tool_span)
    assert t["gen_ai.tool.call.id"] == "call_1"
    assert t["gen_ai.tool.call.result"] == "sunny in Paris"
    ancestor = spans.parent(tool_span)
    while ancestor is not None and attributes(ancestor).get("looptrace.langgraph.node") is None:
        ancestor = spans.parent(ancestor)
    assert ancestor is not None and ancestor.name == "tools"
    chats = spans.named("chat gpt-4o-mini")
    assert len(chats) == 2
    first = min(chats, key=lambda s: s.start_time_unix_nano)
    assert attributes(first)["gen_ai.output.messages"][0]["parts"][0] == {
        "type": "tool_call",
        "id": "call_1",
        "name": "get_weather",
        "arguments": {"city": "Paris"},
    }


async def test_node_spans_record_what_is_new_not_the_whole_state(
    otlp: OtlpTestServer, instrumented: None
) -> None:
    """In a tool-calling agent each node gets the whole message list so far: its span records
    the list's length and its last two messages (in the conventions' shape), so what a step
    costs does not grow with the run, while each LLM span keeps every message it was sent and
    each tool span its arguments and result. The steps inside a node that are handed the
    node's very state object (the prebuilt agent's ``call_model`` and its prompt chain) do not
    record it again. The graph's ``thread_id`` is the session."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from langgraph.prebuilt import create_react_agent

    @tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return f"sunny in {city}"

    turns = 4
    replies = [
        AIMessage(
            content="",
            tool_calls=[{"name": "get_weather", "args": {"city": f"c{i}"}, "id": f"call_{i}"}],
            usage_metadata=USAGE,  # type: ignore[arg-type]
        )
        for i in range(turns)
    ]
    replies.append(AIMessage(content=REPLY, usage_metadata=USAGE))  # type: ignore[arg-type]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        agent = create_react_agent(ToolModel(messages=iter(replies)), [get_weather])
    config: Any = {"configurable": {"thread_id": "t-1"}, "metadata": {"user_id": "u-1"}}
    with looptrace.span("caller"):
        await agent.ainvoke({"messages": [("user", "Weather?")]}, config=config)

    spans = await atree(otlp, await sent(otlp))
    spans.assert_one_trace()
    agent_nodes = sorted(
        (s for s in spans.named("agent") if attributes(s).get("looptrace.langgraph.node")),
        key=lambda s: s.start_time_unix_nano,
    )
    assert len(agent_nodes) == turns + 1
    last = attributes(agent_nodes[-1])["input.value"]["messages"]
    assert last["count"] == 1 + 2 * turns  # the question, then a call and a result per turn
    assert [m["role"] for m in last["last"]] == ["assistant", "tool"]
    assert last["last"][1]["parts"][0]["response"] == f"sunny in c{turns - 1}"
    final = attributes(spans.one("LangGraph"))["output.value"]["messages"]
    assert final["count"] == 2 + 2 * turns
    assert final["last"][-1]["parts"] == [{"type": "text", "content": REPLY}]

    for name in ("call_model", "RunnableSequence", "Prompt"):
        steps = spans.named(name)
        assert len(steps) == turns + 1, name
        for step in steps:
            assert "input.value" not in attributes(step), name
            assert "output.value" in attributes(step), name

    chats = sorted(spans.named("chat gpt-4o-mini"), key=lambda s: s.start_time_unix_nano)
    assert len(attributes(chats[-1])["gen_ai.input.messages"]) == 1 + 2 * turns
    tools = sorted(spans.named("execute_tool get_weather"), key=lambda s: s.start_time_unix_nano)
    assert [attributes(t)["gen_ai.tool.call.result"] for t in tools] == [
        f"sunny in c{i}" for i in range(turns)
    ]
    for span in spans.spans:
        a = attributes(span)
        if a.get("looptrace.framework"):
            assert (a["session.id"], a["user.id"]) == ("t-1", "u-1"), span.name
