"""LangChain runs as looptrace spans: real runnables, langchain-core's own fake chat models,
the spans read back from a real OTLP server."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from agents_support import atree, tree
from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableLambda, RunnableParallel
from langchain_core.tools import tool
from langchain_support import REPLY, ChatModel, model

import looptrace
from fake_llm_server import attributes
from genai_support import otlp
from looptrace.integrations.langchain import (
    Handler,
    instrument_langchain,
    uninstrument_langchain,
)
from otlp_server import OtlpTestServer

__all__ = ["otlp"]  # a fixture, used by name


class Shelf(BaseRetriever):
    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        return [Document(page_content=f"about {query}", metadata={"source": "shelf"})]


@pytest.fixture
def instrumented() -> Iterator[None]:
    instrument_langchain()
    yield
    uninstrument_langchain()


def chain(chat: ChatModel) -> Any:
    prompt = ChatPromptTemplate.from_messages(
        [("system", "Be terse."), ("human", "Weather in {city}?")]
    )
    return prompt | chat | StrOutputParser()


async def test_a_chain_is_a_tree_under_the_caller(otlp: OtlpTestServer, no_blocking: None) -> None:
    """``callbacks=[Handler()]``: a prompt | chat model | parser chain is one CHAIN span with
    a span per step, under the caller's span; the chat model's span is an LLM CLIENT span with
    provider, model, tokens, the conversation, and a cost from the price table."""
    with looptrace.span("caller"):
        out = await chain(model()).ainvoke({"city": "Paris"}, config={"callbacks": [Handler()]})
    assert out == REPLY

    spans = await atree(otlp, 5)
    spans.assert_one_trace()
    sequence = spans.one("RunnableSequence")
    assert spans.parent_name(sequence) == "caller"
    for name in ("ChatPromptTemplate", "chat gpt-4o-mini", "StrOutputParser"):
        assert spans.parent(spans.one(name)) is sequence, name
    s = attributes(sequence)
    assert s["openinference.span.kind"] == "CHAIN"
    assert s["input.value"] == {"city": "Paris"}
    assert s["output.value"] == f'"{REPLY}"'  # a JSON string

    llm = spans.one("chat gpt-4o-mini")
    assert llm.kind == 3  # CLIENT
    a = attributes(llm)
    assert a["openinference.span.kind"] == "LLM"
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.provider.name"] == "openai"
    assert a["gen_ai.request.model"] == "gpt-4o-mini"
    assert a["gen_ai.request.temperature"] == 0.2
    assert a["gen_ai.usage.input_tokens"] == 11
    assert a["gen_ai.usage.output_tokens"] == 3
    assert a["gen_ai.system_instructions"] == [{"type": "text", "content": "Be terse."}]
    assert a["gen_ai.input.messages"] == [
        {"role": "user", "parts": [{"type": "text", "content": "Weather in Paris?"}]}
    ]
    assert a["gen_ai.output.messages"][0]["parts"] == [{"type": "text", "content": REPLY}]
    assert a["llm.cost.total"] > 0


async def test_streaming_records_the_first_chunk(otlp: OtlpTestServer) -> None:
    """``astream``: the chat model's span says it streamed and when the first chunk came,
    and ends when the stream does."""
    chunks = []
    with looptrace.span("caller"):
        async for chunk in chain(model()).astream(
            {"city": "Paris"}, config={"callbacks": [Handler()]}
        ):
            chunks.append(chunk)
    assert "".join(chunks) == REPLY
    spans = await atree(otlp, 5)
    spans.assert_one_trace()
    a = spans.attrs("chat gpt-4o-mini")
    assert a["gen_ai.request.stream"] is True
    assert a["gen_ai.response.time_to_first_chunk"] >= 0
    assert "gen_ai.first_token" in [e.name for e in spans.one("chat gpt-4o-mini").events]


async def test_instrument_langchain_traces_every_run_once(
    otlp: OtlpTestServer, instrumented: None
) -> None:
    """After ``instrument_langchain()`` a run with no callbacks is traced, and a run given a
    Handler by hand as well is traced once, not twice."""
    with looptrace.span("caller"):
        await chain(model()).ainvoke({"city": "Paris"})
        await chain(model()).ainvoke({"city": "Rome"}, config={"callbacks": [Handler()]})
    spans = await atree(otlp, 9)
    spans.assert_one_trace()
    assert len(spans.named("RunnableSequence")) == 2
    assert len(spans.named("chat gpt-4o-mini")) == 2


async def test_uninstrument_langchain_stops_tracing(otlp: OtlpTestServer) -> None:
    """After ``uninstrument_langchain()``, runs without a handler record nothing."""
    instrument_langchain()
    uninstrument_langchain()
    with looptrace.span("caller"):
        await chain(model()).ainvoke({"city": "Paris"})
    assert (await atree(otlp, 1)).names() == ["caller"]


async def test_tools_and_their_errors(otlp: OtlpTestServer, instrumented: None) -> None:
    """A tool call is an execute_tool TOOL span with its arguments, result (its output; for a
    model's tool call, the ToolMessage's content) and call id; a tool that raises marks its
    span failed with error.type and the exception, and the exception reaches the caller
    unchanged."""

    @tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        with looptrace.span("weather lookup"):
            return f"sunny in {city}"

    @tool
    def broken(city: str) -> str:
        """Always fails."""
        raise ConnectionError("weather service down")

    with looptrace.span("caller"):
        result = await get_weather.ainvoke(
            {"args": {"city": "Paris"}, "id": "call_7", "name": "get_weather", "type": "tool_call"}
        )
        with pytest.raises(ConnectionError):
            broken.invoke({"city": "Paris"})
    assert result.content == "sunny in Paris"

    spans = await atree(otlp, 4)
    spans.assert_one_trace()
    assert spans.parent_name(spans.one("weather lookup")) == "execute_tool get_weather"
    ok = spans.attrs("execute_tool get_weather")
    assert ok["openinference.span.kind"] == "TOOL"
    assert ok["gen_ai.tool.name"] == "get_weather"
    assert ok["gen_ai.tool.call.id"] == "call_7"
    assert ok["gen_ai.tool.call.arguments"] == {"city": "Paris"}
    assert ok["gen_ai.tool.call.result"] == "sunny in Paris"
    assert ok["output.value"] == '"sunny in Paris"'  # the ToolMessage's content, as JSON
    assert ok["gen_ai.tool.description"] == "The weather in a city."
    failed = spans.one("execute_tool broken")
    assert failed.status.code == 2
    assert attributes(failed)["error.type"] == "ConnectionError"
    assert [e.name for e in failed.events] == ["exception"]


async def test_retriever_and_parallel_branches(otlp: OtlpTestServer, instrumented: None) -> None:
    """Parallel branches run concurrently each nest under the parallel step, and a
    retriever is a RETRIEVER span with its query and documents."""
    branches = RunnableParallel(
        docs=Shelf(),
        upper=RunnableLambda(lambda q: q.upper(), name="upper"),
    )
    with looptrace.span("caller"):
        out = await branches.ainvoke("paris")
    assert out["upper"] == "PARIS"

    spans = await atree(otlp, 4)
    spans.assert_one_trace()
    parallel = spans.one("RunnableParallel<docs,upper>")
    retrieval = spans.one("retrieval Shelf")
    assert spans.parent(retrieval) is parallel
    assert spans.parent(spans.one("upper")) is parallel
    r = attributes(retrieval)
    assert r["openinference.span.kind"] == "RETRIEVER"
    assert r["gen_ai.operation.name"] == "retrieval"
    assert r["input.value"] == '"paris"'  # a JSON string
    assert r["output.value"] == [{"page_content": "about paris", "metadata": {"source": "shelf"}}]


async def test_concurrent_callers_stay_apart(otlp: OtlpTestServer, instrumented: None) -> None:
    """Chains gathered concurrently, each under its own caller span, land in their caller's
    trace each."""

    async def one(i: int) -> None:
        with looptrace.span(f"caller {i}"):
            await chain(model()).ainvoke({"city": "Paris"})

    await asyncio.gather(*(one(i) for i in range(4)))
    spans = await atree(otlp, 4 * 5)
    for i in range(4):
        caller = spans.one(f"caller {i}")
        assert len([s for s in spans.spans if s.trace_id == caller.trace_id]) == 5


def test_a_failing_chat_model_records_error_type(otlp: OtlpTestServer, instrumented: None) -> None:
    """A chat model that raises: its span and the chain's are failed, with error.type."""
    chat = model()
    chat.messages = iter(())  # nothing left to say: the fake raises StopIteration's wrapper
    with pytest.raises(Exception) as raised, looptrace.span("caller"):
        chain(chat).invoke({"city": "Paris"})
    spans = tree(otlp, 4)
    llm = spans.one("chat gpt-4o-mini")
    assert llm.status.code == 2
    assert attributes(llm)["error.type"].endswith(type(raised.value).__name__)
    assert spans.one("RunnableSequence").status.code == 2


