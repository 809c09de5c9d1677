"""Capture: every kind of function becomes a span with the right name, parent, inputs, output
and status, and capture never changes what the user's code returns or raises."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import looptrace
from looptrace import StatusCode
from looptrace._capture.spans import UNSET
from looptrace.testing import SpanCapture, capture_spans


@looptrace.traced
def add(a: int, b: int = 2) -> int:
    return a + b


@looptrace.traced(name="custom", attributes={"team": "evals"})
async def fetch(url: str, *, retries: int = 0) -> dict[str, Any]:
    await asyncio.sleep(0)
    return {"url": url, "retries": retries}


@looptrace.traced
def count_up(n: int) -> Any:
    yield from range(n)
    return "done"


@looptrace.traced
async def acount(n: int) -> Any:
    for i in range(n):
        await asyncio.sleep(0)
        yield i


class Service:
    @looptrace.traced
    def method(self, x: int) -> int:
        return x + 1

    @looptrace.traced
    async def amethod(self, x: int) -> int:
        return x * 2

    @looptrace.traced
    @classmethod
    def make(cls, n: int) -> int:
        return n

    @looptrace.traced
    @staticmethod
    def helper(n: int) -> int:
        return -n


def test_sync_function_span_has_inputs_output_and_qualname() -> None:
    """A decorated sync function records its bound arguments (as passed) and return value."""
    with capture_spans() as spans:
        assert add(1, b=5) == 6
    s = spans.by_name("add")
    assert s.inputs == {"a": 1, "b": 5}
    assert s.output == 6
    assert s.parent_span_id == 0
    assert s.end_ns >= s.start_ns > 0
    assert s.status_code == StatusCode.UNSET
    assert s.site is not None and s.site.module == __name__


async def test_async_function_uses_custom_name_and_site_attributes() -> None:
    """``name=`` renames the span; decorator attributes travel on the call site, not per call."""
    with capture_spans() as spans:
        assert await fetch("u", retries=2) == {"url": "u", "retries": 2}
    s = spans.by_name("custom")
    assert s.inputs == {"url": "u", "retries": 2}
    assert s.site is not None and s.site.attributes == {"team": "evals"}


def test_generator_records_items_and_ends_when_exhausted() -> None:
    """A generator's span covers the whole iteration and keeps the yielded items and count."""
    with capture_spans() as spans:
        gen = count_up(3)
        assert spans == [] and next(gen) == 0
        assert list(gen) == [1, 2]
    s = spans.by_name("count_up")
    assert s.output == [0, 1, 2]
    assert s.attributes == {"looptrace.generator.items": 3}


def test_generator_closed_early_ends_span_without_error() -> None:
    """Closing a generator early ends its span, marked closed early, not failed."""
    with capture_spans() as spans:
        gen = count_up(10)
        next(gen)
        gen.close()
    s = spans.by_name("count_up")
    assert s.status_code == StatusCode.UNSET
    assert s.attributes is not None and s.attributes["looptrace.generator.closed_early"] is True
    assert s.output == [0]


def test_generator_garbage_collected_ends_span() -> None:
    """An abandoned, unfinished generator still ends its span when collected."""
    with capture_spans() as spans:
        gen = count_up(10)
        next(gen)
        del gen
        gc.collect()
    assert spans.by_name("count_up").end_ns > 0


def test_generator_keeps_only_the_first_n_items() -> None:
    """Output of a long generator is bounded to max_generator_items, the count is exact."""
    with capture_spans(max_generator_items=5) as spans:
        assert sum(count_up(1000)) == sum(range(1000))
    s = spans.by_name("count_up")
    assert s.output == [0, 1, 2, 3, 4]
    assert s.attributes is not None and s.attributes["looptrace.generator.items"] == 1000


def test_generator_send_and_throw_pass_through() -> None:
    """send() and throw() reach the wrapped generator unchanged."""

    @looptrace.traced
    def echo() -> Any:
        received = []
        try:
            while True:
                received.append((yield len(received)))
        except KeyError:
            yield received

    with capture_spans():
        gen = echo()
        assert next(gen) == 0
        assert gen.send("a") == 1
        assert gen.throw(KeyError("x")) == ["a"]


async def test_async_generator_records_items_and_parent() -> None:
    """An async generator is one span, parented to the caller's span, holding its items."""
    with capture_spans() as spans:
        async with looptrace.span("outer") as outer:
            assert [i async for i in acount(3)] == [0, 1, 2]
    s = spans.by_name("acount")
    assert s.output == [0, 1, 2]
    assert s.parent_span_id == outer.span_id


