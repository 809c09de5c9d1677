"""Culprits: name the callback or task step that held the loop, and tell the span it hurt.

While some monitor on a loop has ``culprits=True``, the wrapped ``Handle._run`` (``_hook``)
bumps a counter per callback; a watchdog thread (``_Watch``) dates callbacks from that counter
and samples the loop thread's stack (``sys._current_frames``) once one has run for half the
threshold. When the step ends above the threshold it becomes a :class:`Culprit` on every monitor
whose threshold it passed, and a ``looptrace.loop.stall`` event on the span that was active in
the blocked code (or a warning on the ``looptrace.monitor`` logger when there was none).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import inspect
import logging
import os
import sys
import sysconfig
import threading
import time
from types import FrameType
from typing import TYPE_CHECKING, Any

from . import _hook
from ._hook import _patch, _release_watch, _watches
from ._internals import CURRENT, _clock, internal_error
from ._registry import _forget_loop, _lock

if TYPE_CHECKING:
    from ._internals import Span
    from ._monitor import LagMonitor

logger = logging.getLogger("looptrace.monitor")

STALL_EVENT = "looptrace.loop.stall"

_perf = time.perf_counter
_CORO_FLAGS = inspect.CO_COROUTINE | inspect.CO_ITERABLE_COROUTINE | inspect.CO_ASYNC_GENERATOR
_MAX_SAMPLES = 64
_MAX_STACK = 40


@dataclasses.dataclass(frozen=True)
class Culprit:
    """A callback or task step that held the event loop longer than the threshold.

    ``qualname``/``filename``/``lineno`` name the innermost coroutine (or, for a plain callback,
    the innermost function) at the line where it was blocking, as sampled while it ran;
    ``stack`` is the whole sampled stack, outermost first, as ``"qualname (file:line)"``.
    ``task_name`` is None for a callback that is not a task step.
    """

    task_name: str | None
    qualname: str
    filename: str
    lineno: int
    duration_ms: float
    stack: tuple[str, ...]


# A sampled frame: (filename, qualname, lineno, is_coroutine, is_library).
_Frame = tuple[str, str, int, bool, bool]

# Frames from the standard library (asyncio's to_thread, gather...) and from looptrace itself are
# shown in the stack but not named as the culprit when the user's own coroutine is on the stack.
_STDLIB_DIR = os.path.join(sysconfig.get_paths()["stdlib"], "")
# This file is in looptrace/monitor/: the library is everything under its parent.
_LOOPTRACE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "")
# `looptrace demo` plays the user's program: its blocking step is what the culprit must name.
_DEMO_FILE = os.path.join(_LOOPTRACE_DIR, "_demo.py")


def _is_library(filename: str) -> bool:
    if filename.startswith(_LOOPTRACE_DIR):  # wherever looptrace is installed
        return filename != _DEMO_FILE
    # The standard library, but not the third-party packages installed under it.
    return filename.startswith(_STDLIB_DIR) and "-packages" not in filename


class _Watch:
    """Per-loop state shared by the wrapped ``Handle._run`` (loop thread) and the watchdog.

    The loop thread bumps ``seq`` when a callback starts and sets ``done`` when it ends, and does
    nothing else on the common path: no clock reading, which would cost as much again. The
    watchdog reads them without a lock (each read and write is atomic under the GIL), dates a
    callback's start to the middle of the two looks around it (``t0``, within half a period),
    and re-checks ``seq``/``done`` after sampling, so a sample is only kept for the callback it
    saw.
    """

    __slots__ = (
        "delivered",
        "done",
        "flagged",
        "handle",
        "last_look",
        "loop",
        "monitors",
        "samples",
        "seen",
        "seq",
        "stop",
        "t0",
        "thread",
        "thread_id",
        "threshold",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop, thread_id: int) -> None:
        self.loop = loop
        self.thread_id = thread_id
        self.monitors: list[LagMonitor] = []
        self.threshold = 0.1
        self.seq = 0
        self.done = 0
        self.seen = 0
        self.t0 = 0.0
        self.last_look = _perf()
        self.handle: asyncio.Handle | None = None
        self.flagged = -1
        self.samples: list[tuple[list[_Frame], Span | None]] = []
        self.delivered: list[Span] = []
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    def refresh(self) -> None:
        self.threshold = min((m._threshold for m in self.monitors), default=0.1)

    # -- watchdog thread ---------------------------------------------------------------------

    def run_watchdog(self) -> None:
        try:
            while True:
                # A quarter of the threshold between looks: a step is first sampled between
                # half and three quarters of the threshold, before it crosses it. Bounded so a
                # huge threshold still notices a closed loop.
                period = min(max(self.threshold / 4, 0.002), 0.25)
                if self.stop.wait(period):
                    return
                if self.loop.is_closed():
                    _forget_loop(self.loop)
                    return
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

    def finish(self, handle: asyncio.Handle) -> None:
        """A sampled callback just returned: if it ran past the threshold, report it."""
        elapsed = _perf() - self.t0
        samples, delivered = self.samples, self.delivered
        self.samples, self.delivered = [], []
        if elapsed < self.threshold:
            return
        culprit = _make_culprit(handle, samples, elapsed)
        for monitor in self.monitors:
            if elapsed >= monitor._threshold:
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
            logger.warning(
                "event loop blocked for %.1f ms by %s%s (%s:%d)\n%s",
                culprit.duration_ms,
                f"task {culprit.task_name!r} in " if culprit.task_name else "",
                culprit.qualname,
                culprit.filename,
                culprit.lineno,
                "\n".join(f"  {line}" for line in culprit.stack),
            )

    def on_span_end(self, span: Span) -> None:
        """A span ends inside a step the watchdog has sampled: give it its stall event now,
        since it will be gone when the step returns."""
        s = self.seq
        if self.flagged != s or self.done == s:
            return
        if not any(sampled is span for _, sampled in self.samples):
            return
        elapsed = _perf() - self.t0
        if elapsed < self.threshold or any(d is span for d in self.delivered):
            return
        culprit = _make_culprit(self.handle, self.samples, elapsed)
        # End hooks run after end_ns is set, so add_event would refuse: append directly.
        _append_event(span, culprit, elapsed)
        self.delivered.append(span)


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
        "code.function": culprit.qualname,
        "code.filepath": culprit.filename,
        "code.lineno": culprit.lineno,
        "looptrace.loop.stall.stack": "\n".join(culprit.stack),
    }
    if culprit.task_name is not None:
        attributes["looptrace.task.name"] = culprit.task_name
    return attributes


def _walk(frame: FrameType | None) -> list[_Frame]:
    """The loop thread's frames inside the running callback, outermost first."""
    out: list[_Frame] = []
    stop = _hook._wrapped_run.__code__
    # Read at each walk: _patch rebinds it when the wrapper goes in.
    skip = getattr(_hook._original_run, "__code__", None)
    while frame is not None and len(out) < _MAX_STACK:
        code = frame.f_code
        if code is stop:
            break
        if code is not skip:
            qualname = getattr(code, "co_qualname", code.co_name)
            filename = code.co_filename
            out.append(
                (
                    filename,
                    qualname,
                    frame.f_lineno,
                    bool(code.co_flags & _CORO_FLAGS),
                    _is_library(filename),
                )
            )
        frame = frame.f_back
    out.reverse()
    return out


