"""Loop-lag figures a user can act on: what stalled the loop is told apart from what did not.

- The pytest gate (``max_loop_lag_ms``) fails a test for the stalls its code caused, naming the
  line or the cause (garbage collection), and passes a test whose process was stopped for longer
  than the limit, saying so; ``count_unscheduled=True`` counts everything, as before.
- looptrace's own start-up on the loop is named as looptrace's, never the user's coroutine.
- After one ``looptrace demo``, the summary it prints and the ``/api/lag`` figures the viewer's
  cards read give the same worst stall, and no culprit or span of the user's carries looptrace's
  start-up.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from looptrace.monitor import CAUSE_LOOPTRACE
from looptrace.monitor._causes import _off_time
from looptrace.monitor._culprits import _make_culprit
from looptrace.monitor._frames import _LOOPTRACE_DIR, STARTUP, _own_work

INI = (
    "[pytest]\n"
    "addopts = -p no:benchmark -p no:hypothesispytest -p no:cacheprovider -p no:randomly\n"
    "asyncio_mode = auto\n"
    "asyncio_default_fixture_loop_scope = function\n"
)

# The inner suite. Each test has a 50 ms limit; line numbers below are asserted.
SUITE = '''
import asyncio
import gc
import os
import subprocess
import sys
import time

import pytest

# Stops the test's process with SIGSTOP, waits 150 ms, resumes it with SIGCONT: a process in
# another process's hands, as on a loaded machine, only longer and certain.
STOPPER = (
    "import os, signal, sys, time; pid = int(sys.argv[1]); "
    "os.kill(pid, signal.SIGSTOP); time.sleep(0.15); os.kill(pid, signal.SIGCONT)"
)
posix_only = pytest.mark.skipif(
    sys.platform == "win32", reason="SIGSTOP and SIGCONT are POSIX signals"
)


async def stopped_for_150_ms():
    helper = subprocess.Popen([sys.executable, "-c", STOPPER, str(os.getpid())])
    while helper.poll() is None:
        await asyncio.sleep(0.005)
    assert helper.returncode == 0


@posix_only
@pytest.mark.looptrace(max_loop_lag_ms=50)
async def test_paused():
    await stopped_for_150_ms()


@posix_only
@pytest.mark.looptrace(max_loop_lag_ms=50, count_unscheduled=True)
async def test_paused_counted():
    await stopped_for_150_ms()


@pytest.mark.looptrace(max_loop_lag_ms=50)
async def test_sleeps():
    await asyncio.sleep(0)
    time.sleep(0.15)


HEAP = []


@pytest.fixture(scope="module")
def big_heap():
    """Enough tracked objects that a full collection takes 120 ms of CPU here, measured: a
    sample, then a heap scaled from it, then checked."""
    gc.collect()
    while True:
        HEAP.extend([] for _ in range(max(200_000, len(HEAP))))
        started = time.process_time()
        gc.collect()
        took = time.process_time() - started
        if took >= 0.12 or len(HEAP) >= 8_000_000:
            return took


@pytest.mark.looptrace(max_loop_lag_ms=50)
async def test_collects(big_heap):
    await asyncio.sleep(0)
    gc.collect()
'''


def _line(text: str) -> int:
    """The line number of the last line of the suite that reads ``text``."""
    lines = SUITE.splitlines()
    return len(lines) - lines[::-1].index(text)


@pytest.fixture(scope="module")
def gate_run(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    """The inner suite, run once under the plugin in a process of its own (the one stopped)."""
    root = tmp_path_factory.mktemp("gate")
    (root / "pytest.ini").write_text(INI)
    (root / "test_gate.py").write_text(SUITE)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOOPTRACE_", "OTEL_"))}
    env["LOOPTRACE_STORE"] = str(root / "traces.db")
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-rA", "--looptrace", "test_gate.py"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _section(out: str, test: str) -> str:
    """What the run printed for one test: its failure or its passing report."""
    match = re.search(rf"_{{3,}} {test} _{{3,}}\n(.*?)(?=\n_{{3,}} |\n={{3,}} )", out, re.S)
    assert match is not None, out
    return match.group(1)


@pytest.mark.skipif(sys.platform == "win32", reason="SIGSTOP and SIGCONT are POSIX signals")
def test_a_stopped_process_passes_the_gate_and_the_report_names_the_pause(
    gate_run: subprocess.CompletedProcess[str],
) -> None:
    """A process stopped for 150 ms during a test limited to 50 ms: the test passes (its code
    held the loop for nothing like that), and its report says the process was not scheduled
    for about that long; the terminal summary names the pause too."""
    out = gate_run.stdout
    assert "PASSED test_gate.py::test_paused" in out, out
    section = _section(out, "test_paused")
    pause = re.search(r"event loop paused (\d+) ms: the process was not scheduled", section)
    assert pause is not None, section
    assert int(pause.group(1)) >= 100
    assert "not counted against the 50 ms limit" in section
    # The summary names the worst pause of the run (a long collection can stall longer).
    assert re.search(r"loop pause  \d+ ms not scheduled in test_gate.py::test_\w+", out)


@pytest.mark.skipif(sys.platform == "win32", reason="SIGSTOP and SIGCONT are POSIX signals")
def test_count_unscheduled_counts_the_pause(gate_run: subprocess.CompletedProcess[str]) -> None:
    """``count_unscheduled=True`` keeps the old rule, everything counts: the same pause fails
    the test, and the message says the process was not scheduled."""
    out = gate_run.stdout
    assert "FAILED test_gate.py::test_paused_counted" in out, out
    section = _section(out, "test_paused_counted")
    assert re.search(r"event loop stalled \d+ ms > 50 ms limit: process not scheduled", section)


def test_a_blocking_sleep_fails_the_gate_and_names_the_line(
    gate_run: subprocess.CompletedProcess[str],
) -> None:
    """``time.sleep(0.15)`` on the loop fails the 50 ms limit, naming the file and line."""
    out = gate_run.stdout
    assert "FAILED test_gate.py::test_sleeps" in out, out
    line = _line("    time.sleep(0.15)")
    message = re.search(
        rf"event loop stalled (\d+) ms > 50 ms limit: test_gate.py:{line} in test_sleeps", out
    )
    assert message is not None, out
    assert int(message.group(1)) >= 100


def test_a_long_collection_fails_the_gate_and_names_garbage_collection(
    gate_run: subprocess.CompletedProcess[str],
) -> None:
    """A forced ``gc.collect()`` over a heap that takes 120 ms of CPU to collect fails the
    50 ms limit, and the message names garbage collection, its generation and the line that
    triggered it."""
    out = gate_run.stdout
    assert "FAILED test_gate.py::test_collects" in out, out
    section = _section(out, "test_collects")
    line = _line("    gc.collect()")
    assert re.search(
        rf"event loop stalled \d+ ms > 50 ms limit: garbage collection \(generation 2, \d+ ms\)"
        rf" during test_gate.py:{line} in test_collects",
        section,
    ), section


STARTUP_SCRIPT = """
import asyncio, json
import looptrace
from looptrace.monitor import LagMonitor


