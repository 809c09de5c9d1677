"""A process's first traced call on an event loop: the export pipeline is built on the loop's
next turn, not inside the user's call, and no span of that turn is lost or left waiting."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import looptrace
from looptrace import _export, _state
from looptrace._export.first_span import MAX_WAITING, Deferred
from looptrace._store import Store


def names_in(store: Path) -> list[str]:
    with Store(store) as s:
        return sorted(t["name"].rsplit(".", 1)[-1] for t in s.list_traces(limit=100))


async def test_the_first_call_only_records_and_the_pipeline_starts_on_the_next_turn(
    tmp_path: Path,
) -> None:
    """The first traced call returns with its span waiting and no pipeline built; the loop's
    next turn builds it and hands it the spans of that turn, in order; a flush sends them."""
    store = tmp_path / "first.db"
    looptrace.configure(store_path=store)

    @looptrace.traced
    async def first(i: int) -> int:
        return i

    assert await first(1) == 1
    assert await first(2) == 2
    assert isinstance(_state.sink, Deferred)
    assert _export._pipeline is None  # nothing was built inside the calls
    await asyncio.sleep(0)  # the loop's next turn
    assert _export._pipeline is not None
    assert _state.sink is _export._pipeline
    await first(3)
    result = await looptrace.flush(timeout=30)
    assert result.sent == 3 and result.ok
    assert names_in(store) == ["first", "first", "first"]


async def test_flush_right_after_the_first_call_sends_its_span(tmp_path: Path) -> None:
    """A flush (or statistics) before the loop turned builds the pipeline there and then: the
    span that waited is sent, not reported as nothing pending."""
    store = tmp_path / "flush.db"
    looptrace.configure(store_path=store)

    @looptrace.traced
    async def only() -> str:
        return "ok"

    await only()
    assert _export._pipeline is None
    result = await looptrace.flush(timeout=30)
    assert result.sent == 1 and result.ok
    assert names_in(store) == ["only"]


async def test_a_burst_before_the_loop_turns_builds_the_pipeline_instead_of_waiting(
    tmp_path: Path,
) -> None:
    """Spans that wait are bounded: the span past the bound builds the pipeline in its own
    call, and every span of the burst is sent."""
    store = tmp_path / "burst.db"
    looptrace.configure(store_path=store, max_batch_spans=512)
    count = MAX_WAITING + 10
    for _ in range(count):
        with looptrace.span("step"):
            pass
    assert _export._pipeline is not None  # built by the span past the bound
    result = await looptrace.flush(timeout=60)
    assert result.sent == count and result.ok


SCRIPT = """
import asyncio
import looptrace

@looptrace.traced
async def first():
    return "done"

# The loop is closed right after the call: its next turn never comes.
loop = asyncio.new_event_loop()
loop.run_until_complete(first())
loop.close()
"""


def test_a_loop_closed_before_its_next_turn_still_has_its_spans_sent_at_exit(
    tmp_path: Path,
) -> None:
    """The exit handler builds a pipeline that waited for a turn that never came, and sends."""
    store = tmp_path / "exit.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOOPTRACE_", "OTEL_"))}
    env["LOOPTRACE_STORE"] = str(store)
    script = tmp_path / "app.py"
    script.write_text(textwrap.dedent(SCRIPT))
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "could not be sent" not in done.stderr, done.stderr
    assert names_in(store) == ["first"]
