"""Evaluations: experiments, cases, scores, concurrency, cancellation, flushing and backpressure."""

from __future__ import annotations

import asyncio
import io
import statistics
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
import orjson
import pytest

import looptrace
from looptrace import _semconv as sc
from looptrace._capture.spans import UNSET
from looptrace.evals import Score, _tokens
from looptrace.testing import SpanCapture, capture_spans
from otlp_server import OtlpTestServer


def _cases(spans: SpanCapture) -> dict[int, looptrace.Span]:
    return {
        s.attributes[sc.CASE_INDEX]: s
        for s in spans
        if s.attributes and s.attributes.get(sc.SPAN_TYPE) == sc.SPAN_TYPE_CASE
    }


def _experiment_span(spans: SpanCapture) -> looptrace.Span:
    found = [
        s
        for s in spans
        if s.attributes and s.attributes.get(sc.SPAN_TYPE) == sc.SPAN_TYPE_EXPERIMENT
    ]
    assert len(found) == 1
    return found[0]


@looptrace.traced
async def _double(x: int) -> int:
    await anyio.lowlevel.checkpoint()
    return x * 2


async def _task(x: int) -> int:
    if x == 3:
        raise ValueError("no threes")
    return await _double(x)


def _exact(output: Any, expected: Any) -> bool:
    return bool(output == expected)


async def _closeness(input: Any, output: Any, expected: Any) -> Score:
    await anyio.lowlevel.checkpoint()
    return Score("", 1.0 / (1 + abs(output - expected)), comment=f"input {input}")


def _parts(output: Any, expected: Any) -> dict[str, float]:
    return {"even": float(output % 2 == 0), "big": float(output > 4)}


def _broken(output: Any) -> float:
    if output == 8:
        raise RuntimeError("scorer broke")
    return 0.5


async def test_scores_and_errors_land_on_their_cases() -> None:
    """Each case's scores (bool, Score with comment, dict of named scores) and errors (task,
    scorer) are on that case's result and its root span, and nowhere else."""
    dataset = [{"input": i, "expected": i * 2 + (1 if i == 1 else 0)} for i in range(5)]
    with capture_spans() as spans:
        async with looptrace.experiment("scores", quiet=True) as exp:
            results = await exp.run(
                _task, dataset, scorers=[_exact, _closeness, _parts, _broken], concurrency=2
            )
    assert [r.index for r in results] == [0, 1, 2, 3, 4]
    assert results == exp.results
    by_index = {r.index: r for r in results}
    cases = _cases(spans)
    assert sorted(cases) == [0, 1, 2, 3, 4]
    for i, r in by_index.items():
        span = cases[i]
        assert span.attributes is not None
        assert span.attributes[sc.EXPECTED_VALUE] == dataset[i]["expected"]
        assert span.inputs == i
        if i == 3:
            assert r.error == "ValueError: no threes"
            assert r.scores == {}
            assert span.attributes[sc.CASE_ERROR] == "ValueError: no threes"
            assert span.status_code == looptrace.StatusCode.ERROR
            assert not any(k.startswith(sc.SCORE_PREFIX) for k in span.attributes)
            continue
        output = i * 2
        assert r.error is None
        assert r.output == output
        assert span.output == output
        expected = dataset[i]["expected"]
        assert r.scores["_exact"].value == (1.0 if output == expected else 0.0)
        assert r.scores["_closeness"].value == pytest.approx(1 / (1 + abs(output - expected)))
        assert r.scores["_closeness"].comment == f"input {i}"
        assert r.scores["even"].value == 1.0
        assert r.scores["big"].value == float(output > 4)
        for name, score in r.scores.items():
            assert span.attributes[sc.SCORE_PREFIX + name] == score.value
        assert span.attributes[sc.SCORE_PREFIX + "_closeness" + sc.SCORE_COMMENT_SUFFIX] == (
            f"input {i}"
        )
        assert sc.CASE_ERROR not in span.attributes
        if i == 4:
            assert r.scorer_errors == {"_broken": "RuntimeError: scorer broke"}
            assert "_broken" not in r.scores
            assert span.attributes[sc.SCORER_ERROR_PREFIX + "_broken"] == (
                "RuntimeError: scorer broke"
            )
            assert span.status_code == looptrace.StatusCode.ERROR
            assert isinstance(span.exception, RuntimeError)
        else:
            assert r.scorer_errors == {}
            assert r.scores["_broken"].value == 0.5
            assert span.status_code == looptrace.StatusCode.UNSET
    summary = exp.summary()
    assert (summary.cases, summary.errors, summary.scorer_errors) == (5, 1, 1)
    exact = [r.scores["_exact"].value for r in results if "_exact" in r.scores]
    assert summary.scores["_exact"].count == len(exact) == 4
    assert summary.scores["_exact"].mean == pytest.approx(statistics.fmean(exact))
    assert summary.scores["_exact"].stdev == pytest.approx(statistics.pstdev(exact))


