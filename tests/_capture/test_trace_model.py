"""The LLM application's trace model: a session, user, tags and metadata every span of a block
inherits (``looptrace.attributes``), feedback attached after the fact (``looptrace.score``),
the span kinds OpenInference backends read, and what experiments add to them. Spans are read
back from a real OTLP server on 127.0.0.1; LLM calls go through the real ``openai`` client to the
fake API there."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import openai
import pytest
from opentelemetry import trace as otel_trace
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.semconv._incubating.attributes import session_attributes, user_attributes

import looptrace
from fake_llm_server import FakeLlmServer, attributes
from genai_support import llm, otlp
from looptrace import _semconv as sc
from otel_support import otel
from otlp_server import OtlpTestServer

__all__ = ["llm", "otel", "otlp"]  # fixtures, used by name

API_KEY = "sk-test-secret-key"
MESSAGES = [{"role": "user", "content": "Say hello"}]


@pytest.fixture
def instrumented() -> Iterator[None]:
    looptrace.instrument_openai()
    yield
    looptrace.uninstrument_openai()


def arrived(otlp: OtlpTestServer, count: int) -> list[Any]:
    """The spans at the OTLP server, once ``count`` have arrived."""
    # Not asserted ok: on a loaded machine the server may reset a connection, and the
    # pipeline's retry delivers the spans a moment later; the count below is the check.
    looptrace.flush_sync(10)
    assert otlp.wait_for_spans(count, timeout=20)
    spans = otlp.accepted_spans()
    assert len(spans) == count, [s.name for s in spans]
    return spans


def by_name(spans: list[Any]) -> dict[str, Any]:
    return {s.name: s for s in spans}


def span_id(span: Any) -> int:
    return int.from_bytes(span.span_id, "big")


def trace_id(span: Any) -> int:
    return int.from_bytes(span.trace_id, "big")


def parent_id(span: Any) -> int:
    return int.from_bytes(span.parent_span_id, "big") if span.parent_span_id else 0


# -- looptrace.attributes -------------------------------------------------------------------


def test_names_match_the_conventions_packages() -> None:
    """The keys the block writes are the ones the OpenTelemetry conventions package names, so
    a rename there fails here."""
    assert sc.SESSION_ID == session_attributes.SESSION_ID
    assert sc.USER_ID == user_attributes.USER_ID
    assert sc.GEN_AI_EVALUATION_NAME == gen_ai.GEN_AI_EVALUATION_NAME
    assert sc.GEN_AI_EVALUATION_SCORE_VALUE == gen_ai.GEN_AI_EVALUATION_SCORE_VALUE
    assert sc.GEN_AI_EVALUATION_SCORE_LABEL == gen_ai.GEN_AI_EVALUATION_SCORE_LABEL
    assert sc.GEN_AI_EVALUATION_EXPLANATION == gen_ai.GEN_AI_EVALUATION_EXPLANATION
    assert sc.GEN_AI_TOOL_NAME == gen_ai.GEN_AI_TOOL_NAME
    assert sc.GEN_AI_AGENT_NAME == gen_ai.GEN_AI_AGENT_NAME


def _context_of(attrs: dict[str, Any]) -> tuple[Any, Any, Any, Any]:
    return (
        attrs.get(sc.SESSION_ID),
        attrs.get(sc.USER_ID),
        attrs.get(sc.TAG_TAGS),
        attrs.get(sc.METADATA),
    )


async def test_attributes_reach_llm_spans_through_gather_taskgroup_to_thread_and_threads(
    llm: FakeLlmServer, otlp: OtlpTestServer, instrumented: None
) -> None:
    """Inside one block, every span gets the session, user, tags and metadata: LLM calls made in
    gather's tasks, a task group's tasks, a to_thread worker (sync client) and a plain thread
    given ``bind_context``; metadata is one JSON string, written under Langfuse's key too."""
    aclient = openai.AsyncOpenAI(base_url=llm.openai_url, api_key=API_KEY, max_retries=0)
    sclient = openai.OpenAI(base_url=llm.openai_url, api_key=API_KEY, max_retries=0)

    async def ask(name: str) -> None:
        with looptrace.span(name):
            await aclient.chat.completions.create(model="gpt-4o", messages=MESSAGES)

    def ask_sync(name: str) -> None:
        with looptrace.span(name):
            sclient.chat.completions.create(model="gpt-4o", messages=MESSAGES)

    async with looptrace.attributes(
        session_id="conv-7", user_id="u-42", tags=["beta"], metadata={"plan": "pro"}
    ):
        await asyncio.gather(ask("gather-a"), ask("gather-b"))
        if sys.version_info >= (3, 11):
            async with asyncio.TaskGroup() as tg:
                tg.create_task(ask("group"))
        else:
            await asyncio.create_task(ask("group"))
        await asyncio.to_thread(ask_sync, "to-thread")
        thread = threading.Thread(target=looptrace.bind_context(ask_sync), args=("thread",))
        thread.start()
        await asyncio.to_thread(thread.join)
    with looptrace.span("outside"):
        pass
    spans = arrived(otlp, 11)
    named = by_name(spans)
    llm_spans = [s for s in spans if attributes(s).get(sc.OPENINFERENCE_SPAN_KIND) == sc.OI_LLM]
    assert len(llm_spans) == 5
    for span in [*llm_spans, *(named[n] for n in ("gather-a", "group", "to-thread", "thread"))]:
        attrs = attributes(span)
        assert _context_of(attrs) == ("conv-7", "u-42", ["beta"], {"plan": "pro"}), span.name
        assert attrs[sc.LANGFUSE_TRACE_METADATA] == {"plan": "pro"}
    raw = {kv.key: kv.value.string_value for kv in named["group"].attributes}
    assert json.loads(raw[sc.METADATA]) == {"plan": "pro"}  # a JSON string on the wire
    assert _context_of(attributes(named["outside"])) == (None, None, None, None)


