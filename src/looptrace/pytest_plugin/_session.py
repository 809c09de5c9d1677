"""The session's state: whether tracing is on, the experiment's identity, what the tests did.

One :class:`_Plugin` per process, made in ``pytest_configure`` and kept in the config's stash.
Under pytest-xdist the controller hands the experiment's identity to each worker; with the
plugin off, code under test that traces writes to a store of the run's own.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest

from ._options import _MARKER_HELP, _float_or_none
from ._outcomes import _Outcome, _outcome_of

if TYPE_CHECKING:
    from looptrace import Span


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

        from ._internals import new_root, semconv

        looptrace.get_config()
        if self.is_worker:
            return
        attrs: dict[str, Any] = {
            semconv.SPAN_TYPE: semconv.SPAN_TYPE_EXPERIMENT,
            semconv.EXPERIMENT_NAME: self.experiment_name,
        }
        span = new_root(self.experiment_name, attrs)
        self.experiment_span = span
        # As in looptrace.evals, the experiment id is the experiment span's trace id, unless
        # xdist workers were already told another one.
        if not self.id_shared and span.trace_id:
            self.experiment_id = f"{span.trace_id:032x}"
        span.set_attribute(semconv.EXPERIMENT_ID, self.experiment_id)
        if span.is_recording:
            self.parent_ids = (span.trace_id, span.span_id)


_PLUGIN = pytest.StashKey[_Plugin]()


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