async def test_token_usage_is_summed_per_case_and_in_the_summary() -> None:
    """The gen_ai.usage.* attributes of the spans in a case's trace add up on the case (result
    and root span) and over the experiment; spans outside any case are not counted."""

    async def task(n: int) -> int:
        for _ in range(n):
            with looptrace.span("llm") as s:
                s.set_attribute("gen_ai.usage.input_tokens", 10)
                s.set_attribute("gen_ai.usage.output_tokens", 3)
        return n

    with capture_spans() as spans:
        with looptrace.span("outside") as s:
            s.set_attribute("gen_ai.usage.input_tokens", 1000)
        async with looptrace.experiment("tokens", quiet=True) as exp:
            results = await exp.run(task, [0, 1, 2], concurrency=3)
    assert [(r.input_tokens, r.output_tokens) for r in results] == [(0, 0), (10, 3), (20, 6)]
    summary = exp.summary()
    assert (summary.input_tokens, summary.output_tokens) == (30, 9)
    assert "tokens in 30  out 9" in summary.format()
    cases = _cases(spans)
    assert cases[2].attributes is not None
    assert cases[2].attributes[sc.CASE_INPUT_TOKENS] == 20
    assert cases[2].attributes[sc.CASE_OUTPUT_TOKENS] == 6
    assert sc.CASE_INPUT_TOKENS not in (cases[0].attributes or {})
    from looptrace import _state

    assert _tokens._count_tokens not in _state.end_hooks  # removed once no case runs


async def test_case_traces_link_to_the_experiment_and_hold_the_task_spans() -> None:
    """Each case is a trace of its own, linked to the experiment span, carrying the experiment
    id; the task's spans nest under the case root; the experiment span has its own facts."""
    with capture_spans() as spans:
        async with looptrace.experiment(
            "linked", metadata={"model": "m1"}, tags=["nightly"], quiet=True
        ) as exp:
            await exp.run(_task, [{"input": 1, "expected": 2, "metadata": {"src": "a"}}, 2])
    root = _experiment_span(spans)
    assert root.parent_span_id == 0
    assert root.name == "linked"
    assert exp.id == f"{root.trace_id:032x}"
    assert root.attributes is not None
    assert root.attributes[sc.EXPERIMENT_ID] == exp.id
    assert root.attributes[sc.EXPERIMENT_NAME] == "linked"
    assert root.attributes[sc.EXPERIMENT_METADATA] == {"model": "m1"}
    assert root.attributes[sc.EXPERIMENT_TAGS] == ["nightly"]
    assert root.attributes[sc.EXPERIMENT_CASES] == 2
    assert root.attributes[sc.EXPERIMENT_ERRORS] == 0
    cases = _cases(spans)
    assert len({c.trace_id for c in cases.values()} | {root.trace_id}) == 3
    for index, case in cases.items():
        assert case.parent_span_id == 0
        assert case.links is not None
        assert [link.context for link in case.links] == [root.context]
        assert case.attributes is not None
        assert case.attributes[sc.EXPERIMENT_ID] == exp.id
        assert case.attributes[sc.CASE_REPETITION] == 0
        assert case.attributes[sc.CASE_DURATION_MS] >= 0
        (child,) = spans.children(case)
        assert child.name == "_double"
        assert child.inputs == {"x": case.inputs}
        assert exp.results[index].trace_id == f"{case.trace_id:032x}"
    assert cases[0].attributes is not None
    assert cases[0].attributes[sc.CASE_METADATA] == {"src": "a"}
    # A plain item is the input itself.
    assert cases[1].inputs == 2
    assert sc.EXPECTED_VALUE not in (cases[1].attributes or {})


