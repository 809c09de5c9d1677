"""looptrace's pytest plugin: a test run as an experiment you can browse and compare.

Off unless switched on (``--looptrace``, ``looptrace = true`` in the ini file, or a
``@pytest.mark.looptrace`` marker on a test). While off, every hook returns after one lookup and
nothing of looptrace's pipeline is configured or started; the package's modules import only
pytest and the standard library at the top so that loading it costs nothing either.

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

from . import _fixtures, _lag, _log, _options, _report, _session, _spans

# pytest looks for hooks and fixtures in the namespace of the module registered under the
# pytest11 entry point: this one. Each is defined in the module that holds its job.
pytest_addoption = _options.pytest_addoption
pytest_configure = _session.pytest_configure
pytest_unconfigure = _session.pytest_unconfigure
pytest_configure_node = _session.pytest_configure_node
pytest_testnodedown = _session.pytest_testnodedown
pytest_runtest_protocol = _spans.pytest_runtest_protocol
pytest_runtest_call = _lag.pytest_runtest_call
pytest_runtest_makereport = _spans.pytest_runtest_makereport
pytest_sessionfinish = _report.pytest_sessionfinish
pytest_terminal_summary = _report.pytest_terminal_summary

looptrace_log = _fixtures.looptrace_log
looptrace = _fixtures.looptrace
looptrace_spans = _fixtures.looptrace_spans

TestLog = _log.TestLog

# The attribute names the plugin writes on test spans.
TEST_NODEID = _spans.TEST_NODEID
TEST_FILE = _spans.TEST_FILE
TEST_LINENO = _spans.TEST_LINENO
TEST_FUNCTION = _spans.TEST_FUNCTION
TEST_PARAMS = _spans.TEST_PARAMS
TEST_PARAM_ID = _spans.TEST_PARAM_ID
TEST_OUTCOME = _spans.TEST_OUTCOME
TEST_DURATION = _spans.TEST_DURATION
TEST_SKIP_REASON = _spans.TEST_SKIP_REASON
TEST_WORKER = _spans.TEST_WORKER
LAG_LIMIT = _spans.LAG_LIMIT
LAG_CULPRIT = _spans.LAG_CULPRIT

__all__ = ["TestLog"]
