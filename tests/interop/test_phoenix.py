"""looptrace's spans in a real Arize Phoenix: a traced program sends OTLP/HTTP to Phoenix's
``/v1/traces``, and what Phoenix made of it is read back through Phoenix's own REST and
GraphQL APIs (span kinds, session and user, token counts, cost, scores)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import genai_prices
import httpx
import openai
import pytest
from phoenix_support import Phoenix

import looptrace
from fake_llm_server import USAGE_IN, FakeLlmServer

PROJECT = "looptrace-interop"
SESSION = "conversation-42"
USER = "user-7"
MESSAGES = [{"role": "user", "content": "Say hello"}]
READ_TIMEOUT = 60.0  # Phoenix inserts what it receives in batches, about once a second


def _spans(client: httpx.Client, phoenix: Phoenix, count: int) -> list[dict[str, Any]]:
    """The project's spans once Phoenix has stored ``count`` of them (bounded wait)."""
    deadline = time.monotonic() + READ_TIMEOUT
    spans: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        answer = client.get(f"{phoenix.url}/v1/projects/{PROJECT}/spans", params={"limit": 100})
        if answer.status_code == 200:
            spans = answer.json()["data"]
            if len(spans) >= count:
                return spans
        elif answer.status_code != 404:  # 404: the project appears with its first span
            answer.raise_for_status()
        time.sleep(0.25)
    pytest.fail(f"Phoenix stored {len(spans)} of {count} spans:\n{phoenix.log_tail()}")


def _cost_summary(client: httpx.Client, phoenix: Phoenix, name: str) -> dict[str, Any]:
    """Phoenix's own cost summary of the span called ``name`` (GraphQL: the REST API has none)."""
    query = (
        "{ projects { edges { node { name spans(first: 50) { edges { node { name"
        " costSummary { prompt { cost tokens } completion { cost tokens } total { cost tokens }"
        " } } } } } } } }"
    )
    answer = client.post(f"{phoenix.url}/graphql", json={"query": query})
    answer.raise_for_status()
    for project in answer.json()["data"]["projects"]["edges"]:
        if project["node"]["name"] == PROJECT:
            for span in project["node"]["spans"]["edges"]:
                if span["node"]["name"] == name:
                    summary: dict[str, Any] = span["node"]["costSummary"]
                    return summary
    pytest.fail(f"no span {name!r} in Phoenix's GraphQL answer")


async def _program(llm: FakeLlmServer) -> dict[str, str]:
    """A traced function calling the real OpenAI SDK, in a conversation turn of a session and
    a user, scored afterwards."""
    api = openai.AsyncOpenAI(base_url=llm.openai_url, api_key="sk-test", max_retries=0)

    @looptrace.traced(name="answer")
    async def answer(question: str) -> str:
        reply = await api.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": question}]
        )
        return reply.choices[0].message.content or ""

    with looptrace.attributes(session_id=SESSION, user_id=USER, tags=["interop"]):
        async with looptrace.span("turn") as turn:
            await answer("Say hello")
    looptrace.score(turn, "helpful", 1.0, label="yes", comment="said hello")
    result = await looptrace.flush(10)
    assert result.ok, result
    return {"trace_id": f"{turn.trace_id:032x}", "turn": f"{turn.span_id:016x}"}


@pytest.fixture(scope="module")
def readback(phoenix: Phoenix) -> dict[str, Any]:
    """The program run once against Phoenix, and what Phoenix's APIs then answer."""
    with FakeLlmServer() as llm:
        llm.cached_tokens, llm.reasoning_tokens = 5, 3
        # Start-up work, before the loop runs (importing genai-prices and loading its table
        # takes a few hundred milliseconds).
        looptrace.configure(
            endpoint=f"{phoenix.url}/v1/traces",
            service_name="looptrace-interop",
            resource_attributes={"openinference.project.name": PROJECT},
        )
        looptrace.instrument_openai()
        try:
            ids = asyncio.run(_program(llm))
        finally:
            looptrace.uninstrument_openai()
        out_tokens = len(llm.pieces())
    with httpx.Client(timeout=10.0) as client:
        spans = {s["name"]: s for s in _spans(client, phoenix, 4)}
        session = client.get(f"{phoenix.url}/v1/sessions/{SESSION}")
        annotations = client.get(
            f"{phoenix.url}/v1/projects/{PROJECT}/span_annotations",
            params={"span_ids": ids["turn"]},
        )
        summary = _cost_summary(client, phoenix, "chat gpt-4o-mini")
    found = {
        **ids,
        "out_tokens": out_tokens,
        "spans": spans,
        "session": (session.status_code, _data(session)),
        "annotations": (annotations.status_code, _data(annotations)),
        "cost_summary": summary,
    }
    _print_table(found)
    return found