async def test_the_experiment_is_a_root_even_inside_a_span() -> None:
    """Opening an experiment under an active span still starts a new trace, and spans made in
    the block outside any case nest under the experiment span."""
    with capture_spans() as spans, looptrace.span("outer") as outer:
        async with looptrace.experiment("nested", quiet=True) as exp:
            with looptrace.span("setup"):
                pass
        assert looptrace.current_span() is outer
    root = _experiment_span(spans)
    assert root.parent_span_id == 0
    assert root.trace_id != outer.trace_id
    assert spans.by_name("setup").parent_span_id == root.span_id
    assert exp.id == f"{root.trace_id:032x}"


async def test_concurrency_is_respected() -> None:
    """Never more than ``concurrency`` cases run at once, and the limit is actually used."""
    active = 0
    peak = 0

    async def task(x: int) -> int:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        try:
            for _ in range(5):
                await anyio.lowlevel.checkpoint()
        finally:
            active -= 1
        return x

    with capture_spans():
        async with looptrace.experiment("limits", quiet=True) as exp:
            results = await exp.run(task, range(20), concurrency=3)
    assert peak == 3
    assert [r.output for r in results] == list(range(20))


async def test_repetitions_and_timeout() -> None:
    """Every case runs ``repetitions`` times as separate traces; a task past ``timeout`` is
    recorded as a timeout on its case and the others finish."""
    release = anyio.Event()

    async def task(x: int) -> int:
        if x == 1:
            await release.wait()  # never set: only the timeout ends it
        return x

    with capture_spans() as spans:
        async with looptrace.experiment("reps", quiet=True) as exp:
            results = await exp.run(task, [0, 1, 2], repetitions=2, timeout=0.05)
    assert [(r.index, r.repetition) for r in results] == [
        (i, k) for i in range(3) for k in range(2)
    ]
    assert [r.error for r in results if r.index == 1] == [
        "TimeoutError: the task took longer than 0.05 s"
    ] * 2
    assert all(r.error is None for r in results if r.index != 1)
    case_spans = [s for s in spans if (s.attributes or {}).get(sc.SPAN_TYPE) == sc.SPAN_TYPE_CASE]
    assert len({s.trace_id for s in case_spans}) == 6
    assert sorted((s.attributes or {})[sc.CASE_REPETITION] for s in case_spans) == [
        0,
        0,
        0,
        1,
        1,
        1,
    ]


async def test_dataset_forms(tmp_path: Path) -> None:
    """A JSONL path, an async iterable and a generator all work as datasets, in order."""
    path = tmp_path / "cases.jsonl"
    rows = [{"input": i, "expected": i * 2} for i in range(3)]
    path.write_bytes(b"\n".join(orjson.dumps(r) for r in rows) + b"\n\n")

    async def agen() -> AsyncIterator[dict[str, int]]:
        for r in rows:
            await anyio.lowlevel.checkpoint()
            yield r

    async def task(x: int) -> int:
        return x * 2

    with capture_spans():
        async with looptrace.experiment("forms", quiet=True) as exp:
            from_file = await exp.run(task, path, scorers=[_exact])
            from_str = await exp.run(task, str(path), scorers=[_exact])
            from_async = await exp.run(task, agen(), scorers=[_exact])
            from_gen = await exp.run(task, (r for r in rows), scorers=[_exact])
    for run in (from_file, from_str, from_async, from_gen):
        assert [(r.input, r.expected, r.output) for r in run] == [
            (i, i * 2, i * 2) for i in range(3)
        ]
        assert all(r.scores["_exact"].value == 1.0 for r in run)
    # Indices stay unique across runs of one experiment.
    assert len({r.index for r in exp.results}) == 12


