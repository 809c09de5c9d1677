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
from genai_support import FAST_RETRY, llm, otlp, received
from otlp_server import OtlpTestServer
from pipeline_support import checked_server, install_pipeline

__all__ = ["llm", "otlp"]  # fixtures, used by name

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
    assert attrs["looptrace.genai.stream"] is True
    assert attrs["gen_ai.usage.input_tokens"] == USAGE_IN
    assert attrs["gen_ai.usage.output_tokens"] == len(llm.pieces())
    assert attrs["gen_ai.response.finish_reasons"] == ["tool_use"]
    parts = attrs["gen_ai.output.messages"][0]["parts"]
    assert parts == [
        {"type": "text", "content": llm.reply},
        {"type": "tool_call", "id": "toolu_1", "name": "get_weather", "arguments": TOOL_ARGUMENTS},
    ]
    assert attrs["output.value"]["content"] == llm.reply
    assert attrs["looptrace.genai.time_to_first_chunk_ms"] > 0
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
    assert attrs["looptrace.genai.time_to_first_chunk_ms"] > 0
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