async def test_run_tags_and_metadata_become_the_trace_models_session_user_and_tags(
    otlp: OtlpTestServer, instrumented: None
) -> None:
    """A run's ``tags`` and ``metadata`` (config) are looptrace's trace model on every span of
    the run: the tags as tags, ``session_id`` and ``user_id`` as session and user, the rest of
    the application's metadata as metadata, merged with a ``looptrace.attributes`` block
    around the run (the run's session wins, tags add up). LangChain's own step tags
    (``seq:step:2``) and bookkeeping metadata (``ls_*``) are left out; the caller's spans and a
    later run without them keep the block's values alone."""

    def lookup(city: str) -> str:
        with looptrace.span("inside"):
            return city

    steps = RunnableLambda(lookup, name="lookup") | chain(model())
    config: Any = {
        "tags": ["beta"],
        "metadata": {"session_id": "s-9", "user_id": "u-3", "experiment": "e1"},
    }
    block = looptrace.attributes(session_id="outer", tags=["web"], metadata={"team": "a"})
    with block, looptrace.span("caller"):
        await steps.ainvoke({"city": "Paris"}, config=config)
        await chain(model()).ainvoke({"city": "Rome"})
        with looptrace.span("after"):
            pass

    spans = await atree(otlp, 1 + 6 + 4 + 1)
    spans.assert_one_trace()
    for name in ("caller", "after", "inside"):
        a = spans.attrs(name)
        assert (a["session.id"], a["tag.tags"], a["metadata"]) == ("outer", ["web"], {"team": "a"})
        assert "user.id" not in a
    first, second = sorted(spans.named("RunnableSequence"), key=lambda s: s.start_time_unix_nano)
    assert spans.parent_name(first) == spans.parent_name(second) == "caller"
    in_first = [s for s in spans.spans if _under(spans, s, first)]
    assert {s.name for s in in_first} >= {"chat gpt-4o-mini", "lookup", "StrOutputParser"}
    for span in [first, *(s for s in in_first if attributes(s).get("looptrace.framework"))]:
        a = attributes(span)
        assert a["session.id"] == "s-9", span.name
        assert a["user.id"] == "u-3", span.name
        assert a["tag.tags"] == ["web", "beta"], span.name
        assert a["metadata"] == {"team": "a", "experiment": "e1"}, span.name
    for span in [second, *(s for s in spans.spans if _under(spans, s, second))]:
        a = attributes(span)
        assert a["session.id"] == "outer", span.name
        assert a["tag.tags"] == ["web"], span.name
        assert a["metadata"] == {"team": "a"}, span.name


