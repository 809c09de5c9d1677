"""What the viewer's browser tests share: Debian's headless chromium driven by Playwright (never
a downloaded browser), a tab that fails its test on a script error, and the page's ready mark."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# What a step may wait for a page on a loaded machine: a bound, never a pause.
TIMEOUT_MS = 30_000
ROOT = Path(__file__).resolve().parent.parent

browser_test = pytest.mark.browser
needs_chromium = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="needs Debian's chromium at /usr/bin/chromium (apt-get install -y chromium)",
)


def launch_chromium() -> Iterator[Any]:
    """The browser, for a module-scoped fixture to yield from; skips without chromium."""
    if not CHROMIUM.exists():
        pytest.skip("needs Debian's chromium at /usr/bin/chromium (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@contextlib.contextmanager
def new_tab(browser: Any, base_url: str, **options: Any) -> Iterator[Any]:
    """A fresh tab on ``base_url``; the test fails if the page logs a script error or a CSP
    violation. ``options`` go to the browser context (``timezone_id``...)."""
    context = browser.new_context(
        viewport={"width": 1280, "height": 800}, base_url=base_url, **options
    )
    context.set_default_timeout(TIMEOUT_MS)
    tab = context.new_page()
    problems: list[str] = []
    tab.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    tab.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    yield tab
    context.close()
    assert problems == []


def open_page(page: Any, path: str) -> None:
    """Go to ``path`` and wait until the viewer has drawn it."""
    page.goto(path)
    page.wait_for_selector("body[data-ready='1']")


def screenshot(page: Any, name: str, tmp_path: Path) -> Path:
    """A screenshot: to docs/img/ with LOOPTRACE_SAVE_SCREENSHOTS=1 (how the docs' are made)."""
    if os.environ.get("LOOPTRACE_SAVE_SCREENSHOTS") == "1":
        target = ROOT / "docs" / "img" / f"viewer-{name}.png"
    else:
        target = tmp_path / f"viewer-{name}.png"
    target.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(target))
    assert target.stat().st_size > 0
    return target