def _data(answer: httpx.Response) -> Any:
    """The ``data`` of a JSON answer; the text of any other (Phoenix's 404s are plain text)."""
    try:
        return answer.json()["data"]
    except (ValueError, KeyError, TypeError):
        return answer.text


def _print_table(found: dict[str, Any]) -> None:
    """What Phoenix showed, one line per fact (``pytest -rP`` or the session's output)."""
    spans = found["spans"]
    rows: list[tuple[str, Any]] = []
    for name, span in spans.items():
        attrs = span["attributes"]
        rows.append((f"{name!r} span kind", span["span_kind"]))
        rows.append(
            (f"{name!r} session.id / user.id", (attrs.get("session.id"), attrs.get("user.id")))
        )
        picked = {
            k: v
            for k, v in attrs.items()
            if k.startswith(("llm.token_count", "llm.cost", "gen_ai.evaluation", "tag."))
        }
        if picked:
            rows.append((f"{name!r} attributes", picked))
    rows.append(("session", found["session"]))
    rows.append(("Phoenix's own cost summary of the LLM span", found["cost_summary"]))
    rows.append(("span annotations of the scored span", found["annotations"]))
    print("\nPhoenix read-back:")
    for what, value in rows:
        print(f"  {what}: {value}")


def test_llm_span_kind(readback: dict[str, Any]) -> None:
    """Phoenix draws the LLM call as an LLM span, under the traced function that made it."""
    spans = readback["spans"]
    fn, llm_span = spans["answer"], spans["chat gpt-4o-mini"]
    assert llm_span["span_kind"] == "LLM"
    assert llm_span["parent_id"] == fn["context"]["span_id"]


def test_traced_function_is_a_chain(readback: dict[str, Any]) -> None:
    """Phoenix draws a traced function as a CHAIN (``openinference.span.kind``)."""
    assert readback["spans"]["answer"]["span_kind"] == "CHAIN"


def test_session_and_user(readback: dict[str, Any]) -> None:
    """Every span of the ``looptrace.attributes`` block carries ``session.id`` and ``user.id``,
    the LLM call's included, and Phoenix files the trace under the session, with the
    session's token count."""
    spans = readback["spans"]
    for name in ("turn", "answer", "chat gpt-4o-mini"):
        assert spans[name]["attributes"]["session.id"] == SESSION, name
        assert spans[name]["attributes"]["user.id"] == USER, name
    status, session = readback["session"]
    assert status == 200, session
    assert [t["trace_id"] for t in session["traces"]] == [readback["trace_id"]]
    assert session["token_count_total"] == USAGE_IN + readback["out_tokens"]


def test_token_counts_and_cost(readback: dict[str, Any]) -> None:
    """Phoenix counts the call's tokens from the GenAI usage attributes, and keeps
    looptrace's ``llm.cost.*``: genai-prices' price of the usage, cached tokens included."""
    attrs = readback["spans"]["chat gpt-4o-mini"]["attributes"]
    out_tokens = readback["out_tokens"]
    assert attrs["llm.token_count.prompt"] == USAGE_IN
    assert attrs["llm.token_count.completion"] == out_tokens
    assert attrs["llm.token_count.total"] == USAGE_IN + out_tokens
    assert attrs["llm.token_count.prompt_details.cache_read"] == 5
    want = genai_prices.calc_price(
        genai_prices.Usage(
            input_tokens=USAGE_IN,
            output_tokens=out_tokens,
            cache_read_tokens=5,
            output_reasoning_tokens=3,
        ),
        "gpt-4o-mini",
        provider_id="openai",
    )
    assert attrs["llm.cost.prompt"] == float(want.input_price)
    assert attrs["llm.cost.completion"] == float(want.output_price)
    assert attrs["llm.cost.total"] == float(want.total_price)
    assert readback["cost_summary"]["total"]["tokens"] == USAGE_IN + out_tokens


def test_scores(readback: dict[str, Any]) -> None:
    """A score reaches Phoenix as an EVALUATOR span in the scored span's trace, parented to
    it, with the GenAI evaluation attributes. (Phoenix shows it as a span: it makes span
    annotations, its evaluations, only from its own REST API, not from OTLP.)"""
    evaluation = readback["spans"]["evaluation helpful"]
    assert evaluation["span_kind"] == "EVALUATOR"
    assert evaluation["parent_id"] == readback["turn"]
    assert evaluation["context"]["trace_id"] == readback["trace_id"]
    attrs = evaluation["attributes"]
    assert attrs["gen_ai.evaluation.name"] == "helpful"
    assert attrs["gen_ai.evaluation.score.value"] == 1.0
    assert attrs["gen_ai.evaluation.score.label"] == "yes"
    assert attrs["gen_ai.evaluation.explanation"] == "said hello"
