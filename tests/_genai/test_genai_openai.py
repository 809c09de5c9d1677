"""OpenAI calls as spans: the real ``openai`` client against a fake API on 127.0.0.1, the spans
read back from a real OTLP server."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest

import looptrace
from fake_llm_server import TOOL_ARGUMENTS, USAGE_IN, FakeLlmServer, attributes, events
from genai_support import FAST_RETRY, llm, otlp, received, unused_port
from otlp_server import OtlpTestServer
from pipeline_support import checked_server, install_pipeline

__all__ = ["llm", "otlp", "unused_port"]  # fixtures, used by name

API_KEY = "sk-test-secret-key"
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Say hello"},
]
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}},
    }
]


@pytest.fixture
def instrumented() -> Iterator[None]:
    looptrace.instrument_openai()
    yield
    looptrace.uninstrument_openai()


def client(llm: FakeLlmServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=llm.openai_url, api_key=API_KEY, max_retries=0)


def async_client(llm: FakeLlmServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=llm.openai_url, api_key=API_KEY, max_retries=0)


def assert_child_of_caller(spans: dict[str, Any], name: str) -> dict[str, Any]:
    span, caller = spans[name], spans["caller"]
    assert span.parent_span_id == caller.span_id
    assert span.trace_id == caller.trace_id
    assert span.kind == 3  # OTLP SPAN_KIND_CLIENT
    attrs = attributes(span)
    assert API_KEY not in repr(attrs)
    return attrs


def test_importing_looptrace_does_not_import_the_sdks() -> None:
    """The SDKs are the user's: ``import looptrace`` and reading the instrument functions load
    neither openai nor anthropic."""
    code = (
        "import sys, looptrace\n"
        "looptrace.instrument_openai, looptrace.instrument_anthropic\n"
        "print('openai' in sys.modules, 'anthropic' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]


def test_chat_completion_is_a_client_span_with_genai_attributes(
    llm: FakeLlmServer, otlp: OtlpTestServer, instrumented: None
) -> None:
    """A plain chat call is one CLIENT span under the caller's span, with request parameters,
    response id/model, finish reasons, usage, and the conversation as payload and attributes."""

    @looptrace.traced(name="caller")
    def caller() -> str | None:
        response = client(llm).chat.completions.create(
            model="gpt-4o", messages=MESSAGES, temperature=0.3, max_tokens=50, top_p=0.9
        )
        return response.choices[0].message.content

    assert caller() == llm.reply
    attrs = assert_child_of_caller(received(otlp, 2), "chat gpt-4o")
    assert attrs["gen_ai.provider.name"] == "openai"
    assert attrs["gen_ai.system"] == "openai"
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.request.model"] == "gpt-4o"
    assert attrs["gen_ai.request.temperature"] == 0.3
    assert attrs["gen_ai.request.max_tokens"] == 50
    assert attrs["gen_ai.request.top_p"] == 0.9
    assert attrs["gen_ai.response.model"] == "gpt-4o-2024"
    assert attrs["gen_ai.response.id"] == "chatcmpl-1"
    assert attrs["gen_ai.response.finish_reasons"] == ["stop"]
    assert attrs["gen_ai.usage.input_tokens"] == USAGE_IN
    assert attrs["gen_ai.usage.output_tokens"] == len(llm.pieces())
    assert attrs["gen_ai.input.messages"] == [
        {"role": "system", "parts": [{"type": "text", "content": "You are terse."}]},
        {"role": "user", "parts": [{"type": "text", "content": "Say hello"}]},
    ]
    assert attrs["gen_ai.output.messages"] == [
        {
            "role": "assistant",
            "parts": [{"type": "text", "content": llm.reply}],
            "finish_reason": "stop",
        }
    ]
    assert attrs["input.value"]["messages"] == MESSAGES
    assert attrs["output.value"]["choices"][0]["message"]["content"] == llm.reply
    assert "gen_ai.response.time_to_first_chunk" not in attrs


def test_streamed_chat_span_lasts_the_stream_and_carries_text_usage_and_ttft(
    llm: FakeLlmServer, otlp: OtlpTestServer, instrumented: None
) -> None:
    """With ``stream=True`` the span ends when the caller has read the stream; it carries the
    whole text, the usage the stream reports, and the time to the first token."""
    with looptrace.span("caller"):
        stream = client(llm).chat.completions.create(
            model="gpt-4o",
            messages=MESSAGES,
            stream=True,
            stream_options={"include_usage": True},
        )
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == llm.reply
    spans = received(otlp, 2)
    attrs = assert_child_of_caller(spans, "chat gpt-4o")
    span = spans["chat gpt-4o"]
    assert span.end_time_unix_nano <= spans["caller"].end_time_unix_nano
    assert attrs["gen_ai.request.stream"] is True
    assert attrs["gen_ai.response.finish_reasons"] == ["stop"]
    assert attrs["gen_ai.usage.input_tokens"] == USAGE_IN
    assert attrs["gen_ai.usage.output_tokens"] == len(llm.pieces())
    ttft = attrs["gen_ai.response.time_to_first_chunk"]  # seconds, as the conventions say
    assert isinstance(ttft, float)
    assert 0 < ttft <= (span.end_time_unix_nano - span.start_time_unix_nano) / 1e9
    first = [e for e in span.events if e.name == "gen_ai.first_token"]
    assert len(first) == 1
    assert first[0].time_unix_nano == span.start_time_unix_nano + round(ttft * 1e9)
    assert attrs["output.value"]["content"] == llm.reply
    assert attrs["gen_ai.output.messages"][0]["parts"] == [{"type": "text", "content": llm.reply}]


async def test_async_stream_with_a_tool_call_records_the_joined_arguments(
    llm: FakeLlmServer, otlp: OtlpTestServer, instrumented: None
) -> None:
    """Tool calls streamed in fragments arrive on the span whole, with the tools offered."""
    async with looptrace.span("caller"):
        stream = await async_client(llm).chat.completions.create(
            model="gpt-4o", messages=MESSAGES, tools=TOOLS, stream=True
        )
        async with stream:
            chunks = [c async for c in stream]
    assert chunks
    await looptrace.flush(5)
    attrs = assert_child_of_caller(received(otlp, 2), "chat gpt-4o")
    assert attrs["gen_ai.tool.definitions"] == TOOLS
    assert attrs["gen_ai.response.finish_reasons"] == ["tool_calls"]
    call = {"type": "tool_call", "id": "call_1", "name": "get_weather"}
    call["arguments"] = TOOL_ARGUMENTS
    assert attrs["gen_ai.output.messages"][0]["parts"] == [call]
    assert attrs["output.value"]["tool_calls"] == [call]
    assert "gen_ai.response.time_to_first_chunk" in attrs


async def test_responses_plain_and_streamed(
    llm: FakeLlmServer, otlp: OtlpTestServer, instrumented: None
) -> None:
    """``responses.create`` is traced like chat, plain and streamed, instructions included."""
    api = async_client(llm)
    async with looptrace.span("caller"):
        with looptrace.span("plain"):
            response = await api.responses.create(
                model="gpt-4o", input="Say hello", instructions="Be terse."
            )
        with looptrace.span("streamed"):
            stream = await api.responses.create(model="gpt-4o", input="Say hello", stream=True)
            deltas = [e.delta async for e in stream if e.type == "response.output_text.delta"]
    assert response.output_text == "".join(deltas) == llm.reply
    await looptrace.flush(5)
    assert otlp.wait_for_spans(5)
    spans = otlp.accepted_spans()
    by_parent = {s.parent_span_id: s for s in spans if s.name == "chat gpt-4o"}
    names = {s.span_id: s.name for s in spans}
    assert sorted(names[p] for p in by_parent) == ["plain", "streamed"]
    for parent, span in by_parent.items():
        attrs = attributes(span)
        assert attrs["gen_ai.response.id"] == "resp_1"
        assert attrs["gen_ai.response.finish_reasons"] == ["stop"]
        assert attrs["gen_ai.usage.input_tokens"] == USAGE_IN
        assert attrs["gen_ai.output.messages"][0]["parts"] == [
            {"type": "text", "content": llm.reply}
        ]
        assert attrs["gen_ai.input.messages"] == [
            {"role": "user", "parts": [{"type": "text", "content": "Say hello"}]}
        ]
        streamed = names[parent] == "streamed"
        assert ("gen_ai.response.time_to_first_chunk" in attrs) is streamed
        if not streamed:
            assert attrs["gen_ai.system_instructions"] == [{"type": "text", "content": "Be terse."}]


def test_embeddings(llm: FakeLlmServer, otlp: OtlpTestServer, instrumented: None) -> None:
    """An embeddings call records model, usage and the vectors' shape, not the vectors."""
    with looptrace.span("caller"):
        result = client(llm).embeddings.create(model="te-3", input=["a", "b"])
    assert len(result.data) == 2
    attrs = assert_child_of_caller(received(otlp, 2), "embeddings te-3")
    assert attrs["gen_ai.operation.name"] == "embeddings"
    assert attrs["gen_ai.response.model"] == "te-3-2024"
    assert attrs["gen_ai.usage.input_tokens"] == 4
    assert attrs["gen_ai.embeddings.dimension.count"] == 3
    assert attrs["output.value"] == {"embeddings": 2, "dimensions": 3}
    assert attrs["input.value"] == {"model": "te-3", "input": ["a", "b"]}


