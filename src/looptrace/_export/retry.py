"""What the flusher knows of the destination's health: when the next request may go, whether
it is failing (then one request at a time probes it), and the request counters.

The wait after a failure comes from a :class:`~looptrace._transport.RetryPolicy` (full jitter,
never longer than a fifth of the outage so far, the destination's Retry-After as a floor); a
batch whose next attempt would fall past the retry budget, counted from its first failure, is
given up. The first success ends the outage at once: what is queued goes out as fast as the
in-flight limit allows, not at the backoff's pace.
"""

from __future__ import annotations

import threading
import time

from .._transport import RetryPolicy
from .exporter import Outcome

__all__ = ["Health"]


class Health:
    """Counters and backoff state; every method is safe from any thread."""

    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy
        self._lock = threading.Lock()
        self.retry_at = 0.0  # monotonic: no request before this
        self.failing_since: float | None = None  # set at the first failure of an outage
        self._consecutive_failures = 0
        self.requests_sent = 0
        self.requests_failed = 0
        self.retries = 0
        self.last_error: str | None = None
        self._rejections: set[str] = set()

    @property
    def failing(self) -> bool:
        return self.failing_since is not None

    def sent(self) -> None:
        with self._lock:
            self.requests_sent += 1
            self._consecutive_failures = 0
            self.last_error = None  # it says what is wrong now, not what once was
            if self.failing_since is not None:
                self.failing_since = None
                self.retry_at = 0.0

    def failed(self, error: str, retry_after: float | None, first_failure: float) -> bool:
        """Count a failed attempt of a batch that first failed at ``first_failure``; False when
        its next attempt would fall past the retry budget (give it up)."""
        now = time.monotonic()
        with self._lock:
            self.requests_failed += 1
            self.last_error = error
            if self.failing_since is None:
                self.failing_since = now
            delay = self.policy.delay(
                self._consecutive_failures, retry_after, now - self.failing_since
            )
            if now + delay - first_failure > self.policy.budget:
                return False
            self._consecutive_failures += 1
            self.retries += 1
            self.retry_at = max(self.retry_at, now + delay)
            return True

    def too_large(self, outcome: Outcome) -> None:
        with self._lock:
            self.requests_failed += 1
            self.last_error = f"{outcome.error}: request too large, split in halves"

    def rejected(self, outcome: Outcome) -> bool:
        """Count a refusal; True the first time this kind of refusal is seen."""
        with self._lock:
            self.requests_failed += 1
            self.last_error = outcome.describe()
            first = outcome.error not in self._rejections
            self._rejections.add(outcome.error)
            return first