async def test_bad_jsonl_line_is_reported_with_its_number(tmp_path: Path) -> None:
    """A JSONL file with a broken line fails the run before any case, naming the line."""
    path = tmp_path / "bad.jsonl"
    path.write_text('{"input": 1}\n{oops\n')
    with capture_spans():
        async with looptrace.experiment("bad", quiet=True) as exp:
            with pytest.raises(ValueError, match=r"bad\.jsonl:2"):
                await exp.run(_task, path)
    assert exp.results == []


async def test_sync_task_runs_off_the_loop_with_its_spans_nested() -> None:
    """A plain-function task runs in a worker thread, and its traced calls nest under the case."""
    import threading

    loop_thread = threading.get_ident()
    threads: set[int] = set()

    @looptrace.traced
    def work(x: int) -> int:
        threads.add(threading.get_ident())
        return x + 1

    with capture_spans() as spans:
        async with looptrace.experiment("sync", quiet=True) as exp:
            await exp.run(work, [1, 2])
    assert loop_thread not in threads
    assert [r.output for r in exp.results] == [2, 3]
    for case in _cases(spans).values():
        assert [c.name for c in spans.children(case)] == [work.__qualname__]


async def test_manual_case_records_output_scores_and_swallows_errors() -> None:
    """The manual form records output and scores; an exception in the block goes on the case
    and the loop continues."""
    with capture_spans() as spans:
        async with looptrace.experiment("manual", quiet=True) as exp:
            for i in range(3):
                async with exp.case(input=i, expected=i) as case:
                    if i == 1:
                        raise KeyError("missing")
                    case.output = await _double(i)
                    case.score("exact", case.output == case.expected)
                    case.score("half", 0.5, comment="why")
    results = exp.results
    assert [r.error for r in results] == [None, "KeyError: 'missing'", None]
    assert results[0].scores["exact"].value == 1.0
    assert results[2].scores["exact"].value == 0.0
    assert results[2].scores["half"] == Score("half", 0.5, "why")
    cases = _cases(spans)
    assert cases[2].attributes is not None
    assert cases[2].attributes[sc.SCORE_PREFIX + "half.comment"] == "why"
    assert cases[1].status_code == looptrace.StatusCode.ERROR
    # The task's span, then one evaluation span per score.
    assert [c.name for c in spans.children(cases[0])] == [
        "_double",
        "evaluation exact",
        "evaluation half",
    ]


async def test_manual_case_lets_cancellation_through() -> None:
    """Cancelling inside a manual case cancels (it is not swallowed) and marks the case."""
    with capture_spans() as spans:
        async with looptrace.experiment("manual-cancel", quiet=True) as exp:
            with anyio.move_on_after(0.01):
                async with exp.case(input=1):
                    await anyio.sleep_forever()
    (result,) = exp.results
    assert result.error == "cancelled"
    assert (_cases(spans)[0].attributes or {})[sc.CANCELLED] is True


async def test_cancelling_the_block_cancels_cases() -> None:
    """Cancelling the task that runs the experiment cancels its running cases, ends every span
    (cases marked cancelled) and still closes the experiment."""
    started = 0
    both = asyncio.Event()

    async def task(x: int) -> int:
        nonlocal started
        started += 1
        if started == 2:
            both.set()
        await anyio.sleep_forever()
        return x

    exp = looptrace.experiment("cancel", quiet=True)

    async def body() -> None:
        async with exp:
            await exp.run(task, range(10), concurrency=2)

    with capture_spans() as spans:
        runner = asyncio.create_task(body())
        await asyncio.wait_for(both.wait(), 5)
        runner.cancel()
        with pytest.raises(asyncio.CancelledError):
            await runner
    assert started == 2
    assert [r.error for r in exp.results] == ["cancelled", "cancelled"]
    cases = _cases(spans)
    assert len(cases) == 2
    assert all((c.attributes or {}).get(sc.CANCELLED) is True and c.end_ns for c in cases.values())
    root = _experiment_span(spans)
    assert root.end_ns
    assert (root.attributes or {}).get(sc.CANCELLED) is True