@pytest.mark.parametrize(
    ("model", "error"),
    [("bad-request", openai.BadRequestError), ("rate-limited", openai.RateLimitError)],
)
def test_api_errors_are_recorded_and_reraised_untouched(
    llm: FakeLlmServer, otlp: OtlpTestServer, instrumented: None, model: str, error: type
) -> None:
    """A 400 or 429 reaches the caller as the SDK's own exception; the span says so."""
    with looptrace.span("caller"), pytest.raises(error) as caught:
        client(llm).chat.completions.create(model=model, messages=MESSAGES)
    assert type(caught.value) is error
    spans = received(otlp, 2)
    span = spans[f"chat {model}"]
    assert span.status.code == 2
    assert error.__name__ in span.status.message
    assert events(span) == ["exception"]
    assert span.parent_span_id == spans["caller"].span_id


def test_a_stream_closed_early_ends_its_span(
    llm: FakeLlmServer, otlp: OtlpTestServer, instrumented: None
) -> None:
    """Closing a stream after its first chunk ends the span there, marked as closed early,
    with the text read so far."""
    llm.hold()
    with looptrace.span("caller"):
        stream = client(llm).chat.completions.create(model="gpt-4o", messages=MESSAGES, stream=True)
        first = [next(stream), next(stream)]  # the role chunk, then the first word
        stream.close()
    llm.release()
    assert first[1].choices[0].delta.content == llm.pieces()[0]
    attrs = assert_child_of_caller(received(otlp, 2), "chat gpt-4o")
    assert attrs["looptrace.genai.stream.closed_early"] is True
    assert attrs["output.value"]["content"] == llm.pieces()[0]