def test_nested_blocks_merge_and_a_span_attribute_wins(otlp: OtlpTestServer) -> None:
    """An inner block replaces the session or user it sets and keeps the rest; tags add up
    (each once), metadata merges key by key; a span's own ``session.id`` wins over the block's.
    Leaving the inner block brings the outer values back."""
    with looptrace.attributes(session_id="s1", user_id="u1", tags=["a"], metadata={"k": 1}):
        with looptrace.attributes(user_id="u2", tags=["b", "a"], metadata={"j": 2, "k": 3}):
            with looptrace.span("inner"):
                pass
            with looptrace.span("own", {sc.SESSION_ID: "mine"}):
                pass
        with looptrace.span("after"):
            pass
    named = by_name(arrived(otlp, 3))
    assert _context_of(attributes(named["inner"])) == ("s1", "u2", ["a", "b"], {"k": 3, "j": 2})
    assert attributes(named["own"])[sc.SESSION_ID] == "mine"
    assert _context_of(attributes(named["after"])) == ("s1", "u1", ["a"], {"k": 1})


def test_attributes_as_decorator_on_every_kind_of_function(otlp: OtlpTestServer) -> None:
    """The decorator form works on plain, coroutine, generator and async generator functions;
    a generator's block covers its own code at each step, never the caller's between steps."""
    deco = looptrace.attributes(session_id="deco", tags="single")

    @deco
    def plain() -> int:
        with looptrace.span("plain"):
            return 1

    @deco
    async def coro() -> int:
        with looptrace.span("coro"):
            return 2

    @deco
    def gen() -> Iterator[int]:
        with looptrace.span("gen"):
            yield 3

    @deco
    async def agen() -> AsyncIterator[int]:
        with looptrace.span("agen"):
            yield 4

    async def consume() -> list[int]:
        return [x async for x in agen()]

    assert plain() == 1
    assert asyncio.run(coro()) == 2
    for item in gen():
        with looptrace.span("between"):
            assert item == 3
    assert asyncio.run(consume()) == [4]
    named = by_name(arrived(otlp, 5))
    for name in ("plain", "coro", "gen", "agen"):
        assert _context_of(attributes(named[name]))[:3] == ("deco", None, ["single"]), name
    assert attributes(named["between"]).get(sc.SESSION_ID) is None


