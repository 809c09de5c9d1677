"""looptrace's pytest plugin: a test run as an experiment you can browse and compare.

Off unless switched on (``--looptrace``, ``looptrace = true`` in the ini file, or a
``@pytest.mark.looptrace`` marker on a test). While off, every hook returns after one lookup and
nothing of looptrace's pipeline is configured or started; this module imports only pytest and the
standard library at the top so that loading it costs nothing either.

When on:

- every test is a root span (``looptrace.span.type = "case"``) carrying the session's experiment
  id and name, its node id, file, parameters, outcome and duration, the error on failure and the
  skip reason; spans made by the code under test nest under it, in sync and async tests alike;
- the session itself is one ``experiment`` span holding the summary (counts, pass rate, mean
  scores, every test's outcome), linked from each test span;
- the ``looptrace_log`` fixture logs inputs, outputs, expected values and named scores;
- ``@pytest.mark.looptrace(max_loop_lag_ms=50)`` (or ``looptrace_max_loop_lag_ms``) fails an
  async test whose event loop stalled longer than that, naming the culprit;
- the session ends with a terminal summary and a flush bounded by ``LOOPTRACE_SHUTDOWN_TIMEOUT``;
  a backend that cannot be reached costs one warning line, never a failed or hung run.

Under pytest-xdist the controller makes the experiment id and hands it to every worker; each
worker flushes its own spans and reports its counts back for the summary.

The ``looptrace_spans`` fixture (always available) captures the spans a test's code makes, in
memory, with deterministic ids and clock: see :mod:`looptrace.testing`.
"""

from __future__ import annotations

import functools
import inspect
import math
import re
import time
import uuid
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from looptrace._span import Span
    from looptrace.testing import SpanCapture

__all__ = ["TestLog"]

# Attribute names the plugin writes on test spans, beside the shared experiment names of
# looptrace._semconv (imported lazily, like everything else from looptrace).
TEST_NODEID = "looptrace.test.nodeid"
TEST_FILE = "code.filepath"
TEST_LINENO = "code.lineno"
TEST_FUNCTION = "code.function"
TEST_PARAMS = "looptrace.test.params"
TEST_PARAM_ID = "looptrace.test.param_id"
TEST_OUTCOME = "looptrace.test.outcome"
TEST_DURATION = "looptrace.test.duration_s"
TEST_SKIP_REASON = "looptrace.test.skip_reason"
TEST_WORKER = "looptrace.test.worker"
LAG_LIMIT = "looptrace.test.max_loop_lag_ms"
LAG_CULPRIT = "looptrace.loop.culprit"

_MARKER_HELP = (
    "looptrace(max_loop_lag_ms=None): trace this test with looptrace (even without --looptrace); "
    "with max_loop_lag_ms, fail an async test whose event loop stalled longer than that."
)
_PRIMITIVES = (str, int, float, bool, type(None))


# ---------------------------------------------------------------------------------------------
# Options


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("looptrace", "looptrace: trace tests as an experiment")
    group.addoption(
        "--looptrace",
        action="store_true",
        default=False,
        help="trace every test with looptrace (one experiment per session).",
    )
    group.addoption(
        "--looptrace-experiment",
        metavar="NAME",
        default=None,
        help="experiment name for this run (implies --looptrace).",
    )
    group.addoption(
        "--looptrace-max-loop-lag-ms",
        metavar="MS",
        type=float,
        default=None,
        help="fail async tests whose event loop stalled longer than MS (implies --looptrace).",
    )
    parser.addini("looptrace", "trace every test with looptrace", type="bool", default=False)
    parser.addini("looptrace_experiment", "experiment name for test runs", default="")
    parser.addini(
        "looptrace_max_loop_lag_ms", "default event-loop stall limit for async tests", default=""
    )


# ---------------------------------------------------------------------------------------------
# Session state


@dataclass
class _Outcome:
    """What the summary needs about one test, built from its reports (also on an xdist
    controller, which sees only the reports)."""

    nodeid: str
    outcome: str = "passed"
    duration: float = 0.0
    scores: dict[str, float] = field(default_factory=dict)
    lag_max_ms: float | None = None
    lag_culprit: str = ""


