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
    # LOOPTRACE_SAVE_SCREENSHOTS is a test-run switch (tests/test_viewer.py), not a setting.
    if _name.startswith(("LOOPTRACE_", "OTEL_")) and _name not in (
        "LOOPTRACE_RAISE_INTERNAL_ERRORS",
        "LOOPTRACE_SAVE_SCREENSHOTS",
    ):
        del os.environ[_name]

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True)
def _isolated_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test gets its own store path, so nothing lands in ~/.local/share."""
    monkeypatch.setenv("LOOPTRACE_STORE", str(tmp_path / "store.db"))


@pytest.fixture(autouse=True)
def _reset_pipeline() -> Iterator[None]:
    """After each test: stop the export pipeline (no flusher leaks into the next test) and go
    back to the configuration in the environment."""
    yield
    from looptrace import _errors, _export, _state

    _export.shutdown_sync(timeout=2.0)
    _export._last_stats[0] = None
    _state.config = None
    # A test that left looptrace disabled or misconfigured leaves the next one a fresh start.
    _state.disabled = False
    if isinstance(_state.sink, (_state.NullSink, _export.Misconfigured)):
        _state.sink = _export.STARTS_PIPELINE
    # A test that provokes an internal error on purpose must not show up in the next one.
    _errors.counts.clear()
