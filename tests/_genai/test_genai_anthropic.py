"""Anthropic calls as spans: the real ``anthropic`` client against a fake API on 127.0.0.1, the
spans read back from a real OTLP server."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

import looptrace
from fake_llm_server import TOOL_ARGUMENTS, USAGE_IN, FakeLlmServer, attributes, events
from genai_support import FAST_RETRY, llm, otlp, received, unused_port
from otlp_server import OtlpTestServer
from pipeline_support import checked_server, install_pipeline

__all__ = ["llm", "otlp", "unused_port"]  # fixtures, used by name

API_KEY = "sk-ant-test-secret"
MESSAGES = [{"role": "user", "content": "Say hello"}]
TOOLS = [{"name": "get_weather", "input_schema": {"type": "object", "properties": {}}}]


@pytest.fixture
def instrumented() -> Iterator[None]:
    looptrace.instrument_anthropic()
    yield
    looptrace.uninstrument_anthropic()


def client(llm: FakeLlmServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=llm.anthropic_url, api_key=API_KEY, max_retries=0)


def async_client(llm: FakeLlmServer) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=llm.anthropic_url, api_key=API_KEY, max_retries=0)


def llm_span(spans: dict[str, Any], name: str = "chat claude-test") -> tuple[Any, dict[str, Any]]:
    """The LLM span, checked to be a CLIENT child of ``caller`` with no API key anywhere."""
    span, caller = spans[name], spans["caller"]
    assert span.parent_span_id == caller.span_id
    assert span.trace_id == caller.trace_id
    assert span.kind == 3
    attrs = attributes(span)
    assert API_KEY not in repr(attrs)
    return span, attrs


def test_messages_create_with_system_and_tools(
    llm: FakeLlmServer, otlp: OtlpTestServer, instrumented: None
) -> None:
    """A plain call records the request parameters, the system prompt apart from the
    messages, the tools offered, the reply with its tool call, stop reason and usage."""

    @looptrace.traced(name="caller")
    def caller() -> Any:
        return client(llm).messages.create(
            model="claude-test",
            max_tokens=100,
            stop_sequences=["END"],
            system="Be terse.",
            messages=MESSAGES,
            tools=TOOLS,
        )

    message = caller()
    assert message.stop_reason == "tool_use"
    _, attrs = llm_span(received(otlp, 2))
    assert attrs["gen_ai.provider.name"] == "anthropic"
    assert attrs["gen_ai.system"] == "anthropic"
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.request.model"] == "claude-test"
    assert attrs["gen_ai.request.max_tokens"] == 100
    assert attrs["gen_ai.request.stop_sequences"] == ["END"]
    assert attrs["gen_ai.tool.definitions"] == TOOLS
    assert attrs["gen_ai.response.id"] == "msg_1"
    assert attrs["gen_ai.response.model"] == "claude-test-2024"
    assert attrs["gen_ai.response.finish_reasons"] == ["tool_use"]
    assert attrs["gen_ai.usage.input_tokens"] == USAGE_IN
    assert attrs["gen_ai.usage.output_tokens"] == len(llm.pieces())
    assert attrs["gen_ai.system_instructions"] == [{"type": "text", "content": "Be terse."}]
    assert attrs["gen_ai.input.messages"] == [
        {"role": "user", "parts": [{"type": "text", "content": "Say hello"}]}
    ]
    tool_call = {
        "type": "tool_call",
        "id": "toolu_1",
        "name": "get_weather",
        "arguments": {"city": "Paris"},
    }
    assert attrs["gen_ai.output.messages"] == [
        {
            "role": "assistant",
            "parts": [{"type": "text", "content": llm.reply}, tool_call],
            "finish_reason": "tool_use",
        }
    ]
    assert attrs["input.value"]["system"] == "Be terse."
    assert attrs["output.value"]["content"][0]["text"] == llm.reply


def test_create_with_stream_true(
    llm: FakeLlmServer, otlp: OtlpTestServer, instrumented: None
) -> None:
    """``messages.create(stream=True)``: the span lasts the stream and carries the joined
    text, tool arguments, usage from both ends of the stream, and the first chunk's time."""
    with looptrace.span("caller"):
        stream = client(llm).messages.create(
            model="claude-test", max_tokens=10, messages=MESSAGES, tools=TOOLS, stream=True
        )
        with stream:
            kinds = [event.type for event in stream]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    span, attrs = llm_span(received(otlp, 2))
    assert attrs["gen_ai.request.stream"] is True
    assert attrs["gen_ai.usage.input_tokens"] == USAGE_IN
    assert attrs["gen_ai.usage.output_tokens"] == len(llm.pieces())
    assert attrs["gen_ai.response.finish_reasons"] == ["tool_use"]
    parts = attrs["gen_ai.output.messages"][0]["parts"]
    assert parts == [
        {"type": "text", "content": llm.reply},
        {"type": "tool_call", "id": "toolu_1", "name": "get_weather", "arguments": TOOL_ARGUMENTS},
    ]
    assert attrs["output.value"]["content"] == llm.reply
    assert attrs["gen_ai.response.time_to_first_chunk"] > 0
    assert "gen_ai.first_token" in events(span)
    assert "looptrace.genai.stream.closed_early" not in attrs


