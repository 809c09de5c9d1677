"""The README's tour is a program that runs and scores what it says it scores."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_readme_tour_runs_and_both_cases_score() -> None:
    """The tour's experiment runs as printed in the README: two cases, no errors, and its
    scorer (named in the summary) gives both cases full marks."""
    text = (ROOT / "README.md").read_text()
    match = re.search(r"```python\n(import asyncio\nimport looptrace\n.*?)```", text, re.S)
    assert match is not None, "the README's tour is missing"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOOPTRACE_", "OTEL_"))}
    env["LOOPTRACE_STORE"] = str(Path(os.environ["LOOPTRACE_STORE"]))
    done = subprocess.run(
        [sys.executable, "-c", match.group(1)], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    summary = done.stdout + done.stderr  # the summary is printed to standard error
    assert "cases 2  errors 0" in summary
    assert re.search(r"mentions_expected\s+1\.000\s+0\.000\s+1\.000\s+1\.000\s+2", summary)
