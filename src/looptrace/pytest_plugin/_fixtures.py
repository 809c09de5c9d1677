"""The plugin's fixtures: ``looptrace_log`` (and its former name) and ``looptrace_spans``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from ._log import TestLog
from ._spans import _RECORD, _TestRecord

if TYPE_CHECKING:
    from looptrace.testing import SpanCapture


@pytest.fixture
def looptrace_log(request: pytest.FixtureRequest) -> TestLog:
    """Log inputs, outputs, expected values and scores on this test's span."""
    record: _TestRecord | None = request.node.stash.get(_RECORD, None)
    if record is None:
        return TestLog(None)
    return record.log


@pytest.fixture
def looptrace(looptrace_log: TestLog) -> TestLog:
    """The former name of ``looptrace_log``: as a test parameter it hid the ``looptrace``
    module inside the test. Still works, with a deprecation warning."""
    import warnings

    warnings.warn(
        "the 'looptrace' fixture is now 'looptrace_log' (the old name hides the looptrace "
        "module inside the test)",
        DeprecationWarning,
        stacklevel=2,
    )
    return looptrace_log


@pytest.fixture
def looptrace_spans() -> Iterator[SpanCapture]:
    """The spans this test's own code makes, in memory, with deterministic ids and clock.

    Works whether or not the plugin is on; while it is requested, the test's code is not
    parented to the test span, so ``spans.roots()`` and ``spans.tree()`` see only the test's
    own spans.
    """
    from looptrace.testing import capture_spans

    with capture_spans(deterministic=True) as spans:
        yield spans
