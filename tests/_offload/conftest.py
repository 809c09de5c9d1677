from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _workers_take_these_payloads(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests carry payloads of hundreds of kilobytes, below the size from which a worker
    pays by default (4 MiB): they test the workers, so the threshold comes down to them."""
    monkeypatch.setenv("LOOPTRACE_OFFLOAD_THRESHOLD_BYTES", str(256 * 1024))
