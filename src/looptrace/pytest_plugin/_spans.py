"""Each traced test as a root span: opened before setup, closed after teardown.

The span carries the experiment's id and name, the test's node id, file, parameters, outcome
and duration; the record kept in the item's stash carries it (and what the test logged) from
hook to hook.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest

from ._log import TestLog
from ._options import _float_or_none
from ._outcomes import _Outcome, _outcome_of
from ._session import _PLUGIN, _Plugin

if TYPE_CHECKING:
    from looptrace import Span


# Attribute names the plugin writes on test spans, beside the shared experiment names it takes
# from looptrace's core through _internals (imported lazily, like everything from looptrace).
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


_PRIMITIVES = (str, int, float, bool, type(None))


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


_RECORD = pytest.StashKey[_TestRecord]()


def _lag_limit(item: pytest.Item, plugin: _Plugin) -> float | None:
    marker = item.get_closest_marker("looptrace")
    if marker is not None and "max_loop_lag_ms" in marker.kwargs:
        return _float_or_none(marker.kwargs["max_loop_lag_ms"])
    return plugin.default_lag_ms


def _primitive(value: Any) -> Any:
    return value if isinstance(value, _PRIMITIVES) else repr(value)


def _start_test_span(item: pytest.Item, plugin: _Plugin) -> _TestRecord:
    from looptrace import SpanContext

    from ._internals import new_root, semconv

    plugin.ensure_active()
    path, lineno, _ = item.location
    attrs: dict[str, Any] = {
        semconv.SPAN_TYPE: semconv.SPAN_TYPE_CASE,
        semconv.EXPERIMENT_ID: plugin.experiment_id,
        semconv.EXPERIMENT_NAME: plugin.experiment_name,
        semconv.CASE_INDEX: plugin.case_index,
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
    span = new_root(item.name, attrs)
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
    from ._internals import CURRENT

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


def _finish_test_span(record: _TestRecord) -> None:
    from looptrace import StatusCode

    from ._internals import semconv

    span = record.span
    outcome, reason = _outcome_of(record.reports)
    duration = sum(rep.duration for rep in record.reports)
    span.set_attribute(TEST_OUTCOME, outcome)
    span.set_attribute(TEST_DURATION, duration)
    if reason:
        span.set_attribute(TEST_SKIP_REASON, reason)
    if record.lag_max_ms is not None:
        span.set_attribute(semconv.LOOP_LAG_MAX_MS, record.lag_max_ms)
        if record.lag_culprit:
            span.set_attribute(LAG_CULPRIT, record.lag_culprit)
    if outcome in ("passed", "xfailed", "skipped") and span.status_code != StatusCode.ERROR:
        span.set_status(StatusCode.OK)
    span.end()