def test_stream_helper_get_final_text(
    llm: FakeLlmServer, otlp: OtlpTestServer, instrumented: None
) -> None:
    """``with messages.stream(...)``: the helper's own accumulation (``get_final_text``) works
    unchanged and feeds the span, which ends with the block."""
    with (
        looptrace.span("caller"),
        client(llm).messages.stream(
            model="claude-test", max_tokens=10, messages=MESSAGES
        ) as stream,
    ):
        text = stream.get_final_text()
    assert text == llm.reply
    _, attrs = llm_span(received(otlp, 2))
    assert attrs["output.value"]["content"] == llm.reply
    assert attrs["gen_ai.response.finish_reasons"] == ["end_turn"]
    assert attrs["gen_ai.response.time_to_first_chunk"] > 0
    assert attrs["gen_ai.input.messages"][0]["role"] == "user"


async def test_async_stream_helper_text_stream(
    llm: FakeLlmServer, otlp: OtlpTestServer, instrumented: None
) -> None:
    """``async with messages.stream(...)`` and its ``text_stream``, on the async client."""
    async with (
        looptrace.span("caller"),
        async_client(llm).messages.stream(
            model="claude-test", max_tokens=10, messages=MESSAGES
        ) as stream,
    ):
        pieces = [piece async for piece in stream.text_stream]
        final = await stream.get_final_message()
    assert "".join(pieces) == llm.reply
    assert final.usage.output_tokens == len(llm.pieces())
    await looptrace.flush(5)
    _, attrs = llm_span(received(otlp, 2))
    assert attrs["output.value"]["content"] == llm.reply
    assert attrs["gen_ai.usage.output_tokens"] == len(llm.pieces())


def test_stream_helper_left_early_ends_the_span(
    llm: FakeLlmServer, otlp: OtlpTestServer, instrumented: None
) -> None:
    """Leaving the ``with`` block after the first text ends the span, marked as closed early,
    with the text read so far."""
    llm.hold()
    with (
        looptrace.span("caller"),
        client(llm).messages.stream(
            model="claude-test", max_tokens=10, messages=MESSAGES
        ) as stream,
    ):
        first = next(iter(stream.text_stream))
    llm.release()
    assert first == llm.pieces()[0]
    _, attrs = llm_span(received(otlp, 2))
    assert attrs["looptrace.genai.stream.closed_early"] is True
    assert attrs["output.value"]["content"] == first


