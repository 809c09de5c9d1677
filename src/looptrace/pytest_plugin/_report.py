"""The end of the session: the experiment span's summary, one bounded flush, the terminal lines.

Only the process that prints (the only one, or the xdist controller) closes the experiment
span and writes the summary; every process flushes its own spans.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from ._outcomes import _summarize
from ._session import _PLUGIN, _Plugin


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
    delivery: dict[str, Any] = {
        "sent": 0,
        "dropped": 0,
        "spooled": 0,
        "spool": "",
        "seconds": 0.0,
        "error": "",
    }
    plugin.delivery = delivery
    try:
        result = looptrace.shutdown_sync(cfg.shutdown_timeout)
        stats = looptrace.statistics()
    except Exception as exc:  # tracing must never fail the run
        delivery["error"] = f"flush failed: {type(exc).__name__}: {exc}"
        return
    delivery["sent"] = stats.spans_sent
    delivery["dropped"] = stats.dropped_total + result.pending
    # Kept on disk for the next process that exports to the same endpoint: not lost, not sent.
    delivery["spooled"] = stats.spooled
    delivery["spool"] = stats.spool.directory or ""
    delivery["seconds"] = time.monotonic() - started
    if delivery["dropped"] or delivery["spooled"]:
        delivery["error"] = stats.last_error or ""


def _delivery_warning(deliveries: list[dict[str, Any]], where: str) -> str:
    """One line for the whole run (every xdist worker included), or "" when all arrived."""
    dropped = sum(int(d.get("dropped", 0)) for d in deliveries)
    spooled = sum(int(d.get("spooled", 0)) for d in deliveries)
    errors = [str(d["error"]) for d in deliveries if d.get("error")]
    if not dropped and not spooled and not errors:
        return ""
    seconds = max(float(d.get("seconds", 0.0)) for d in deliveries)
    error = f" ({errors[0]})" if errors else ""
    kept = ""
    if spooled:
        spool = next((str(d["spool"]) for d in deliveries if d.get("spool")), "the spool")
        kept = f"; {spooled} kept in {spool} for the next run to send"
    return (
        f"looptrace: {dropped + spooled} span(s) not delivered to {where} within "
        f"{seconds:.1f} s{error}{kept}"
    )


def _worst_pause(plugin: _Plugin) -> tuple[str, float] | None:
    """The test whose process was not scheduled the longest, from the reports' properties (an
    xdist controller sees only reports)."""
    from ._lag import UNSCHEDULED_PROPERTY

    worst: tuple[str, float] | None = None
    for nodeid, reports in plugin.reports.items():
        for report in reports:
            for name, value in getattr(report, "user_properties", ()):
                if name == UNSCHEDULED_PROPERTY and (worst is None or float(value) > worst[1]):
                    worst = (nodeid, float(value))
    return worst


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
            f"loop lag    worst stall {s.worst_lag.lag_max_ms:.0f} ms in {s.worst_lag.nodeid}"
            f"{culprit}"
        )
    pause = _worst_pause(plugin)
    if pause is not None:
        tr.write_line(
            f"loop pause  {pause[1]:.0f} ms not scheduled in {pause[0]} (the machine was busy or "
            "the process was stopped)"
        )
    deliveries = [plugin.delivery, *plugin.worker_counts]
    sent = sum(int(d.get("sent", 0)) for d in deliveries)
    dropped = sum(int(d.get("dropped", 0)) for d in deliveries)
    spooled = sum(int(d.get("spooled", 0)) for d in deliveries)
    tr.write_line(
        f"spans       {sent} sent, {dropped} dropped" + (f", {spooled} spooled" if spooled else "")
    )
    import looptrace

    cfg = looptrace.get_config()
    if cfg.endpoint:
        tr.write_line(f"traces      sent to {cfg.endpoint}")
    else:
        from ._internals import default_store_path

        store = "" if cfg.store_path == default_store_path() else f"--store {cfg.store_path} "
        tr.write_line(
            f"traces      looptrace {store}experiments {plugin.experiment_id}"
            f"  (in a browser: looptrace {store}serve)"
        )
    warning = _delivery_warning(deliveries, cfg.endpoint or str(cfg.store_path))
    if warning:
        tr.write_line(warning, yellow=True)
