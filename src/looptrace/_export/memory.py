"""An exporter that keeps what it is given, for tests of the flusher that need no network:
each span becomes a :class:`~looptrace._wire.WireSpan`; each export answers from a script of
outcomes (default: sent)."""

from __future__ import annotations

import collections
from collections.abc import Iterable, Sequence, Sized
from typing import TYPE_CHECKING

from .._wire import WireSpan
from .exporter import SENT, Outcome, Verdict, encode_each
from .stats import OffloadStatistics

if TYPE_CHECKING:
    from .._capture.spans import Span
    from .._config import Config

__all__ = ["InMemoryExporter"]


class _Wired:
    __slots__ = ("nbytes", "wire")

    def __init__(self, wire: WireSpan, nbytes: int) -> None:
        self.wire = wire
        self.nbytes = nbytes

    def __len__(self) -> int:
        return self.nbytes


class InMemoryExporter:
    """``exported`` holds one list of spans per successful export, in order; ``attempts``
    every export, answered or not."""

    def __init__(self, cfg: Config, script: Iterable[Outcome] = ()) -> None:
        self.cfg = cfg
        self.script: collections.deque[Outcome] = collections.deque(script)
        self.exported: list[list[WireSpan]] = []
        self.attempts = 0

    def loaded_cheaply(self) -> bool:
        return False

    def load(self) -> None:
        from .. import _serialize

        self._to_wire = _serialize.to_wire
        self._to_wire_or_steps = _serialize.to_wire_or_steps
        self._estimate = _serialize.estimate_size

    def estimate(self, span: Span) -> int:
        return self._estimate(span)

    async def encode(self, spans: Sequence[Span]) -> list[Sized | None]:
        cfg, wire = self.cfg, self._to_wire_or_steps
        return await encode_each(spans, lambda span: wire(span, cfg), self._wired)

    def encode_open(self, span: Span) -> Sized:
        return self._wired(self._to_wire(span, self.cfg))

    @staticmethod
    def _wired(wire: WireSpan) -> Sized:
        return _Wired(wire, wire.weight())

    def session(self) -> InMemoryExporter:
        return self

    async def export(self, chunks: Sequence[Sized]) -> Outcome:
        self.attempts += 1
        outcome = self.script.popleft() if self.script else SENT
        if outcome.verdict is Verdict.SENT:
            self.exported.append([c.wire for c in chunks if isinstance(c, _Wired)])
        return outcome

    async def aclose(self) -> None:
        pass

    def offload_statistics(self) -> OffloadStatistics:
        return OffloadStatistics()

    def shutdown(self) -> None:
        pass

    @property
    def spans(self) -> list[WireSpan]:
        """Every span exported, in order."""
        return [span for batch in self.exported for span in batch]