@dataclass(eq=False)
class _Plugin:
    config: pytest.Config
    enabled: bool
    experiment_id: str
    experiment_name: str
    default_lag_ms: float | None
    is_worker: bool
    # Process-local: set once the pipeline has been touched (first traced test).
    active: bool = False
    experiment_span: Span | None = None
    case_index: int = 0
    outcomes: dict[str, _Outcome] = field(default_factory=dict)
    # This process's delivery, then each xdist worker's (same keys, see _flush).
    delivery: dict[str, Any] = field(default_factory=dict)
    worker_counts: list[dict[str, Any]] = field(default_factory=list)
    # The experiment span's ids, as the controller passed them (workers link to it).
    parent_ids: tuple[int, int] | None = None
    id_shared: bool = False
    reports: dict[str, list[pytest.TestReport]] = field(default_factory=dict)

    # Registered as a plugin object too: this hook has no config argument to find the state by.
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        data = getattr(report, "looptrace", None)
        if data is None:
            return
        self.ensure_active()
        entry = self.outcomes.get(report.nodeid)
        if entry is None:
            entry = self.outcomes[report.nodeid] = _Outcome(report.nodeid)
        reports = self.reports.setdefault(report.nodeid, [])
        reports.append(report)
        entry.outcome, _ = _outcome_of(reports)
        entry.duration += report.duration
        if "scores" in data:
            entry.scores.update(data["scores"])
        if "lag_max_ms" in data:
            entry.lag_max_ms = data["lag_max_ms"]
            entry.lag_culprit = data.get("lag_culprit", "")

    def ensure_active(self) -> None:
        """Touch the pipeline once: read the settings (environment first) and, in the process
        that prints the summary, open the experiment span."""
        if self.active:
            return
        self.active = True
        import looptrace
        from looptrace import _semconv

        looptrace.get_config()
        if self.is_worker:
            return
        attrs: dict[str, Any] = {
            _semconv.SPAN_TYPE: _semconv.SPAN_TYPE_EXPERIMENT,
            _semconv.EXPERIMENT_NAME: self.experiment_name,
        }
        span = _new_root(self.experiment_name, attrs)
        self.experiment_span = span
        # As in looptrace.evals, the experiment id is the experiment span's trace id, unless
        # xdist workers were already told another one.
        if not self.id_shared and span.trace_id:
            self.experiment_id = f"{span.trace_id:032x}"
        span.set_attribute(_semconv.EXPERIMENT_ID, self.experiment_id)
        if span.is_recording:
            self.parent_ids = (span.trace_id, span.span_id)


def _new_root(name: str, attributes: dict[str, Any]) -> Span:
    """A span that starts a new trace whatever is active (nothing recorded while disabled)."""
    # The pipeline too, for its wiring: the test spans need its sink.
    from looptrace import _capture, _export, _state
    from looptrace._span import NonRecordingSpan

    _ = _export

    if _state.disabled:
        return NonRecordingSpan()
    return _capture.start_root(name, attributes)


_PLUGIN = pytest.StashKey[_Plugin]()
_RECORD = pytest.StashKey["_TestRecord"]()


def _float_or_none(raw: object) -> float | None:
    if raw is None or raw == "":
        return None
    try:
        value = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise pytest.UsageError(
            f"looptrace: max_loop_lag_ms must be a number, got {raw!r}"
        ) from None
    if not value > 0 or math.isinf(value):
        raise pytest.UsageError(f"looptrace: max_loop_lag_ms must be positive, got {raw!r}")
    return value


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", _MARKER_HELP)
    cli_name = config.getoption("looptrace_experiment")
    cli_lag = config.getoption("looptrace_max_loop_lag_ms")
    enabled = bool(
        config.getoption("looptrace")
        or config.getini("looptrace")
        or cli_name is not None
        or cli_lag is not None
    )
    workerinput: dict[str, Any] | None = getattr(config, "workerinput", None)
    # Only a placeholder until the experiment span exists (its trace id becomes the id); kept
    # when only marked tests are traced under xdist and workers must agree before that.
    name = cli_name or str(config.getini("looptrace_experiment") or "")
    if not name:
        name = f"pytest {config.rootpath.name}"
    experiment_id = uuid.uuid4().hex
    parent_ids = None
    if workerinput is not None and "looptrace_experiment_id" in workerinput:
        experiment_id = workerinput["looptrace_experiment_id"]
        name = workerinput["looptrace_experiment_name"]
        ids = workerinput.get("looptrace_experiment_span")
        parent_ids = (int(ids[0]), int(ids[1])) if ids else None
    default_lag = _float_or_none(
        cli_lag if cli_lag is not None else config.getini("looptrace_max_loop_lag_ms")
    )
    plugin = _Plugin(
        config=config,
        enabled=enabled,
        experiment_id=experiment_id,
        experiment_name=name,
        default_lag_ms=default_lag,
        is_worker=workerinput is not None,
        parent_ids=parent_ids,
    )
    config.stash[_PLUGIN] = plugin
    config.pluginmanager.register(plugin, "looptrace-session")
    if not enabled:
        _keep_the_personal_store_out(config)
    # With tracing on for the whole run, the controller opens the experiment span now so its
    # ids can travel to xdist workers.
    if enabled and workerinput is None:
        plugin.ensure_active()


