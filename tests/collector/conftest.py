"""What the viewer's browser tests share: one chromium per test module, and a fresh tab on the
viewer a module serves (its ``base_url`` fixture) for each test."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from viewer_support import launch_chromium, new_tab


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from launch_chromium()


@pytest.fixture
def page(browser: Any, base_url: str) -> Iterator[Any]:
    """A fresh tab on the module's viewer; the test fails on a script error."""
    with new_tab(browser, base_url) as tab:
        yield tab
