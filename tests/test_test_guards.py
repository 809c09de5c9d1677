"""The guards tests/conftest.py puts around every test, tested on inner runs of the same
conftest (pytester): a background failure fails the test that caused it."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

CONFTEST = (Path(__file__).parent / "conftest.py").read_text()


def test_a_background_failure_fails_the_test_unless_it_is_expected(
    pytester: pytest.Pytester,
) -> None:
    """An internal error recorded in looptrace's background (here: a thread, as the flusher
    runs) is never raised into the test, and would pass unnoticed; the guard fails the test,
    naming it. A test marked ``internal_errors`` expects it and passes."""
    pytester.makeconftest(
        CONFTEST.replace("Path(__file__).parent", f"Path({str(Path(__file__).parent)!r})")
    )
    pytester.makeini(
        "[pytest]\naddopts = -p no:benchmark -p no:hypothesispytest -p no:cacheprovider\n"
        "markers = internal_errors: expected\n"
    )
    pytester.makepyfile(
        """
import threading
import pytest
from looptrace import _errors

def plant():
    thread = threading.Thread(
        target=_errors.report_internal, args=("pipeline.send", RuntimeError("planted"))
    )
    thread.start()
    thread.join()

def test_planted():
    plant()

@pytest.mark.internal_errors
def test_expected():
    plant()

def test_clean():
    pass
"""
    )
    result = pytester.runpytest_subprocess("-p", "no:randomly")
    # The planted test's teardown fails (pytest counts the call as passed and the teardown
    # as an error): the run is red, and names the test and the failure.
    result.assert_outcomes(passed=3, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*looptrace recorded internal errors during this test: {'pipeline.send': 1}*",
            "ERROR *::test_planted*",
        ]
    )