_ENDPOINT_VARIABLES = (
    "LOOPTRACE_STORE",
    "LOOPTRACE_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
)
_TEMP_STORE = pytest.StashKey[str]()


def _keep_the_personal_store_out(config: pytest.Config) -> None:
    """With the plugin off, code under test that traces would write to the user's own store
    (``~/.local/share/looptrace``), mixing test runs into their traces. Unless they said where
    spans go, spans go to a store of this run's own, removed at its end."""
    import os
    import tempfile

    if any(os.environ.get(name) for name in _ENDPOINT_VARIABLES):
        return
    folder = tempfile.mkdtemp(prefix="looptrace-pytest-")
    config.stash[_TEMP_STORE] = folder
    os.environ["LOOPTRACE_STORE"] = os.path.join(folder, "traces.db")


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = config.stash.get(_TEMP_STORE, None)
    if folder is not None:
        import os
        import shutil

        if os.environ.get("LOOPTRACE_STORE", "").startswith(folder):
            del os.environ["LOOPTRACE_STORE"]
        shutil.rmtree(folder, ignore_errors=True)
    plugin = config.stash.get(_PLUGIN, None)
    if plugin is not None and config.pluginmanager.is_registered(plugin):
        config.pluginmanager.unregister(plugin)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist controller: hand the experiment's identity to each worker."""
    plugin = node.config.stash.get(_PLUGIN, None)
    if plugin is None:
        return
    plugin.id_shared = True
    node.workerinput["looptrace_experiment_id"] = plugin.experiment_id
    node.workerinput["looptrace_experiment_name"] = plugin.experiment_name
    if plugin.parent_ids is not None:
        # Strings: execnet carries ints of any size, but keep the wire shape obvious.
        node.workerinput["looptrace_experiment_span"] = [str(i) for i in plugin.parent_ids]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """xdist controller: collect each worker's delivery counts for the summary."""
    plugin = node.config.stash.get(_PLUGIN, None)
    counts = getattr(node, "workeroutput", {}).get("looptrace")
    if plugin is not None and counts:
        plugin.worker_counts.append(counts)


# ---------------------------------------------------------------------------------------------
# The fixture tests log through


class TestLog:
    """What a test records about itself, through the ``looptrace`` fixture::

        def test_answer(looptrace):
            answer = ask("2 + 2")
            looptrace.log(inputs={"question": "2 + 2"}, outputs=answer, expected="4")
            looptrace.score("exact", answer == "4")

    Inputs and outputs go to the test span's ``input.value``/``output.value``, the expected value
    to ``looptrace.expected.value`` and each score to ``looptrace.score.<name>``; the terminal
    summary shows the mean of every score. When the test is not traced, every call does nothing.
    """

    __test__ = False  # not a test class, whatever pytest's name rules say

    def __init__(self, span: Span | None) -> None:
        self._span = span
        self.scores: dict[str, float] = {}

    @property
    def enabled(self) -> bool:
        """Whether this test is traced (what is logged is kept)."""
        return self._span is not None and self._span.is_recording

    @property
    def span(self) -> Span | None:
        """The test's root span (None when the test is not traced)."""
        return self._span

    def log(
        self,
        *,
        inputs: Any = None,
        outputs: Any = None,
        expected: Any = None,
        scores: Mapping[str, float | bool] | None = None,
        **attributes: Any,
    ) -> None:
        """Record what the test fed in, what came back, and what was expected (``None`` means
        "not given"); ``scores`` and extra ``attributes`` are set as well."""
        span = self._span
        if span is None:
            return
        if inputs is not None:
            span.set_inputs(inputs)
        if outputs is not None:
            span.set_output(outputs)
        if expected is not None:
            from looptrace._semconv import EXPECTED_VALUE

            span.set_attribute(EXPECTED_VALUE, expected)
        if attributes:
            span.set_attributes(attributes)
        if scores:
            for name, value in scores.items():
                self.score(name, value)

    def score(self, name: str, value: float | bool) -> None:
        """Record a named score (a number, or a bool counted as 1.0/0.0)."""
        if self._span is None:
            return
        number = float(value)
        self.scores[name] = number
        from looptrace._semconv import SCORE_PREFIX

        self._span.set_attribute(SCORE_PREFIX + name, number)