@pytest.mark.parametrize("mode", ["ainvoke", "astream"])
async def test_spans_after_a_run_go_under_the_caller_not_the_run(
    otlp: OtlpTestServer, instrumented: None, mode: str
) -> None:
    """LangChain ends an async run in a copy of the caller's context: after ``await
    chain.ainvoke()`` (or an ``astream`` consumed), the caller's next span, the next run and
    ``current_span()`` are the caller's, not the ended run's, and carry none of the run's
    session, tags or metadata."""
    config: Any = {"tags": ["beta"], "metadata": {"session_id": "s-9", "experiment": "e1"}}
    with looptrace.span("caller") as caller:
        if mode == "ainvoke":
            await chain(model()).ainvoke({"city": "Paris"}, config=config)
        else:
            async for _ in chain(model()).astream({"city": "Paris"}, config=config):
                pass
        assert looptrace.current_span() is caller
        with looptrace.span("after"):
            pass
        await chain(model()).ainvoke({"city": "Rome"})

    spans = await atree(otlp, 1 + 4 + 1 + 4)
    spans.assert_one_trace()
    assert spans.parent_name(spans.one("after")) == "caller"
    runs = spans.named("RunnableSequence")
    assert [spans.parent_name(r) for r in runs] == ["caller", "caller"]
    for name in ("caller", "after"):
        a = spans.attrs(name)
        assert not {"session.id", "tag.tags", "metadata"} & a.keys(), name


def _under(spans: Any, span: Any, ancestor: Any) -> bool:
    parent = spans.parent(span)
    while parent is not None:
        if parent is ancestor:
            return True
        parent = spans.parent(parent)
    return False


async def test_hidden_chain_runs_have_no_span_and_what_ran_inside_goes_under_their_parent(
    otlp: OtlpTestServer, instrumented: None
) -> None:
    """A chain run tagged ``langsmith:hidden`` (LangGraph's plumbing, which LangSmith does not
    show) has no span; the chain runs inside it, hidden too (LangChain hands tags down), have
    none either, and the LLM call inside goes under the nearest traced run, as it ran."""

    async def plumbing(city: str) -> str:
        return str(await chain(model()).ainvoke({"city": city}))

    hidden = RunnableLambda(plumbing, name="plumbing").with_config(tags=["langsmith:hidden"])
    steps = RunnableLambda(lambda x: x, name="first") | hidden
    with looptrace.span("caller"):
        assert await steps.ainvoke("Paris") == REPLY

    spans = await atree(otlp, 4)
    spans.assert_one_trace()
    assert spans.names() == ["RunnableSequence", "caller", "chat gpt-4o-mini", "first"]
    assert spans.parent_name(spans.one("chat gpt-4o-mini")) == "RunnableSequence"
    assert spans.parent_name(spans.one("RunnableSequence")) == "caller"
