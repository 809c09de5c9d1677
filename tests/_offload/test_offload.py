"""The worker-process offload: identical bytes, every fallback, any event loop, and unguarded
scripts under every start method."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from looptrace import _otlp, _serialize
from looptrace._capture.spans import Span
from looptrace._config import Config
from looptrace._offload import parent as _offload
from looptrace._offload import pool as _pool
from looptrace._offload.parent import Offloader

CFG = Config()
PARENT_PID = os.getpid()


def big_span(payload: Any = None, span_id: int = 2) -> Span:
    span = Span("big", 1, span_id, 0, 1_000)
    span.end_ns = 2_000
    span.inputs = {"image": "QUJD" * 100_000, "password": "p", "n": 3}
    span.output = payload if payload is not None else {"ok": True, "tags": {"b", "a"}}
    span.attributes = {"k": "v"}
    return span


def inline(span: Span, encoding: str = "protobuf") -> bytes:
    return _otlp.encode_span(_serialize.to_wire(span, CFG), encoding)


def idle_pids(off: Offloader) -> list[int]:
    """The idle-priority workers (a helper comes and goes on a busy machine)."""
    assert off._pool is not None
    return sorted(ch.process.pid for ch in off._pool._channels if not ch.helper)


@pytest.fixture(scope="module")
def pool() -> Iterator[Offloader]:
    off = Offloader(workers=1)
    yield off
    off.shutdown(wait=True)


class OnlyInParent:
    """Pickles fine, but cannot be rebuilt in another process (like a class from __main__)."""

    def __reduce__(self) -> Any:
        return (_rebuild_only_in, (PARENT_PID,))


def _rebuild_only_in(pid: int) -> OnlyInParent:
    if os.getpid() != pid:
        raise AttributeError("Can't get attribute 'OnlyInParent' on <module '__main__'>")
    return OnlyInParent.__new__(OnlyInParent)


@pytest.mark.parametrize("encoding", ["protobuf", "json"])
async def test_pool_and_inline_give_identical_bytes(pool: Offloader, encoding: str) -> None:
    """The pool path and the inline path produce the same encoded span, byte for byte."""
    span = big_span()
    before = pool.stats["offloaded"]
    body = await pool.encode(span, CFG, encoding)
    assert pool.stats["offloaded"] == before + 1
    assert body == inline(span, encoding)


async def test_worker_counts_reach_the_parent(pool: Offloader) -> None:
    """Redactions done in the worker are added to the parent's serializer stats."""
    _serialize.stats.clear()
    await pool.encode(big_span(), CFG, "protobuf")
    assert _serialize.stats["redactions"] == 1


async def test_unpicklable_value_falls_back_inline(pool: Offloader) -> None:
    """A payload that cannot be pickled is serialized inline, with the reason counted."""
    lock = threading.Lock()
    span = big_span({"lock": lock})
    body = await pool.encode(span, CFG, "protobuf")
    assert pool.stats["unpicklable"] == 1
    assert body == inline(span)
    assert pool.state == "running"


async def test_value_the_worker_cannot_rebuild_falls_back_and_keeps_the_pool(
    pool: Offloader,
) -> None:
    """A value that fails to unpickle in the worker falls back inline; the pool survives."""
    span = big_span({"obj": OnlyInParent()})
    await pool.ready()
    pids = idle_pids(pool)
    body = await pool.encode(span, CFG, "protobuf")
    assert pool.stats["worker_error"] == 1
    assert body == inline(span)
    assert pool.state == "running"
    assert idle_pids(pool) == pids


async def test_hooks_run_once_in_the_parent(pool: Offloader) -> None:
    """User hooks (which cannot travel to a worker) run in the parent, once per span."""
    calls = []

    def hook(value: Any) -> Any:
        calls.append(os.getpid())
        return {"hooked": True}

    cfg = CFG.replace(process_outputs=hook)
    span = big_span()
    body = await pool.encode(span, cfg, "json")
    assert calls == [os.getpid()]
    assert b'{\\"hooked\\":true}' in body


async def test_payload_larger_than_the_pipe_arrives_whole(pool: Offloader) -> None:
    """A span whose pickle is larger than the worker's pipe holds (3 MB of strings below the
    size that travels by address) is written out over several turns of the loop, and its
    3 MB answer read back over several: the bytes are those of the inline path."""
    span = big_span({"parts": [f"{i:04d}" + "y" * 60_000 for i in range(50)]})
    before = pool.stats["offloaded"]
    body = await pool.encode(span, CFG, "protobuf")
    assert pool.stats["offloaded"] == before + 1
    assert len(body) > 3_000_000 and body == inline(span)