async def first_use():
    return looptrace.experiment  # looptrace loads its evaluations now, on the loop


async def main():
    async with LagMonitor(interval=0.002, culprits=True, culprit_threshold=0.005) as m:
        await asyncio.sleep(0.01)
        await first_use()
        await asyncio.sleep(0.05)
    print(json.dumps({
        "culprits": [
            {"cause": c.cause, "qualname": c.qualname, "filename": c.filename,
             "duration_ms": c.duration_ms, "stall_ms": c.stall_ms}
            for c in m.culprits
        ],
        "worst_stall_ms": m.snapshot().worst_stall_ms,
        "looptrace_ms": m.snapshot().looptrace_ms,
    }))


asyncio.run(main())
"""


def test_looptrace_start_up_on_the_loop_is_named_as_looptrace_s_own(tmp_path: Path) -> None:
    """In a fresh process, the first use of ``looptrace.experiment`` inside a coroutine loads
    looptrace's evaluations on the loop: that stall is a culprit named "looptrace start-up" at
    the user's line, never the user's coroutine, and the monitor's worst stall leaves it out
    (it is counted as looptrace's own)."""
    script = tmp_path / "app.py"
    script.write_text(STARTUP_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOOPTRACE_", "OTEL_"))}
    env["LOOPTRACE_STORE"] = str(tmp_path / "traces.db")
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    mine = [c for c in found["culprits"] if c["filename"] == str(script)]
    startup = [c for c in mine if c["qualname"] == STARTUP]
    assert startup, found
    assert all(c["cause"] == CAUSE_LOOPTRACE for c in startup)
    assert not [c for c in mine if c["qualname"] == "first_use"], found
    assert found["looptrace_ms"] > 0
    assert found["worst_stall_ms"] < max(c["stall_ms"] for c in startup)


def test_whose_work_a_stack_is() -> None:
    """Passing over the standard library, the import system and third-party packages, the
    first other frame decides: looptrace's (its decorators excepted) makes the work looptrace's
    own, named "looptrace start-up" when it was importing; the user's makes it the user's."""
    user = ("/app/main.py", "handler", 10, True, False)
    wrapper = (os.path.join(_LOOPTRACE_DIR, "_capture", "decorators.py"), "w", 5, True, True)
    evals = (os.path.join(_LOOPTRACE_DIR, "evals", "_running.py"), "run_cases", 99, True, True)
    anyio = ("/venv/lib/python3.11/site-packages/anyio/_core/_tasks.py", "tg", 3, False, False)
    frozen = ("<frozen importlib._bootstrap>", "_find_and_load", 1176, False, False)
    third = ("/venv/lib/python3.11/site-packages/anthropic/_client.py", "init", 7, False, False)
    assert _own_work([user, wrapper, evals, anyio, frozen]) == STARTUP
    assert _own_work([user, evals, anyio]) == "looptrace (run_cases)"
    assert _own_work([user]) is None
    assert _own_work([wrapper, user, third]) is None  # AsyncAnthropic() is the user's call
    assert _own_work([wrapper, third]) is None  # an installed app's own code, through @traced
    culprit = _make_culprit(None, [([user, evals, anyio, frozen], None)], 0.2)
    assert (culprit.cause, culprit.qualname, culprit.filename, culprit.lineno) == (
        CAUSE_LOOPTRACE,
        STARTUP,
        "/app/main.py",
        10,
    )
    assert not culprit.charged


def test_a_gap_in_the_heartbeat_is_a_pause_only_past_the_noise_and_the_cpu() -> None:
    """A watchdog look 150 ms late with no CPU used is 150 ms the process did not run (less the
    usual lateness); the same gap with the CPU busy all along (a C call or a collection holding
    the GIL) is no pause; a look late by the machine's usual noise is none either."""
    assert _off_time(0.1625, 0.0125, 0.001, 0.002) == pytest.approx(0.147)
    assert _off_time(0.1625, 0.0125, 0.150, 0.002) == 0.0
    assert _off_time(0.0185, 0.0125, 0.0, 0.004) == 0.0


# -- the demo: one figure, from the summary to the viewer's cards ---------------------------


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """One ``looptrace demo`` in a process of its own, into a store of its own: what it printed,
    and the store."""
    root = tmp_path_factory.mktemp("demo")
    store = root / "traces.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOOPTRACE_", "OTEL_"))}
    env["LOOPTRACE_STORE"] = str(store)
    # The suite runs asyncio in debug mode, which reads source files (linecache) for every
    # callback it schedules: on a loaded machine those reads are stalls of their own, which
    # the demo, as users run it, does not have.
    env.pop("PYTHONASYNCIODEBUG", None)
    done = subprocess.run(
        [sys.executable, "-m", "looptrace.cli", "demo"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        cwd=root,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout, store


def _get(store: Path, path: str) -> Any:
    """GET ``path`` from the collector's API over ``store``, served by uvicorn on 127.0.0.1."""
    pytest.importorskip("uvicorn")
    import httpx
    import uvicorn

    from looptrace.collector.app import create_app

    server = uvicorn.Server(
        uvicorn.Config(create_app(store), host="127.0.0.1", port=0, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline
            time.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        response = httpx.get(f"http://127.0.0.1:{port}{path}", timeout=10)
        response.raise_for_status()
        return response.json()
    finally:
        server.should_exit = True
        thread.join(10)


def test_the_demo_s_summary_and_the_api_give_the_same_worst_stall(
    demo_store: tuple[str, Path],
) -> None:
    """The worst stall the demo prints (the experiment's summary, the CLI's output) is the worst
    stall ``/api/lag`` gives the viewer's cards, to the printed tenth of a millisecond, with the
    same cause (on a quiet machine, the demo's planted blocking call)."""
    out, store = demo_store
    printed = re.search(r"loop  worst stall ([\d.]+) ms(?: in (\S+) \()?", out)
    assert printed is not None, out
    figures = _get(store, "/api/lag?limit=500&worst=50")["figures"]
    assert f"{figures['worst_stall_ms']:.1f}" == printed.group(1), (figures, out)
    if printed.group(2):
        assert figures["worst_stall_cause"].startswith(f"{printed.group(2)} ("), (figures, out)


def test_no_culprit_or_span_of_the_user_s_carries_looptrace_s_start_up(
    demo_store: tuple[str, Path],
) -> None:
    """The demo's culprits are all its own code (the planted ``time.sleep`` among them), none
    is looptrace's start-up; and no span saw a stall beyond the demo's worst (plus the culprit
    threshold's worth of ticker phase), where looptrace's start-up once put 80-190 ms."""
    out, store = demo_store
    data = _get(store, "/api/lag?limit=500&worst=50")
    culprits = data["culprits"]
    # The planted 15 ms block is a culprit unless the machine kept the process from running
    # through part of it (then less than the 10 ms culprit threshold may be the code's own).
    if data["figures"]["unscheduled_ms"] == 0:
        assert any(
            c["function"] == "generate" and c["filepath"].endswith("_demo.py") for c in culprits
        ), (culprits, data["figures"])
    for c in culprits:
        assert c["cause"] in ("code", "gc")
        assert c["function"] != STARTUP and c["filepath"].endswith("_demo.py"), c
    bound = max(data["figures"]["worst_stall_ms"], 10.0) + 10.0
    over = [(s["name"], s["lag_max_ms"]) for s in data["worst_spans"] if s["lag_max_ms"] > bound]
    assert not over, (over, data["figures"])
    assert "looptrace start-up" not in out


def test_the_api_names_its_figures_and_filters_by_service(demo_store: tuple[str, Path]) -> None:
    """``figures`` covers the summaries shown; a service that sent none leaves no figure."""
    _, store = demo_store
    data = _get(store, "/api/lag?limit=500&worst=5")
    figures = data["figures"]
    assert figures["summaries"] == len(data["summaries"]) >= 1
    assert figures["processes"] == 1
    assert figures["p99_lag_ms"] is not None and figures["p99_window_ms"] > 0
    assert figures["worst_lag_ms"] is not None
    none = _get(store, "/api/lag?service=no-such-service")
    assert none["summaries"] == [] and none["figures"]["worst_stall_ms"] is None


def test_the_summary_line_says_what_each_figure_measures() -> None:
    """The experiment summary's loop line: the worst stall with where it was, the p99 lag and
    the window both are over, and the time the process was not scheduled when there was any."""
    from looptrace.evals._results import _loop_line
    from looptrace.monitor import LagSnapshot

    snap = LagSnapshot(
        count=30,
        mean_ms=1.0,
        p50_ms=0.2,
        p90_ms=2.0,
        p99_ms=14.0,
        max_ms=40.0,
        total_stall_ms=30.0,
        worst_at_ns=1,
        worst_stall_ms=15.2,
        worst_stall_cause="generate (/elsewhere/app.py:86)",
        unscheduled_ms=25.0,
        looptrace_ms=0.0,
        window_ms=120.0,
    )
    assert _loop_line(snap, 40.0) == (
        "worst stall 15.2 ms in generate (/elsewhere/app.py:86)  p99 lag 14.0 ms  over 0.12 s"
        "  not scheduled 25 ms"
    )
    assert _loop_line(None, None) == "n/a (the lag monitor is asyncio-only)"
