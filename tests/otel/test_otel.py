"""The OpenTelemetry bridge: spans made through the OpenTelemetry API are looptrace spans, in
looptrace's traces, exported by its pipeline to a real OTLP server on 127.0.0.1; one active span
for both APIs; the SDK's spans handed over by looptrace's span processor."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator

import pytest
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

import looptrace
from looptrace import _state
from looptrace.testing import capture_spans
from otel_support import by_name, otel
from otlp_server import OtlpTestServer
from pipeline_support import FAST_RETRY, checked_server, install_pipeline

__all__ = ["otel"]

pytestmark = pytest.mark.usefixtures("otel")


@pytest.fixture
def server() -> Iterator[OtlpTestServer]:
    with checked_server() as srv:
        yield srv


def tracer() -> trace.Tracer:
    return trace.get_tracer("tests.bridge", "2.1")


@pytest.mark.parametrize("encoding", ["protobuf", "json"])
async def test_both_apis_nest_in_one_trace_and_keep_their_scopes(
    server: OtlpTestServer, encoding: str
) -> None:
    """traced -> OpenTelemetry span -> traced -> OpenTelemetry span: one trace, each the child
    of the one around it, each span under its own instrumentation scope on the wire."""
    install_pipeline(server, retry=FAST_RETRY, encoding=encoding)
    t = tracer()
    other = trace.get_tracer("tests.other")

    @looptrace.traced(name="handler")
    async def handler() -> str:
        with t.start_as_current_span("db query", kind=SpanKind.CLIENT, attributes={"rows": 3}):
            return await inner()

    @looptrace.traced(name="inner")
    async def inner() -> str:
        with other.start_as_current_span("leaf"):
            return "done"

    assert await handler() == "done"
    assert (await looptrace.flush(5)).ok
    spans = by_name(server)
    assert set(spans) == {"handler", "db query", "inner", "leaf"}
    assert len({s.trace_id for s in spans.values()}) == 1
    assert spans["handler"].parent_id == 0
    assert spans["db query"].parent_id == spans["handler"].span_id
    assert spans["inner"].parent_id == spans["db query"].span_id
    assert spans["leaf"].parent_id == spans["inner"].span_id
    assert spans["db query"].scope == ("tests.bridge", "2.1")
    assert spans["leaf"].scope == ("tests.other", "")
    assert spans["handler"].scope == ("looptrace", looptrace.__version__)
    assert spans["db query"].span.kind == 3  # CLIENT, in OTLP's numbering
    assert spans["db query"].attributes["rows"] == 3


async def test_the_span_api_is_honoured_in_full(server: OtlpTestServer) -> None:
    """Attributes (arrays too), events with their time, links, update_name, kind, status,
    recorded exceptions and end(end_time) all reach the wire as given."""
    install_pipeline(server, retry=FAST_RETRY)
    t = tracer()
    linked = t.start_span("linked")
    linked.end()
    span = t.start_span(
        "first name",
        kind=SpanKind.PRODUCER,
        attributes={"tags": ["a", "b"], "ratio": 0.5},
        links=[Link(linked.get_span_context(), {"why": "batch"})],
        start_time=1_000_000_000,
    )
    assert span.is_recording()
    span.set_attribute("ok", True)
    span.set_attributes({"n": 7})
    span.add_event("checkpoint", {"step": 2}, timestamp=1_500_000_000)
    span.update_name("final name")
    try:
        raise ValueError("bad input")
    except ValueError as exc:
        span.record_exception(exc, {"extra": "x"}, escaped=True)
    span.set_status(Status(StatusCode.ERROR, "it failed"))
    span.set_status(StatusCode.UNSET)  # changes nothing, as in the SDK
    span.end(end_time=2_000_000_000)
    assert not span.is_recording()
    span.set_attribute("late", 1)  # ignored after end
    span.end()  # a second end changes nothing

    assert (await looptrace.flush(5)).ok
    spans = by_name(server)
    got = spans["final name"]
    assert got.span.kind == 4  # PRODUCER
    assert (got.span.start_time_unix_nano, got.span.end_time_unix_nano) == (10**9, 2 * 10**9)
    assert got.attributes["tags"] == ["a", "b"]
    assert got.attributes["ratio"] == 0.5
    assert got.attributes["ok"] is True and got.attributes["n"] == 7
    assert "late" not in got.attributes
    events = {e.name: e for e in got.span.events}
    assert events["checkpoint"].time_unix_nano == 1_500_000_000
    exc_attrs = {kv.key: kv.value for kv in events["exception"].attributes}
    assert exc_attrs["exception.type"].string_value.endswith("ValueError")
    assert exc_attrs["exception.message"].string_value == "bad input"
    assert exc_attrs["exception.escaped"].bool_value is True
    assert exc_attrs["extra"].string_value == "x"
    assert "raise ValueError" in exc_attrs["exception.stacktrace"].string_value
    assert got.span.status.code == 2 and got.span.status.message == "it failed"
    (link,) = got.span.links
    assert link.span_id == spans["linked"].span.span_id
    assert {kv.key: kv.value.string_value for kv in link.attributes} == {"why": "batch"}


def test_ok_status_is_final_and_only_errors_keep_a_description() -> None:
    with tracer().start_as_current_span("s") as span:
        span.set_status(StatusCode.OK, "ignored for OK")
        span.set_status(StatusCode.ERROR, "too late")
        loop_span = looptrace.current_span()
    assert (loop_span.status_code, loop_span.status_message) == (1, "")


async def test_exceptions_escaping_a_span_are_recorded_and_reraised(
    server: OtlpTestServer,
) -> None:
    """start_as_current_span and start_span used as a context manager record what escapes
    (unless told not to) and re-raise it untouched; a cancellation is marked as one."""
    install_pipeline(server, retry=FAST_RETRY)
    t = tracer()
    error = KeyError("k")
    with pytest.raises(KeyError) as caught, t.start_as_current_span("raises"):
        raise error
    assert caught.value is error
    with pytest.raises(RuntimeError), t.start_span("as context manager"):
        raise RuntimeError("boom")
    with (
        pytest.raises(RuntimeError),
        t.start_as_current_span("quiet", record_exception=False, set_status_on_exception=False),
    ):
        raise RuntimeError("not recorded")

    async def slow() -> None:
        with t.start_as_current_span("cancelled"):
            await asyncio.sleep(30)

    task = asyncio.ensure_future(slow())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (await looptrace.flush(5)).ok
    spans = by_name(server)
    assert spans["raises"].span.status.code == 2
    assert [e.name for e in spans["raises"].span.events] == ["exception"]
    assert spans["as context manager"].span.status.code == 2
    assert spans["quiet"].span.status.code == 0 and not spans["quiet"].span.events
    assert spans["cancelled"].attributes["looptrace.cancelled"] is True


def test_current_span_is_one_span_for_both_apis() -> None:
    t = tracer()

    @looptrace.traced(name="traced_fn")
    def traced_fn() -> None:
        inside = trace.get_current_span()
        assert inside.get_span_context().span_id == looptrace.current_span().span_id
        assert inside.is_recording()
        inside.set_attribute("set.through.otel", 1)  # lands on the looptrace span
        assert looptrace.current_span().attributes == {"set.through.otel": 1}

    with t.start_as_current_span("outer") as outer:
        assert trace.get_current_span() is outer
        assert looptrace.current_span().span_id == outer.get_span_context().span_id
        traced_fn()
    # A span activated with the API's own use_span (as some instrumentations do) counts too.
    span = t.start_span("used")
    with trace.use_span(span, end_on_exit=True):
        assert looptrace.current_span().span_id == span.get_span_context().span_id
        with looptrace.span("child") as child:
            assert child.parent_span_id == span.get_span_context().span_id
    assert trace.get_current_span() is trace.INVALID_SPAN
    assert not looptrace.current_span().is_recording


def test_a_traced_generator_is_the_current_span_of_both_apis_only_while_it_runs() -> None:
    """Each time a traced generator (sync or async) resumes, its span is the current one for
    the OpenTelemetry API too; between items, the caller's span is current again in both."""
    t = tracer()
    seen: list[tuple[int, int]] = []

    def record() -> None:
        seen.append(
            (trace.get_current_span().get_span_context().span_id, looptrace.current_span().span_id)
        )

    @looptrace.traced(name="numbers")
    def numbers() -> Iterator[int]:
        for i in range(3):
            record()
            yield i

    @looptrace.traced(name="anumbers")
    async def anumbers() -> AsyncIterator[int]:
        for i in range(3):
            record()
            yield i
            await asyncio.sleep(0)

    async def consume() -> list[int]:
        return [i async for i in anumbers()]

    with t.start_as_current_span("caller") as caller, capture_spans() as spans:
        caller_id = caller.get_span_context().span_id
        for _ in numbers():
            record()
        assert asyncio.run(consume()) == [0, 1, 2]
    ids = {s.name: s.span_id for s in spans}
    gen, agen = ids["numbers"], ids["anumbers"]
    assert seen == [(gen, gen), (caller_id, caller_id)] * 3 + [(agen, agen)] * 3
    assert trace.get_current_span() is trace.INVALID_SPAN


