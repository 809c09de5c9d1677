"""A pipeline's lifecycle: one object with an explicit state, after httpx's client state and the
OpenTelemetry SDK's batch processor.

    RUNNING --shutdown()/shutdown_sync()--> STOPPING --flushed--> CLOSING --last flusher--> CLOSED
       |                                                             ^
       +---------------- close_soon() (configure replaced it) -------+

``STOPPING``: the caller of shutdown waits for a flush; a backend that fails is not waited for
(what is held goes to the spool, or is given up, at once). ``CLOSING``: a deadline is set; each
flusher stops once nothing is held, or when the deadline cancels it. ``CLOSED``: what was still
held is dropped (or spooled) and counted, and the buffer takes no span any more. States only go
forward; every transition is made under one lock, from any thread.
"""

from __future__ import annotations

import enum
import threading

__all__ = ["Lifecycle", "State"]


class State(enum.Enum):
    RUNNING = "running"
    STOPPING = "stopping"
    CLOSING = "closing"
    CLOSED = "closed"


_ORDER = {State.RUNNING: 0, State.STOPPING: 1, State.CLOSING: 2, State.CLOSED: 3}


class Lifecycle:
    """The state, the shutdown deadline (set on entering ``CLOSING``), and a way to wait for
    ``CLOSED`` from any thread."""

    __slots__ = ("_closed", "_deadline", "_lock", "_state")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state = State.RUNNING
        self._deadline: float | None = None
        self._closed = threading.Event()

    def __repr__(self) -> str:
        return f"<Lifecycle {self._state.value}>"

    @property
    def state(self) -> State:
        return self._state

    @property
    def running(self) -> bool:
        return self._state is State.RUNNING

    @property
    def closing(self) -> bool:
        """A deadline is set: flushers stop once nothing is held (``CLOSING`` or ``CLOSED``)."""
        return self._deadline is not None

    @property
    def closed(self) -> bool:
        return self._state is State.CLOSED

    @property
    def deadline(self) -> float | None:
        """The monotonic time by which the flushers stop, once ``CLOSING``."""
        return self._deadline

    def _advance(self, to: State) -> bool:
        # Under the lock. States only go forward.
        if _ORDER[to] <= _ORDER[self._state]:
            return False
        self._state = to
        return True

    def stop(self) -> None:
        """``shutdown`` began: flush what is held, not waiting for a backend that fails."""
        with self._lock:
            self._advance(State.STOPPING)

    def begin_close(self, deadline: float) -> None:
        """Stop the flushers once nothing is held, or at ``deadline`` (the earlier of two
        deadlines wins)."""
        with self._lock:
            self._advance(State.CLOSING)
            if self._state is State.CLOSING and (
                self._deadline is None or deadline < self._deadline
            ):
                self._deadline = deadline

    def close(self) -> bool:
        """Enter ``CLOSED``; True for the one caller that made the transition, which calls
        :meth:`closed_down` once it has dropped or spooled what was held."""
        with self._lock:
            if self._deadline is None:
                self._deadline = 0.0
            return self._advance(State.CLOSED)

    def closed_down(self) -> None:
        """What was held is accounted for: wake whoever waits in :meth:`wait_closed`."""
        self._closed.set()

    def wait_closed(self, timeout: float | None = None) -> bool:
        """Block this thread until ``CLOSED`` and accounted for (at most ``timeout`` s)."""
        return self._closed.wait(timeout)
