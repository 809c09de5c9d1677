"""The attribute names looptrace writes, checked against the conventions' own packages
(``opentelemetry-semantic-conventions`` and ``openinference-semantic-conventions``), so a name
that drifts from them fails here. looptrace itself imports neither."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import anthropic
import openai
import pytest
from openinference.semconv.trace import OpenInferenceSpanKindValues, SpanAttributes
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.semconv.attributes import error_attributes, server_attributes

import looptrace
from fake_llm_server import FakeLlmServer, attributes
from genai_support import llm, otlp, received
from looptrace import _semconv as sc
from otlp_server import OtlpTestServer

__all__ = ["llm", "otlp"]  # fixtures, used by name

# looptrace's name -> the package's constant of the same name, for every GEN_AI_* attribute
# looptrace defines (the operation and provider values are checked apart).
_GEN_AI_ATTRIBUTES = sorted(
    name
    for name, value in vars(sc).items()
    if name.startswith("GEN_AI_")
    and isinstance(value, str)
    and name != "GEN_AI_LATEST_EXPERIMENTAL"
    and (name == "GEN_AI_PROVIDER_NAME" or not name.startswith(("GEN_AI_OP_", "GEN_AI_PROVIDER_")))
)
# Names of the conventions the installed package does not define as constants yet.
_NOT_IN_PACKAGE = {"GEN_AI_EVALUATION_RESULT"}  # an event name; the package has attributes only


@pytest.mark.parametrize("name", _GEN_AI_ATTRIBUTES)
def test_gen_ai_names_match_opentelemetry_semantic_conventions(name: str) -> None:
    """Each GenAI attribute name in looptrace's table is the conventions' own."""
    if name in _NOT_IN_PACKAGE:
        assert getattr(sc, name) == "gen_ai.evaluation.result"
        return
    assert getattr(sc, name) == getattr(gen_ai, name)


def test_the_table_covers_what_llm_spans_need() -> None:
    """The names the LLM spans, scores and cost build on are all in the table (so the
    parametrized check above cannot pass by the table losing one)."""
    needed = {
        "GEN_AI_PROVIDER_NAME",
        "GEN_AI_REQUEST_STREAM",
        "GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK",
        "GEN_AI_RESPONSE_MODEL",
        "GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS",
        "GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS",
        "GEN_AI_USAGE_REASONING_OUTPUT_TOKENS",
        "GEN_AI_INPUT_MESSAGES",
        "GEN_AI_OUTPUT_MESSAGES",
        "GEN_AI_SYSTEM_INSTRUCTIONS",
        "GEN_AI_TOOL_DEFINITIONS",
        "GEN_AI_EVALUATION_NAME",
        "GEN_AI_EVALUATION_SCORE_VALUE",
        "GEN_AI_EVALUATION_SCORE_LABEL",
        "GEN_AI_EVALUATION_EXPLANATION",
    }
    assert needed <= set(_GEN_AI_ATTRIBUTES)
    assert sc.GENAI_INPUT_TOKENS == gen_ai.GEN_AI_USAGE_INPUT_TOKENS
    assert sc.GENAI_OUTPUT_TOKENS == gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS


def test_values_and_general_attributes_match() -> None:
    """Operation and provider values, ``error.type``, ``server.address``, ``server.port``."""
    ops = gen_ai.GenAiOperationNameValues
    assert ops.CHAT.value == sc.GEN_AI_OP_CHAT
    assert ops.EMBEDDINGS.value == sc.GEN_AI_OP_EMBEDDINGS
    assert ops.INVOKE_AGENT.value == sc.GEN_AI_OP_INVOKE_AGENT
    assert ops.EXECUTE_TOOL.value == sc.GEN_AI_OP_EXECUTE_TOOL
    providers = gen_ai.GenAiProviderNameValues
    assert providers.OPENAI.value == sc.GEN_AI_PROVIDER_OPENAI
    assert providers.ANTHROPIC.value == sc.GEN_AI_PROVIDER_ANTHROPIC
    assert sc.ERROR_TYPE == error_attributes.ERROR_TYPE
    assert sc.SERVER_ADDRESS == server_attributes.SERVER_ADDRESS
    assert sc.SERVER_PORT == server_attributes.SERVER_PORT


def test_openinference_names_match_openinference_semantic_conventions() -> None:
    """The OpenInference names Phoenix reads: span kind and its values, session, user, tags,
    metadata, cost, token counts, payloads."""
    pairs = {
        "OPENINFERENCE_SPAN_KIND": "OPENINFERENCE_SPAN_KIND",
        "SESSION_ID": "SESSION_ID",
        "USER_ID": "USER_ID",
        "TAG_TAGS": "TAG_TAGS",
        "METADATA": "METADATA",
        "LLM_COST_PROMPT": "LLM_COST_PROMPT",
        "LLM_COST_COMPLETION": "LLM_COST_COMPLETION",
        "LLM_COST_TOTAL": "LLM_COST_TOTAL",
        "LLM_TOKEN_COUNT_PROMPT": "LLM_TOKEN_COUNT_PROMPT",
        "LLM_TOKEN_COUNT_COMPLETION": "LLM_TOKEN_COUNT_COMPLETION",
        "LLM_TOKEN_COUNT_TOTAL": "LLM_TOKEN_COUNT_TOTAL",
        "LLM_TOKEN_COUNT_PROMPT_CACHE_READ": "LLM_TOKEN_COUNT_PROMPT_DETAILS_CACHE_READ",
        "LLM_TOKEN_COUNT_PROMPT_CACHE_WRITE": "LLM_TOKEN_COUNT_PROMPT_DETAILS_CACHE_WRITE",
        "LLM_TOKEN_COUNT_COMPLETION_REASONING": "LLM_TOKEN_COUNT_COMPLETION_DETAILS_REASONING",
        "INPUT_VALUE": "INPUT_VALUE",
        "OUTPUT_VALUE": "OUTPUT_VALUE",
        "INPUT_MIME_TYPE": "INPUT_MIME_TYPE",
        "OUTPUT_MIME_TYPE": "OUTPUT_MIME_TYPE",
    }
    for ours, theirs in pairs.items():
        assert getattr(sc, ours) == getattr(SpanAttributes, theirs), ours
    kinds = {
        name[3:]: getattr(sc, name)
        for name in dir(sc)
        if name.startswith("OI_") and isinstance(getattr(sc, name), str)
    }
    assert len(kinds) == 10
    for name, value in kinds.items():
        assert value == OpenInferenceSpanKindValues[name].value


@pytest.mark.parametrize(
    ("value", "latest"),
    [
        (None, False),
        ("", False),
        ("http", False),
        ("gen_ai_latest_experimental", True),
        ("http/dup, gen_ai_latest_experimental ,database", True),
        ("GEN_AI_LATEST_EXPERIMENTAL", True),
        ("gen_ai_latest_experimental_not", False),
    ],
)
def test_the_latest_conventions_opt_in_is_read_from_the_list(
    value: str | None, latest: bool
) -> None:
    """``OTEL_SEMCONV_STABILITY_OPT_IN`` is a comma-separated list; looptrace looks for
    ``gen_ai_latest_experimental`` in it."""
    environ = {} if value is None else {"OTEL_SEMCONV_STABILITY_OPT_IN": value}
    assert sc.gen_ai_latest_experimental(environ) is latest


def test_looptrace_imports_neither_conventions_package() -> None:
    """The conventions' packages are test dependencies: importing looptrace and instrumenting
    both SDKs loads neither."""
    code = (
        "import sys, looptrace\n"
        "looptrace.instrument_openai(); looptrace.instrument_anthropic()\n"
        "print(sorted(m for m in sys.modules if m.startswith(('openinference', "
        "'opentelemetry.semconv'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def _known_names() -> set[str]:
    names = {v for k, v in vars(gen_ai).items() if k.startswith("GEN_AI_") and isinstance(v, str)}
    names |= {v for k, v in vars(SpanAttributes).items() if k.isupper() and isinstance(v, str)}
    names |= {error_attributes.ERROR_TYPE, server_attributes.SERVER_ADDRESS}
    names.add(server_attributes.SERVER_PORT)
    return names


async def test_every_name_on_an_llm_span_is_a_conventions_name_or_looptraces_own(
    llm: FakeLlmServer, otlp: OtlpTestServer
) -> None:
    """Whatever an LLM span carries (OpenAI chat streamed with tools, a failed call,
    embeddings, responses; Anthropic plain and streamed) is named by one of the conventions'
    packages, or is looptrace's own (``looptrace.*``)."""
    oai = openai.AsyncOpenAI(base_url=llm.openai_url, api_key="sk-test", max_retries=0)
    ant = anthropic.AsyncAnthropic(base_url=llm.anthropic_url, api_key="sk-test", max_retries=0)
    tools: list[Any] = [{"type": "function", "function": {"name": "get_weather"}}]
    messages: list[Any] = [{"role": "user", "content": "Say hello"}]
    llm.cached_tokens, llm.cache_creation_tokens, llm.reasoning_tokens = 1, 2, 3
    looptrace.instrument_openai(oai)
    looptrace.instrument_anthropic(ant)
    try:
        async with looptrace.span("caller"):
            stream = await oai.chat.completions.create(
                model="m", messages=messages, tools=tools, stream=True, temperature=0.1
            )
            [c async for c in stream]
            with pytest.raises(openai.RateLimitError):
                await oai.chat.completions.create(model="rate-limited", messages=messages)
            await oai.embeddings.create(model="e", input="a", encoding_format="float")
            await oai.responses.create(model="r", input="Say hello", instructions="Be terse.")
            await ant.messages.create(
                model="a", max_tokens=5, system="Be terse.", messages=messages
            )
            async with ant.messages.stream(model="a", max_tokens=5, messages=messages) as s:
                await s.get_final_message()
    finally:
        looptrace.uninstrument_openai(oai)
        looptrace.uninstrument_anthropic(ant)
    await looptrace.flush(5)
    received(otlp, 7)
    known = _known_names()
    seen: set[str] = set()
    for span in otlp.accepted_spans():
        if span.name != "caller":
            seen |= set(attributes(span))
    strangers = {k for k in seen if k not in known and not k.startswith("looptrace.")}
    assert not strangers
    assert {
        "gen_ai.usage.cache_read.input_tokens",
        "gen_ai.usage.cache_creation.input_tokens",
        "gen_ai.usage.reasoning.output_tokens",
        "gen_ai.response.time_to_first_chunk",
        "gen_ai.request.stream",
        "error.type",
        "server.address",
        "server.port",
        "openinference.span.kind",
    } <= seen
