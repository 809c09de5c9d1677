"""What each test's reports say, and what they add up to for the session.

Built from the reports alone, so an xdist controller, which sees only its workers' reports, has
the same view as a single process.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest


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
