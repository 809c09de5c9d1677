"""The pytest plugin, tested the way users meet it: inner pytest runs made with ``pytester``.

Most inner runs record their spans through a small conftest (``RECORDER``) that swaps the sink for
one writing every ended span to a JSON-lines file per process; the delivery tests send to a real
OTLP server on 127.0.0.1 instead.
"""

from __future__ import annotations

import json
import os
import re
import socket
from pathlib import Path
from typing import Any

import pytest

pytest_plugins = ["pytester"]

# Every inner run: asyncio auto mode, and no plugins these tests do not need (each costs startup).
INI = (
    "[pytest]\n"
    "addopts = -p no:benchmark -p no:hypothesispytest -p no:cacheprovider\n"
    "asyncio_mode = auto\n"
    "asyncio_default_fixture_loop_scope = function\n"
)

# The inner conftest: every span that ends goes to spans-<pid>.jsonl in the inner run's rootdir.
RECORDER = r"""
import json, os
from pathlib import Path

import pytest
import looptrace
from looptrace import _state
from looptrace._capture.spans import UNSET

OUT = Path(__file__).parent / f"spans-{os.getpid()}.jsonl"


def _plain(value):
    if value is UNSET:
        return None
    try:
        json.dumps(value)
        return value
    except TypeError:
        return repr(value)


class Recorder:
    def on_start(self, span):
        pass

    def on_end(self, span):
        doc = {
            "name": span.name,
            "trace_id": f"{span.trace_id:032x}",
            "span_id": f"{span.span_id:016x}",
            "parent_span_id": f"{span.parent_span_id:016x}",
            "attributes": {k: _plain(v) for k, v in (span.attributes or {}).items()},
            "inputs": _plain(span.inputs),
            "output": _plain(span.output),
            "status_code": span.status_code,
            "status_message": span.status_message,
            "events": [[e.name, type(e.exception).__name__ if e.exception else None]
                       for e in (span.events or [])],
            "links": [[f"{l.context.trace_id:032x}", f"{l.context.span_id:016x}"]
                      for l in (span.links or [])],
        }
        with OUT.open("a") as f:
            f.write(json.dumps(doc) + "\n")


looptrace.configure()
_state.sink = Recorder()
"""


def read_spans(root: Path) -> list[dict[str, Any]]:
    spans: list[dict[str, Any]] = []
    for path in sorted(root.glob("spans-*.jsonl")):
        spans.extend(json.loads(line) for line in path.read_text().splitlines())
    return spans


