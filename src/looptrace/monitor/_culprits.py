"""Culprits: name the callback or task step that held the loop, say what held it, and tell the
span it hurt.

Every monitor joins its loop's watch (``_Watch``), whose watchdog thread looks every few
milliseconds: each look is a heartbeat that finds the time the process did not run
(``_causes``). While some monitor on the loop has ``culprits=True``, the wrapped
``Handle._run`` (``_hook``) also bumps a counter per callback; the watchdog dates callbacks from
that counter and samples the loop thread's stack (``sys._current_frames``) once one has run for
half the threshold. When the step ends above the threshold it becomes a :class:`Culprit` with
its cause (the program's code, garbage collection, looptrace's own work, or the process not
running) on every monitor whose threshold it passed, and a ``looptrace.loop.stall`` event on the
span that was active in the blocked code (or a line on the ``looptrace.monitor`` logger when
there was none).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from ._causes import _MIN_PAUSE, GC_LOG, _Beats, describe_gc, describe_pause
from ._frames import _CORO_FLAGS as _CORO_FLAGS
from ._frames import _DEMO_FILE as _DEMO_FILE
from ._frames import _LOOPTRACE_DIR as _LOOPTRACE_DIR
from ._frames import _MAX_STACK as _MAX_STACK
from ._frames import _STDLIB_DIR as _STDLIB_DIR
from ._frames import _Frame, _own_work, _pick, _user_frame, _walk
from ._hook import _patch, _refresh_patch, _release_watch, _watches
from ._internals import CURRENT, _clock, internal_error
from ._registry import _forget_loop, _lock

if TYPE_CHECKING:
    from ._internals import Span
    from ._monitor import LagMonitor

logger = logging.getLogger("looptrace.monitor")

STALL_EVENT = "looptrace.loop.stall"

_perf = time.perf_counter
_MAX_SAMPLES = 64

# What held the loop, as a Culprit's and a stall event's ``cause`` says it.
CAUSE_CODE = "code"  # the program's code (the user's, or a library it called)
CAUSE_GC = "gc"  # garbage collection, most of the stall
CAUSE_LOOPTRACE = "looptrace"  # looptrace's own work (its start-up included): never the user's
CAUSE_UNSCHEDULED = "unscheduled"  # the process did not run, most of the stall
# The causes a stall limit counts: what the program did.
CHARGED_CAUSES = frozenset((CAUSE_CODE, CAUSE_GC))


@dataclasses.dataclass(frozen=True)
class Culprit:
    """A callback or task step that held the event loop longer than the threshold.

    ``qualname``/``filename``/``lineno`` name the innermost coroutine (or, for a plain callback,
    the innermost function) at the line where it was blocking, as sampled while it ran;
    ``stack`` is the whole sampled stack, outermost first, as ``"qualname (file:line)"``.
    ``task_name`` is None for a callback that is not a task step.

    ``cause`` says what held the loop: ``"code"`` (the program's code), ``"gc"`` (garbage
    collection took most of it: ``gc_ms``, ``gc_generation``), ``"looptrace"`` (looptrace's own
    work, its start-up included: ``qualname`` is then ``"looptrace start-up"`` or
    ``"looptrace (<function>)"``, and the file and line are where the user's code called it), or
    ``"unscheduled"`` (the process did not run for most of it: ``unscheduled_ms``).
    ``stall_ms`` is the part of ``duration_ms`` the process was running.
    """

    task_name: str | None
    qualname: str
    filename: str
    lineno: int
    duration_ms: float
    stack: tuple[str, ...]
    cause: str = CAUSE_CODE
    unscheduled_ms: float = 0.0
    gc_ms: float = 0.0
    gc_generation: int | None = None

    @property
    def stall_ms(self) -> float:
        """How long the loop was held while the process ran: the duration less the time the
        process was not scheduled."""
        return round(max(0.0, self.duration_ms - self.unscheduled_ms), 3)

    @property
    def charged(self) -> bool:
        """Whether the program's code caused it (its code or its garbage collection), rather
        than looptrace or the operating system."""
        return self.cause in CHARGED_CAUSES

    def describe_cause(self) -> str:
        """The cause in words: ``garbage collection (generation 2, 78 ms)``,
        ``process not scheduled for 150 ms (...)``, ``looptrace start-up``, or ``""`` for the
        program's code (the file and line say it)."""
        if self.cause == CAUSE_GC:
            generation = -1 if self.gc_generation is None else self.gc_generation
            return describe_gc(self.gc_ms / 1e3, generation, None)
        if self.cause == CAUSE_UNSCHEDULED:
            return describe_pause(self.unscheduled_ms / 1e3)
        if self.cause == CAUSE_LOOPTRACE:
            return self.qualname
        return ""


class _Watch:
    """Per-loop state shared by the loop thread (the wrapped ``Handle._run``, the ticker) and
    the watchdog.

    The loop thread bumps ``seq`` when a callback starts and sets ``done`` when it ends, and does
    nothing else on the common path: no clock reading, which would cost as much again. The
    watchdog reads them without a lock (each read and write is atomic under the GIL), dates a
    callback's start to the middle of the two looks around it (``t0``, within half a period),
    and re-checks ``seq``/``done`` after sampling, so a sample is only kept for the callback it
    saw. Each look is also a heartbeat (``beats``): the time the process did not run.
    """

    __slots__ = (
        "beats",
        "delivered",
        "done",
        "flagged",
        "handle",
        "hooked",
        "last_look",
        "loop",
        "monitors",
        "samples",
        "seen",
        "seq",
        "stop",
        "t0",
        "t0_low",
        "thread",
        "thread_id",
        "threshold",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop, thread_id: int) -> None:
        self.loop = loop
        self.thread_id = thread_id
        self.monitors: list[LagMonitor] = []
        self.threshold = 0.1
        # Whether some monitor here names culprits (and the Handle._run wrapper serves it).
        self.hooked = False
        self.seq = 0
        self.done = 0
        self.seen = 0
        self.t0 = 0.0
        self.t0_low = 0.0
        self.last_look = _perf()
        self.handle: asyncio.Handle | None = None
        self.flagged = -1
        self.samples: list[tuple[list[_Frame], Span | None]] = []
        self.delivered: list[Span] = []
        self.beats = _Beats()
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    def refresh(self) -> None:
        naming = [m for m in self.monitors if m._culprit_watch]
        self.hooked = bool(naming)
        self.threshold = min((m._threshold for m in naming), default=0.1)
        shortest = min((m._threshold for m in self.monitors), default=0.0)
        self.beats.floor = max(_MIN_PAUSE, shortest / 2)

    # -- watchdog thread ---------------------------------------------------------------------

    def run_watchdog(self) -> None:
        try:
            while True:
                # A quarter of the threshold between looks: a step is first sampled between
                # half and three quarters of the threshold, before it crosses it. Bounded so a
                # huge threshold still notices a closed loop, and a pause is seen within 25 ms.
                period = min(max(self.threshold / 4, 0.002), 0.025)
                if self.stop.wait(period):
                    return
                if self.loop.is_closed():
                    _forget_loop(self.loop)
                    return
                self.beats.beat(period)
                if self.hooked:
                    self.look()
        except Exception as exc:  # never let the watchdog die silently under our tests
            internal_error("monitor.watchdog", exc)

    def look(self) -> None:
        now = _perf()
        previous, self.last_look = self.last_look, now
        s = self.seq
        if self.done == s:
            return
        if self.seen != s:
            # First time we see this callback: it started since the previous look.
            self.seen = s
            self.t0 = (previous + now) / 2
            self.t0_low = previous
            return
        handle = self.handle
        if handle is None or now - self.t0 < self.threshold / 2:
            return
        frame = sys._current_frames().get(self.thread_id)
        if frame is None:
            return
        frames = _walk(frame)
        context = getattr(handle, "_context", None)
        span = context.get(CURRENT) if context is not None else None
        if self.seq != s or self.done == s:
            return  # the callback ended while we looked: the sample may be someone else's
        if self.flagged != s:
            self.samples = []
            self.delivered = []
        if len(self.samples) < _MAX_SAMPLES:
            self.samples.append((frames, span))
        self.flagged = s

    # -- loop thread -------------------------------------------------------------------------

    def _elapsed(self, now: float) -> float:
        """How long the current step has run: from ``t0``, or from the first collection inside
        it when one held the GIL while the step began (the watchdog could not look then)."""
        start = self.t0
        for a, b, _gen, _where in list(GC_LOG.ring):
            if self.t0_low <= a < start and b > a:
                start = a
                break
        return now - start

    def finish(self, handle: asyncio.Handle) -> None:
        """A sampled callback just returned: if it ran past the threshold, report it."""
        now = _perf()
        elapsed = self._elapsed(now)
        samples, delivered = self.samples, self.delivered
        self.samples, self.delivered = [], []
        if elapsed < self.threshold:
            return
        culprit = _make_culprit(handle, samples, elapsed, self.beats, now)
        for monitor in self.monitors:
            monitor._note_culprit(culprit)
            if monitor._culprit_watch and elapsed >= monitor._threshold:
                monitor._culprits.append(culprit)
        emitted = bool(delivered)
        for _, span in reversed(samples):
            if span is not None and span.is_recording and not span.end_ns:
                span.add_event(
                    STALL_EVENT, _event_attributes(culprit), _stall_start_ns(elapsed, span)
                )
                emitted = True
                break
        if not emitted:
            _log(culprit)

    def on_span_end(self, span: Span) -> None:
        """A span ends inside a step the watchdog has sampled: give it its stall event now,
        since it will be gone when the step returns."""
        s = self.seq
        if self.flagged != s or self.done == s:
            return
        if not any(sampled is span for _, sampled in self.samples):
            return
        now = _perf()
        elapsed = self._elapsed(now)
        if elapsed < self.threshold or any(d is span for d in self.delivered):
            return
        culprit = _make_culprit(self.handle, self.samples, elapsed, self.beats, now)
        # End hooks run after end_ns is set, so add_event would refuse: append directly.
        _append_event(span, culprit, elapsed)
        self.delivered.append(span)


def _log(culprit: Culprit) -> None:
    """A stall outside any span: a warning when the program caused it, a line at info level
    when it was looptrace's own work or the process not running (said, not alarmed about)."""
    where = (
        f"{'task ' + repr(culprit.task_name) + ' in ' if culprit.task_name else ''}"
        f"{culprit.qualname} ({culprit.filename}:{culprit.lineno})"
    )
    stack = "\n".join(f"  {line}" for line in culprit.stack)
    if culprit.cause == CAUSE_CODE:
        logger.warning(
            "event loop blocked for %.1f ms by %s\n%s", culprit.duration_ms, where, stack
        )
    elif culprit.cause == CAUSE_GC:
        logger.warning(
            "event loop blocked for %.1f ms by %s during %s\n%s",
            culprit.duration_ms,
            culprit.describe_cause(),
            where,
            stack,
        )
    else:
        logger.info(
            "event loop held for %.1f ms, not by the program: %s during %s",
            culprit.duration_ms,
            culprit.describe_cause(),
            where,
        )


def _append_event(span: Span, culprit: Culprit, elapsed: float) -> None:
    from ._internals import Event

    event = Event(STALL_EVENT, _stall_start_ns(elapsed, span), _event_attributes(culprit))
    if span.events is None:
        span.events = [event]
    else:
        span.events.append(event)


def _stall_start_ns(elapsed: float, span: Span) -> int:
    """When the stall began, as seen by ``span``: a span that started inside the blocking step
    (after the stall began) dates it at its own start, never before it."""
    return max(_clock.now_ns() - int(elapsed * 1e9), span.start_ns)


def _event_attributes(culprit: Culprit) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "looptrace.loop.stall.duration_ms": culprit.duration_ms,
        "looptrace.loop.stall.cause": culprit.cause,
        "code.function": culprit.qualname,
        "code.filepath": culprit.filename,
        "code.lineno": culprit.lineno,
        "looptrace.loop.stall.stack": "\n".join(culprit.stack),
    }
    if culprit.unscheduled_ms:
        attributes["looptrace.loop.stall.unscheduled_ms"] = culprit.unscheduled_ms
    if culprit.gc_ms:
        attributes["looptrace.loop.stall.gc_ms"] = culprit.gc_ms
        if culprit.gc_generation is not None:
            attributes["looptrace.loop.stall.gc_generation"] = culprit.gc_generation
    if culprit.task_name is not None:
        attributes["looptrace.task.name"] = culprit.task_name
    return attributes