async def test_attributes_reach_opentelemetry_bridge_spans_and_llm_spans_under_them(
    llm: FakeLlmServer, otlp: OtlpTestServer, otel: None, instrumented: None
) -> None:
    """A span made through the OpenTelemetry API inside the block, and an LLM call inside that
    span, both carry the block's values; the OpenTelemetry span keeps its own kind (no CHAIN
    default: it belongs to its instrumentation)."""
    tracer = otel_trace.get_tracer("my.instrumentation")
    aclient = openai.AsyncOpenAI(base_url=llm.openai_url, api_key=API_KEY, max_retries=0)
    async with looptrace.attributes(session_id="otel-session", user_id="u"):
        with tracer.start_as_current_span("otel-op"):
            await aclient.chat.completions.create(model="gpt-4o", messages=MESSAGES)
    spans = arrived(otlp, 2)
    named = by_name(spans)
    bridged = named["otel-op"]
    call = next(s for s in spans if s is not bridged)
    assert parent_id(call) == span_id(bridged)
    for span in (bridged, call):
        assert _context_of(attributes(span))[:2] == ("otel-session", "u")
    assert sc.OPENINFERENCE_SPAN_KIND not in attributes(bridged)
    assert attributes(call)[sc.OPENINFERENCE_SPAN_KIND] == sc.OI_LLM


def test_wrong_argument_types_raise_at_the_call() -> None:
    """Types that cannot be right fail where the block is written, not later in the exporter."""
    with pytest.raises(TypeError):
        looptrace.attributes(metadata=["not", "a", "mapping"])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        looptrace.attributes(tags=5)  # type: ignore[arg-type]


# -- span kinds -----------------------------------------------------------------------------


def test_span_kinds_for_openinference_backends(otlp: OtlpTestServer) -> None:
    """Traced functions and span blocks are CHAIN by default; ``as_type`` makes them TOOL,
    AGENT, RETRIEVER...; a tool and an agent also carry the GenAI operation and their name;
    an unknown value fails at decoration."""

    @looptrace.traced
    def plain() -> None:
        pass

    @looptrace.traced(as_type="tool", name="get_weather")
    def tool() -> None:
        pass

    @looptrace.traced(as_type="agent")
    async def planner() -> None:
        with looptrace.span("search", as_type="retriever"):
            tool()

    plain()
    asyncio.run(planner())
    with looptrace.span("block"):
        pass
    with pytest.raises(ValueError, match="as_type"):
        looptrace.traced(as_type="robot")
    named = {s.name: attributes(s) for s in arrived(otlp, 5)}
    kinds = {n: a[sc.OPENINFERENCE_SPAN_KIND] for n, a in named.items()}
    short = {n.rsplit(".", 1)[-1]: k for n, k in kinds.items()}
    assert short == {
        "plain": "CHAIN",
        "get_weather": "TOOL",
        "planner": "AGENT",
        "search": "RETRIEVER",
        "block": "CHAIN",
    }
    assert named["get_weather"][sc.GEN_AI_OPERATION_NAME] == "execute_tool"
    assert named["get_weather"][sc.GEN_AI_TOOL_NAME] == "get_weather"
    agent = next(a for n, a in named.items() if n.endswith("planner"))
    assert agent[sc.GEN_AI_OPERATION_NAME] == "invoke_agent"
    assert agent[sc.GEN_AI_AGENT_NAME].endswith("planner")
    assert sc.GEN_AI_OPERATION_NAME not in named["search"]


# -- looptrace.score ------------------------------------------------------------------------


def _evaluation(attrs: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in attrs.items() if k.startswith("gen_ai.evaluation.")}