async def test_async_generator_aclose_early() -> None:
    """Closing an async generator early ends its span as closed early."""
    with capture_spans() as spans:
        agen = acount(10)
        assert await agen.__anext__() == 0
        await agen.aclose()
    s = spans.by_name("acount")
    assert s.attributes is not None and s.attributes["looptrace.generator.closed_early"] is True


async def test_methods_skip_self_and_cls() -> None:
    """Methods, classmethods and staticmethods are traced; self/cls are not recorded."""
    svc = Service()
    with capture_spans() as spans:
        assert svc.method(1) == 2
        assert await svc.amethod(2) == 4
        assert Service.make(3) == 3
        assert Service.helper(4) == -4
    assert spans.by_name("Service.method").inputs == {"x": 1}
    assert spans.by_name("Service.amethod").inputs == {"x": 2}
    assert spans.by_name("Service.make").inputs == {"n": 3}
    assert spans.by_name("Service.helper").inputs == {"n": 4}


def test_varargs_are_recorded_under_their_names() -> None:
    """*args and **kwargs land under their own names in the inputs."""

    @looptrace.traced
    def f(a: int, *rest: int, **options: Any) -> int:
        return a + sum(rest)

    with capture_spans() as spans:
        assert f(1, 2, 3, flag=True) == 6
    assert spans.by_name("test_varargs_are_recorded_under_their_names.<locals>.f").inputs == {
        "a": 1,
        "rest": (2, 3),
        "flag": True,
    }


def test_exception_is_recorded_and_reraised_untouched() -> None:
    """An exception leaves the function as the very same object; the span has status ERROR and
    an exception event holding it."""
    boom = ValueError("bad input")

    @looptrace.traced
    def fails() -> None:
        raise boom

    with capture_spans() as spans, pytest.raises(ValueError) as info:
        fails()
    assert info.value is boom
    s = spans[0]
    assert s.status_code == StatusCode.ERROR
    assert s.status_message == "ValueError: bad input"
    assert s.events is not None and s.events[0].name == "exception"
    assert s.exception is boom
    assert s.events[0].traceback is not None
    assert s.output is UNSET


async def test_cancellation_ends_span_cancelled_and_propagates() -> None:
    """A cancelled coroutine's span ends with a cancelled status and CancelledError propagates."""
    started = asyncio.Event()

    @looptrace.traced
    async def waits_forever() -> None:
        started.set()
        await asyncio.Event().wait()

    with capture_spans() as spans:
        task = asyncio.create_task(waits_forever())
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    s = spans[0]
    assert s.status_code == StatusCode.ERROR and s.status_message == "cancelled"
    assert s.attributes is not None and s.attributes["looptrace.cancelled"] is True


async def test_parenting_through_gather_create_task_and_taskgroup() -> None:
    """Spans started in tasks (gather, create_task, TaskGroup) are children of the span that
    created the tasks."""

    @looptrace.traced
    async def leaf(i: int) -> int:
        await asyncio.sleep(0)
        return i

    with capture_spans() as spans:
        async with looptrace.span("root") as root:
            await asyncio.gather(leaf(1), leaf(2))
            await asyncio.create_task(leaf(3))
            if hasattr(asyncio, "TaskGroup"):
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(leaf(4))
    leaves = [s for s in spans if s.name.endswith("leaf")]
    assert len(leaves) == (4 if hasattr(asyncio, "TaskGroup") else 3)
    assert {s.parent_span_id for s in leaves} == {root.span_id}
    assert {s.trace_id for s in spans} == {root.trace_id}


async def test_parenting_through_to_thread_and_executor_helper() -> None:
    """asyncio.to_thread keeps the parent; run_in_executor and plain threads keep it with
    bind_context."""

    @looptrace.traced
    def work(i: int) -> int:
        return i

    with capture_spans() as spans:
        async with looptrace.span("root") as root:
            await asyncio.to_thread(work, 1)
            loop = asyncio.get_running_loop()
            with ThreadPoolExecutor(2) as pool:
                await loop.run_in_executor(pool, looptrace.bind_context(work), 2)
            t = threading.Thread(target=looptrace.bind_context(work), args=(3,))
            t.start()
            t.join()
    works = [s for s in spans if s.name.endswith("work")]
    assert sorted(s.inputs["i"] for s in works) == [1, 2, 3]
    assert {s.parent_span_id for s in works} == {root.span_id}


