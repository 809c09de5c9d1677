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
    if _name.startswith(("LOOPTRACE_", "OTEL_")) and _name != "LOOPTRACE_RAISE_INTERNAL_ERRORS":
        del os.environ[_name]

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True)
def _isolated_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every test gets its own store path, so nothing lands in ~/.local/share."""
    monkeypatch.setenv("LOOPTRACE_STORE", str(tmp_path / "store.db"))
    yield
