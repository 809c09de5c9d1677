"""Activation that outlives its span: a framework that activates a run's span in the caller's
context and ends it in a copy of that context (LangChain's async runs) leaves the ended span
active for the caller; the caller's next spans go under the span that was active before it."""

from __future__ import annotations

import asyncio
from typing import Any

import looptrace
from looptrace._capture.spans import Span
from looptrace._capture.start import _activate, _release, start_span
from looptrace.testing import SpanCapture, capture_spans


def begin(name: str) -> tuple[Span, Any]:
    """A run starting in the calling context, as an integration starts one: its span created
    and made the active span there."""
    span = start_span(name)
    return span, _activate(span)


async def end_elsewhere(span: Span, tokens: Any) -> None:
    """The run ending in a task, that is in a copy of the context that started it (as
    LangChain's shielded end callbacks do)."""

    async def end() -> None:
        _release(span, tokens)
        span.end()

    await asyncio.create_task(end())


def parent_of(spans: SpanCapture, name: str) -> str | None:
    span = spans.by_name(name)
    parents = [s for s in spans if s.span_id == span.parent_span_id]
    return parents[0].name if parents else None


async def test_a_span_after_a_run_ended_elsewhere_goes_under_the_caller() -> None:
    """After the run ended in a copy of the context, the run's span is still the active span
    of the caller's context, but a span the caller starts goes under the caller's span, and
    ``current_span()`` and ``inject()`` name the caller's span; what ran inside the run
    stays under the run."""
    with capture_spans() as spans, looptrace.span("caller") as caller:
        run, tokens = begin("run")
        with looptrace.span("inside"):
            pass
        await end_elsewhere(run, tokens)
        with looptrace.span("after"):
            pass
        assert looptrace.current_span() is caller
        assert looptrace.inject()["traceparent"].split("-")[2] == f"{caller.span_id:016x}"
    assert parent_of(spans, "inside") == "run"
    assert parent_of(spans, "run") == "caller"
    assert parent_of(spans, "after") == "caller"
    assert len({s.trace_id for s in spans}) == 1


async def test_nested_runs_ended_elsewhere_in_either_order() -> None:
    """Runs nested in one context (a sequence and its steps) ended elsewhere, inner first or
    outer first: the caller's next span goes under the caller's span either way."""
    for inner_first in (True, False):
        with capture_spans() as spans, looptrace.span("caller"):
            outer, outer_tokens = begin("outer run")
            step, step_tokens = begin("step")
            ends = [(step, step_tokens), (outer, outer_tokens)]
            for span, tokens in ends if inner_first else ends[::-1]:
                await end_elsewhere(span, tokens)
            with looptrace.span("after"):
                pass
        assert parent_of(spans, "step") == "outer run"
        assert parent_of(spans, "after") == "caller", inner_first


async def test_a_run_with_no_caller_span_leaves_the_next_span_a_new_trace() -> None:
    """With no span active when the run started, the caller's next span starts a trace of its
    own instead of joining the ended run's."""
    with capture_spans() as spans:
        run, tokens = begin("run")
        await end_elsewhere(run, tokens)
        with looptrace.span("after"):
            pass
        assert not looptrace.current_span().is_recording
    after = spans.by_name("after")
    assert after.parent_span_id == 0
    assert after.trace_id != spans.by_name("run").trace_id


async def test_a_task_that_outlives_its_creator_stays_under_the_creators_span() -> None:
    """A span that ended the ordinary way (its block left) stays the parent of spans started
    in a task it created, even after it ended: the task's work is still its work."""
    release = asyncio.Event()

    async def background() -> None:
        await release.wait()
        with looptrace.span("later"):
            pass
        with looptrace.span("later again"):
            pass

    with capture_spans() as spans:
        with looptrace.span("handler"):
            task = asyncio.create_task(background())
        release.set()
        await task
    assert parent_of(spans, "later") == "handler"
    assert parent_of(spans, "later again") == "handler"


def test_a_run_ended_in_its_own_context_is_simply_inactive() -> None:
    """A run that ends in the context that started it (``invoke``) is no longer the active
    span there, and nothing is marked."""
    with capture_spans() as spans, looptrace.span("caller") as caller:
        run, tokens = begin("run")
        _release(run, tokens)
        run.end()
        assert looptrace.current_span() is caller
        with looptrace.span("after"):
            pass
    assert parent_of(spans, "after") == "caller"
