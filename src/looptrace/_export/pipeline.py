"""The pipeline callers see: a :class:`~.flusher.Flusher` with the waiting, the shutdown and the
statistics that ``looptrace.flush()``, ``shutdown()`` and ``statistics()`` ask of it.

``flush`` and ``shutdown`` share one deadline; a caller on the loop that hosts the flusher never
blocks it (the spans go to the private thread's flusher instead); after the deadline what is
still held is dropped, counted as ``shutdown``, and said once.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from .. import _errors
from .._transport import RetryPolicy, Transport, off_loop
from .batch import Batch
from .exporter import Exporter
from .flusher import Flusher
from .homes import Home, Waiter, running_asyncio_loop, wait_future
from .lifecycle import Lifecycle
from .retry import Health
from .stats import FlushResult, SpoolStatistics, Statistics

if TYPE_CHECKING:
    from .._capture.spans import Span
    from .._config import Config
    from .spool import Spool

__all__ = ["Pipeline", "default_exporter"]

logger = logging.getLogger("looptrace")


def default_exporter(
    cfg: Config, transport_factory: Callable[[], Transport] | None = None
) -> Exporter:
    """OTLP/HTTP to ``cfg.endpoint`` (or to ``transport_factory``'s transports); with neither,
    the local store."""
    if cfg.endpoint is None and transport_factory is None:
        from .store import StoreExporter

        return StoreExporter(cfg)
    from .otlp_http import OtlpHttpExporter

    return OtlpHttpExporter(cfg, transport_factory)


class Pipeline:
    """A flusher over its exporter, and the lifecycle they share: the sink capture hands
    spans to (``_state.sink``), and what ``looptrace.flush``/``shutdown``/``statistics`` act on.

    ``on_end`` is the flusher's ``Buffer.push`` itself (span.end() costs one call); once the
    pipeline is closed, the buffer counts a span pushed to it as dropped (``shutdown``)."""

    def __init__(
        self,
        cfg: Config,
        transport_factory: Callable[[], Transport] | None = None,
        retry_policy: RetryPolicy | None = None,
        exporter: Exporter | None = None,
    ) -> None:
        self.cfg = cfg
        self.exporter = exporter or default_exporter(cfg, transport_factory)
        self.health = Health(
            retry_policy or RetryPolicy(budget=cfg.retry_budget),
            cfg.endpoint or f"the local store {cfg.store_path}",
        )
        self.lifecycle = Lifecycle()
        self.flusher = Flusher(
            cfg, self.exporter, self.health, self.lifecycle, self._spool_factory()
        )
        self.buffer = self.flusher.buffer
        self.spool = self.flusher.spool
        self.on_end: Callable[[Span], None] = self.buffer.push
        self.on_start: Callable[[Span], None] = (
            self.flusher.roots.add if cfg.sends_in_progress else _ignore
        )

    def __repr__(self) -> str:
        return f"<looptrace Pipeline -> {self.exporter!r} {self.lifecycle.state.value} queued={self.buffer.queued_spans}>"

    def _spool_factory(self) -> Callable[[Flusher], Spool] | None:
        # Only OTLP endpoints have a spool: the local store is on this machine's disk already.
        # (An OTLP exporter means its module is loaded: the store's pipeline never imports it.)
        cfg = self.cfg
        otlp = sys.modules.get(f"{__package__}.otlp_http")
        if not (
            cfg.spool
            and cfg.endpoint is not None
            and otlp is not None
            and isinstance(self.exporter, otlp.OtlpHttpExporter)
        ):
            return None
        from .spool import Spool

        exporter = self.exporter
        return lambda flusher: Spool(cfg, exporter, flusher)

    def _counters(self) -> tuple[int, dict[str, int], int, int]:
        replayed = self.spool.replayed if self.spool is not None else 0
        return (
            self.buffer.spans_sent,
            dict(self.buffer.dropped),
            self.buffer.spooled_spans,
            replayed,
        )

    def _result(self, before: tuple[int, dict[str, int], int, int], target: int) -> FlushResult:
        sent, dropped, spooled, replayed = self._counters()
        return FlushResult(
            sent=sent - before[0],
            dropped={k: v - before[1].get(k, 0) for k, v in dropped.items()},
            pending=self.buffer.unresolved_before(target),
            spooled=spooled - before[2],
            replayed=replayed - before[3],
        )

    async def flush(self, timeout: float | None = None) -> FlushResult:
        """Wait (without blocking the loop) until every span ended before the call is resolved."""
        loop = running_asyncio_loop()
        if loop is None:
            import anyio.to_thread

            return await anyio.to_thread.run_sync(self.flush_sync, timeout, abandon_on_cancel=True)
        before = self._counters()
        target = self.buffer.flush_target()
        if self.buffer.watermark() < target:
            waiter = Waiter(target, loop, loop.create_future())
            self.flusher.add_waiter(waiter)
            home = self.flusher.homes.kick(urgent=True)
            if home.loop is not loop and home.loop is not None and not home.loop.is_running():
                self.flusher.homes.thread_home().kick(urgent=True)
            assert waiter.future is not None
            try:
                await wait_future(waiter.future, timeout)
            finally:
                self.flusher.remove_waiter(waiter)
        return self._result(before, target)

    def flush_sync(self, timeout: float | None = None) -> FlushResult:
        """Block this thread until the spans ended before the call are resolved.

        Called on the thread whose loop hosts the flusher, that flusher cannot run while we
        block: the pending spans, the batches that loop had in flight and the one it was
        encoding are handed to the private thread instead.
        """
        before = self._counters()
        target = self.buffer.flush_target()
        if self.buffer.watermark() >= target:
            return self._result(before, target)
        waiter = Waiter(target)
        self.flusher.add_waiter(waiter)
        try:
            homes = self.flusher.homes
            home = homes.primary
            if (
                home is None
                or not home.alive()
                or home.thread_id == threading.get_ident()
                or (home.loop is not None and not home.loop.is_running() and not home.private)
            ):
                if home is not None and home.alive():
                    # That loop cannot run while we wait: its requests will not complete.
                    # Send them again from the private thread (a duplicate at worst).
                    for batch in list(home.sending):
                        self.buffer.returned(batch)
                    # Nor will the batch it was encoding (between two slices): a copy of its
                    # spans goes to the private thread; the loop, once it runs again, finishes
                    # and sends the original (a duplicate at worst).
                    for batch, spans in list(home.encoding.items()):
                        copy = Batch(batch.lo, batch.hi, list(spans), batch.nbytes)
                        self.buffer.replace(batch, [copy])
                        self.buffer.returned(copy)
                home = homes.thread_home()
            if home.done.is_set():  # no thread could be started (interpreter shutdown)
                self._drain_inline(waiter, timeout)
            else:
                home.kick(urgent=True)
                assert waiter.event is not None
                waiter.event.wait(timeout)
        finally:
            self.flusher.remove_waiter(waiter)
        return self._result(before, target)

    def _drain_inline(self, waiter: Waiter, timeout: float | None) -> None:
        """Flush on a temporary loop in this thread (when no thread can be started)."""
        if running_asyncio_loop() is not None:
            return

        async def main() -> None:
            home = Home(private=True)
            home.loop = asyncio.get_running_loop()
            home.thread_id = threading.get_ident()
            home.event = asyncio.Event()
            home.slots = asyncio.Semaphore(self.cfg.max_concurrent_requests)
            home.task = asyncio.current_task()
            home.urgent = True
            home.stopping = True
            self.flusher.homes.adopt(home)
            assert waiter.event is not None
            runner = asyncio.ensure_future(self.flusher._run_home(home))
            try:
                while not waiter.event.is_set() and not runner.done():
                    await asyncio.sleep(0.005)
            finally:
                runner.cancel()
                await asyncio.gather(runner, return_exceptions=True)

        try:
            asyncio.run(asyncio.wait_for(main(), timeout))
        except (asyncio.TimeoutError, RuntimeError):
            pass

    async def backpressure(self) -> None:
        """Wait while the bytes pending plus in flight exceed ``cfg.backpressure_bytes``."""
        limit = self.cfg.backpressure_bytes
        if self.buffer.outstanding_bytes <= limit:
            return
        loop = running_asyncio_loop()
        if loop is None:
            import anyio

            while self.buffer.outstanding_bytes > limit:
                self.flusher.homes.kick(urgent=True)
                await anyio.sleep(self.cfg.flush_interval / 4)
            return
        while self.buffer.outstanding_bytes > limit:
            waiter = Waiter(-1, loop, loop.create_future())
            self.flusher.add_waiter(waiter)
            self.flusher.homes.kick(urgent=True)
            assert waiter.future is not None
            try:
                # The timeout only guards against a lost wake-up; the waiter normally fires.
                await wait_future(waiter.future, self.cfg.flush_interval)
            finally:
                self.flusher.remove_waiter(waiter)

    # ------------------------------------------------------------------ shutdown
    def _begin_close(self, deadline: float) -> list[Home]:
        self.lifecycle.begin_close(deadline)
        homes = self.flusher.homes.alive()
        if not homes:
            if self.buffer.idle():
                self.flusher.close_down()
                return []
            homes = [self.flusher.homes.thread_home()]
        for home in homes:
            home.kick(urgent=True)
        return homes

    def _stop(self, quiet: bool) -> None:
        if quiet:
            # The exit says what is lost in one line of its own: no drop log, no deadline line.
            self.flusher.quiet = True
            self.flusher.drops.mute()
        self.lifecycle.stop()
        self.health.closing()

    def shutdown_sync(self, timeout: float | None = None, quiet: bool = False) -> FlushResult:
        """Send what is held, within ``timeout`` (default cfg.shutdown_timeout), then stop.
        ``quiet``: log nothing about what is lost (the caller reports the result itself)."""
        self._stop(quiet)
        timeout = self.cfg.shutdown_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        before = self._counters()
        target = self.buffer.flush_target()
        self.flush_sync(timeout)
        homes = self._begin_close(deadline)
        self.flusher.homes.cancel_all()
        for home in homes:
            if home.thread_id != threading.get_ident():
                home.done.wait(max(0.0, deadline - time.monotonic()) + 0.5)
        # A flusher that stopped meanwhile may be spilling what is held to the spool: the
        # result counts it once that is done.
        self.flusher.close_down(wait=self.cfg.shutdown_timeout)
        return self._result(before, target)

    async def shutdown(self, timeout: float | None = None) -> FlushResult:
        """Async twin of :meth:`shutdown_sync`; never blocks the loop."""
        self._stop(quiet=False)
        timeout = self.cfg.shutdown_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        before = self._counters()
        target = self.buffer.flush_target()
        await self.flush(timeout)
        homes = self._begin_close(deadline)
        self.flusher.homes.cancel_all()
        loop = running_asyncio_loop()
        for home in homes:
            left = max(0.0, deadline - time.monotonic()) + 0.5
            if home.task is not None and home.loop is loop:
                await asyncio.wait([home.task], timeout=left)
            elif loop is not None:
                await asyncio.to_thread(home.done.wait, left)
        if self.spool is not None:
            # What is still held is encoded and written to the spool off the loop.
            await off_loop(self.spool.close)
        self.flusher.close_down()
        if not self.lifecycle.wait_closed(0):
            # A flusher that stopped meanwhile is spilling what is held to the spool.
            await off_loop(self.lifecycle.wait_closed, self.cfg.shutdown_timeout)
        return self._result(before, target)

    def close_soon(self) -> None:
        """Stop in the background (``configure`` replacing this pipeline): drain what is held
        within cfg.shutdown_timeout, without making the caller wait."""
        deadline = time.monotonic() + self.cfg.shutdown_timeout
        homes = self._begin_close(deadline)
        for home in homes:
            loop = home.loop
            if loop is None:
                continue
            delay = max(0.0, deadline - time.monotonic())
            try:
                loop.call_soon_threadsafe(loop.call_later, delay, home.cancel)
            except RuntimeError:
                pass

    # ------------------------------------------------------------------ reading
    @property
    def requests_sent(self) -> int:
        return self.health.requests_sent

    @property
    def requests_failed(self) -> int:
        return self.health.requests_failed

    @property
    def retries(self) -> int:
        return self.health.retries

    @property
    def last_error(self) -> str | None:
        return self.health.last_error

    def statistics(self) -> Statistics:
        b = self.buffer
        return Statistics(
            queued_spans=b.queued_spans,
            queued_bytes=b.queued_bytes,
            in_flight_spans=b.in_flight_spans,
            in_flight_bytes=b.in_flight_bytes,
            requests_sent=self.requests_sent,
            requests_failed=self.requests_failed,
            retries=self.retries,
            spans_sent=b.spans_sent,
            dropped=dict(b.dropped),
            last_error=self.last_error,
            internal_errors=dict(_errors.counts),
            offload=self.exporter.offload_statistics(),
            spooled=b.spooled_spans,
            replayed=self.spool.replayed if self.spool is not None else 0,
            spool=self._spool_statistics(),
        )

    def _spool_statistics(self) -> SpoolStatistics:
        spool = self.spool
        if spool is None:
            return SpoolStatistics()
        return SpoolStatistics(
            directory=spool.where,
            spooled=self.buffer.spooled_spans,
            replayed=spool.replayed,
            dropped=spool.dropped(),
        )


def _ignore(span: Span) -> None:
    pass