def test_an_abandoned_stream_ends_its_span_when_collected(
    llm: FakeLlmServer, otlp: OtlpTestServer, instrumented: None
) -> None:
    """A stream dropped without being closed ends its span when it is garbage-collected."""
    with looptrace.span("caller"):
        stream = client(llm).chat.completions.create(model="gpt-4o", messages=MESSAGES, stream=True)
        next(stream)
        del stream
        gc.collect()
    attrs = assert_child_of_caller(received(otlp, 2), "chat gpt-4o")
    assert attrs["looptrace.genai.stream.abandoned"] is True


async def test_a_call_cancelled_mid_stream_is_recorded_as_cancelled(
    llm: FakeLlmServer, otlp: OtlpTestServer, instrumented: None
) -> None:
    """Cancelling the task that reads a stream ends the span as cancelled; the cancellation
    reaches the task untouched."""
    llm.hold()
    got_first = asyncio.Event()

    async def consume() -> None:
        async with looptrace.span("caller"):
            stream = await async_client(llm).chat.completions.create(
                model="gpt-4o", messages=MESSAGES, stream=True
            )
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    got_first.set()

    task = asyncio.create_task(consume())
    await got_first.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    llm.release()
    await looptrace.flush(5)
    spans = received(otlp, 2)
    span = spans["chat gpt-4o"]
    attrs = assert_child_of_caller(spans, "chat gpt-4o")
    assert attrs["looptrace.cancelled"] is True
    assert span.status.code == 2
    assert "gen_ai.response.time_to_first_chunk" in attrs