@pytest.fixture
def looptrace_log(request: pytest.FixtureRequest) -> TestLog:
    """Log inputs, outputs, expected values and scores on this test's span."""
    record: _TestRecord | None = request.node.stash.get(_RECORD, None)
    if record is None:
        return TestLog(None)
    return record.log


@pytest.fixture
def looptrace(looptrace_log: TestLog) -> TestLog:
    """The former name of ``looptrace_log``: as a test parameter it hid the ``looptrace``
    module inside the test. Still works, with a deprecation warning."""
    import warnings

    warnings.warn(
        "the 'looptrace' fixture is now 'looptrace_log' (the old name hides the looptrace "
        "module inside the test)",
        DeprecationWarning,
        stacklevel=2,
    )
    return looptrace_log


@pytest.fixture
def looptrace_spans() -> Iterator[SpanCapture]:
    """The spans this test's own code makes, in memory, with deterministic ids and clock.

    Works whether or not the plugin is on; while it is requested, the test's code is not
    parented to the test span, so ``spans.roots()`` and ``spans.tree()`` see only the test's
    own spans.
    """
    from looptrace.testing import capture_spans

    with capture_spans(deterministic=True) as spans:
        yield spans


# ---------------------------------------------------------------------------------------------
# Per-test spans


@dataclass
class _TestRecord:
    span: Span
    log: TestLog
    parent_code: bool  # whether the test's code runs under the test span
    lag_limit_ms: float | None
    outcome: _Outcome
    lag_max_ms: float | None = None
    lag_culprit: str = ""
    lag_message: str = ""
    reports: list[pytest.TestReport] = field(default_factory=list)


def _lag_limit(item: pytest.Item, plugin: _Plugin) -> float | None:
    marker = item.get_closest_marker("looptrace")
    if marker is not None and "max_loop_lag_ms" in marker.kwargs:
        return _float_or_none(marker.kwargs["max_loop_lag_ms"])
    return plugin.default_lag_ms


def _primitive(value: Any) -> Any:
    return value if isinstance(value, _PRIMITIVES) else repr(value)


def _start_test_span(item: pytest.Item, plugin: _Plugin) -> _TestRecord:
    from looptrace import _semconv
    from looptrace._span import SpanContext

    plugin.ensure_active()
    path, lineno, _ = item.location
    attrs: dict[str, Any] = {
        _semconv.SPAN_TYPE: _semconv.SPAN_TYPE_CASE,
        _semconv.EXPERIMENT_ID: plugin.experiment_id,
        _semconv.EXPERIMENT_NAME: plugin.experiment_name,
        _semconv.CASE_INDEX: plugin.case_index,
        TEST_NODEID: item.nodeid,
        TEST_FILE: path,
        TEST_FUNCTION: getattr(item, "originalname", item.name),
    }
    plugin.case_index += 1
    if lineno is not None:
        attrs[TEST_LINENO] = lineno + 1
    worker = getattr(item.config, "workerinput", {}).get("workerid")
    if worker:
        attrs[TEST_WORKER] = worker
    params: dict[str, Any] | None = None
    callspec = getattr(item, "callspec", None)
    if callspec is not None:
        params = {k: _primitive(v) for k, v in callspec.params.items()}
        attrs[TEST_PARAMS] = params
        attrs[TEST_PARAM_ID] = callspec.id
    limit = _lag_limit(item, plugin)
    if limit is not None:
        attrs[LAG_LIMIT] = limit
    span = _new_root(item.name, attrs)
    if params:
        span.set_inputs(params)
    ids = plugin.parent_ids
    if ids is not None:
        span.add_link(SpanContext(ids[0], ids[1]))
    return _TestRecord(
        span=span,
        log=TestLog(span),
        parent_code="looptrace_spans" not in getattr(item, "fixturenames", ()),
        lag_limit_ms=limit,
        outcome=_Outcome(item.nodeid),
    )