@pytest.mark.parametrize(
    ("model", "error"),
    [("bad-request", anthropic.BadRequestError), ("rate-limited", anthropic.RateLimitError)],
)
async def test_api_errors_are_recorded_and_reraised_untouched(
    llm: FakeLlmServer, otlp: OtlpTestServer, instrumented: None, model: str, error: type
) -> None:
    """A 400 or 429 reaches the caller as the SDK's own exception, plain or via the stream
    helper; each span records it."""
    api = async_client(llm)
    async with looptrace.span("caller"):
        with pytest.raises(error) as plain:
            await api.messages.create(model=model, max_tokens=10, messages=MESSAGES)
        with pytest.raises(error) as streamed:
            async with api.messages.stream(model=model, max_tokens=10, messages=MESSAGES):
                pass
    assert type(plain.value) is error and type(streamed.value) is error
    await looptrace.flush(5)
    assert otlp.wait_for_spans(3)
    failed = [s for s in otlp.accepted_spans() if s.name == f"chat {model}"]
    assert len(failed) == 2
    for span in failed:
        assert span.status.code == 2
        assert error.__name__ in span.status.message
        assert events(span) == ["exception"]


async def test_a_call_cancelled_mid_stream_is_recorded_as_cancelled(
    llm: FakeLlmServer, otlp: OtlpTestServer, instrumented: None
) -> None:
    """Cancelling the task reading ``messages.create(stream=True)`` ends the span as
    cancelled, and the task sees its cancellation."""
    llm.hold()
    got_first = asyncio.Event()

    async def consume() -> None:
        async with looptrace.span("caller"):
            stream = await async_client(llm).messages.create(
                model="claude-test", max_tokens=10, messages=MESSAGES, stream=True
            )
            async for event in stream:
                if event.type == "content_block_delta":
                    got_first.set()

    task = asyncio.create_task(consume())
    await got_first.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    llm.release()
    await looptrace.flush(5)
    span, attrs = llm_span(received(otlp, 2))
    assert attrs["looptrace.cancelled"] is True
    assert span.status.code == 2
    assert attrs["gen_ai.response.id"] == "msg_1"


def test_content_capture_off(llm: FakeLlmServer, instrumented: None) -> None:
    """``LOOPTRACE_CAPTURE_GENAI_CONTENT=false`` keeps model, usage and stop reason and drops
    messages, system prompt and reply."""
    config = looptrace.Config.from_env({"LOOPTRACE_CAPTURE_GENAI_CONTENT": "false"})
    assert config.capture_genai_content is False
    with checked_server() as otlp:
        install_pipeline(otlp, retry=FAST_RETRY, capture_genai_content=False)
        with looptrace.span("caller"):
            client(llm).messages.create(
                model="claude-test", max_tokens=10, system="Secret plan", messages=MESSAGES
            )
            with client(llm).messages.stream(
                model="claude-test", max_tokens=10, messages=MESSAGES
            ) as stream:
                stream.until_done()
        assert looptrace.flush_sync(5).ok
        assert otlp.wait_for_spans(3)
        spans = [s for s in otlp.accepted_spans() if s.name == "chat claude-test"]
    assert len(spans) == 2
    for span in spans:
        attrs = attributes(span)
        assert not {
            "input.value",
            "output.value",
            "gen_ai.input.messages",
            "gen_ai.output.messages",
            "gen_ai.system_instructions",
        } & set(attrs)
        assert "Secret plan" not in repr(attrs) and llm.reply not in repr(attrs)
        assert attrs["gen_ai.usage.input_tokens"] == USAGE_IN
        assert attrs["gen_ai.response.finish_reasons"] == ["end_turn"]


def test_one_client_only_and_undone(llm: FakeLlmServer, otlp: OtlpTestServer) -> None:
    """A client instrumented on its own is traced (its stream helper too); others are not;
    undoing it puts the SDK's methods back."""
    mine, other = client(llm), client(llm)
    looptrace.instrument_anthropic(mine)
    looptrace.instrument_anthropic(mine)
    try:
        with looptrace.span("caller"):
            mine.messages.create(model="m-one", max_tokens=5, messages=MESSAGES)
            with mine.messages.stream(model="m-stream", max_tokens=5, messages=MESSAGES) as s:
                s.until_done()
            other.messages.create(model="m-other", max_tokens=5, messages=MESSAGES)
            looptrace.uninstrument_anthropic(mine)
            mine.messages.create(model="m-undone", max_tokens=5, messages=MESSAGES)
    finally:
        looptrace.uninstrument_anthropic(mine)
    assert looptrace.flush_sync(5).ok
    assert otlp.wait_for_spans(3)
    assert otlp.span_names() == ["caller", "chat m-one", "chat m-stream"]
    assert {"create", "stream"}.isdisjoint(mine.messages.__dict__)