def test_bind_context_wrapper_can_run_in_two_threads_at_once() -> None:
    """One bound callable used from several threads concurrently does not fail (each call gets
    its own copy of the context)."""
    barrier = threading.Barrier(2)

    def work() -> int:
        barrier.wait(timeout=5)
        return looptrace.current_span().span_id

    with capture_spans(), looptrace.span("root") as root:
        bound = looptrace.bind_context(work)
        with ThreadPoolExecutor(2) as pool:
            results = list(pool.map(lambda _: bound(), range(2)))
    assert results == [root.span_id, root.span_id]


def test_span_context_manager_sets_attributes_events_and_status() -> None:
    """``with looptrace.span()`` yields a span the block can annotate; it is current inside."""
    with capture_spans() as spans:
        with looptrace.span("step", attributes={"a": 1}) as s:
            assert looptrace.current_span() is s
            s.set_attribute("b", 2)
            s.set_inputs({"q": "hi"})
            s.set_output("answer")
            s.add_event("checkpoint", {"n": 1})
            s.set_status(StatusCode.OK)
        assert not looptrace.current_span().is_recording
    (s,) = spans
    assert s.attributes == {"a": 1, "b": 2}
    assert (s.inputs, s.output) == ({"q": "hi"}, "answer")
    assert s.events is not None and s.events[0].name == "checkpoint"
    assert s.status_code == StatusCode.OK


def test_span_is_frozen_after_end() -> None:
    """Once ended, a span ignores further changes and a second end()."""
    with capture_spans() as spans:
        with looptrace.span("step") as s:
            pass
        end = s.end_ns
        s.set_attribute("late", 1)
        s.end()
    assert spans[0].attributes is None and spans[0].end_ns == end and len(spans) == 1


def test_exception_in_span_block_is_recorded_and_propagates() -> None:
    """An exception leaving a span block fails the span and is re-raised."""
    with capture_spans() as spans, pytest.raises(KeyError), looptrace.span("step"):
        raise KeyError("k")
    assert spans[0].status_code == StatusCode.ERROR


def test_span_block_left_in_another_context_still_ends() -> None:
    """A generator suspended inside a span block and resumed in another context (a task's
    copy, say) leaves the block there: the span still ends, with nothing raised into the
    generator, and that context is left with no active span."""

    def steps() -> Any:
        with looptrace.span("step"):
            yield
            yield

    with capture_spans() as spans, looptrace.span("outer") as outer:
        gen = steps()
        next(gen)  # the block begins here, under "outer"
        other = contextvars.Context()
        other.run(next, gen)
        with pytest.raises(StopIteration):
            other.run(next, gen)  # ... and ends in a context that never entered it
        assert other.run(looptrace.current_span).is_recording is False
    assert [s.name for s in spans] == ["step", "outer"]
    assert spans[0].parent_span_id == outer.span_id


def test_current_span_outside_any_span_is_non_recording() -> None:
    """With no active span, current_span() is a harmless non-recording span."""
    s = looptrace.current_span()
    assert not s.is_recording
    s.set_attribute("x", 1)
    s.end()


def test_sampling_keeps_or_drops_whole_traces() -> None:
    """With a 50% rate about half the traces are kept, and a kept trace is kept whole."""

    @looptrace.traced
    def child() -> None:
        pass

    @looptrace.traced
    def parent() -> None:
        child()
        child()

    with capture_spans(sample_rate=0.5) as spans:
        for _ in range(400):
            parent()
    per_trace: dict[int, int] = {}
    for s in spans:
        per_trace[s.trace_id] = per_trace.get(s.trace_id, 0) + 1
    assert set(per_trace.values()) == {3}
    assert 120 < len(per_trace) < 280


def test_sampling_zero_records_nothing_but_keeps_context() -> None:
    """An unsampled trace records no span, yet inject() still names the trace (sampled=0)."""
    with capture_spans(sample_rate=0.0) as spans, looptrace.span("root"):
        headers = looptrace.inject()
        assert add(1) == 3
    assert spans == []
    assert headers["traceparent"].endswith("-00")


def test_disabled_costs_nothing_and_records_nothing() -> None:
    """With disabled=True decorated functions run unchanged and no span is made."""
    with capture_spans(disabled=True) as spans:
        assert add(2) == 4
        assert list(count_up(2)) == [0, 1]
        with looptrace.span("block") as s:
            assert not s.is_recording
    assert spans == []


