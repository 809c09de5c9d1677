"""A process's first traced call on an event loop: the export pipeline is built on the loop's
next turn, not inside the user's call, and no span of that turn is lost or left waiting."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import looptrace
from looptrace import Config, _export, _state
from looptrace._export import first_span
from looptrace._export.first_span import MAX_WAITING, Deferred
from looptrace._store import Store
from looptrace.monitor import _frames


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


async def test_the_first_call_leaves_the_settings_to_the_loop_s_next_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first traced call does not scan the environment (it cost that call as much as the
    rest of its span): the settings are read once, on the loop's next turn, as the pipeline
    is built."""
    monkeypatch.setenv("LOOPTRACE_STORE", str(tmp_path / "read.db"))
    reads: list[Config] = []
    from_env = Config.from_env.__func__  # type: ignore[attr-defined]

    def counted(cls: type[Config], **overrides: Any) -> Config:
        cfg = from_env(cls, **overrides)
        reads.append(cfg)
        return cfg

    monkeypatch.setattr(Config, "from_env", classmethod(counted))

    @looptrace.traced
    async def first() -> str:
        return "ok"

    reads.clear()  # @traced may read them as it decorates, before any loop waits
    await first()
    assert reads == []
    await asyncio.sleep(0)
    assert len(reads) == 1 and _export._pipeline is not None
    assert str(_export._pipeline.cfg.store_path) == str(tmp_path / "read.db")


async def test_the_pipeline_s_build_is_charged_to_looptrace_not_to_the_user_s_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stack the pipeline is built on, as the lag monitor would sample it, is looptrace's
    own work (named after its entry, Deferred.run), with no frame of the user's coroutine: a
    stall there is never a culprit in the user's code."""
    looptrace.configure(store_path=tmp_path / "stack.db")
    stacks: list[list[Any]] = []
    build = _export._get_or_create

    def record_stack() -> Any:
        stacks.append(_frames._walk(sys._getframe(1)))  # the caller's stack, not this frame
        return build()

    monkeypatch.setattr(_export, "_get_or_create", record_stack)

    @looptrace.traced
    async def user_handler() -> str:
        return "ok"

    await user_handler()
    assert stacks == []
    await asyncio.sleep(0)
    (stack,) = stacks
    assert not [f for f in stack if f[1].endswith("user_handler")]
    # What the monitor samples: the frames inside the loop's callback, which is Deferred.run
    # (named "run" before Python 3.11, which has no qualified names of code).
    (entry,) = [
        i for i, f in enumerate(stack) if f[0] == first_span.__file__ and f[1].endswith("run")
    ]
    inside = stack[entry:]
    assert _frames._own_work(inside) == f"looptrace ({stack[entry][1]})"
    assert _frames._user_frame(inside) is None


SETTINGS_AFTER_IMPORT = """
import asyncio, os
import looptrace

@looptrace.traced
async def ask(question):
    return question.upper()

# Set after the imports (and the decoration), before the first call.
os.environ.update({extra})

async def main():
    await ask("first")
    await asyncio.sleep(0)
    await ask("second")

asyncio.run(main())
looptrace.flush_sync(timeout=30)
"""


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"LOOPTRACE_DISABLED": "1"}, []),
        ({"LOOPTRACE_SAMPLE_RATE": "0"}, []),
        ({"LOOPTRACE_CAPTURE_INPUTS": "false"}, [None, None]),
        ({}, ['{"question":"first"}', '{"question":"second"}']),
    ],
)
def test_settings_a_program_sets_after_its_imports_hold_for_its_first_spans(
    tmp_path: Path, extra: dict[str, str], expected: list[str | None]
) -> None:
    """A program that sets its variables after its imports gets them from its first span on:
    the spans that waited for the settings are held to them (none when disabled or sampled
    out; no inputs when inputs are not captured)."""
    store = tmp_path / "late.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOOPTRACE_", "OTEL_"))}
    env["LOOPTRACE_STORE"] = str(store)
    script = tmp_path / "app.py"
    script.write_text(SETTINGS_AFTER_IMPORT.replace("{extra}", repr(extra)))
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    if not store.exists():
        assert expected == []
        return
    with Store(store) as s:
        traces = sorted(s.list_traces(limit=10), key=lambda t: t["start_ns"])
        spans = [s.get_trace(t["trace_id"])[0] for t in traces]
    assert [span["input"] for span in spans] == expected