async def test_summary_numbers_follow_the_results() -> None:
    """Latency percentiles and score spread are computed from the per-case results."""
    with capture_spans():
        async with looptrace.experiment("stats", quiet=True) as exp:
            for i in range(10):
                async with exp.case(input=i) as case:
                    case.output = i
                    case.score("value", i / 10)
    summary = exp.summary()
    durations = sorted(r.duration_ms for r in exp.results)
    assert summary.latency_p50_ms == pytest.approx(statistics.median(durations))
    assert summary.latency_p95_ms is not None
    assert durations[-2] <= summary.latency_p95_ms <= durations[-1]
    values = [i / 10 for i in range(10)]
    s = summary.scores["value"]
    assert (s.count, s.min, s.max) == (10, 0.0, 0.9)
    assert s.mean == pytest.approx(statistics.fmean(values))
    assert s.stdev == pytest.approx(statistics.pstdev(values))
    assert summary.name == "stats"
    assert summary.id == exp.id
    assert summary.wall_s > 0


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


async def test_progress_on_a_terminal_and_summary_on_exit() -> None:
    """On a terminal a one-line bar is drawn while cases run and the summary is printed when the
    block ends; ``quiet`` prints nothing; a non-terminal gets the summary but no bar."""
    tty = _Tty()
    with capture_spans():
        async with looptrace.experiment("shown", stream=tty) as exp:
            await exp.run(_task, range(5), scorers=[_broken])
    text = tty.getvalue()
    assert "\rshown [####################] 5/5  errors 1" in text
    assert text.endswith(exp.summary().format() + "\n")
    assert "_broken" in text
    assert "cases 5  errors 1  scorer errors 1" in text

    plain = io.StringIO()
    with capture_spans():
        async with looptrace.experiment("plain", stream=plain) as exp2:
            await exp2.run(_task, range(2))
    assert "\r" not in plain.getvalue()
    assert plain.getvalue() == exp2.summary().format() + "\n"

    silent = _Tty()
    with capture_spans():
        async with looptrace.experiment("silent", stream=silent, quiet=True) as exp3:
            await exp3.run(_task, range(2))
    assert silent.getvalue() == ""


async def test_misuse_is_reported() -> None:
    """Running outside the block, bad arguments and re-entering raise clear errors."""
    exp = looptrace.experiment("misuse", quiet=True)
    with pytest.raises(looptrace.LoopTraceError):
        await exp.run(_task, [1])
    with pytest.raises(looptrace.LoopTraceError):
        _ = exp.id
    with capture_spans():
        async with exp:
            with pytest.raises(ValueError, match="concurrency"):
                await exp.run(_task, [1], concurrency=0)
            with pytest.raises(ValueError, match="repetitions"):
                await exp.run(_task, [1], repetitions=0)
        with pytest.raises(looptrace.LoopTraceError):
            async with exp:
                pass
        with pytest.raises(looptrace.LoopTraceError):
            exp.case(input=1)


async def test_disabled_tracing_still_runs_and_scores() -> None:
    """With tracing disabled the experiment runs, scores and summarizes, recording no span."""
    with capture_spans() as spans:
        looptrace._state.disabled = True
        try:
            async with looptrace.experiment("off", quiet=True) as exp:
                await exp.run(_task, [{"input": 1, "expected": 2}], scorers=[_exact])
        finally:
            looptrace._state.disabled = False
    assert list(spans) == []
    assert exp.results[0].scores["_exact"].value == 1.0
    assert len(exp.id) == 32
    assert int(exp.id, 16) != 0