def _make_culprit(
    handle: asyncio.Handle | None,
    samples: list[tuple[list[_Frame], Span | None]],
    elapsed: float,
    beats: _Beats | None = None,
    now: float | None = None,
) -> Culprit:
    callback = getattr(handle, "_callback", None)
    owner = getattr(callback, "__self__", None)
    task_name = owner.get_name() if isinstance(owner, asyncio.Task) else None
    frames: list[_Frame] = []
    if samples:
        # The line seen most often is where the step spent its time (ties: the first seen).
        counts = collections.Counter(_pick(f) for f, _ in samples if f)
        if counts:
            best = counts.most_common(1)[0][0]
            frames = next(f for f, _ in samples if f and _pick(f) == best)
    if frames:
        filename, qualname, lineno, _, _ = _pick(frames)
    elif isinstance(owner, asyncio.Task):
        # Not sampled in time (a step just past the threshold): name the coroutine instead,
        # at the line it is suspended on now.
        coro = owner.get_coro()
        code = getattr(coro, "cr_code", None) or getattr(coro, "gi_code", None)
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        qualname = getattr(code, "co_qualname", getattr(code, "co_name", repr(coro)))
        filename = getattr(code, "co_filename", "?")
        lineno = frame.f_lineno if frame is not None else getattr(code, "co_firstlineno", 0)
    else:
        code = getattr(callback, "__code__", None)
        qualname = getattr(callback, "__qualname__", None) or repr(callback)
        filename = getattr(code, "co_filename", "?")
        lineno = getattr(code, "co_firstlineno", 0)
    stack = tuple(f"{q} ({fn}:{ln})" for fn, q, ln, _, _ in frames)
    cause = CAUSE_CODE
    unscheduled = gc_s = 0.0
    generation = -1
    if now is not None:
        start = now - elapsed
        if beats is not None:
            unscheduled = beats.unscheduled(start, now)
        gc_s, generation, _where = GC_LOG.during(start, now)
    # Whose work it was comes first (looptrace's own is never the program's, however long the
    # process waited meanwhile); then what else took most of it.
    own = _own_work(frames) if frames else None
    if own is not None:
        cause = CAUSE_LOOPTRACE
        user = _user_frame(frames)
        qualname = own
        if user is not None:
            filename, lineno = user[0], user[2]
    elif unscheduled >= elapsed / 2:
        cause = CAUSE_UNSCHEDULED
    elif gc_s >= (elapsed - unscheduled) / 2:
        cause = CAUSE_GC
    return Culprit(
        task_name,
        qualname,
        filename,
        lineno,
        round(elapsed * 1e3, 3),
        stack,
        cause=cause,
        unscheduled_ms=round(unscheduled * 1e3, 3),
        gc_ms=round(gc_s * 1e3, 3),
        gc_generation=generation if generation >= 0 else None,
    )