def _make_culprit(
    handle: asyncio.Handle | None,
    samples: list[tuple[list[_Frame], Span | None]],
    elapsed: float,
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
    return Culprit(task_name, qualname, filename, lineno, round(elapsed * 1e3, 3), stack)


def _pick(frames: list[_Frame]) -> _Frame:
    """The frame to name: the innermost coroutine outside the standard library and looptrace,
    else the innermost coroutine, else the innermost frame."""
    for frame in reversed(frames):
        if frame[3] and not frame[4]:
            return frame
    for frame in reversed(frames):
        if frame[3]:
            return frame
    return frames[-1]


# --------------------------------------------------------------------------------------------
# A monitor joins and leaves its loop's watch (both under the registry's lock)


def _join_watch(monitor: LagMonitor, loop: asyncio.AbstractEventLoop) -> None:
    """Put ``monitor`` on ``loop``'s watch, wrapping ``Handle._run`` and starting the watchdog
    when it is the first; loops that do not run asyncio Handles (uvloop) only get a warning."""
    if not isinstance(loop, asyncio.BaseEventLoop):
        logger.warning(
            "looptrace: %s does not run asyncio Handles; lag is measured but culprits "
            "cannot be named on this loop",
            type(loop).__name__,
        )
        return
    thread_id = threading.get_ident() if loop.is_running() else 0
    with _lock:
        watch = _watches.get(loop)
        if watch is None:
            watch = _watches[loop] = _Watch(loop, thread_id)
        watch.monitors.append(monitor)
        watch.refresh()
        monitor._watch = watch
        _patch(True)
        if watch.thread is None:
            watch.thread = threading.Thread(
                target=watch.run_watchdog, name="looptrace-lag-watchdog", daemon=True
            )
            watch.thread.start()


def _leave_watch(monitor: LagMonitor, loop: asyncio.AbstractEventLoop) -> threading.Thread | None:
    """Take ``monitor`` off its watch; the last one off stops the watchdog (returned, to join)
    and, on the last watched loop, puts ``Handle._run`` back."""
    with _lock:
        watch, monitor._watch = monitor._watch, None
        if watch is None:
            return None
        if monitor in watch.monitors:
            watch.monitors.remove(monitor)
        watch.refresh()
        if watch.monitors:
            return None
        return _release_watch(loop)
