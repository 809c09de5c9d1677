"""LOOPTRACE_LAG_MONITOR from the very first span of a process, and the last summary window."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from looptrace._store import Store

SCRIPT = """
import asyncio, time
import looptrace

@looptrace.traced
async def first():
    time.sleep(0.2)  # blocks the loop inside the process's first span
    await asyncio.sleep(0.05)
    return "done"

async def main():
    await first()

asyncio.run(main())
looptrace.flush_sync(timeout=10)
"""


def test_a_block_in_the_first_span_of_a_process_is_measured_and_attributed(
    tmp_path: Path,
) -> None:
    """With LOOPTRACE_LAG_MONITOR=1, the monitor starts when the first span starts, so a
    200 ms block inside that span is measured and the span carries it (its loop lag max); the
    loop's last, partial summary window (60 s long, the run far shorter) is exported when
    ``asyncio.run`` ends, with the stall in it."""
    store = tmp_path / "store.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOOPTRACE_", "OTEL_"))}
    env.update(
        LOOPTRACE_STORE=str(store),
        LOOPTRACE_LAG_MONITOR="1",
        LOOPTRACE_LAG_SUMMARY_INTERVAL="60",
    )
    script = tmp_path / "app.py"
    script.write_text(textwrap.dedent(SCRIPT))
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    with Store(store) as s:
        (trace,) = [t for t in s.list_traces(limit=10) if t["name"] == "first"]
        (span,) = s.get_trace(trace["trace_id"])
        assert span["lag_max_ms"] is not None and span["lag_max_ms"] >= 150
        summaries = s.lag_summaries()["summaries"]
        assert summaries and max(x["values"]["max_ms"] for x in summaries) >= 150