# --------------------------------------------------------------------------------------------
# A monitor joins and leaves its loop's watch (both under the registry's lock)


def _join_watch(monitor: LagMonitor, loop: asyncio.AbstractEventLoop) -> None:
    """Put ``monitor`` on ``loop``'s watch, starting the watchdog when it is the first; with
    culprits, wrap ``Handle._run`` too. Loops that do not run asyncio Handles (uvloop) get the
    heartbeat, and a warning when culprits were asked for."""
    naming = monitor._want_culprits
    if naming and not isinstance(loop, asyncio.BaseEventLoop):
        logger.warning(
            "looptrace: %s does not run asyncio Handles; lag is measured but culprits "
            "cannot be named on this loop",
            type(loop).__name__,
        )
        naming = False
    thread_id = threading.get_ident() if loop.is_running() else 0
    with _lock:
        watch = _watches.get(loop)
        if watch is None:
            watch = _watches[loop] = _Watch(loop, thread_id)
        elif not watch.thread_id:
            watch.thread_id = thread_id
        watch.monitors.append(monitor)
        monitor._watch = watch
        monitor._culprit_watch = naming
        watch.refresh()
        if naming:
            _patch(True)
        GC_LOG.acquire()
        if watch.thread is None:
            watch.thread = threading.Thread(
                target=watch.run_watchdog, name="looptrace-lag-watchdog", daemon=True
            )
            watch.thread.start()


def _leave_watch(monitor: LagMonitor, loop: asyncio.AbstractEventLoop) -> threading.Thread | None:
    """Take ``monitor`` off its watch; the last one off stops the watchdog (returned, to join);
    ``Handle._run`` is put back when no watched loop names culprits any more."""
    with _lock:
        watch, monitor._watch = monitor._watch, None
        monitor._culprit_watch = False
        if watch is None:
            return None
        GC_LOG.release()
        if monitor in watch.monitors:
            watch.monitors.remove(monitor)
        watch.refresh()
        if watch.monitors:
            _refresh_patch()
            return None
        return _release_watch(loop)