def test_trio_backend() -> None:
    """The same experiment runs under trio (through anyio), concurrency limit included."""
    active = 0
    peak = 0

    async def task(x: int) -> int:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await anyio.lowlevel.checkpoint()
        await anyio.lowlevel.checkpoint()
        active -= 1
        return await _double(x)

    async def main() -> looptrace.Experiment:
        async with looptrace.experiment("trio", quiet=True) as exp:
            await exp.run(
                task, [{"input": i, "expected": i * 2} for i in range(6)], [_exact], concurrency=2
            )
        return exp

    with capture_spans() as spans:
        exp = anyio.run(main, backend="trio")
    assert peak == 2
    assert [r.scores["_exact"].value for r in exp.results] == [1.0] * 6
    for case in _cases(spans).values():
        assert [c.name for c in spans.children(case)] == ["_double", "evaluation _exact"]


def test_run_experiment_from_sync_code() -> None:
    """``run_experiment`` runs the whole experiment from sync code and returns it closed."""
    with capture_spans() as spans:
        exp = looptrace.run_experiment(
            "sync-entry",
            _task,
            [{"input": i, "expected": i * 2} for i in range(4)],
            [_exact],
            concurrency=2,
            quiet=True,
        )
    summary = exp.summary()
    assert (summary.cases, summary.errors) == (4, 1)
    assert summary.scores["_exact"].mean == 1.0
    assert len(_cases(spans)) == 4


async def test_run_experiment_refuses_a_running_loop() -> None:
    """Calling the blocking entry point from async code says what to use instead."""
    with pytest.raises(looptrace.LoopTraceError, match="async with"):
        looptrace.run_experiment("nope", _task, [1], quiet=True)


# ---------------------------------------------------------------------------------------------
# Against a real OTLP server: no flush per case, slow backends, backpressure, final flush
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def server() -> Iterator[OtlpTestServer]:
    """A local OTLP server; released at the end so no request is left hanging."""
    with OtlpTestServer() as srv:
        yield srv
        srv.release()


async def _wait_until(condition: Callable[[], bool], limit: float = 5.0) -> None:
    with anyio.fail_after(limit):
        while not condition():
            await anyio.sleep(0.005)


async def test_spans_flow_without_a_flush_per_case(server: OtlpTestServer) -> None:
    """Case spans go out in a few batched requests, not one per case, all delivered, and the
    summary counts what was sent."""
    looptrace.configure(endpoint=server.url, flush_interval=5.0)
    async with looptrace.experiment("batched", quiet=True) as exp:
        await exp.run(_task, range(30), scorers=[_exact], concurrency=4)
    # experiment span, case roots, one _double span and one evaluation span per passing case
    expected = 1 + 30 + 29 + 29
    assert server.accepted_span_count == expected
    assert server.request_count < 10
    summary = exp.summary()
    assert summary.flushed
    assert summary.unsent == 0
    assert summary.spans_sent == expected
    assert summary.spans_dropped == 0
    assert summary.worst_loop_lag_ms is not None
    names = server.span_names()
    assert names.count("_double") == 29
    assert "batched" in names


async def test_slow_backend_never_stalls_the_run(server: OtlpTestServer) -> None:
    """With the backend holding a request unanswered, the remaining cases still run to the end
    (nothing waits for the server below the backpressure threshold); the spans arrive once the
    server answers."""
    looptrace.configure(endpoint=server.url, flush_interval=0.01)
    server.hold()

    async def task(x: int) -> int:
        if x == 1:
            # From here on a request is certainly in flight and held by the server.
            assert await anyio.to_thread.run_sync(server.wait_for_active, 1, 5.0)
        return await _double(x)

    async with looptrace.experiment("held", quiet=True) as exp:
        results = await exp.run(task, range(20), concurrency=1)
        assert [r.output for r in results] == [x * 2 for x in range(20)]
        assert server.request_count == 0  # nothing has been answered yet
        assert exp.summary().backpressure_waits == 0
        server.release()
    assert server.accepted_span_count == 1 + 20 + 20
    assert exp.summary().unsent == 0


