"""LiteLLM calls as looptrace spans: the real ``litellm`` package, answering with its own
``mock_response`` or calling the fake OpenAI API on 127.0.0.1, the spans read back from a real
OTLP server. (tests/integrations/conftest.py sets ``LITELLM_LOCAL_MODEL_COST_MAP``: LiteLLM
would otherwise fetch its price map from the network at import.)"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import litellm
import pytest
from agents_support import ScriptedLlm, atree, tree
from litellm.integrations.custom_logger import CustomLogger

import looptrace
from fake_llm_server import USAGE_IN, attributes
from genai_support import otlp
from looptrace.integrations.litellm import Callback, instrument_litellm, uninstrument_litellm
from otlp_server import OtlpTestServer

__all__ = ["otlp"]  # a fixture, used by name

MESSAGES = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}]


@pytest.fixture
def logged() -> Iterator[Logged]:
    logged = Logged()
    yield logged
    litellm.logging_callback_manager.remove_callback_from_all_lists(logged)


@pytest.fixture
def instrumented(logged: Logged) -> Iterator[Callback]:
    callback = instrument_litellm()
    litellm.logging_callback_manager.add_litellm_callback(logged)
    yield callback
    uninstrument_litellm()


@pytest.fixture
def llm() -> Iterator[ScriptedLlm]:
    with ScriptedLlm(reply="Hello from the fake model") as server:
        yield server


async def spans_when(otlp: OtlpTestServer, logged: Logged, calls: int, count: int) -> Any:
    """The ``count`` spans sent once LiteLLM has logged ``calls`` calls: it logs a call in a
    task of the loop (or a thread) of its own after the call returns, so the loop must run
    on until then."""
    assert await asyncio.to_thread(logged.wait, calls)
    return await atree(otlp, count)


async def test_acompletion_is_an_llm_span_under_the_caller(
    otlp: OtlpTestServer, instrumented: Callback, logged: Logged, no_blocking: None
) -> None:
    """``acompletion`` is one LLM CLIENT span under the caller's span: provider, model,
    sampling parameters, tokens, the conversation, finish reason, LiteLLM's own cost, and the
    session and tags of looptrace.attributes()."""
    with looptrace.attributes(session_id="s-1", tags=["beta"]), looptrace.span("caller"):
        response = await litellm.acompletion(
            model="gpt-4o-mini", messages=MESSAGES, mock_response="Hello there", temperature=0.3
        )
    assert response.choices[0].message.content == "Hello there"

    spans = await spans_when(otlp, logged, 1, 2)
    spans.assert_one_trace()
    span = spans.one("chat gpt-4o-mini")
    assert spans.parent_name(span) == "caller"
    assert span.kind == 3  # CLIENT
    a = attributes(span)
    assert a["openinference.span.kind"] == "LLM"
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.provider.name"] == "openai"
    assert a["gen_ai.request.model"] == "gpt-4o-mini"
    assert a["gen_ai.request.temperature"] == 0.3
    assert a["gen_ai.usage.input_tokens"] == response.usage.prompt_tokens
    assert a["gen_ai.usage.output_tokens"] == response.usage.completion_tokens
    assert a["gen_ai.response.finish_reasons"] == ["stop"]
    assert a["gen_ai.input.messages"][1] == {
        "role": "user",
        "parts": [{"type": "text", "content": "Hi"}],
    }
    assert a["gen_ai.output.messages"][0]["parts"] == [{"type": "text", "content": "Hello there"}]
    assert a["session.id"] == "s-1"  # LiteLLM logs in a copy of the caller's context
    assert a["tag.tags"] == ["beta"]
    cost = response._hidden_params["response_cost"]
    assert a["llm.cost.total"] == pytest.approx(cost)
    assert a["llm.cost.prompt"] + a["llm.cost.completion"] == pytest.approx(cost)


async def test_a_failed_call_records_error_type(
    otlp: OtlpTestServer, instrumented: Callback, logged: Logged
) -> None:
    """A call that fails is a failed span with the exception and its error.type; the caller
    gets LiteLLM's exception unchanged."""
    with pytest.raises(litellm.RateLimitError), looptrace.span("caller"):
        await litellm.acompletion(
            model="gpt-4o-mini",
            messages=MESSAGES,
            mock_response=litellm.RateLimitError("slow down", "openai", "gpt-4o-mini"),
        )
    spans = await spans_when(otlp, logged, 1, 2)
    span = spans.one("chat gpt-4o-mini")
    assert spans.parent_name(span) == "caller"
    assert span.status.code == 2
    assert attributes(span)["error.type"] == "litellm.RateLimitError"
    assert [e.name for e in span.events] == ["exception"]
    assert "llm.cost.total" not in attributes(span)