async def test_large_values_of_every_kind_travel_raw_and_arrive_the_same(
    pool: Offloader,
) -> None:
    """Large strings (ASCII, non-ASCII, a lone surrogate), bytes and bytearrays, one of them
    met twice, travel after the pickle and come out as the inline path would encode them."""
    text = "é" * 70_000 + "\ud800" + "x" * 70_000
    blob = bytes(range(256)) * 400
    span = big_span({"t": text, "again": text, "b": blob, "ba": bytearray(blob), "n": 1})
    before = pool.stats["offloaded"]
    assert await pool.encode(span, CFG, "json") == inline(span, "json")
    assert pool.stats["offloaded"] == before + 1


class _NoPipesLoop(asyncio.SelectorEventLoop):
    """An event loop that cannot watch pipes or sockets' readiness by callback, as Windows'
    proactor loop cannot."""

    def add_reader(self, *args: Any) -> None:  # type: ignore[override]
        raise NotImplementedError

    def add_writer(self, *args: Any) -> None:  # type: ignore[override]
        raise NotImplementedError


def test_a_loop_that_cannot_watch_pipes_still_offloads(pool: Offloader) -> None:
    """Offload never depends on ``loop.add_reader`` (which Windows' proactor loop lacks):
    spans from such a loop are serialized in the worker, not silently inline."""
    loop = _NoPipesLoop()
    try:
        before = dict(pool.stats)
        body = loop.run_until_complete(pool.encode(big_span(span_id=7), CFG, "protobuf"))
    finally:
        loop.close()
    assert body == inline(big_span(span_id=7))
    assert pool.stats["offloaded"] == before.get("offloaded", 0) + 1
    assert sum(pool.stats.values()) == sum(before.values()) + 1  # no fallback counted


async def test_two_running_loops_share_the_pool(pool: Offloader) -> None:
    """A span from a loop in another thread, while this one runs, goes to the same workers."""
    await pool.encode(big_span(), CFG, "protobuf")
    span = big_span(span_id=9)
    before = pool.stats["offloaded"]
    here = pool.encode(big_span(span_id=10), CFG, "protobuf")
    there = asyncio.to_thread(asyncio.run, pool.encode(span, CFG, "protobuf"))
    bodies = await asyncio.gather(here, there)
    assert bodies == [inline(big_span(span_id=10)), inline(span)]
    assert pool.stats["offloaded"] == before + 2


def test_the_pool_follows_the_loop_that_runs(pool: Offloader) -> None:
    """A loop that ended (closed by asyncio.run) or stopped (run_until_complete returned)
    hands the pool to the next loop that uses it, and gets it back when it runs again."""
    kept = asyncio.new_event_loop()
    try:
        for run in (kept.run_until_complete, asyncio.run, kept.run_until_complete, asyncio.run):
            before = pool.stats["offloaded"]
            assert run(pool.encode(big_span(), CFG, "protobuf")) == inline(big_span())
            assert pool.stats["offloaded"] == before + 1
    finally:
        kept.close()


