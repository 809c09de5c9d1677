"""The progress line an experiment draws while its cases run."""

from __future__ import annotations

import time
from typing import IO

from ._internals import internal_error
from ._results import CaseResult


def _isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except Exception:
        return False


class _Progress:
    """A one-line ``\\r`` progress bar, redrawn at most every 0.1 s."""

    def __init__(
        self,
        stream: IO[str],
        name: str,
        total: int | None,
        results: list[CaseResult],
        first: int,
    ) -> None:
        self.stream = stream
        self.name = name
        self.total = total
        self.results = results
        self.first = first
        self.t0 = time.perf_counter()
        self.last = 0.0
        self.drawn = False

    def update(self) -> None:
        results = self.results[self.first :]
        now = time.perf_counter()
        if now - self.last < 0.1 and (self.total is None or len(results) < self.total):
            return
        self.last = now
        done = len(results)
        errors = sum(1 for r in results if r.error is not None)
        if self.total:
            filled = min(20, done * 20 // self.total)
            bar = f"[{'#' * filled}{'.' * (20 - filled)}] {done}/{self.total}"
        else:
            bar = f"{done} cases"
        line = f"\r{self.name} {bar}  errors {errors}  {now - self.t0:.1f} s"
        try:
            self.stream.write(line)
            self.stream.flush()
            self.drawn = True
        except Exception as exc:
            internal_error("evals.progress", exc)

    def close(self) -> None:
        if self.drawn:
            try:
                self.stream.write("\n")
                self.stream.flush()
            except Exception as exc:
                internal_error("evals.progress", exc)