def cases(spans: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Test spans by node id."""
    return {
        s["attributes"]["looptrace.test.nodeid"]: s
        for s in spans
        if s["attributes"].get("looptrace.span.type") == "case"
    }


def experiment_spans(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [s for s in spans if s["attributes"].get("looptrace.span.type") == "experiment"]


@pytest.fixture
def inner(pytester: pytest.Pytester) -> pytest.Pytester:
    """A pytester tree with asyncio auto mode and the span recorder installed."""
    pytester.makeini(INI)
    pytester.makeconftest(RECORDER)
    return pytester


SUITE = """
import pytest
import looptrace as lt

@lt.traced
def add(a, b):
    return a + b

def test_pass():
    assert add(1, 2) == 3

def test_fail():
    assert add(1, 1) == 3

@pytest.fixture
def broken():
    raise RuntimeError("fixture boom")

def test_error(broken):
    pass

@pytest.mark.skip(reason="not today")
def test_skip():
    pass

@pytest.mark.xfail(reason="known bug")
def test_xfail():
    assert add(2, 2) == 5

@pytest.mark.parametrize("n, word", [(1, "one"), (2, "two")])
def test_param(n, word):
    assert add(n, 0) == n
"""


def test_off_changes_nothing(pytester: pytest.Pytester) -> None:
    """Without --looptrace, the ini option or a marker, the plugin neither configures looptrace
    nor records a span, and the run's output is line for line what it is with the plugin
    unloaded (apart from timings and the list of plugins)."""
    pytester.makeini(INI)
    pytester.makeconftest(
        """
import pytest
from looptrace import _export, _state

@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    print(f"LOOPTRACE-STATE config={_state.config is not None} pipeline={_export.current()}")
"""
    )
    # No traced code in this suite: calling a traced function starts looptrace's pipeline
    # whether or not the plugin is on, and this test checks that the plugin starts nothing.
    pytester.makepyfile(test_suite=SUITE.replace("@lt.traced\n", ""))
    store = Path(os.environ["LOOPTRACE_STORE"])
    loaded = pytester.runpytest_subprocess("-rA")
    unloaded = pytester.runpytest_subprocess("-rA", "-p", "no:looptrace")

    def scrub(lines: list[str]) -> list[str]:
        # The plugin list names looptrace when it is loaded; that line is the one difference.
        return [
            re.sub(r"in \d+\.\d+s", "in Ns", line)
            for line in lines
            if not line.startswith("plugins:")
        ]

    assert loaded.ret == unloaded.ret == pytest.ExitCode.TESTS_FAILED
    loaded.assert_outcomes(passed=3, failed=1, errors=1, skipped=1, xfailed=1)
    assert scrub(loaded.outlines) == scrub(unloaded.outlines)
    loaded.stdout.fnmatch_lines(["LOOPTRACE-STATE config=False pipeline=None"])
    assert not any("looptrace =" in line for line in loaded.outlines)
    assert not store.exists()


def test_traces_every_outcome(inner: pytest.Pytester) -> None:
    """With --looptrace each test is a root span of its own trace with node id, file, outcome,
    duration, the error on failure, the skip reason and the parameters; traced code nests under
    the test span; every span carries the session's experiment id, and the experiment span holds
    the summary and every test's outcome."""
    inner.makepyfile(test_suite=SUITE)
    result = inner.runpytest_subprocess("--looptrace", "--looptrace-experiment", "nightly")
    result.assert_outcomes(passed=3, failed=1, errors=1, skipped=1, xfailed=1)
    spans = read_spans(inner.path)
    by_id = cases(spans)
    base = "test_suite.py::"
    assert sorted(by_id) == sorted(
        base + n
        for n in (
            "test_pass",
            "test_fail",
            "test_error",
            "test_skip",
            "test_xfail",
            "test_param[1-one]",
            "test_param[2-two]",
        )
    )
    outcomes = {
        k.removeprefix(base): v["attributes"]["looptrace.test.outcome"] for k, v in by_id.items()
    }
    assert outcomes == {
        "test_pass": "passed",
        "test_fail": "failed",
        "test_error": "error",
        "test_skip": "skipped",
        "test_xfail": "xfailed",
        "test_param[1-one]": "passed",
        "test_param[2-two]": "passed",
    }
    (exp,) = experiment_spans(spans)
    exp_id = exp["attributes"]["looptrace.experiment.id"]
    assert exp_id == exp["trace_id"]
    assert exp["attributes"]["looptrace.experiment.name"] == "nightly"
    trace_ids = set()
    for span in by_id.values():
        attrs = span["attributes"]
        assert span["parent_span_id"] == "0" * 16
        assert attrs["looptrace.experiment.id"] == exp_id
        assert attrs["looptrace.experiment.name"] == "nightly"
        assert attrs["code.filepath"] == "test_suite.py"
        assert attrs["looptrace.test.duration_s"] >= 0
        assert span["links"] == [[exp["trace_id"], exp["span_id"]]]
        trace_ids.add(span["trace_id"])
    assert len(trace_ids) == len(by_id)  # one trace per test

    failed = by_id[base + "test_fail"]
    assert failed["status_code"] == 2
    assert failed["status_message"].startswith("AssertionError")
    assert ["exception", "AssertionError"] in failed["events"]
    errored = by_id[base + "test_error"]
    assert errored["status_message"] == "RuntimeError: fixture boom"
    assert by_id[base + "test_skip"]["attributes"]["looptrace.test.skip_reason"] == "not today"
    assert by_id[base + "test_pass"]["status_code"] == 1
    param = by_id[base + "test_param[2-two]"]
    assert param["attributes"]["looptrace.test.params"] == {"n": 2, "word": "two"}
    assert param["attributes"]["looptrace.test.param_id"] == "2-two"

    # The traced helper nests under the test that called it.
    adds = [s for s in spans if s["name"] == "add"]
    assert len(adds) == 5  # pass, fail, xfail, two params
    case_span_ids = {(s["trace_id"], s["span_id"]) for s in by_id.values()}
    assert all((s["trace_id"], s["parent_span_id"]) in case_span_ids for s in adds)

    summary = exp["attributes"]
    assert summary["looptrace.experiment.tests"] == 7
    assert summary["looptrace.experiment.passed"] == 3
    assert summary["looptrace.experiment.failed"] == 1
    assert summary["looptrace.experiment.error"] == 1
    assert summary["looptrace.experiment.pass_rate"] == pytest.approx(4 / 6)
    assert summary["looptrace.experiment.outcomes"][base + "test_skip"] == "skipped"


def test_marker_traces_only_marked_tests(inner: pytest.Pytester) -> None:
    """Without --looptrace, a @pytest.mark.looptrace test is traced and its neighbours are not."""
    inner.makepyfile(
        """
import pytest

@pytest.mark.looptrace
def test_marked(looptrace_log):
    assert looptrace_log.enabled
    looptrace_log.score("ok", True)

def test_plain(looptrace_log):
    assert not looptrace_log.enabled
    looptrace_log.log(inputs=1, outputs=2, scores={"ignored": 1})
"""
    )
    result = inner.runpytest_subprocess()
    result.assert_outcomes(passed=2)
    spans = read_spans(inner.path)
    assert sorted(cases(spans)) == ["test_marker_traces_only_marked_tests.py::test_marked"]
    assert len(experiment_spans(spans)) == 1
    result.stdout.fnmatch_lines(
        ["*= looptrace =*", "tests       1 traced: 1 passed, pass rate 100.0%"]
    )


def test_fixture_logs_inputs_outputs_expected_and_scores(inner: pytest.Pytester) -> None:
    """The ``looptrace_log`` fixture puts inputs, outputs, expected and scores on the test span, and
    the terminal summary shows the mean of each score."""
    inner.makepyfile(
        """
import pytest

@pytest.mark.parametrize("q, a", [("2+2", "4"), ("3+3", "7")])
def test_answer(looptrace_log, q, a):
    looptrace_log.log(inputs={"question": q}, outputs=a, expected="4" if q == "2+2" else "6")
    looptrace_log.score("exact", a in ("4", "6"))
    looptrace_log.score("len", len(a))
"""
    )
    result = inner.runpytest_subprocess("--looptrace")
    result.assert_outcomes(passed=2)
    by_id = cases(read_spans(inner.path))
    second = by_id["test_fixture_logs_inputs_outputs_expected_and_scores.py::test_answer[3+3-7]"]
    assert second["inputs"] == {"question": "3+3"}
    assert second["output"] == "7"
    assert second["attributes"]["looptrace.expected.value"] == "6"
    assert second["attributes"]["looptrace.score.exact"] == 0.0
    assert second["attributes"]["looptrace.score.len"] == 1.0
    result.stdout.fnmatch_lines(["scores      exact 0.5 (n=2), len 1 (n=2)"])


ASYNC_SUITE = """
import asyncio
import pytest
import looptrace as lt

@lt.traced
async def step(n):
    await asyncio.sleep(0)
    return n

@lt.traced
def sync_step():
    return 1

@pytest.fixture
async def resource():
    with lt.span("fixture-setup"):
        await asyncio.sleep(0)
    yield 1

async def test_asyncio(resource):
    await step(1)
    await asyncio.gather(step(2), asyncio.create_task(step(3)))
    sync_step()

@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_anyio_first(anyio_backend):
    await step(4)

@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_anyio_second(anyio_backend):
    async with lt.span("block"):
        await step(5)
"""


def test_async_tests_parent_their_spans(inner: pytest.Pytester) -> None:
    """Spans made inside async tests (pytest-asyncio, and anyio's plugin whose runner task
    outlives a test) nest under that test's span, through gather and create_task too; a
    fixture's spans nest under the test that set it up."""
    inner.makeini(INI.replace("asyncio_mode = auto", "asyncio_mode = strict"))
    inner.makepyfile(
        ASYNC_SUITE.replace(
            "async def test_asyncio", "@pytest.mark.asyncio\nasync def test_asyncio"
        ).replace(
            "@pytest.fixture\nasync def resource",
            "import pytest_asyncio\n@pytest_asyncio.fixture\nasync def resource",
        )
    )
    result = inner.runpytest_subprocess("--looptrace")
    result.assert_outcomes(passed=3)
    spans = read_spans(inner.path)
    by_id = cases(spans)
    by_span = {(s["trace_id"], s["span_id"]): s for s in spans}

    def test_of(span: dict[str, Any]) -> str:
        while span["parent_span_id"] != "0" * 16:
            span = by_span[(span["trace_id"], span["parent_span_id"])]
        return str(span["attributes"].get("looptrace.test.nodeid"))

    owners = {
        (s["name"], json.dumps(s["inputs"])): test_of(s).split("::")[1]
        for s in spans
        if s["name"] in ("step", "sync_step", "fixture-setup", "block")
    }
    assert owners == {
        ("step", '{"n": 1}'): "test_asyncio",
        ("step", '{"n": 2}'): "test_asyncio",
        ("step", '{"n": 3}'): "test_asyncio",
        ("sync_step", "{}"): "test_asyncio",
        ("fixture-setup", "null"): "test_asyncio",
        ("step", '{"n": 4}'): "test_anyio_first[asyncio]",
        ("block", "null"): "test_anyio_second[asyncio]",
        ("step", '{"n": 5}'): "test_anyio_second[asyncio]",
    }
    assert len(by_id) == 3


def test_looptrace_spans_fixture(inner: pytest.Pytester) -> None:
    """``looptrace_spans`` captures the test's own spans with deterministic ids, whether the
    plugin is on or off, and its spans stay roots even while the test itself is traced."""
    inner.makepyfile(
        """
import looptrace as lt

@lt.traced
def outer():
    return inner_fn()

@lt.traced
def inner_fn():
    return 2

def test_capture(looptrace_spans):
    outer()
    assert looptrace_spans.tree() == [(0, "outer"), (1, "inner_fn")]
    root = looptrace_spans.by_name("outer")
    assert root.trace_id == 1 and root.parent_span_id == 0
"""
    )
    inner.runpytest_subprocess().assert_outcomes(passed=1)
    inner.runpytest_subprocess("--looptrace").assert_outcomes(passed=1)
    # The test span still went to the real pipeline; the captured spans did not.
    spans = read_spans(inner.path)
    assert [s["name"] for s in spans if s["attributes"].get("looptrace.span.type") == "case"] == [
        "test_capture"
    ]
    assert not [s for s in spans if s["name"] in ("outer", "inner_fn")]


def test_bad_lag_limit_is_a_usage_error(pytester: pytest.Pytester) -> None:
    """A max_loop_lag_ms that is not a positive number stops the run with a clear message."""
    pytester.makeini(INI)
    pytester.makepyfile("def test_one():\n    pass\n")
    result = pytester.runpytest_subprocess("--looptrace-max-loop-lag-ms", "-5")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*max_loop_lag_ms must be positive*"])


LAG_SUITE = """
import asyncio
import time

import pytest


async def slow_step():
    time.sleep(0.4)


@pytest.mark.looptrace(max_loop_lag_ms=200)
async def test_blocks():
    await asyncio.sleep(0)
    await slow_step()


@pytest.mark.looptrace(max_loop_lag_ms=200)
async def test_awaits():
    await asyncio.sleep(0.4)


def test_sync_is_not_checked():
    time.sleep(0.01)
"""


def test_lag_marker_fails_a_blocking_test_and_names_the_culprit(inner: pytest.Pytester) -> None:
    """``max_loop_lag_ms`` fails an async test that called time.sleep inside a coroutine, with a
    message naming the function and line, passes one that awaited as long, and the terminal
    summary shows the worst lag."""
    inner.makepyfile(test_lag=LAG_SUITE)
    result = inner.runpytest_subprocess("--looptrace", "-p", "no:randomly")
    result.assert_outcomes(passed=2, failed=1)
    line = LAG_SUITE.strip().splitlines().index("    time.sleep(0.4)") + 1
    culprit = f"test_lag.py:{line} in slow_step"
    result.stdout.fnmatch_lines([f"event loop stalled * ms > 200 ms limit: {culprit}"])
    result.stdout.fnmatch_lines([f"loop lag    worst * ms in test_lag.py::test_blocks ({culprit})"])
    by_id = cases(read_spans(inner.path))
    blocked = by_id["test_lag.py::test_blocks"]["attributes"]
    assert blocked["looptrace.test.outcome"] == "failed"
    assert blocked["looptrace.loop.lag_max_ms"] >= 350
    assert blocked["looptrace.loop.culprit"] == culprit
    awaited = by_id["test_lag.py::test_awaits"]["attributes"]
    assert awaited["looptrace.test.outcome"] == "passed"
    assert awaited["looptrace.loop.lag_max_ms"] < 200
    assert (
        "looptrace.loop.lag_max_ms"
        not in by_id["test_lag.py::test_sync_is_not_checked"]["attributes"]
    )


def test_ini_options(inner: pytest.Pytester) -> None:
    """``looptrace = true`` in the ini file traces the whole run under the ``looptrace_experiment``
    name; ``looptrace_max_loop_lag_ms`` applies to every async test, and a marker's own limit
    wins over it."""
    inner.makeini(
        INI + "looptrace = true\nlooptrace_experiment = from-ini\nlooptrace_max_loop_lag_ms = 200\n"
    )
    inner.makepyfile(
        """
import time
import pytest

async def test_default_limit():
    time.sleep(0.4)

@pytest.mark.looptrace(max_loop_lag_ms=2000)
async def test_own_limit():
    time.sleep(0.4)
"""
    )
    result = inner.runpytest_subprocess()
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        ["event loop stalled * ms > 200 ms limit: test_ini_options.py:5 in test_default_limit"]
    )
    names = {
        s["attributes"]["looptrace.experiment.name"] for s in cases(read_spans(inner.path)).values()
    }
    assert names == {"from-ini"}