def test_propagation_apis_agree_both_ways() -> None:
    """propagate.inject and looptrace.inject write the same traceparent; a context extracted by
    either API parents the other API's spans (as a remote parent)."""
    with looptrace.span("root"):
        otel_carrier: dict[str, str] = {}
        propagate.inject(otel_carrier)
        assert otel_carrier["traceparent"] == looptrace.inject()["traceparent"]
        with tracer().start_as_current_span("otel child"):
            otel_carrier = {}
            propagate.inject(otel_carrier)
            assert otel_carrier == dict(looptrace.inject())

    incoming = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    token = otel_context.attach(propagate.extract(incoming))
    try:
        with looptrace.span("server side") as s:
            assert (s.trace_id, s.parent_span_id) == (
                0x0AF7651916CD43DD8448EB211C80319C,
                0xB7AD6B7169203331,
            )
            assert s.parent_is_remote
    finally:
        otel_context.detach(token)
    with (
        looptrace.attach(looptrace.extract(incoming)),
        tracer().start_as_current_span("otel server side") as span,
    ):
        ctx = span.get_span_context()
        assert ctx.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
        assert looptrace.current_span().parent_span_id == 0xB7AD6B7169203331
        assert looptrace.current_span().parent_is_remote


@pytest.fixture
def reconfigured() -> Iterator[None]:
    yield
    looptrace.configure()  # back to the environment's configuration


