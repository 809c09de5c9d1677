"""The plugin's command-line options, ini settings and marker."""

from __future__ import annotations

import math

import pytest

_MARKER_HELP = (
    "looptrace(max_loop_lag_ms=None, count_unscheduled=False): trace this test with looptrace "
    "(even without --looptrace); with max_loop_lag_ms, fail an async test whose code stalled the "
    "event loop longer than that (time the process was not scheduled is reported, and counted "
    "only with count_unscheduled=True)."
)


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
        help="fail async tests whose code stalled the event loop longer than MS "
        "(implies --looptrace).",
    )
    group.addoption(
        "--looptrace-count-unscheduled",
        action="store_true",
        default=False,
        help="the stall limit counts the raw worst lag: time the process was not scheduled "
        "(a busy machine, a stopped process) and looptrace's own work included.",
    )
    parser.addini("looptrace", "trace every test with looptrace", type="bool", default=False)
    parser.addini("looptrace_experiment", "experiment name for test runs", default="")
    parser.addini(
        "looptrace_max_loop_lag_ms", "default event-loop stall limit for async tests", default=""
    )
    parser.addini(
        "looptrace_count_unscheduled",
        "the stall limit counts time the process was not scheduled too",
        type="bool",
        default=False,
    )


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