def _traced(item: pytest.Item, plugin: _Plugin) -> bool:
    return plugin.enabled or item.get_closest_marker("looptrace") is not None


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, object, object]:
    plugin = item.config.stash.get(_PLUGIN, None)
    if plugin is None or not _traced(item, plugin):
        return (yield)
    from looptrace._context import CURRENT

    record = _start_test_span(item, plugin)
    item.stash[_RECORD] = record
    # Active through setup, call and teardown, so fixtures' spans nest too; plugins that copy
    # the context before running a coroutine (pytest-asyncio) carry it into the test's loop.
    token = CURRENT.set(record.span) if record.parent_code else None
    try:
        return (yield)
    finally:
        if token is not None:
            CURRENT.reset(token)
        _finish_test_span(record)
        del item.stash[_RECORD]


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    record = item.stash.get(_RECORD, None)
    if record is None or not isinstance(item, pytest.Function):
        return (yield)
    fn = item.obj
    if not inspect.iscoroutinefunction(fn):
        return (yield)
    # Async plugins may run the coroutine in a context captured before this test (anyio keeps
    # one runner task per loop), so the test function itself makes its span active.
    item.obj = _wrap_async_test(fn, record)
    try:
        result = yield
    finally:
        item.obj = fn
    if record.lag_message:
        pytest.fail(record.lag_message, pytrace=False)
    return result


def _wrap_async_test(fn: Callable[..., Any], record: _TestRecord) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def traced_test(*args: Any, **kwargs: Any) -> Any:
        from looptrace._context import CURRENT

        token = CURRENT.set(record.span) if record.parent_code else None
        monitor = _start_monitor(record) if record.lag_limit_ms is not None else None
        try:
            if monitor is not None:
                # The monitor names culprits from the task steps that start after it: begin a
                # fresh step so a stall in the test's very first step is attributed too.
                import asyncio

                await asyncio.sleep(0)
            return await fn(*args, **kwargs)
        finally:
            if monitor is not None:
                await _stop_monitor(monitor, record)
            if token is not None:
                CURRENT.reset(token)

    return traced_test


def _start_monitor(record: _TestRecord) -> Any:
    """A lag monitor on the running asyncio loop, or None (trio, or no loop)."""
    import asyncio

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return None
    from looptrace.monitor import LagMonitor

    assert record.lag_limit_ms is not None
    limit_s = record.lag_limit_ms / 1000.0
    monitor = LagMonitor(interval=min(0.01, limit_s / 2), culprits=True, culprit_threshold=limit_s)
    monitor.start()
    return monitor


async def _stop_monitor(monitor: Any, record: _TestRecord) -> None:
    import asyncio

    # A stall right before the test returned is only measured once the monitor's ticker runs
    # again: give the loop two turns.
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    monitor.stop()
    snap = monitor.snapshot()
    limit = record.lag_limit_ms
    assert limit is not None
    record.lag_max_ms = float(snap.max_ms)
    worst = max(monitor.culprits, key=lambda c: c.duration_ms, default=None)
    if worst is not None:
        record.lag_culprit = _describe_culprit(worst)
    stalled = max(record.lag_max_ms, worst.duration_ms if worst is not None else 0.0)
    if stalled > limit:
        record.lag_max_ms = stalled
        where = record.lag_culprit or "culprit unknown"
        record.lag_message = f"event loop stalled {stalled:.0f} ms > {limit:g} ms limit: {where}"


def _describe_culprit(culprit: Any) -> str:
    """``file:line in coroutine``, plus the innermost frame when the blocking line is in a plain
    function the coroutine called (``time.sleep`` inside a helper, say)."""
    text = f"{_short_path(culprit.filename)}:{culprit.lineno} in {culprit.qualname}"
    if culprit.stack:
        match = re.fullmatch(r"(.*) \((.*):(\d+)\)", culprit.stack[-1])
        if match is not None:
            qualname, filename, lineno = match.groups()
            if (qualname, int(lineno)) != (culprit.qualname, culprit.lineno):
                text += f", blocked in {qualname} at {_short_path(filename)}:{lineno}"
    return text