# -- the loop a caller writes around a stream sees what it sees without looptrace ------------


def _sync_close_in_loop(api: anthropic.Anthropic, got: list[str]) -> None:
    stream = api.messages.create(model="claude-test", max_tokens=10, messages=MESSAGES, stream=True)
    for event in stream:
        got.append(event.type)
        if len(got) == 2:
            stream.close()


async def _async_close_in_loop(api: anthropic.AsyncAnthropic, got: list[str]) -> None:
    stream = await api.messages.create(
        model="claude-test", max_tokens=10, messages=MESSAGES, stream=True
    )
    async for event in stream:
        got.append(event.type)
        if len(got) == 4:
            await stream.close()


async def _async_with_break_then_read_on(api: anthropic.AsyncAnthropic, got: list[str]) -> None:
    stream = await api.messages.create(
        model="claude-test", max_tokens=10, messages=MESSAGES, stream=True
    )
    async with stream:
        async for event in stream:
            got.append(event.type)
            if len(got) == 4:
                break
    got.append("<after the with block>")
    got.extend([event.type async for event in stream])


async def _outcome(consume: Any, api: Any) -> list[str]:
    got: list[str] = []
    try:
        result = consume(api, got)
        if asyncio.iscoroutine(result):
            await result
    except Exception as exc:
        got.append(f"raised {type(exc).__name__}")
    return got


@pytest.mark.parametrize(
    "consume", [_sync_close_in_loop, _async_close_in_loop, _async_with_break_then_read_on]
)
async def test_closing_a_stream_inside_its_loop_changes_nothing_the_loop_sees(
    llm: FakeLlmServer, otlp: OtlpTestServer, consume: Any
) -> None:
    """``messages.create(stream=True)`` closed (or its block left) inside the caller's loop:
    the loop sees exactly the events the SDK's own stream gives it; the span ends at the
    close, marked as closed early."""
    llm.one_write = True
    api = async_client(llm) if consume.__name__.startswith("_async") else client(llm)
    untraced = await _outcome(consume, api)
    looptrace.instrument_anthropic(api)
    try:
        async with looptrace.span("caller"):
            traced = await _outcome(consume, api)
    finally:
        looptrace.uninstrument_anthropic(api)
    assert traced == untraced
    assert traced.count("content_block_delta") == len(llm.pieces())
    await looptrace.flush(5)
    _, attrs = llm_span(received(otlp, 2))
    assert attrs["looptrace.genai.stream.closed_early"] is True
    assert "error.type" not in attrs


