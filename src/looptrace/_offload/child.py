"""What a worker process does for :mod:`looptrace._offload`: finish serializing a large span
and encode it; the encoded span goes back to the parent, which sends it with the others.

Everything a worker unpickles lives here or in the modules this one imports: the calls it
answers, the slots that stand for raw values. None of them imports asyncio.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from .. import _otlp, _serialize

__all__ = ["CALLS", "LIFT_BUDGET", "Slot", "restore"]

# Values visited (per span) looking for large strings to send raw: the planning walk's
# budget, so a span's handoff stays as cheap as its plan. The parent's lift and the worker's
# restore walk the same values in the same order within it.
LIFT_BUDGET = 256


class Slot:
    """Stands in for a large str or bytes that travels raw after the call's pickle: the
    ``index``-th raw value, of type ``kind``."""

    __slots__ = ("index", "kind")

    def __init__(self, index: int, kind: str) -> None:
        self.index = index
        self.kind = kind

    def __reduce__(self) -> tuple[Any, ...]:
        return (Slot, (self.index, self.kind))

    def __repr__(self) -> str:
        return f"<raw slot {self.index} {self.kind}>"


class _Raw:
    """The worker's view of the raw values of one call."""

    def __init__(self, values: list[bytes]) -> None:
        self._values = values

    def value(self, slot: Slot) -> Any:
        data = self._values[slot.index]
        return data.decode("utf-8", "surrogatepass") if slot.kind == "str" else data


def _ping() -> int:
    return os.getpid()


def restore(v: Any, raw: _Raw, left: list[int]) -> Any:
    """``v`` with every slot replaced by its value: the mirror of the parent's lift, walking
    the same values in the same order within the same budget. ``left`` is [slots still to
    find, values still to visit]."""
    cls = type(v)
    if cls is Slot:
        left[0] -= 1
        return raw.value(v)
    if cls is dict:
        for k, x in v.items():
            left[1] -= 1
            if left[0] <= 0 or left[1] < 0:
                break
            y = restore(x, raw, left)
            if y is not x:
                v[k] = y
        return v
    if cls is list or cls is tuple:
        out = v if cls is list else list(v)
        for i, x in enumerate(out):
            left[1] -= 1
            if left[0] <= 0 or left[1] < 0:
                break
            out[i] = restore(x, raw, left)
        return out if cls is list else tuple(out)
    return v


def _restored(inputs: Any, output: Any, raw: list[bytes]) -> tuple[Any, Any]:
    if not raw:
        return inputs, output
    values = _Raw(raw)
    # Slots met more than once (one value in two places) count each time.
    left = [1 << 30, LIFT_BUDGET]
    inputs = (inputs[0], restore(inputs[1], values, left))
    output = (output[0], restore(output[1], values, left))
    return inputs, output


def _work(
    wire: Any,
    inputs: Any,
    output: Any,
    pol: Any,
    max_span_bytes: int,
    encoding: str,
    raw: list[bytes] | None = None,
) -> Any:
    """Finish serializing one prepared span, and encode it: the encoded span comes back raw.
    (A value the worker cannot rebuild, such as a class from the user's ``__main__``, fails
    in the unpickling, which answers with the error.)"""
    from .worker import Raw

    try:
        inputs, output = _restored(inputs, output, raw or [])
        with _serialize.counted() as counts:
            wire = _serialize.finish(wire, inputs, output, pol, max_span_bytes)
        body = _otlp.encode_span(wire, encoding)
    except Exception as exc:
        return None, {"error": 1, type(exc).__name__: 1}
    return Raw([body], dict(counts))


def _modules() -> list[str]:
    """The modules this worker has loaded (diagnostics: what its start-up costs)."""
    return sorted(sys.modules)


# What a worker answers to, by name.
CALLS: dict[str, Any] = {
    "ping": _ping,
    "modules": _modules,
    "work": _work,
}
