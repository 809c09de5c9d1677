"""What a test records about itself: inputs, outputs, expected values and scores."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from looptrace import Span


class TestLog:
    """What a test records about itself, through the ``looptrace`` fixture::

        def test_answer(looptrace):
            answer = ask("2 + 2")
            looptrace.log(inputs={"question": "2 + 2"}, outputs=answer, expected="4")
            looptrace.score("exact", answer == "4")

    Inputs and outputs go to the test span's ``input.value``/``output.value``, the expected value
    to ``looptrace.expected.value`` and each score to ``looptrace.score.<name>``; the terminal
    summary shows the mean of every score. When the test is not traced, every call does nothing.
    """

    __test__ = False  # not a test class, whatever pytest's name rules say

    def __init__(self, span: Span | None) -> None:
        self._span = span
        self.scores: dict[str, float] = {}

    @property
    def enabled(self) -> bool:
        """Whether this test is traced (what is logged is kept)."""
        return self._span is not None and self._span.is_recording

    @property
    def span(self) -> Span | None:
        """The test's root span (None when the test is not traced)."""
        return self._span

    def log(
        self,
        *,
        inputs: Any = None,
        outputs: Any = None,
        expected: Any = None,
        scores: Mapping[str, float | bool] | None = None,
        **attributes: Any,
    ) -> None:
        """Record what the test fed in, what came back, and what was expected (``None`` means
        "not given"); ``scores`` and extra ``attributes`` are set as well."""
        span = self._span
        if span is None:
            return
        if inputs is not None:
            span.set_inputs(inputs)
        if outputs is not None:
            span.set_output(outputs)
        if expected is not None:
            from ._internals import semconv

            span.set_attribute(semconv.EXPECTED_VALUE, expected)
        if attributes:
            span.set_attributes(attributes)
        if scores:
            for name, value in scores.items():
                self.score(name, value)

    def score(self, name: str, value: float | bool) -> None:
        """Record a named score (a number, or a bool counted as 1.0/0.0)."""
        if self._span is None:
            return
        number = float(value)
        self.scores[name] = number
        from ._internals import semconv

        self._span.set_attribute(semconv.SCORE_PREFIX + name, number)