async def test_killed_worker_is_replaced_once_then_inline(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker killed mid-life breaks the pool: that span goes inline, the pool is replaced
    once; a second break retires the pool and later spans go inline."""
    # One worker, however busy the machine: a helper would take the calls a dead worker misses.
    monkeypatch.setattr(_pool, "START_HELP_SECONDS", 600.0)
    monkeypatch.setattr(_pool, "BEHIND_SECONDS", 600.0)
    off = Offloader(workers=1)
    try:
        assert await off.encode(big_span(), CFG, "protobuf") == inline(big_span())
        kill(off.worker_pids()[0])
        body = await off.encode(big_span(span_id=3), CFG, "protobuf")
        assert body == inline(big_span(span_id=3))
        assert off.stats["broken_pool"] == 1
        assert off.state == "broken"

        assert await off.encode(big_span(span_id=4), CFG, "protobuf") == inline(big_span(span_id=4))
        assert off.state == "running"
        assert off.stats["offloaded"] == 2
        kill(off.worker_pids()[0])
        await off.encode(big_span(span_id=5), CFG, "protobuf")
        assert off.state == "retired"
        assert await off.encode(big_span(span_id=6), CFG, "protobuf") == inline(big_span(span_id=6))
        assert off.stats["pool_retired"] == 1
        assert off.stats["broken_pool"] == 2
    finally:
        off.shutdown(wait=True)


async def test_spans_arriving_together_start_the_pool_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first large spans come together (one per request slot): they share one start, on
    one executor thread, and a span whose sender is cancelled meanwhile does not stop it."""
    starts: list[str] = []
    original = Offloader._start

    def counted(self: Offloader) -> None:
        starts.append(threading.current_thread().name)
        original(self)

    monkeypatch.setattr(Offloader, "_start", counted)
    off = Offloader(workers=1)
    try:
        gave_up = asyncio.ensure_future(off.encode(big_span(span_id=9), CFG, "protobuf"))
        await asyncio.sleep(0)
        gave_up.cancel()
        spans = [big_span(span_id=i) for i in range(2, 6)]
        bodies = await asyncio.gather(*(off.encode(s, CFG, "protobuf") for s in spans))
        assert bodies == [inline(s) for s in spans]
        assert len(starts) == 1
        assert off.state == "running"
        assert off.stats["offloaded"] == 4
    finally:
        off.shutdown(wait=True)


async def test_no_subprocesses_means_inline(monkeypatch: pytest.MonkeyPatch) -> None:
    """When no worker can start, every span is serialized inline, counted as unavailable."""

    def cannot(workers: int) -> Any:
        raise OSError("no processes here")

    monkeypatch.setattr(_offload, "_new_pool", cannot)
    off = Offloader()
    assert await off.encode(big_span(), CFG, "protobuf") == inline(big_span())
    assert await off.encode(big_span(), CFG, "protobuf") == inline(big_span())
    assert off.state == "unavailable"
    assert off.stats["unavailable"] == 2


async def test_after_shutdown_spans_go_inline() -> None:
    """After shutdown() the offloader still answers, inline."""
    off = Offloader()
    off.shutdown(wait=True)
    assert await off.encode(big_span(), CFG, "json") == inline(big_span(), "json")
    assert off.stats["shutdown"] == 1


def kill(pid: int) -> None:
    """End a process at once, on any platform (SIGKILL on POSIX, TerminateProcess on Windows)."""
    os.kill(pid, getattr(signal, "SIGKILL", signal.SIGTERM))


def test_unguarded_script_runs_once(tmp_path: Path) -> None:
    """A script without an ``if __name__ == "__main__"`` guard works with the offload and its
    top-level code runs exactly once (the worker does not re-import __main__)."""
    marker = tmp_path / "runs.txt"
    script = tmp_path / "user_script.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import asyncio, os
            from looptrace._config import Config
            from looptrace._offload.parent import Offloader
            from looptrace._capture.spans import Span

            with open({str(marker)!r}, "a") as f:
                f.write(f"{{os.getpid()}}\\n")

            class Local:
                pass

            span = Span("s", 1, 2, 0, 1)
            span.end_ns = 2
            span.inputs = {{"big": "x" * 300_000}}
            span.output = {{"mine": Local()}}

            async def main():
                off = Offloader()
                body = await off.encode(span, Config(), "protobuf")
                off.shutdown(wait=True)
                print(dict(off.stats), len(body))

            asyncio.run(main())
            """
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPTRACE_")}
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
    assert len(marker.read_text().split()) == 1
    # ``Local`` lives in the script's __main__, which the worker never imports: the span
    # still goes through (inline), and nothing ran twice.
    assert "'worker_error': 1" in done.stdout


def test_unguarded_script_offloads_plain_values(tmp_path: Path) -> None:
    """The same kind of unguarded script, with only plain values, is served by the pool."""
    script = tmp_path / "plain.py"
    script.write_text(
        textwrap.dedent(
            """
            import asyncio
            from looptrace._config import Config
            from looptrace._offload.parent import Offloader
            from looptrace._capture.spans import Span

            print("top-level")
            span = Span("s", 1, 2, 0, 1)
            span.end_ns = 2
            span.inputs = {"big": "x" * 300_000}

            async def main():
                off = Offloader()
                await off.encode(span, Config(), "protobuf")
                off.shutdown(wait=True)
                print(dict(off.stats))

            asyncio.run(main())
            """
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPTRACE_")}
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("top-level") == 1
    assert "{'offloaded': 1}" in done.stdout


def _exited(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")  # a zombie has exited
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads process states from /proc")
def test_workers_exit_when_the_application_is_killed(tmp_path: Path) -> None:
    """An application killed outright (SIGKILL, the OOM killer) leaves no worker behind: each
    worker sees its call pipe close and exits."""
    script = tmp_path / "app.py"
    script.write_text(
        textwrap.dedent(
            """
            import asyncio, sys
            from looptrace._config import Config
            from looptrace._offload.parent import Offloader
            from looptrace._capture.spans import Span

            span = Span("s", 1, 2, 0, 1)
            span.end_ns = 2
            span.inputs = {"big": "x" * 300_000}
            off = Offloader(workers=2)
            asyncio.run(off.encode(span, Config(), "protobuf"))
            print(*off.worker_pids(), flush=True)
            sys.stdin.read()
            """
        )
    )
    app = subprocess.Popen(
        [sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert app.stdout is not None
    pids = [int(pid) for pid in app.stdout.readline().split()]
    assert len(pids) >= 2  # and a helper, when the machine was busy enough to call for one
    app.kill()
    app.wait()
    deadline = time.monotonic() + 30
    while not all(_exited(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(_exited(pid) for pid in pids)


@pytest.mark.parametrize("method", multiprocessing.get_all_start_methods())
def test_traced_unguarded_script_under_each_start_method(tmp_path: Path, method: str) -> None:
    """A traced script with no ``__main__`` guard, whatever start method it gives
    ``multiprocessing``, runs its top level once, offloads its large payloads, and every span
    reaches the backend."""
    from otlp_server import OtlpTestServer

    script = tmp_path / "unguarded.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import asyncio, multiprocessing
            import looptrace

            multiprocessing.set_start_method({method!r}, force=True)
            print("top-level", flush=True)

            @looptrace.traced
            async def handle(request):
                return len(request.get("image", ""))

            async def main():
                for i in range(3):
                    await handle({{"i": i, "image": "QUJD" * 200_000}})
                await handle({{"i": "small"}})
                result = await looptrace.flush(timeout=60)
                print("flushed", result.ok, looptrace.statistics().offload.offloaded)

            asyncio.run(main())
            """
        )
    )
    with OtlpTestServer() as server:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LOOPTRACE_", "OTEL_"))}
        env["LOOPTRACE_ENDPOINT"] = server.endpoint
        env["LOOPTRACE_OFFLOAD_THRESHOLD_BYTES"] = os.environ["LOOPTRACE_OFFLOAD_THRESHOLD_BYTES"]
        done = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.count("top-level") == 1
        assert "flushed True 3" in done.stdout
        assert server.wait_for_spans(4)
        assert server.accepted_span_count == 4