def _short_path(filename: str) -> str:
    import os

    try:
        rel = os.path.relpath(filename)
    except ValueError:
        return filename
    return filename if rel.startswith("..") else rel


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    record = item.stash.get(_RECORD, None)
    if record is None:
        return report
    record.reports.append(report)
    excinfo = call.excinfo
    if report.failed and excinfo is not None:
        record.span.fail(excinfo.value)
    # Travels with the report (also from xdist workers) to whoever prints the summary.
    data: dict[str, Any] = {}
    if report.when == "call":
        if record.log.scores:
            data["scores"] = dict(record.log.scores)
        if record.lag_max_ms is not None:
            data["lag_max_ms"] = record.lag_max_ms
            data["lag_culprit"] = record.lag_culprit
    report.looptrace = data  # type: ignore[attr-defined]
    return report


def _outcome_of(reports: list[pytest.TestReport]) -> tuple[str, str]:
    """(outcome, skip reason) the way the terminal reports them."""
    outcome, reason = "passed", ""
    for rep in reports:
        if rep.failed:
            return ("failed" if rep.when == "call" else "error"), ""
        if rep.skipped:
            if hasattr(rep, "wasxfail"):
                outcome, reason = "xfailed", str(rep.wasxfail)
            else:
                outcome = "skipped"
                longrepr = rep.longrepr
                if isinstance(longrepr, tuple) and len(longrepr) == 3:
                    reason = str(longrepr[2]).removeprefix("Skipped: ")
        elif rep.when == "call" and hasattr(rep, "wasxfail"):
            outcome = "xpassed"
    return outcome, reason


def _finish_test_span(record: _TestRecord) -> None:
    from looptrace._semconv import LOOP_LAG_MAX_MS
    from looptrace._span import StatusCode

    span = record.span
    outcome, reason = _outcome_of(record.reports)
    duration = sum(rep.duration for rep in record.reports)
    span.set_attribute(TEST_OUTCOME, outcome)
    span.set_attribute(TEST_DURATION, duration)
    if reason:
        span.set_attribute(TEST_SKIP_REASON, reason)
    if record.lag_max_ms is not None:
        span.set_attribute(LOOP_LAG_MAX_MS, record.lag_max_ms)
        if record.lag_culprit:
            span.set_attribute(LAG_CULPRIT, record.lag_culprit)
    if outcome in ("passed", "xfailed", "skipped") and span.status_code != StatusCode.ERROR:
        span.set_status(StatusCode.OK)
    span.end()


# ---------------------------------------------------------------------------------------------
# Summary (in the process that prints: the only one, or the xdist controller)


@dataclass
class _Summary:
    tests: int
    counts: dict[str, int]
    pass_rate: float | None
    scores: dict[str, tuple[float, int]]
    slowest: list[_Outcome]
    worst_lag: _Outcome | None


def _summarize(outcomes: Mapping[str, _Outcome]) -> _Summary:
    counts: dict[str, int] = {}
    sums: dict[str, list[float]] = {}
    for o in outcomes.values():
        counts[o.outcome] = counts.get(o.outcome, 0) + 1
        for name, value in o.scores.items():
            sums.setdefault(name, []).append(value)
    judged = sum(counts.get(k, 0) for k in ("passed", "failed", "error", "xpassed", "xfailed"))
    good = counts.get("passed", 0) + counts.get("xfailed", 0)
    lagged = [o for o in outcomes.values() if o.lag_max_ms is not None]
    return _Summary(
        tests=len(outcomes),
        counts=counts,
        pass_rate=good / judged if judged else None,
        scores={k: (sum(v) / len(v), len(v)) for k, v in sorted(sums.items())},
        slowest=sorted(outcomes.values(), key=lambda o: o.duration, reverse=True)[:3],
        worst_lag=max(lagged, key=lambda o: o.lag_max_ms or 0.0, default=None),
    )


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    plugin = session.config.stash.get(_PLUGIN, None)
    if plugin is None or not plugin.active:
        return
    span = plugin.experiment_span
    if span is not None and span.is_recording:
        summary = _summarize(plugin.outcomes)
        span.set_attribute("looptrace.experiment.tests", summary.tests)
        for name, count in summary.counts.items():
            span.set_attribute(f"looptrace.experiment.{name}", count)
        if summary.pass_rate is not None:
            span.set_attribute("looptrace.experiment.pass_rate", summary.pass_rate)
        # Not under looptrace.score.*: the store reads those as one case's scores.
        for name, (mean, _n) in summary.scores.items():
            span.set_attribute(f"looptrace.experiment.score_mean.{name}", mean)
        span.set_attribute(
            "looptrace.experiment.outcomes", {o.nodeid: o.outcome for o in plugin.outcomes.values()}
        )
        span.set_attribute("looptrace.pytest.exitstatus", int(exitstatus))
        span.end()
    _flush(plugin)
    if plugin.is_worker:
        session.config.workeroutput["looptrace"] = plugin.delivery  # type: ignore[attr-defined]