async def test_a_real_http_call_stream_and_concurrent_callers(
    llm: ScriptedLlm, otlp: OtlpTestServer, instrumented: Callback, logged: Logged
) -> None:
    """Calls over HTTP to an OpenAI-compatible server (the fake API on 127.0.0.1), one of
    them streamed, gathered under three callers: each span is in its caller's trace, with the
    server's address and the tokens it reported."""

    async def one(i: int) -> None:
        with looptrace.span(f"caller {i}"):
            response = await litellm.acompletion(
                model="openai/gpt-4o-mini",
                api_base=llm.openai_url,
                api_key="sk-test",
                messages=MESSAGES,
                stream=i == 0,
            )
            if i == 0:
                async for _chunk in response:
                    pass

    await asyncio.gather(*(one(i) for i in range(3)))
    spans = await spans_when(otlp, logged, 3, 6)
    for i in range(3):
        caller = spans.one(f"caller {i}")
        mine = [s for s in spans.spans if s.parent_span_id == caller.span_id]
        assert len(mine) == 1, i
        assert mine[0].trace_id == caller.trace_id
        a = attributes(mine[0])
        assert a["server.address"] == "127.0.0.1"
        assert a["server.port"] == llm.port
        if i == 0:
            assert a["gen_ai.request.stream"] is True
        else:
            assert a["gen_ai.usage.input_tokens"] == USAGE_IN


def test_sync_completion_and_uninstrument(otlp: OtlpTestServer, logged: Logged) -> None:
    """``completion`` (LiteLLM logs it on a thread of its own) is traced under the caller
    too; after uninstrument_litellm() nothing is, and LiteLLM's lists no longer hold the
    callback."""
    callback = instrument_litellm()
    assert instrument_litellm() is callback
    litellm.logging_callback_manager.add_litellm_callback(logged)
    with looptrace.span("caller"):
        litellm.completion(model="gpt-4o-mini", messages=MESSAGES, mock_response="Yo")
    assert logged.wait(1)
    spans = tree(otlp, 2)
    assert spans.parent_name(spans.one("chat gpt-4o-mini")) == "caller"

    uninstrument_litellm()
    assert callback not in litellm.callbacks
    assert callback not in litellm.logging_callback_manager.get_all_callbacks()
    with looptrace.span("after"):
        litellm.completion(model="gpt-4o-mini", messages=MESSAGES, mock_response="Yo")
    assert logged.wait(2)
    assert looptrace.flush_sync(5).ok
    assert sorted(s.name for s in otlp.accepted_spans()) == ["after", "caller", "chat gpt-4o-mini"]


class Logged(CustomLogger):
    """A callback of the test's own, after looptrace's in LiteLLM's list: LiteLLM calls its
    callbacks one after the other, so once this one has a call, looptrace's has had it."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self._changed = threading.Condition()

    def _one(self) -> None:
        with self._changed:
            self.calls += 1
            self._changed.notify_all()

    def wait(self, calls: int) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: self.calls >= calls, timeout=10)

    def log_success_event(
        self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        self._one()

    def log_failure_event(
        self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        self._one()

    async def async_log_success_event(
        self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        self._one()

    async def async_log_failure_event(
        self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        self._one()