def test_content_capture_off_keeps_metadata_only(llm: FakeLlmServer, instrumented: None) -> None:
    """With ``capture_genai_content=False`` no prompt or completion leaves the process; model,
    usage and finish reasons still do."""
    with checked_server() as otlp:
        install_pipeline(otlp, retry=FAST_RETRY, capture_genai_content=False)
        with looptrace.span("caller"):
            client(llm).chat.completions.create(model="gpt-4o", messages=MESSAGES, tools=TOOLS)
            stream = client(llm).chat.completions.create(
                model="gpt-4o",
                messages=MESSAGES,
                stream=True,
                stream_options={"include_usage": True},
            )
            for _ in stream:
                pass
        assert looptrace.flush_sync(5).ok
        assert otlp.wait_for_spans(3)
        llm_spans = [s for s in otlp.accepted_spans() if s.name == "chat gpt-4o"]
    assert len(llm_spans) == 2
    for span in llm_spans:
        attrs = attributes(span)
        for key in ("input.value", "output.value", "gen_ai.input.messages"):
            assert key not in attrs
        assert "gen_ai.output.messages" not in attrs
        assert llm.reply not in repr(attrs) and "Say hello" not in repr(attrs)
        assert attrs["gen_ai.usage.input_tokens"] == USAGE_IN
        assert attrs["gen_ai.response.finish_reasons"] in (["stop"], ["tool_calls"])


def test_one_client_idempotent_and_undone(llm: FakeLlmServer, otlp: OtlpTestServer) -> None:
    """Instrumenting one client traces only that client; twice is once; undoing stops it;
    instrumenting a client and all clients still traces each call once."""
    mine, other = client(llm), client(llm)
    looptrace.instrument_openai(mine)
    looptrace.instrument_openai(mine)
    try:
        with looptrace.span("caller"):
            mine.chat.completions.create(model="m-one", messages=MESSAGES)
            other.chat.completions.create(model="m-other", messages=MESSAGES)
            looptrace.instrument_openai()
            try:
                mine.chat.completions.create(model="m-both", messages=MESSAGES)
            finally:
                looptrace.uninstrument_openai()
            looptrace.uninstrument_openai(mine)
            mine.chat.completions.create(model="m-undone", messages=MESSAGES)
    finally:
        looptrace.uninstrument_openai(mine)
    looptrace.flush_sync(5)
    assert otlp.wait_for_spans(3)
    assert otlp.span_names() == ["caller", "chat m-both", "chat m-one"]
    assert "create" not in mine.chat.completions.__dict__
    assert openai.resources.chat.completions.Completions.create.__name__ == "create"
    assert not hasattr(
        openai.resources.chat.completions.Completions.create, "__looptrace_original__"
    )


