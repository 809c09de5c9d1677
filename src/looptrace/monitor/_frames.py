"""Reading a sampled stack: whose code it is, which frame to name, and when it is looptrace's own.

A frame is kept as ``(filename, qualname, lineno, is_coroutine, is_library)``. The culprit names
the innermost coroutine of the user's code (``_pick``); when the blocking work was looptrace's
own (its start-up imports, its flusher), ``_own_work`` says so, so it is never charged to the
user's code.
"""

from __future__ import annotations

import inspect
import os
import sysconfig
from types import FrameType

from . import _hook

_CORO_FLAGS = inspect.CO_COROUTINE | inspect.CO_ITERABLE_COROUTINE | inspect.CO_ASYNC_GENERATOR
_MAX_STACK = 40

# A sampled frame: (filename, qualname, lineno, is_coroutine, is_library).
_Frame = tuple[str, str, int, bool, bool]

# Frames from the standard library (asyncio's to_thread, gather...) and from looptrace itself are
# shown in the stack but not named as the culprit when the user's own coroutine is on the stack.
_STDLIB_DIR = os.path.join(sysconfig.get_paths()["stdlib"], "")
# This file is in looptrace/monitor/: the library is everything under its parent.
_LOOPTRACE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "")
# `looptrace demo` plays the user's program: its blocking step is what the culprit must name.
_DEMO_FILE = os.path.join(_LOOPTRACE_DIR, "_demo.py")
# looptrace's decorators (and the generator wrappers) only pass the call through to the user's
# function: work below them is the user's.
_PASS_THROUGH = (
    os.path.join(_LOOPTRACE_DIR, "_capture", "decorators.py"),
    os.path.join(_LOOPTRACE_DIR, "_capture", "generators.py"),
)
# The import system: a stall inside it is code being loaded, not code running.
_IMPORTING = "<frozen importlib."

STARTUP = "looptrace start-up"


def _is_library(filename: str) -> bool:
    if filename.startswith(_LOOPTRACE_DIR):  # wherever looptrace is installed
        return filename != _DEMO_FILE
    # The standard library, but not the third-party packages installed under it.
    return filename.startswith(_STDLIB_DIR) and "-packages" not in filename


def _is_looptrace(filename: str) -> bool:
    return filename.startswith(_LOOPTRACE_DIR) and filename != _DEMO_FILE


def _is_third_party(filename: str) -> bool:
    return "-packages" in filename


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


def _own_work(frames: list[_Frame]) -> str | None:
    """What of looptrace's held the loop, when the blocking work was looptrace's own; else None.

    From the innermost frame outwards, the standard library, the import system and third-party
    packages are passed over (they ran for whoever called them); the first other frame decides:
    the user's code, or looptrace's decorators passing a call through to it, make the work the
    user's; any other looptrace frame makes it looptrace's own. Its name is
    ``"looptrace start-up"`` when code was being loaded, else ``"looptrace (<entry>)"``, naming
    the outermost looptrace frame of that call.
    """
    # Loading code (the import system anywhere on the stack, or a module's top level running)
    # is start-up, whichever frame the sample caught.
    importing = any(f[0].startswith(_IMPORTING) or f[1] == "<module>" for f in frames)
    for i in range(len(frames) - 1, -1, -1):
        filename = frames[i][0]
        if filename.startswith(_IMPORTING):
            continue
        if _is_looptrace(filename):
            if filename in _PASS_THROUGH:
                return None
            entry = frames[i]
            for outer in reversed(frames[:i]):
                if outer[0] in _PASS_THROUGH:
                    break
                if _is_looptrace(outer[0]):
                    entry = outer
                elif not (outer[0].startswith(_IMPORTING) or _is_library(outer[0])):
                    break
            return STARTUP if importing else f"looptrace ({entry[1]})"
        if filename.startswith(_STDLIB_DIR) and "-packages" not in filename:
            continue
        if _is_third_party(filename):
            continue
        return None
    return None


def _user_frame(frames: list[_Frame]) -> _Frame | None:
    """The innermost frame of the user's own code (not looptrace, the standard library, the
    import system or a third-party package), if any."""
    for frame in reversed(frames):
        filename = frame[0]
        if not (_is_library(filename) or filename.startswith("<") or _is_third_party(filename)):
            return frame
    return None