def _attributes(span: Any) -> dict[str, Any]:
    """A protobuf span's attributes as plain values."""
    out: dict[str, Any] = {}
    for kv in span.attributes:
        kind = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, kind) if kind else None
    return out


def test_logged_values_arrive_at_a_real_server(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pointed at an OTLP endpoint with LOOPTRACE_ENDPOINT, the run delivers the experiment span,
    every test span with its logged input, output, expected value and scores, and the spans of
    the code under test, before the session ends; the summary counts them as sent."""
    from otlp_server import OtlpTestServer

    pytester.makeini(INI)
    pytester.makepyfile(
        """
import looptrace as lt

@lt.traced
def answer(question):
    return "4"

def test_qa(looptrace_log):
    out = answer("2+2")
    looptrace_log.log(inputs={"question": "2+2"}, outputs=out, expected="4")
    looptrace_log.score("exact", out == "4")

def test_fails(looptrace_log):
    looptrace_log.score("exact", False)
    assert False, "wrong"
"""
    )
    with OtlpTestServer() as server:
        monkeypatch.setenv("LOOPTRACE_ENDPOINT", server.endpoint)
        result = pytester.runpytest_subprocess("--looptrace")
        result.assert_outcomes(passed=1, failed=1)
        # Everything was delivered before the inner session returned: no waiting here.
        spans = {s.name: s for s in server.accepted_spans()}
    assert sorted(spans) == ["answer", f"pytest {pytester.path.name}", "test_fails", "test_qa"]
    # (the experiment span is named after the experiment: "pytest <rootdir name>" by default)
    qa = _attributes(spans["test_qa"])
    assert json.loads(qa["input.value"]) == {"question": "2+2"}
    assert json.loads(qa["output.value"]) == "4"
    assert qa["looptrace.expected.value"] == "4"
    assert qa["looptrace.score.exact"] == 1.0
    assert qa["looptrace.test.outcome"] == "passed"
    assert spans["answer"].parent_span_id == spans["test_qa"].span_id
    exp = _attributes(spans[f"pytest {pytester.path.name}"])
    assert exp["looptrace.experiment.id"] == qa["looptrace.experiment.id"]
    assert exp["looptrace.experiment.score_mean.exact"] == 0.5
    assert "looptrace.score.exact" not in exp  # the store would count it as a case's score
    assert exp["looptrace.experiment.pass_rate"] == 0.5
    result.stdout.fnmatch_lines(
        [
            "scores      exact 0.5 (n=2)",
            "spans       4 sent, 0 dropped",
            f"traces      sent to {server.endpoint}",
        ]
    )


def test_unreachable_backend_costs_one_warning_line(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With nothing listening at the endpoint, the session still exits 0, each process keeps to
    the shutdown deadline, and the whole run (two xdist workers and the controller) says so in
    one warning line, naming where the spans were kept."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    pytester.makeini(INI)
    pytester.makepyfile("def test_one():\n    pass\n\ndef test_two():\n    pass\n")
    monkeypatch.setenv("LOOPTRACE_ENDPOINT", f"http://127.0.0.1:{port}/v1/traces")
    monkeypatch.setenv("LOOPTRACE_SHUTDOWN_TIMEOUT", "0.5")
    # A hung session would hit the subprocess timeout and fail this test.
    result = pytester.runpytest_subprocess("--looptrace", "-n", "2", timeout=120)
    assert result.ret == pytest.ExitCode.OK
    warnings = [line for line in result.outlines if "not delivered" in line]
    assert len(warnings) == 1, result.outlines
    # Two test spans (one per worker) and the controller's experiment span.
    assert f"3 span(s) not delivered to http://127.0.0.1:{port}/v1/traces" in warnings[0]
    assert "ConnectionRefusedError" in warnings[0]
    # Not lost: the spool keeps them for the next run that exports there.
    assert "3 kept in " in warnings[0] and "for the next run to send" in warnings[0]
    result.stdout.fnmatch_lines(["spans       0 sent, 0 dropped, 3 spooled"])
    # Each final flush kept to the 0.5 s deadline (plus up to 0.5 s for the pipeline's thread to
    # stop, and some slack for a busy machine).
    waited = float(re.search(r"within ([\d.]+) s", warnings[0]).group(1))  # type: ignore[union-attr]
    assert waited <= 0.5 + 0.5 + 0.5
    # Nothing was left for the exit handler to wait for and warn about again.
    assert not [line for line in result.errlines if "could not be sent" in line]


def test_xdist_workers_share_the_experiment(inner: pytest.Pytester) -> None:
    """Under pytest-xdist every worker traces its own tests and flushes its own spans, and all
    of them carry the controller's experiment id and link to its experiment span."""
    inner.makepyfile(
        "\n".join(
            f"def test_{i}(looptrace_log):\n    looptrace_log.score('i', {i})\n" for i in range(6)
        )
    )
    result = inner.runpytest_subprocess("--looptrace", "-n", "2")
    result.assert_outcomes(passed=6)
    spans = read_spans(inner.path)
    (exp,) = experiment_spans(spans)
    by_id = cases(spans)
    assert len(by_id) == 6
    assert {s["attributes"]["looptrace.test.worker"] for s in by_id.values()} == {"gw0", "gw1"}
    assert {s["attributes"]["looptrace.experiment.id"] for s in by_id.values()} == {exp["trace_id"]}
    assert all(s["links"] == [[exp["trace_id"], exp["span_id"]]] for s in by_id.values())
    assert len(list(inner.path.glob("spans-*.jsonl"))) == 3  # controller and two workers
    result.stdout.fnmatch_lines(
        ["tests       6 traced: 6 passed, pass rate 100.0%", "scores      i 2.5 (n=6)"]
    )


def test_the_old_fixture_name_still_works_and_the_module_is_not_hidden(
    inner: pytest.Pytester,
) -> None:
    """``looptrace_log`` leaves ``looptrace`` the module inside a test; the old fixture name
    ``looptrace`` still logs, with a DeprecationWarning that names the new one."""
    inner.makepyfile(
        """
import looptrace

def test_new(looptrace_log):
    assert looptrace.traced is not None  # the module, not the fixture
    looptrace_log.score("new", 1)

def test_old(looptrace):
    looptrace.score("old", 1)
"""
    )
    result = inner.runpytest_subprocess("--looptrace", "-W", "always::DeprecationWarning")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*'looptrace' fixture is now 'looptrace_log'*"])
    scored = {
        name: s["attributes"].get(f"looptrace.score.{name.split('_')[1]}")
        for name, s in ((s["name"], s) for s in cases(read_spans(inner.path)).values())
    }
    assert scored == {"test_new": 1.0, "test_old": 1.0}


def test_with_the_plugin_off_spans_stay_out_of_the_personal_store(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    """With the plugin off and no store or endpoint set, traced code under test does not
    write to the user's own store (under the home directory's data folder)."""
    pytester.makepyfile(
        """
import looptrace

@looptrace.traced
def work():
    return 1

def test_traces():
    assert work() == 1
    assert looptrace.flush_sync(timeout=10).ok
"""
    )
    home = tmp_path / "home"
    env = {"HOME": str(home), "XDG_DATA_HOME": str(home / ".local" / "share")}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        patch.delenv("LOOPTRACE_STORE", raising=False)
        result = pytester.runpytest_subprocess()
    result.assert_outcomes(passed=1)
    assert not (home / ".local" / "share" / "looptrace").exists()