async def test_loop_blocking_during_a_stream_is_on_the_span(
    llm: FakeLlmServer, otlp: OtlpTestServer, instrumented: None
) -> None:
    """With the lag monitor running, the span says how long the loop was blocked during the
    call and before its first token."""
    async with looptrace.LagMonitor(interval=0.001), looptrace.span("caller"):
        stream = await async_client(llm).chat.completions.create(
            model="gpt-4o", messages=MESSAGES, stream=True
        )
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content == llm.pieces()[0]:
                time.sleep(0.05)  # noqa: ASYNC251 - blocks the loop on purpose, after the first token
    await looptrace.flush(5)
    attrs = assert_child_of_caller(received(otlp, 2), "chat gpt-4o")
    blocked = attrs["looptrace.genai.loop_blocked_ms"]
    before = attrs["looptrace.genai.loop_blocked_before_first_chunk_ms"]
    assert blocked >= 40
    assert before < blocked - 40


@pytest.mark.internal_errors
def test_a_failure_inside_the_instrumentation_never_reaches_the_caller(
    llm: FakeLlmServer, otlp: OtlpTestServer, instrumented: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If looptrace's own bookkeeping fails (reading a chunk, or starting the span), the call
    and the stream work as without tracing, and each failure is counted, not raised."""
    from looptrace import _errors
    from looptrace._genai import _core, _openai

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("bookkeeping bug")

    monkeypatch.setattr(_errors, "raise_internal_errors", False)
    monkeypatch.setattr(_openai._ChatStream, "on_chunk", broken)
    api = client(llm)
    with looptrace.span("caller"):
        stream = api.chat.completions.create(model="gpt-4o", messages=MESSAGES, stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        # A client whose span cannot even start: the call goes through untraced.
        _core.patch_instance(
            api.chat.completions,
            "create",
            lambda original: _core.wrap_sync(original, broken, _openai._done_chat),
        )
        plain = api.chat.completions.create(model="untraced", messages=MESSAGES)
    assert text == llm.reply
    assert plain.choices[0].message.content == llm.reply
    assert _errors.counts["genai.stream.chunk"] == len(llm.pieces()) + 2
    assert _errors.counts["genai.begin"] == 1
    assert_child_of_caller(received(otlp, 2), "chat gpt-4o")


async def test_an_async_stream_closed_early_ends_its_span(
    llm: FakeLlmServer, otlp: OtlpTestServer, instrumented: None
) -> None:
    """``await stream.close()`` in the middle of an async stream ends the span there (closed
    early, the text so far); reading on afterwards fails as the SDK's own stream does."""
    llm.hold()
    async with looptrace.span("caller"):
        stream = await async_client(llm).chat.completions.create(
            model="gpt-4o", messages=MESSAGES, stream=True
        )
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                break
        await stream.close()
        with pytest.raises(openai.APIConnectionError):
            [c async for c in stream]
    llm.release()
    await looptrace.flush(5)
    span = received(otlp, 2)["chat gpt-4o"]
    attrs = attributes(span)
    assert attrs["looptrace.genai.stream.closed_early"] is True
    assert attrs["output.value"]["content"] == llm.pieces()[0]
    assert span.status.code != 2 and "error.type" not in attrs  # closing is not a failure


# -- the loop a caller writes around a stream sees what it sees without looptrace ------------


def _item(chunk: Any) -> str:
    return (chunk.choices[0].delta.content or "") if chunk.choices else "<usage>"


def _sync_close_in_loop(api: openai.OpenAI, got: list[str]) -> None:
    stream = api.chat.completions.create(model="gpt-4o", messages=MESSAGES, stream=True)
    for chunk in stream:
        got.append(_item(chunk))
        if len(got) == 2:
            stream.close()


def _sync_with_break_then_read_on(api: openai.OpenAI, got: list[str]) -> None:
    with api.chat.completions.create(model="gpt-4o", messages=MESSAGES, stream=True) as stream:
        for chunk in stream:
            got.append(_item(chunk))
            if len(got) == 2:
                break
    got.append("<after the with block>")
    got.extend(_item(chunk) for chunk in stream)


async def _async_close_in_loop(api: openai.AsyncOpenAI, got: list[str]) -> None:
    stream = await api.chat.completions.create(model="gpt-4o", messages=MESSAGES, stream=True)
    async for chunk in stream:
        got.append(_item(chunk))
        if len(got) == 2:
            await stream.close()


async def _async_with_break_then_read_on(api: openai.AsyncOpenAI, got: list[str]) -> None:
    stream = await api.chat.completions.create(model="gpt-4o", messages=MESSAGES, stream=True)
    async with stream:
        async for chunk in stream:
            got.append(_item(chunk))
            if len(got) == 2:
                break
    got.append("<after the with block>")
    got.extend([_item(chunk) async for chunk in stream])


async def _outcome(consume: Any, api: Any) -> list[str]:
    """What the caller's loop saw: its items, then the exception it ended with, if any."""
    got: list[str] = []
    try:
        result = consume(api, got)
        if asyncio.iscoroutine(result):
            await result
    except Exception as exc:
        got.append(f"raised {type(exc).__name__}")
    return got


@pytest.mark.parametrize(
    "consume",
    [
        _sync_close_in_loop,
        _sync_with_break_then_read_on,
        _async_close_in_loop,
        _async_with_break_then_read_on,
    ],
)
async def test_closing_a_stream_inside_its_loop_changes_nothing_the_loop_sees(
    llm: FakeLlmServer, otlp: OtlpTestServer, consume: Any
) -> None:
    """Closed (or its block left) after 2 of its 12 chunks, a traced stream gives the caller's
    loop exactly what the SDK's own stream gives it (the chunks it had already read, here all
    of them); the span ends at the close, marked as closed early, with the text read so far."""
    llm.one_write = True  # the SDK holds the whole stream when the caller closes it
    is_async = consume.__name__.startswith("_async")
    api = async_client(llm) if is_async else client(llm)
    untraced = await _outcome(consume, api)
    looptrace.instrument_openai(api)
    try:
        async with looptrace.span("caller"):
            traced = await _outcome(consume, api)
    finally:
        looptrace.uninstrument_openai(api)
    assert traced == untraced
    assert len([i for i in traced if not i.startswith("<")]) == 2 + len(llm.pieces())
    await looptrace.flush(5)
    attrs = assert_child_of_caller(received(otlp, 2), "chat gpt-4o")
    assert attrs["looptrace.genai.stream.closed_early"] is True
    assert attrs["output.value"]["content"] == llm.pieces()[0]
    assert "error.type" not in attrs


# -- tool loops: the SDK's own objects passed back ------------------------------------------


def test_a_tool_loop_passing_the_sdks_objects_back_is_traced(
    llm: FakeLlmServer, otlp: OtlpTestServer, instrumented: None
) -> None:
    """The reply's ``ChatCompletionMessage``, or its ``ChatCompletionMessageToolCall`` objects
    inside a message dict, passed back in the next call's messages: each call is a span, and
    the conversation shows the tool call and its result."""
    api = client(llm)
    with looptrace.span("caller"):
        first = api.chat.completions.create(model="m-first", messages=MESSAGES, tools=TOOLS)
        reply = first.choices[0].message
        assert reply.tool_calls and not isinstance(reply.tool_calls[0], dict)
        result = {"role": "tool", "tool_call_id": reply.tool_calls[0].id, "content": "sunny"}
        api.chat.completions.create(
            model="m-whole-message", messages=[*MESSAGES, reply, result], tools=TOOLS
        )
        as_dict = {"role": "assistant", "content": None, "tool_calls": reply.tool_calls}
        api.chat.completions.create(
            model="m-tool-call-objects", messages=[*MESSAGES, as_dict, result], tools=TOOLS
        )
    spans = received(otlp, 4)
    call = {"type": "tool_call", "id": "call_1", "name": "get_weather"}
    call["arguments"] = TOOL_ARGUMENTS
    for name in ("chat m-whole-message", "chat m-tool-call-objects"):
        attrs = assert_child_of_caller(spans, name)
        assert attrs["gen_ai.input.messages"][2:] == [
            {"role": "assistant", "parts": [call]},
            {
                "role": "tool",
                "parts": [{"type": "tool_call_response", "id": "call_1", "response": "sunny"}],
            },
        ]
        assert attrs["gen_ai.response.finish_reasons"] == ["tool_calls"]


async def test_responses_output_items_passed_back_are_traced(
    llm: FakeLlmServer, otlp: OtlpTestServer, instrumented: None
) -> None:
    """``responses.create(input=[..., *previous.output, ...])``: the SDK's output items in the
    input are read as the conversation."""
    api = async_client(llm)
    async with looptrace.span("caller"):
        first = await api.responses.create(model="m-first", input="Say hello")
        await api.responses.create(
            model="m-second",
            input=[
                {"role": "user", "content": "Say hello"},
                *first.output,
                {"role": "user", "content": "Again"},
            ],
        )
    await looptrace.flush(5)
    attrs = assert_child_of_caller(received(otlp, 3), "chat m-second")
    assert attrs["gen_ai.input.messages"] == [
        {"role": "user", "parts": [{"type": "text", "content": "Say hello"}]},
        {"role": "assistant", "parts": [{"type": "text", "content": llm.reply}]},
        {"role": "user", "parts": [{"type": "text", "content": "Again"}]},
    ]


class _Unreadable:
    """A message no reader foresaw: every attribute lookup fails."""

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError("unreadable")


@pytest.mark.internal_errors
def test_a_message_that_cannot_be_read_never_costs_the_span(
    llm: FakeLlmServer, otlp: OtlpTestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever the messages hold, the call is traced: a message looptrace cannot read leaves
    the conversation off the span (counted as an internal error), never the span."""
    from looptrace import _errors

    monkeypatch.setattr(_errors, "raise_internal_errors", False)
    api = client(llm)
    # The SDK serializes what it is given; a transport-level fake accepts anything.
    original = api.post

    def post(path: str, *args: Any, **kwargs: Any) -> Any:
        kwargs["body"] = {**kwargs["body"], "messages": MESSAGES}
        return original(path, *args, **kwargs)

    monkeypatch.setattr(api, "post", post)
    looptrace.instrument_openai(api)
    try:
        with looptrace.span("caller"):
            api.chat.completions.create(model="gpt-4o", messages=[*MESSAGES, _Unreadable()])
    finally:
        looptrace.uninstrument_openai(api)
    attrs = assert_child_of_caller(received(otlp, 2), "chat gpt-4o")
    assert "gen_ai.input.messages" not in attrs
    assert attrs["gen_ai.response.model"] == "gpt-4o-2024"
    assert _errors.counts["genai.messages"] >= 1


# -- error.type, server.address / server.port ------------------------------------------------


@pytest.mark.parametrize(
    ("model", "expected"),
    [("rate-limited", "openai.RateLimitError"), ("server-error", "openai.InternalServerError")],
)
async def test_a_failed_call_carries_error_type_and_the_server(
    llm: FakeLlmServer, otlp: OtlpTestServer, instrumented: None, model: str, expected: str
) -> None:
    """A 429 or 500 answer: ``error.type`` is the SDK exception's public name, and the span
    names the server it called, as every LLM span does."""
    async with looptrace.span("caller"):
        with pytest.raises(openai.APIStatusError):
            await async_client(llm).chat.completions.create(model=model, messages=MESSAGES)
        await async_client(llm).chat.completions.create(model="gpt-4o", messages=MESSAGES)
    await looptrace.flush(5)
    spans = received(otlp, 3)
    failed = assert_child_of_caller(spans, f"chat {model}")
    assert failed["error.type"] == expected
    ok = assert_child_of_caller(spans, "chat gpt-4o")
    assert "error.type" not in ok
    for attrs in (failed, ok):
        assert attrs["server.address"] == "127.0.0.1"
        assert attrs["server.port"] == llm.port


def test_a_connection_error_carries_error_type(
    otlp: OtlpTestServer, instrumented: None, unused_port: int
) -> None:
    """Nothing listening: ``error.type`` is ``openai.APIConnectionError``; the span names the
    server it tried."""
    api = openai.OpenAI(
        base_url=f"http://127.0.0.1:{unused_port}/v1", api_key=API_KEY, max_retries=0
    )
    with looptrace.span("caller"), pytest.raises(openai.APIConnectionError):
        api.chat.completions.create(model="gpt-4o", messages=MESSAGES)
    attrs = assert_child_of_caller(received(otlp, 2), "chat gpt-4o")
    assert attrs["error.type"] == "openai.APIConnectionError"
    assert (attrs["server.address"], attrs["server.port"]) == ("127.0.0.1", unused_port)


def test_the_default_https_port_is_named(instrumented: None) -> None:
    """A base URL without a port names the scheme's port (443 for https)."""
    from looptrace._genai import _core

    api = openai.OpenAI(base_url="https://api.example.invalid/v1", api_key=API_KEY)
    assert _core.server(api.chat.completions) == ("api.example.invalid", 443)


# -- token details, span kind, conventions opt-in --------------------------------------------


async def test_cached_and_reasoning_tokens_plain_and_streamed(
    llm: FakeLlmServer, otlp: OtlpTestServer, instrumented: None
) -> None:
    """The cached input tokens and reasoning output tokens OpenAI reports (chat, plain and
    streamed; responses) are on the span under the conventions' names; the input and output
    counts already include them, as OpenAI counts."""
    llm.cached_tokens, llm.reasoning_tokens = 5, 3
    api = async_client(llm)
    async with looptrace.span("caller"):
        await api.chat.completions.create(model="m-plain", messages=MESSAGES)
        stream = await api.chat.completions.create(
            model="m-streamed",
            messages=MESSAGES,
            stream=True,
            stream_options={"include_usage": True},
        )
        [c async for c in stream]
        await api.responses.create(model="m-responses", input="Say hello")
    await looptrace.flush(5)
    spans = received(otlp, 4)
    for name in ("chat m-plain", "chat m-streamed", "chat m-responses"):
        attrs = assert_child_of_caller(spans, name)
        assert attrs["gen_ai.usage.cache_read.input_tokens"] == 5
        assert attrs["gen_ai.usage.reasoning.output_tokens"] == 3
        assert attrs["gen_ai.usage.input_tokens"] == USAGE_IN
        assert "gen_ai.usage.cache_creation.input_tokens" not in attrs


def test_span_kind_provider_and_the_latest_conventions_opt_in(
    llm: FakeLlmServer, otlp: OtlpTestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LLM spans say ``openinference.span.kind`` LLM (EMBEDDING for embeddings). By default the
    deprecated ``gen_ai.system`` is sent beside ``gen_ai.provider.name``;
    ``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental`` leaves it out."""
    api = client(llm)
    looptrace.instrument_openai(api)
    try:
        with looptrace.span("caller"):
            api.chat.completions.create(model="m-default", messages=MESSAGES)
            api.embeddings.create(model="m-embed", input="a")
            monkeypatch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", "http, gen_ai_latest_experimental")
            looptrace.instrument_openai(api)  # the setting is read when instrumenting
            api.chat.completions.create(model="m-latest", messages=MESSAGES)
    finally:
        looptrace.uninstrument_openai(api)
        monkeypatch.delenv("OTEL_SEMCONV_STABILITY_OPT_IN")
        looptrace.instrument_openai(api)
        looptrace.uninstrument_openai(api)
    spans = received(otlp, 4)
    default = assert_child_of_caller(spans, "chat m-default")
    latest = assert_child_of_caller(spans, "chat m-latest")
    embed = assert_child_of_caller(spans, "embeddings m-embed")
    assert default["openinference.span.kind"] == latest["openinference.span.kind"] == "LLM"
    assert embed["openinference.span.kind"] == "EMBEDDING"
    assert default["gen_ai.system"] == "openai"
    assert "gen_ai.system" not in latest
    assert default["gen_ai.provider.name"] == latest["gen_ai.provider.name"] == "openai"