def test_a_tool_loop_passing_the_sdks_content_blocks_back_is_traced(
    llm: FakeLlmServer, otlp: OtlpTestServer, instrumented: None
) -> None:
    """The reply's content blocks (``TextBlock``, ``ToolUseBlock`` objects) passed back as the
    assistant turn, then the tool result: the second call is a span whose conversation shows
    the tool call and its result."""
    api = client(llm)
    with looptrace.span("caller"):
        first = api.messages.create(model="m-first", max_tokens=10, messages=MESSAGES, tools=TOOLS)
        assert not isinstance(first.content[1], dict)
        result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}
        api.messages.create(
            model="m-second",
            max_tokens=10,
            tools=TOOLS,
            messages=[
                *MESSAGES,
                {"role": "assistant", "content": first.content},
                {"role": "user", "content": [result]},
            ],
        )
    _, attrs = llm_span(received(otlp, 3), "chat m-second")
    tool_call = {
        "type": "tool_call",
        "id": "toolu_1",
        "name": "get_weather",
        "arguments": {"city": "Paris"},
    }
    assert attrs["gen_ai.input.messages"][1:] == [
        {"role": "assistant", "parts": [{"type": "text", "content": llm.reply}, tool_call]},
        {
            "role": "user",
            "parts": [{"type": "tool_call_response", "id": "toolu_1", "response": "sunny"}],
        },
    ]


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("rate-limited", "anthropic.RateLimitError"),
        ("server-error", "anthropic.InternalServerError"),
    ],
)
async def test_a_failed_call_carries_error_type_and_the_server(
    llm: FakeLlmServer, otlp: OtlpTestServer, instrumented: None, model: str, expected: str
) -> None:
    """A 429 or 500 answer, plain or through the stream helper: ``error.type`` is the SDK
    exception's public name; every span names the server it called."""
    api = async_client(llm)
    async with looptrace.span("caller"):
        with pytest.raises(anthropic.APIStatusError):
            await api.messages.create(model=model, max_tokens=10, messages=MESSAGES)
        with pytest.raises(anthropic.APIStatusError):
            async with api.messages.stream(model=model, max_tokens=10, messages=MESSAGES):
                pass
    await looptrace.flush(5)
    assert otlp.wait_for_spans(3)
    failed = [attributes(s) for s in otlp.accepted_spans() if s.name == f"chat {model}"]
    assert len(failed) == 2
    for attrs in failed:
        assert attrs["error.type"] == expected
        assert (attrs["server.address"], attrs["server.port"]) == ("127.0.0.1", llm.port)


def test_a_connection_error_carries_error_type(
    otlp: OtlpTestServer, instrumented: None, unused_port: int
) -> None:
    """Nothing listening: ``error.type`` is ``anthropic.APIConnectionError``."""
    api = anthropic.Anthropic(
        base_url=f"http://127.0.0.1:{unused_port}", api_key=API_KEY, max_retries=0
    )
    with looptrace.span("caller"), pytest.raises(anthropic.APIConnectionError):
        api.messages.create(model="claude-test", max_tokens=10, messages=MESSAGES)
    _, attrs = llm_span(received(otlp, 2))
    assert attrs["error.type"] == "anthropic.APIConnectionError"
    assert (attrs["server.address"], attrs["server.port"]) == ("127.0.0.1", unused_port)


async def test_cache_tokens_plain_and_streamed(
    llm: FakeLlmServer, otlp: OtlpTestServer, instrumented: None
) -> None:
    """Anthropic's cache reads and writes are on the span under the conventions' names, and
    counted in ``gen_ai.usage.input_tokens`` (Anthropic's own input count leaves them out);
    the first chunk's time is in seconds."""
    llm.cached_tokens, llm.cache_creation_tokens = 5, 7
    api = async_client(llm)
    async with looptrace.span("caller"):
        await api.messages.create(model="m-plain", max_tokens=10, messages=MESSAGES)
        async with api.messages.stream(model="m-streamed", max_tokens=10, messages=MESSAGES) as s:
            await s.get_final_message()
    await looptrace.flush(5)
    spans = received(otlp, 3)
    for name in ("chat m-plain", "chat m-streamed"):
        span, attrs = llm_span(spans, name)
        assert attrs["gen_ai.usage.cache_read.input_tokens"] == 5
        assert attrs["gen_ai.usage.cache_creation.input_tokens"] == 7
        assert attrs["gen_ai.usage.input_tokens"] == USAGE_IN + 5 + 7
        assert attrs["openinference.span.kind"] == "LLM"
        assert attrs["gen_ai.system"] == attrs["gen_ai.provider.name"] == "anthropic"
    _, streamed = llm_span(spans, "chat m-streamed")
    span = spans["chat m-streamed"]
    assert streamed["gen_ai.request.stream"] is True
    ttft = streamed["gen_ai.response.time_to_first_chunk"]
    assert isinstance(ttft, float)
    assert 0 < ttft <= (span.end_time_unix_nano - span.start_time_unix_nano) / 1e9