@pytest.mark.usefixtures("reconfigured")
def test_sampled_out_and_disabled_give_non_recording_spans() -> None:
    looptrace.configure(sample_rate=0.0)
    t = tracer()
    with t.start_as_current_span("unsampled") as span:
        assert not span.is_recording()
        ctx = span.get_span_context()
        assert ctx.is_valid and not ctx.trace_flags.sampled
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        assert carrier["traceparent"].endswith("-00")
        with looptrace.span("child") as child:  # stays in the unsampled trace
            assert not child.is_recording and child.trace_id == ctx.trace_id
    looptrace.configure(disabled=True)
    assert t.start_span("off") is trace.INVALID_SPAN


def test_suppressed_tracing_records_nothing_through_either_api() -> None:
    """looptrace's own export runs under suppress_tracing(): spans of instrumented libraries
    (httpx included) are not recorded there, and instrumentations see OpenTelemetry's
    suppression key."""
    with looptrace.suppress_tracing():
        assert not tracer().start_span("hidden").is_recording()
        assert otel_context.get_value(otel_context._SUPPRESS_INSTRUMENTATION_KEY) is True


def test_uninstrumenting_stops_recording_and_unjoins_the_contexts() -> None:
    looptrace.uninstrument_opentelemetry()
    assert _state.bridge is None
    assert not tracer().start_span("after").is_recording()
    with looptrace.span("alone"):
        assert trace.get_current_span() is trace.INVALID_SPAN
    assert looptrace.instrument_opentelemetry() is True  # and back again: idempotent
    assert looptrace.instrument_opentelemetry() is True
    assert tracer().start_span("again").is_recording()


async def test_a_large_span_is_offloaded_with_its_scope(server: OtlpTestServer) -> None:
    """A span made through the API with a large attribute is serialized and sent by a worker
    process like any large span, and still arrives under its instrumentation scope."""
    install_pipeline(server, retry=FAST_RETRY, offload_threshold_bytes=256 * 1024)
    with tracer().start_as_current_span("big") as span:
        span.set_attribute("prompt", "x" * 1_000_000)
    assert (await looptrace.flush(30)).ok
    assert looptrace.statistics().offload.offloaded == 1
    got = by_name(server)["big"]
    assert got.scope == ("tests.bridge", "2.1")
    assert len(got.attributes["prompt"]) == 1_000_000