async def test_backpressure_pauses_the_run_then_resumes(server: OtlpTestServer) -> None:
    """Past the backpressure threshold the next case waits for the backend; when the backend
    answers, the run resumes and finishes every case."""
    looptrace.configure(endpoint=server.url, flush_interval=0.01, backpressure_bytes=1)
    server.hold()
    exp = looptrace.experiment("pressed", quiet=True)

    async def body() -> None:
        async with exp:
            await exp.run(_task, range(5), concurrency=1)

    async with anyio.create_task_group() as tg:
        tg.start_soon(body)
        await _wait_until(lambda: exp._backpressure.waiting and server.wait_for_active(1, 0))
        assert len(exp.results) < 5  # held up while the backend holds the spans
        stats = looptrace.statistics()
        assert stats.queued_bytes + stats.in_flight_bytes > 1
        server.release()
    assert [r.index for r in exp.results] == [0, 1, 2, 3, 4]
    summary = exp.summary()
    assert summary.backpressure_waits >= 1
    assert summary.backpressure_wait_s > 0
    assert server.accepted_span_count == 1 + 5 + 4


async def test_leaving_the_block_flushes_with_a_deadline_and_reports_unsent(
    server: OtlpTestServer,
) -> None:
    """When the backend never answers, leaving the block gives up at the shutdown deadline and
    the summary reports the spans still unsent."""
    looptrace.configure(endpoint=server.url, shutdown_timeout=0.2, flush_interval=5.0)
    server.hold()
    out = io.StringIO()
    start = time.perf_counter()
    async with looptrace.experiment("stuck", stream=out) as exp:
        await exp.run(_task, range(3))
    elapsed = time.perf_counter() - start
    assert elapsed < 0.2 + 1.5
    summary = exp.summary()
    assert summary.flushed
    assert summary.unsent == 1 + 3 + 3
    assert f"unsent {summary.unsent}" in out.getvalue()
    server.release()
    assert (await looptrace.flush(timeout=5)).ok  # nothing was lost, only late


async def test_cancelling_the_block_still_flushes(server: OtlpTestServer) -> None:
    """Cancelled mid-run, the experiment still sends the cancelled cases and its own span
    before the cancellation propagates."""
    looptrace.configure(endpoint=server.url, flush_interval=5.0)
    started = asyncio.Event()

    async def task(x: int) -> int:
        if x == 1:
            started.set()
        await anyio.sleep_forever()
        return x

    exp = looptrace.experiment("cancel-flush", quiet=True)

    async def body() -> None:
        async with exp:
            await exp.run(task, range(10), concurrency=2)

    runner = asyncio.create_task(body())
    await asyncio.wait_for(started.wait(), 5)
    runner.cancel()
    with pytest.raises(asyncio.CancelledError):
        await runner
    summary = exp.summary()
    assert summary.flushed
    assert summary.unsent == 0
    assert server.span_names() == ["cancel-flush", "case 0", "case 1"]


def test_trio_run_sends_through_the_pipeline(server: OtlpTestServer) -> None:
    """Under trio the spans reach the backend and the final flush reports nothing unsent."""
    looptrace.configure(endpoint=server.url)
    exp = looptrace.run_experiment(
        "trio-wire", _task, [{"input": 1, "expected": 2}], [_exact], quiet=True, backend="trio"
    )
    assert exp.summary().flushed
    assert exp.summary().unsent == 0
    assert server.span_names() == ["_double", "case 0", "evaluation _exact", "trio-wire"]
    assert exp.summary().worst_loop_lag_ms is None  # the lag monitor is asyncio-only


async def test_capture_switches_keep_payloads_off_case_roots() -> None:
    """With input and output capture off, case roots carry no input, expected or output, while
    the results still hold them for scoring."""
    with capture_spans(capture_inputs=False, capture_outputs=False) as spans:
        async with looptrace.experiment("private", quiet=True) as exp:
            await exp.run(_task, [{"input": 1, "expected": 2}], scorers=[_exact])
    case = _cases(spans)[0]
    assert case.inputs is UNSET
    assert case.output is UNSET
    assert sc.EXPECTED_VALUE not in (case.attributes or {})
    (result,) = exp.results
    assert (result.input, result.expected, result.output) == (1, 2, 2)
    assert result.scores["_exact"].value == 1.0
