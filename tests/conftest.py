"""Shared test setup: looptrace's own errors raise here, asyncio runs in debug mode, and no test
writes to the user's real store."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ["LOOPTRACE_RAISE_INTERNAL_ERRORS"] = "1"
os.environ["PYTHONASYNCIODEBUG"] = "1"
for _name in list(os.environ):
    # LOOPTRACE_SAVE_SCREENSHOTS is a test-run switch (tests/collector/test_viewer.py), not a setting.
    if _name.startswith(("LOOPTRACE_", "OTEL_")) and _name not in (
        "LOOPTRACE_RAISE_INTERNAL_ERRORS",
        "LOOPTRACE_SAVE_SCREENSHOTS",
    ):
        del os.environ[_name]

sys.path.insert(0, str(Path(__file__).parent))

# LOOPTRACE_TEST_LOOP=uvloop runs the whole run on uvloop (what uvicorn picks when it is
# installed): asyncio.run, pytest-asyncio's loops and the collector's server alike. `nox -s
# tests` runs the client's and the collector's tests that way once more (noxfile.py).
if os.environ.get("LOOPTRACE_TEST_LOOP") == "uvloop":
    import asyncio

    import uvloop

    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


# Capture and export must never block the application's event loop (tests/blocking.py).
BLOCKING_CHECKED = frozenset(
    (
        "test_capture",
        "test_exporters",
        "test_pipeline",
        "test_pipeline_faults",
        "test_pipeline_lifecycle",
    )
)


@pytest.fixture(autouse=True)
def _no_blocking_on_the_loop(request: pytest.FixtureRequest) -> Iterator[None]:
    if request.module.__name__ not in BLOCKING_CHECKED:
        yield
        return
    from blocking import no_blocking_on_the_loop

    with no_blocking_on_the_loop():
        yield


@pytest.fixture(autouse=True)
def _isolated_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test gets its own store path, so nothing lands in ~/.local/share."""
    monkeypatch.setenv("LOOPTRACE_STORE", str(tmp_path / "store.db"))


@pytest.fixture(autouse=True)
def _fail_on_internal_errors(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test during which looptrace recorded an internal error fails, unless it says it
    expects one (``@pytest.mark.internal_errors``): failures in the background (the flusher,
    an exporter) are counted, never raised, and would otherwise pass unnoticed."""
    from looptrace import _errors

    _errors.counts.clear()
    yield
    recorded = {k: v for k, v in _errors.counts.items() if v}
    _errors.counts.clear()
    if recorded and request.node.get_closest_marker("internal_errors") is None:
        pytest.fail(f"looptrace recorded internal errors during this test: {recorded}")


@pytest.fixture(autouse=True)
def _reset_pipeline() -> Iterator[None]:
    """After each test: stop the export pipeline (no flusher leaks into the next test) and go
    back to the configuration in the environment."""
    yield
    from looptrace import Config, _export, _state

    _export.shutdown_sync(timeout=2.0)
    _export._last_stats[0] = None
    _state.config = None
    # A test that left looptrace disabled or misconfigured leaves the next one a fresh start
    # (the first spans of a test are recorded with these switches until its settings are read).
    _state.apply_switches(Config())
    if isinstance(_state.sink, (_state.NullSink, _export.Misconfigured)):
        _state.sink = _export.STARTS_PIPELINE