def test_an_installed_sdk_provider_is_left_alone_with_a_clear_warning(tmp_path: object) -> None:
    code = textwrap.dedent(
        """
        import warnings
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        import looptrace

        sdk = TracerProvider()
        trace.set_tracer_provider(sdk)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            print(looptrace.instrument_opentelemetry())
        print(trace.get_tracer_provider() is sdk)
        print(caught[0].category.__name__, "|", caught[0].message)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    changed, kept, warning = out.stdout.strip().split("\n")
    assert (changed, kept) == ("False", "True")
    assert warning.startswith("RuntimeWarning | ")
    assert "opentelemetry.sdk.trace.TracerProvider" in warning
    assert "looptrace.otel.SpanProcessor()" in warning


async def test_the_sdk_span_processor_hands_spans_to_looptrace(server: OtlpTestServer) -> None:
    """An application on the OpenTelemetry SDK adds looptrace's processor: its spans go out
    through looptrace's pipeline, nested with looptrace's own, scope and status intact."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    looptrace.uninstrument_opentelemetry()  # the SDK's provider, not looptrace's, makes spans
    install_pipeline(server, retry=FAST_RETRY)
    provider = TracerProvider()
    provider.add_span_processor(looptrace.otel.SpanProcessor())
    sdk_tracer = provider.get_tracer("sdk.scope", "0.9")

    @looptrace.traced(name="work")
    def work() -> None:
        with sdk_tracer.start_as_current_span("sdk inner", kind=SpanKind.SERVER) as s:
            s.set_attribute("k", "v")
            s.add_event("e")
            s.set_status(Status(StatusCode.ERROR, "nope"))

    with sdk_tracer.start_as_current_span("sdk outer"):
        work()
    unsampled = TracerProvider(sampler=ALWAYS_OFF)
    unsampled.add_span_processor(looptrace.otel.SpanProcessor())
    with unsampled.get_tracer("x").start_as_current_span("never sent"):
        pass
    assert provider.force_flush(5000)
    spans = by_name(server)
    assert set(spans) == {"sdk outer", "work", "sdk inner"}
    assert spans["work"].parent_id == spans["sdk outer"].span_id
    assert spans["sdk inner"].parent_id == spans["work"].span_id
    assert len({s.trace_id for s in spans.values()}) == 1
    inner = spans["sdk inner"]
    assert inner.scope == ("sdk.scope", "0.9")
    assert inner.span.kind == 2  # SERVER
    assert inner.attributes["k"] == "v"
    assert [e.name for e in inner.span.events] == ["e"]
    assert (inner.span.status.code, inner.span.status.message) == (2, "nope")
    assert spans["work"].scope == ("looptrace", looptrace.__version__)


def test_a_scoped_span_starts_exactly_as_a_span_does() -> None:
    """ScopedSpan writes out Span's constructor for speed: every field must match it."""
    from looptrace._capture.spans import ScopedSpan, Span

    args = ("n", 1, 2, 3, 4, {"a": 1}, "k=v", 2)
    plain, scoped = Span(*args), ScopedSpan(*args, ("scope", "1"), True)
    # pending_bytes is the export buffer's, set when the span ends.
    fields = [f for f in Span.__slots__ if f not in ("__weakref__", "pending_bytes")]
    assert {f: getattr(scoped, f) for f in fields} == {f: getattr(plain, f) for f in fields}
    assert (scoped.scope, scoped.parent_is_remote, plain.scope) == (("scope", "1"), True, None)


async def test_an_experiment_inside_an_opentelemetry_span_still_traces_each_case_alone(
    server: OtlpTestServer,
) -> None:
    """Experiments and cases start traces of their own whatever span is active, in either
    API; a span made through the OpenTelemetry API inside a case is the case's child."""
    install_pipeline(server, retry=FAST_RETRY)
    t = tracer()

    async def task(x: int) -> int:
        with t.start_as_current_span(f"model call {x}"):
            return x * 2

    with t.start_as_current_span("outer job") as outer:
        async with looptrace.experiment("doubling") as exp:
            await exp.run(task, [{"input": 1, "expected": 2}], scorers=[])
    assert exp.results[0].output == 2
    assert (await looptrace.flush(5)).ok
    spans = by_name(server)
    outer_trace = outer.get_span_context().trace_id
    (case,) = [s for s in spans.values() if s.attributes.get("looptrace.span.type") == "case"]
    assert case.trace_id != outer_trace and case.parent_id == 0
    call = spans["model call 1"]
    assert (call.trace_id, call.parent_id) == (case.trace_id, case.span_id)
    (experiment,) = [
        s for s in spans.values() if s.attributes.get("looptrace.span.type") == "experiment"
    ]
    assert experiment.trace_id != outer_trace