def test_capture_inputs_and_outputs_can_be_turned_off() -> None:
    """capture_inputs=False / capture_output=False keep values out of the span, globally or
    per decorator."""

    @looptrace.traced(capture_inputs=False, capture_output=False)
    def secret(password: str) -> str:
        return password[::-1]

    with capture_spans() as spans:
        secret("hunter2")
    assert spans[0].inputs is UNSET and spans[0].output is UNSET
    with capture_spans(capture_inputs=False) as spans2:
        add(1)
    assert spans2[0].inputs is UNSET and spans2[0].output == 3


def test_traceparent_inject_extract_round_trip() -> None:
    """inject() writes a W3C traceparent that extract() reads back; a remote parent continues
    the trace."""
    with capture_spans() as spans:
        with looptrace.span("client") as client:
            carrier = looptrace.inject({})
        ctx = looptrace.extract(carrier)
        assert ctx is not None and ctx.is_remote
        assert (ctx.trace_id, ctx.span_id, ctx.sampled) == (client.trace_id, client.span_id, True)
        with looptrace.span("server", parent=ctx) as server:
            add(1)
        with looptrace.attach(ctx):
            add(2)
    assert server.trace_id == client.trace_id and server.parent_span_id == client.span_id
    assert server.parent_is_remote and not client.parent_is_remote
    adds = [s for s in spans if s.name == "add"]
    assert adds[0].parent_span_id == server.span_id
    assert adds[1].parent_span_id == client.span_id and adds[1].trace_id == client.trace_id


@pytest.mark.parametrize(
    "header",
    [
        "",
        "garbage",
        "00-00000000000000000000000000000000-0000000000000001-01",
        "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
        "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
    ],
)
def test_extract_rejects_malformed_traceparent(header: str) -> None:
    """Invalid traceparent headers are ignored (None), never an exception."""
    assert looptrace.extract({"traceparent": header}) is None


def test_extract_reads_tracestate_and_unsampled_flag() -> None:
    """The sampled flag and tracestate of an incoming header are kept; unsampled is respected."""
    ctx = looptrace.extract(
        {
            "Traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00",
            "tracestate": "vendor=x",
        }
    )
    assert ctx is not None and not ctx.sampled and ctx.trace_state == "vendor=x"
    with capture_spans() as spans, looptrace.span("server", parent=ctx):
        add(1)
    assert spans == []


def test_deterministic_ids_and_clock() -> None:
    """capture_spans(deterministic=True) gives the same ids and times on every run."""

    def run() -> list[tuple[int, int, int, int]]:
        with capture_spans(deterministic=True) as spans:
            add(1)
            add(2)
        return [(s.trace_id, s.span_id, s.start_ns, s.end_ns) for s in spans]

    assert run() == run()
    assert run()[0][:2] == (1, 1)


@pytest.mark.internal_errors
def test_internal_error_in_sink_never_reaches_user_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """If the sink fails, the traced call still returns normally (and the error is counted)."""
    import looptrace._errors as errors
    import looptrace._state as st

    class Broken:
        def on_start(self, span: Any) -> None:
            raise RuntimeError("sink start")

        def on_end(self, span: Any) -> None:
            raise RuntimeError("sink end")

    monkeypatch.setattr(errors, "raise_internal_errors", False)
    before = errors.counts["span.end"]
    with capture_spans():
        monkeypatch.setattr(st, "sink", Broken())
        assert add(1) == 3
    assert errors.counts["span.end"] == before + 1


def test_context_is_restored_after_each_kind_of_call() -> None:
    """After any traced call returns or raises, the active span is what it was before."""

    @looptrace.traced
    def raises() -> None:
        raise RuntimeError

    with capture_spans(), looptrace.span("root") as root:
        add(1)
        list(count_up(2))
        with pytest.raises(RuntimeError):
            raises()
        assert looptrace.current_span() is root


def test_spans_from_copied_context_do_not_leak_between_tasks() -> None:
    """A span opened in one context is invisible in a sibling context."""
    seen: list[bool] = []
    with capture_spans():

        def inner() -> None:
            seen.append(looptrace.current_span().is_recording)

        with looptrace.span("a"):
            ctx = contextvars.copy_context()
        ctx.run(inner)
        contextvars.Context().run(inner)
    assert seen == [True, False]