def test_score_from_a_second_process_reaches_the_server_in_the_scored_trace(
    otlp: OtlpTestServer,
) -> None:
    """A process that has only the ``traceparent`` of a span that ended sends a score that
    arrives in the same trace, parented to that span, as an EVALUATOR span with the GenAI
    evaluation attributes and a ``gen_ai.evaluation.result`` event carrying them too."""
    with looptrace.span("answer") as answer:
        headers = looptrace.inject({})
    arrived(otlp, 1)
    code = textwrap.dedent(
        f"""
        import looptrace
        looptrace.configure(endpoint={otlp.url!r})
        ctx = looptrace.score({headers["traceparent"]!r}, "helpfulness", 0.8,
                              label="good", comment="answered the question")
        assert ctx is not None
        assert looptrace.flush_sync(10).ok
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert otlp.wait_for_spans(2)
    score = next(s for s in otlp.accepted_spans() if s.name != "answer")
    assert score.name == "evaluation helpfulness"
    assert trace_id(score) == answer.trace_id
    assert parent_id(score) == answer.span_id
    attrs = attributes(score)
    expected = {
        sc.GEN_AI_EVALUATION_NAME: "helpfulness",
        sc.GEN_AI_EVALUATION_SCORE_VALUE: 0.8,
        sc.GEN_AI_EVALUATION_SCORE_LABEL: "good",
        sc.GEN_AI_EVALUATION_EXPLANATION: "answered the question",
    }
    assert _evaluation(attrs) == expected
    assert attrs[sc.OPENINFERENCE_SPAN_KIND] == sc.OI_EVALUATOR
    assert attrs[sc.SPAN_TYPE] == sc.SPAN_TYPE_SCORE
    (event,) = score.events
    assert event.name == sc.GEN_AI_EVALUATION_RESULT
    assert _evaluation(attributes(event)) == expected


def test_score_a_span_or_its_context_in_process(otlp: OtlpTestServer) -> None:
    """A span (ended) or its SpanContext is a target too; a bool scores 1.0 or 0.0; a label
    alone is a score."""
    with looptrace.span("answer") as answer:
        pass
    looptrace.score(answer, "thumbs", True)
    looptrace.score(answer.context, "tone", label="friendly")
    spans = arrived(otlp, 3)
    scores = {s.name: s for s in spans if s.name.startswith("evaluation ")}
    assert {n: parent_id(s) for n, s in scores.items()} == {
        "evaluation thumbs": answer.span_id,
        "evaluation tone": answer.span_id,
    }
    assert attributes(scores["evaluation thumbs"])[sc.GEN_AI_EVALUATION_SCORE_VALUE] == 1.0
    tone = attributes(scores["evaluation tone"])
    assert tone[sc.GEN_AI_EVALUATION_SCORE_LABEL] == "friendly"
    assert sc.GEN_AI_EVALUATION_SCORE_VALUE not in tone


@pytest.mark.internal_errors
def test_score_with_a_bad_target_is_dropped_said_once_and_counted(
    otlp: OtlpTestServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A malformed traceparent or a span that records nothing drops the score without raising:
    one warning line for the first, every one counted in statistics()."""
    with looptrace.suppress_tracing(), looptrace.span("unrecorded") as unrecorded:
        pass
    with caplog.at_level("WARNING", logger="looptrace"):
        assert looptrace.score("not-a-traceparent", "x", 1.0) is None
        assert looptrace.score("00-" + "0" * 32 + "-" + "1" * 16 + "-01", "x", 1.0) is None
        assert looptrace.score(unrecorded, "x", 1.0) is None
    assert len([r for r in caplog.records if "score dropped" in r.getMessage()]) == 1
    assert looptrace.statistics().internal_errors["score.invalid_target"] == 3


def test_score_argument_errors_raise() -> None:
    """Mistakes in the calling code (no value and no label, wrong types) raise at the call."""
    tp = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"
    with pytest.raises(ValueError, match="value, a label"):
        looptrace.score(tp, "x")
    with pytest.raises(TypeError):
        looptrace.score(tp, "x", "high")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        looptrace.score(12345, "x", 1.0)  # type: ignore[arg-type]


# -- experiments ----------------------------------------------------------------------------


async def _task(x: int) -> int:
    with looptrace.span("llm-ish") as s:
        if x:
            # What an LLM span carries once priced (llm.cost.total, USD).
            s.set_attribute(sc.LLM_COST_TOTAL, 0.25 * x)
            s.set_attribute(sc.GEN_AI_USAGE_INPUT_TOKENS, 10)
    return x


def _exact(output: int, expected: int) -> bool:
    return output == expected


async def test_experiment_cases_share_a_session_and_scorers_become_evaluator_spans(
    otlp: OtlpTestServer,
) -> None:
    """Every case trace and the experiment's own carry the experiment id as ``session.id`` and
    metadata naming the experiment (and the case); each scorer result is an EVALUATOR span
    parented to its case span, while the case span keeps its looptrace.score.* attributes."""
    async with looptrace.experiment("kinds", tags=["nightly"], quiet=True) as exp:
        await exp.run(_task, [{"input": 1, "expected": 1}, {"input": 2, "expected": 0}], [_exact])
    spans = arrived(otlp, 1 + 2 * 3)
    experiment = next(s for s in spans if s.name == "kinds")
    cases = {s.name: s for s in spans if s.name.startswith("case ")}
    assert attributes(experiment)[sc.SESSION_ID] == exp.id
    assert attributes(experiment)[sc.METADATA] == {
        "experiment_id": exp.id,
        "experiment_name": "kinds",
    }
    assert attributes(experiment)[sc.OPENINFERENCE_SPAN_KIND] == sc.OI_CHAIN
    for index, name in enumerate(("case 0", "case 1")):
        case = cases[name]
        attrs = attributes(case)
        assert attrs[sc.SESSION_ID] == exp.id
        assert attrs[sc.TAG_TAGS] == ["nightly"]
        assert attrs[sc.METADATA]["case_index"] == index
        assert attrs[sc.OPENINFERENCE_SPAN_KIND] == sc.OI_CHAIN
        assert attrs[sc.SCORE_PREFIX + "_exact"] == (1.0 if index == 0 else 0.0)
        (evaluation,) = [
            s for s in spans if s.name == "evaluation _exact" and parent_id(s) == span_id(case)
        ]
        ev = attributes(evaluation)
        assert ev[sc.OPENINFERENCE_SPAN_KIND] == sc.OI_EVALUATOR
        assert ev[sc.GEN_AI_EVALUATION_SCORE_VALUE] == attrs[sc.SCORE_PREFIX + "_exact"]
        assert ev[sc.SESSION_ID] == exp.id


async def test_an_application_session_is_kept_for_the_experiment(otlp: OtlpTestServer) -> None:
    """A session the application set around the experiment stays the session of its spans."""
    async with (
        looptrace.attributes(session_id="mine"),
        looptrace.experiment("own-session", quiet=True) as exp,
    ):
        await exp.run(_task, [0], [])
    spans = arrived(otlp, 3)
    assert {attributes(s)[sc.SESSION_ID] for s in spans} == {"mine"}
    assert all(attributes(s)[sc.METADATA]["experiment_id"] == exp.id for s in spans)


async def test_cost_is_summed_per_case_and_experiment_like_tokens(otlp: OtlpTestServer) -> None:
    """``llm.cost.total`` of the spans in a case's trace is summed on the case span
    (looptrace.case.cost_usd), its result and the experiment summary; a case with no priced
    call has no cost (None), never 0."""
    async with looptrace.experiment("cost", quiet=True) as exp:
        await exp.run(_task, [0, 1, 2], [])
    by_index = {r.index: r for r in exp.results}
    assert by_index[0].cost_usd is None
    assert by_index[1].cost_usd == pytest.approx(0.25)
    assert by_index[2].cost_usd == pytest.approx(0.5)
    summary = exp.summary()
    assert summary.cost_usd == pytest.approx(0.75)
    assert summary.input_tokens == 20
    assert "cost $0.750000" in summary.format()
    cases = {s.name: attributes(s) for s in arrived(otlp, 7) if s.name.startswith("case ")}
    assert sc.CASE_COST_USD not in cases["case 0"]
    assert cases["case 1"][sc.CASE_COST_USD] == pytest.approx(0.25)
    assert cases["case 2"][sc.CASE_COST_USD] == pytest.approx(0.5)


async def test_no_cost_anywhere_is_none_in_the_summary() -> None:
    """An experiment whose calls have no price reports no cost, not a zero."""
    async with looptrace.experiment("free", quiet=True) as exp:
        await exp.run(_task, [0, 0], [])
    assert exp.summary().cost_usd is None
    assert "cost" not in exp.summary().format()


# -- the exporter's two routes --------------------------------------------------------------


@pytest.mark.parametrize(
    "case", ["bare", "site", "own", "own-kind", "site-kind", "override", "big", "scoped"]
)
def test_direct_encoder_writes_what_the_general_route_writes(case: str) -> None:
    """The flusher's direct protobuf route writes a span in a block (and the CHAIN default)
    byte for byte as the general route does, and writes it itself unless the span overrides
    one of the block's attributes."""
    from looptrace import _otlp
    from looptrace._capture.attributes import ContextAttributes
    from looptrace._capture.spans import CallSite, ScopedSpan, Span
    from looptrace._config import Config
    from looptrace._otlp.span_encoder import SpanEncoder
    from looptrace._serialize import to_wire

    cfg = Config(max_span_bytes=4096)
    shared = ContextAttributes("s", "u", ("t1", "t2"), {"k": 1, "password": "x"})
    if case == "scoped":
        span: Span = ScopedSpan("op", 7, 8, 0, 1_000, None, "", 1, ("lib", "1"), False)
    else:
        span = Span("op", 7, 8, 0, 1_000)
    span.context_attributes = shared
    span.end_ns = 2_000
    span.inputs = {"q": "x" * (5000 if case == "big" else 10)}
    if case in ("site", "site-kind"):
        kind = {sc.OPENINFERENCE_SPAN_KIND: sc.OI_TOOL} if case == "site-kind" else {}
        span.site = CallSite("op", "mod.op", "mod", {"team": "a", **kind})
    if case == "own":
        span.attributes = {"x": 1}
    if case == "own-kind":
        span.attributes = {sc.OPENINFERENCE_SPAN_KIND: sc.OI_AGENT}
    if case == "override":
        span.attributes = {sc.SESSION_ID: "mine"}
    enc = SpanEncoder(cfg)
    general = _otlp.encode_span(to_wire(span, cfg), "protobuf")
    assert enc.encode(span, enc.plan(span)) == general
    written = enc._encode_pb(span, enc.plan(span))
    assert (written is None) is (case == "override")


def test_sdk_span_processor_spans_carry_the_block(otlp: OtlpTestServer) -> None:
    """With the OpenTelemetry SDK and looptrace's span processor, an SDK span started inside a
    block carries its values (set as the span starts, so the SDK's other exporters see them),
    and one started outside does not, wherever it ends."""
    from opentelemetry.sdk.trace import TracerProvider

    provider = TracerProvider()
    provider.add_span_processor(looptrace.otel.SpanProcessor())
    tracer = provider.get_tracer("sdk.scope")
    try:
        with looptrace.attributes(session_id="sdk-session", metadata={"k": "v"}):
            inside = tracer.start_span("inside")
        outside_started = tracer.start_span("outside")
        with looptrace.attributes(session_id="other"):
            inside.end()
            outside_started.end()
        named = {s.name: attributes(s) for s in arrived(otlp, 2)}
    finally:
        looptrace.uninstrument_opentelemetry()
    assert named["inside"][sc.SESSION_ID] == "sdk-session"
    assert named["inside"][sc.METADATA] == {"k": "v"}
    assert named["inside"][sc.LANGFUSE_TRACE_METADATA] == {"k": "v"}
    assert sc.SESSION_ID not in named["outside"]