async def test_statistics_show_the_offload() -> None:
    """``looptrace.statistics().offload`` counts spans serialized by workers, the fallbacks
    by reason, and the workers running."""
    import looptrace
    from otlp_server import OtlpTestServer

    with OtlpTestServer() as server:
        looptrace.configure(endpoint=server.endpoint, flush_interval=0.05)
        await _offload_statistics()


async def _offload_statistics() -> None:
    import looptrace

    @looptrace.traced
    def handle(request: Any) -> int:
        return len(request)

    handle("x" * 400_000)
    handle({"lock": threading.Lock(), "image": "y" * 400_000})
    assert (await looptrace.flush(timeout=60)).ok
    stats = looptrace.statistics().offload
    assert stats.offloaded == 1
    assert stats.fallbacks["unpicklable"] == 1
    assert sum(stats.fallbacks.values()) == 1
    assert stats.workers_alive >= 1
    await looptrace.shutdown()
    assert looptrace.statistics().offload.workers_alive == 0


async def test_workers_start_without_opentelemetry_auto_instrumentation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under ``opentelemetry-instrument`` every interpreter started with the application's
    PYTHONPATH runs its sitecustomize and instruments itself; a worker, which does looptrace's
    own work, starts without it (and with the SDK disabled)."""
    auto = tmp_path / "opentelemetry" / "instrumentation" / "auto_instrumentation"
    auto.mkdir(parents=True)
    marker = tmp_path / "instrumented"
    (auto / "sitecustomize.py").write_text(
        "import os\n"
        f"open({str(marker)!r}, 'a').write(os.environ.get('OTEL_SDK_DISABLED', '-') + '\\n')\n"
    )
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(auto), str(tmp_path)]))
    # The stand-in works: a plain child interpreter runs it.
    await asyncio.to_thread(subprocess.run, [sys.executable, "-c", "pass"], check=True, timeout=60)
    assert marker.read_text() == "-\n"
    marker.unlink()

    off = Offloader(workers=1)
    try:
        span = big_span()
        assert await off.encode(span, CFG, "protobuf") == inline(span)
        assert off.stats["offloaded"] == 1
    finally:
        off.shutdown(wait=True)
    assert not marker.exists()
