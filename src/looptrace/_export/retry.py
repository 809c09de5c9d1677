"""What the flusher knows of the destination's health: when the next request may go, whether
it is failing (then one request at a time probes it), and the request counters.

The wait after a failure comes from a :class:`~looptrace._transport.RetryPolicy` (full jitter,
never longer than a fifth of the outage so far), unless the destination said how long to wait
(HTTP ``Retry-After``): then the next request goes when it said, no sooner and no later, since
the jitter, which spreads clients that failed together, is the server's to choose then. A
batch whose next attempt would fall past the retry budget, counted from its first failure, is
given up. The first success ends the outage at once: what is queued goes out as fast as the
in-flight limit allows, not at the backoff's pace.

An outage is said twice on the ``looptrace`` logger, at WARNING: when it starts (where to, and
the error) and when the destination answers again. Once shutdown begins with the destination
failing (:meth:`Health.closing`), what is held gets one more attempt at once and is given up
if that fails too: a backend that was down all along does not hold the exit for the whole
shutdown timeout.
"""

from __future__ import annotations

import logging
import threading
import time

from .._transport import RetryPolicy
from .exporter import Outcome

__all__ = ["Health"]

logger = logging.getLogger("looptrace")


class Health:
    """Counters and backoff state; every method is safe from any thread."""

    def __init__(self, policy: RetryPolicy, where: str = "the backend") -> None:
        self.policy = policy
        self.where = where  # the URL (or the store) named in every message
        self._lock = threading.Lock()
        self.retry_at = 0.0  # monotonic: no request before this
        self.failing_since: float | None = None  # set at the first failure of an outage
        self._consecutive_failures = 0
        self.requests_sent = 0
        self.requests_failed = 0
        self.retries = 0
        self.last_error: str | None = None
        self._rejections: set[str] = set()
        self._give_up = False  # closing while failing: no more backoff

    @property
    def failing(self) -> bool:
        return self.failing_since is not None

    def sent(self) -> None:
        with self._lock:
            self.requests_sent += 1
            self._consecutive_failures = 0
            self.last_error = None  # it says what is wrong now, not what once was
            since = self.failing_since
            if since is not None:
                self.failing_since = None
                self.retry_at = 0.0
        if since is not None:
            logger.warning(
                "looptrace: %s answers again after %.1f s; sending what was kept meanwhile",
                self.where,
                time.monotonic() - since,
            )

    def failed(self, error: str, retry_after: float | None, first_failure: float) -> str | None:
        """Count a failed attempt of a batch that first failed at ``first_failure``: None when
        it is tried again later, or why it is given up (past the retry budget, or shutting
        down with the destination still failing)."""
        now = time.monotonic()
        with self._lock:
            self.requests_failed += 1
            if not (self._give_up and self.last_error):
                # Once giving up, the outage's own error says more than the last attempt's.
                self.last_error = error
            since = self.failing_since
            started = since is None
            if since is None:
                since = self.failing_since = now
            if retry_after is not None:
                delay = retry_after
            else:
                delay = self.policy.delay(self._consecutive_failures, None, now - since)
            if self._give_up:
                verdict: str | None = "shutdown"
            elif now + delay - first_failure > self.policy.budget:
                verdict = "retries_exhausted"
            else:
                verdict = None
                self._consecutive_failures += 1
                self.retries += 1
                self.retry_at = max(self.retry_at, now + delay)
        if started and not self._give_up:
            logger.warning(
                "looptrace: cannot export to %s (%s); spans are kept and retried (within "
                "LOOPTRACE_RETRY_BUDGET and the buffer's bounds)",
                self.where,
                error,
            )
        return verdict

    def closing(self) -> None:
        """Shutdown began: if the destination is failing, try what is held once more now and
        give it up when that fails too."""
        with self._lock:
            if self.failing_since is not None:
                self._give_up = True
                self.retry_at = 0.0

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