def _flush(plugin: _Plugin) -> None:
    """Deliver what is buffered within the shutdown deadline; never raise, never hang.

    The pipeline is shut down rather than flushed: whatever is still unsent at the deadline is
    dropped and counted now, instead of being waited for a second time at interpreter exit.
    """
    import looptrace

    cfg = looptrace.get_config()
    started = time.monotonic()
    delivery: dict[str, Any] = {"sent": 0, "dropped": 0, "seconds": 0.0, "error": ""}
    plugin.delivery = delivery
    try:
        result = looptrace.shutdown_sync(cfg.shutdown_timeout)
        stats = looptrace.statistics()
    except Exception as exc:  # tracing must never fail the run
        delivery["error"] = f"flush failed: {type(exc).__name__}: {exc}"
        return
    delivery["sent"] = stats.spans_sent
    delivery["dropped"] = stats.dropped_total + result.pending
    delivery["seconds"] = time.monotonic() - started
    if delivery["dropped"]:
        delivery["error"] = stats.last_error or ""


def _delivery_warning(deliveries: list[dict[str, Any]], where: str) -> str:
    """One line for the whole run (every xdist worker included), or "" when all arrived."""
    dropped = sum(int(d.get("dropped", 0)) for d in deliveries)
    errors = [str(d["error"]) for d in deliveries if d.get("error")]
    if not dropped and not errors:
        return ""
    seconds = max(float(d.get("seconds", 0.0)) for d in deliveries)
    error = f" ({errors[0]})" if errors else ""
    return f"looptrace: {dropped} span(s) not delivered to {where} within {seconds:.1f} s{error}"


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    plugin = config.stash.get(_PLUGIN, None)
    if plugin is None or not plugin.active or plugin.is_worker:
        return
    tr = terminalreporter
    s = _summarize(plugin.outcomes)
    tr.write_sep("=", "looptrace")
    order = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")
    counts = ", ".join(f"{s.counts[k]} {k}" for k in order if s.counts.get(k))
    rate = f", pass rate {s.pass_rate:.1%}" if s.pass_rate is not None else ""
    tr.write_line(f"experiment  {plugin.experiment_name} ({plugin.experiment_id})")
    tr.write_line(f"tests       {s.tests} traced: {counts or 'none'}{rate}")
    if s.scores:
        tr.write_line(
            "scores      " + ", ".join(f"{k} {m:.3g} (n={n})" for k, (m, n) in s.scores.items())
        )
    for i, o in enumerate(s.slowest):
        tr.write_line(f"{'slowest' if i == 0 else '':<12}{o.duration:6.2f}s  {o.nodeid}")
    if s.worst_lag is not None and s.worst_lag.lag_max_ms is not None:
        culprit = f" ({s.worst_lag.lag_culprit})" if s.worst_lag.lag_culprit else ""
        tr.write_line(
            f"loop lag    worst {s.worst_lag.lag_max_ms:.0f} ms in {s.worst_lag.nodeid}{culprit}"
        )
    deliveries = [plugin.delivery, *plugin.worker_counts]
    sent = sum(int(d.get("sent", 0)) for d in deliveries)
    dropped = sum(int(d.get("dropped", 0)) for d in deliveries)
    tr.write_line(f"spans       {sent} sent, {dropped} dropped")
    import looptrace

    cfg = looptrace.get_config()
    if cfg.endpoint:
        tr.write_line(f"traces      sent to {cfg.endpoint}")
    else:
        from looptrace._config import default_store_path

        store = "" if cfg.store_path == default_store_path() else f"--store {cfg.store_path} "
        tr.write_line(
            f"traces      looptrace {store}experiments {plugin.experiment_id}"
            f"  (in a browser: looptrace {store}serve)"
        )
    warning = _delivery_warning(deliveries, cfg.endpoint or str(cfg.store_path))
    if warning:
        tr.write_line(warning, yellow=True)