def test_span_capture_tree_helper() -> None:
    """SpanCapture.tree() lists spans depth-first by start time (pins the helper users rely on)."""
    with capture_spans() as spans, looptrace.span("a"):
        with looptrace.span("b"):
            add(1)
        with looptrace.span("c"):
            pass
    assert isinstance(spans, SpanCapture)
    assert spans.tree() == [(0, "a"), (1, "b"), (2, "add"), (1, "c")]


def test_inputs_are_snapshotted_against_later_appends() -> None:
    """A list the caller mutates after the call is recorded as it was at call time (top level);
    a large list is kept by reference (documented cost bound)."""

    @looptrace.traced
    def chat(messages: list[str], options: dict[str, int]) -> int:
        return len(messages)

    history = ["hi"]
    opts = {"n": 1}
    big = list(range(1000))
    with capture_spans() as spans:
        chat(history, opts)
        history.append("reply")
        opts["n"] = 2
        chat(big, {})
        big.append(-1)
    assert spans[0].inputs == {"messages": ["hi"], "options": {"n": 1}}
    assert spans[1].inputs["messages"] is big


def test_capture_fills_live_inside_the_block() -> None:
    """Spans appear in the capture as soon as they end, not only when the block exits."""
    with capture_spans() as spans:
        add(1)
        assert spans.names() == ["add"]
        add(2)
        assert len(spans) == 2


def test_inputs_are_bound_the_same_on_every_call_shape() -> None:
    """One parameter, positional or keyword, keyword-only, extra positionals and a method:
    each call shape records the same names and values."""

    @looptrace.traced
    def one(x: int) -> int:
        return x

    @looptrace.traced
    def kwonly(a: int, *, b: int = 0) -> int:
        return a + b

    @looptrace.traced
    def none() -> int:
        return 0

    with capture_spans() as spans:
        one(1)
        one(x=2)
        kwonly(1)
        kwonly(1, b=2)
        none()
        Service().method(5)
        Service().method(x=6)
    assert [s.inputs for s in spans] == [
        {"x": 1},
        {"x": 2},
        {"a": 1},
        {"a": 1, "b": 2},
        {},
        {"x": 5},
        {"x": 6},
    ]


def test_decorating_does_the_start_up_so_the_first_call_does_not() -> None:
    """``@traced`` prepares the export path when it decorates (mostly at import time): the
    export modules are loaded and the redaction patterns built before any call, so the first
    traced call does not pay for them on the caller's loop; no settings are applied yet."""
    import subprocess
    import sys

    code = (
        "import sys, looptrace\n"
        "from looptrace import _state\n"
        "@looptrace.traced\n"
        "def f():\n"
        "    return 1\n"
        "from looptrace import _serialize\n"
        "from looptrace._config import Config\n"
        "print('looptrace._otlp.span_encoder' in sys.modules, _serialize.has_policy(Config.from_env()),\n"
        "      _state.config is None)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOOPTRACE_", "OTEL_"))}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True", "True"]


@pytest.mark.parametrize("destination", ["store", "endpoint"])
def test_the_first_traced_call_imports_nothing(destination: str, tmp_path: Path) -> None:
    """Once a function is decorated, its first call on a running loop loads no module: the
    exporter for the configured destination (OTLP with httpx, or the local store with
    sqlite3) was imported when the decorator prepared the export path, not in the call
    that builds the pipeline (where it cost 4-7 ms of the caller's loop)."""
    import subprocess
    import sys

    code = (
        "import asyncio, os, sys, looptrace\n"
        "@looptrace.traced\n"
        "async def f(x):\n"
        "    return x\n"
        "async def main():\n"
        "    before = set(sys.modules)\n"
        "    await f({'a': 1})\n"
        "    print(sorted(set(sys.modules) - before), flush=True)\n"
        "asyncio.run(main())\n"
        "os._exit(0)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOOPTRACE_", "OTEL_"))}
    if destination == "store":
        env["LOOPTRACE_STORE"] = str(tmp_path / "first.db")
    else:
        env["LOOPTRACE_ENDPOINT"] = "http://127.0.0.1:9/v1/traces"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


async def test_looptrace_code_that_blocks_the_loop_fails_a_test() -> None:
    """The blocking-call detector (conftest) is on for capture's tests: a blocking call made
    from looptrace's code while the application's loop runs raises instead of passing."""
    from blockbuster import BlockingError

    from looptrace import _clock

    planted = compile("import time\ntime.sleep(0)\n", _clock.__file__ or "", "exec")
    with pytest.raises(BlockingError):
        exec(planted, {})
