"""What an experiment produces: one result per case, and the summary of them all.

Plain values, built by the cases and the experiment; ``ExperimentSummary.format`` is the table
printed when an experiment's block ends.
"""

from __future__ import annotations

import dataclasses
import math
import statistics as _stats
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from looptrace.monitor import LagSnapshot


@dataclasses.dataclass(frozen=True)
class Score:
    """One named score. Scorers may return one (to add a comment) instead of a bare number.

    ``name`` may be left empty in a scorer's return value: the scorer's own name is used.
    """

    name: str
    value: float
    comment: str | None = None


@dataclasses.dataclass(frozen=True)
class CaseResult:
    """What happened to one case: its data, the output, the scores, and any error."""

    index: int
    repetition: int
    input: Any
    expected: Any
    metadata: Mapping[str, Any] | None
    output: Any
    scores: Mapping[str, Score]
    error: str | None
    scorer_errors: Mapping[str, str]
    duration_ms: float
    trace_id: str
    # LLM token usage summed over the case's trace (gen_ai.usage.* attributes).
    input_tokens: int = 0
    output_tokens: int = 0
    # The case's LLM cost, worked out when first read (see cost_usd).
    _cost: Any = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def cost_usd(self) -> float | None:
        """USD summed over the LLM calls of the case's trace that have a known price
        (``llm.cost.total``); None when none has, never a guess."""
        cost = self._cost
        return None if cost is None else cost.resolve()

    @property
    def ok(self) -> bool:
        """True when neither the task nor any scorer raised."""
        return self.error is None and not self.scorer_errors


@dataclasses.dataclass(frozen=True)
class ScoreSummary:
    """One score over all the cases that have it."""

    name: str
    count: int
    mean: float
    stdev: float  # population standard deviation (0 for one case)
    min: float
    max: float


@dataclasses.dataclass(frozen=True)
class ExperimentSummary:
    """The numbers printed when an experiment ends, typed, for notebooks and CI assertions.

    ``spans_sent``/``spans_dropped`` are the pipeline's counters over the experiment's lifetime
    (process-wide: other traffic at the same time is included). ``unsent`` is what the final flush
    could not deliver before its deadline; it and ``flushed`` are only final after the block.

    ``loop`` is the event loop's figures over the experiment's own window (from entering the block
    to leaving it; asyncio only, None on trio): ``loop.worst_stall_ms`` is the longest the
    program held the loop, with ``worst_stall_cause``; ``loop.p99_ms`` the p99 lag;
    ``loop.unscheduled_ms`` the time the process was not scheduled. ``worst_loop_lag_ms`` is
    the worst lag, everything included (``loop.max_ms``).
    """

    name: str
    id: str
    cases: int
    errors: int
    scorer_errors: int
    scores: Mapping[str, ScoreSummary]
    latency_p50_ms: float | None
    latency_p95_ms: float | None
    wall_s: float
    spans_sent: int
    spans_dropped: int
    unsent: int
    worst_loop_lag_ms: float | None
    backpressure_waits: int
    backpressure_wait_s: float
    flushed: bool
    # LLM token usage summed over every case.
    input_tokens: int = 0
    output_tokens: int = 0
    # The event loop over the experiment's window (see the docstring).
    loop: LagSnapshot | None = None
    # USD summed over the cases whose cost is known; None when no case's is.
    cost_usd: float | None = None

    def format(self) -> str:
        """The summary as the compact table printed when the block ends."""
        lines = [
            f"experiment {self.name!r}  id {self.id}",
            f"  cases {self.cases}  errors {self.errors}  scorer errors {self.scorer_errors}"
            f"  wall {self.wall_s:.2f} s",
        ]
        if self.scores:
            width = max(5, *(len(n) for n in self.scores))
            lines.append(
                f"  {'score':<{width}}  {'mean':>7} {'stdev':>7} {'min':>7} {'max':>7} {'n':>5}"
            )
            for s in self.scores.values():
                lines.append(
                    f"  {s.name:<{width}}  {s.mean:7.3f} {s.stdev:7.3f} {s.min:7.3f} {s.max:7.3f}"
                    f" {s.count:5d}"
                )
        if self.latency_p50_ms is not None and self.latency_p95_ms is not None:
            lines.append(
                f"  latency p50 {self.latency_p50_ms:.1f} ms  p95 {self.latency_p95_ms:.1f} ms"
            )
        if self.input_tokens or self.output_tokens:
            cost = "" if self.cost_usd is None else f"  cost ${self.cost_usd:.6f}"
            lines.append(f"  tokens in {self.input_tokens}  out {self.output_tokens}{cost}")
        elif self.cost_usd is not None:
            lines.append(f"  cost ${self.cost_usd:.6f}")
        lines.append(
            f"  spans sent {self.spans_sent}  dropped {self.spans_dropped}  unsent {self.unsent}"
        )
        lines.append(f"  loop  {_loop_line(self.loop, self.worst_loop_lag_ms)}")
        if self.backpressure_waits:
            lines.append(
                f"  backpressure: waited {self.backpressure_waits} times,"
                f" {self.backpressure_wait_s:.2f} s in all"
            )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()


def _loop_line(loop: LagSnapshot | None, worst_lag_ms: float | None) -> str:
    """``worst stall 17.7 ms in generate (app.py:86)  p99 lag 14.0 ms  over 0.20 s``, and the
    time the process was not scheduled or looptrace worked, when there was any."""
    if loop is None:
        if worst_lag_ms is None:
            return "n/a (the lag monitor is asyncio-only)"
        return f"worst lag {worst_lag_ms:.1f} ms"
    import os

    cause = loop.worst_stall_cause
    if cause.endswith(")") and " (" in cause:
        head, _, place = cause[:-1].rpartition(" (")
        path, _, line = place.rpartition(":")
        try:
            rel = os.path.relpath(path)
        except ValueError:
            rel = path
        cause = f"{head} ({path if rel.startswith('..') else rel}:{line})"
    text = f"worst stall {loop.worst_stall_ms:.1f} ms"
    if cause and loop.worst_stall_ms:
        text += f" in {cause}"
    text += f"  p99 lag {loop.p99_ms:.1f} ms  over {loop.window_ms / 1e3:.2f} s"
    if loop.unscheduled_ms >= 1.0:
        text += f"  not scheduled {loop.unscheduled_ms:.0f} ms"
    if loop.looptrace_ms >= 1.0:
        text += f"  looptrace's own {loop.looptrace_ms:.0f} ms"
    return text


def _summarize(name: str, values: list[float]) -> ScoreSummary:
    return ScoreSummary(
        name=name,
        count=len(values),
        mean=_stats.fmean(values),
        stdev=_stats.pstdev(values) if len(values) > 1 else 0.0,
        min=min(values),
        max=max(values),
    )


def _percentile(ordered: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default) on a sorted list."""
    if not ordered:
        return None
    pos = (len(ordered) - 1) * q
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)
