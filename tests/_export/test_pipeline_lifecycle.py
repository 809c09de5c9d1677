"""Where the flusher lives and how it ends: many asyncio.run calls, threads, trio, fork,
in-progress records for long roots, shutdown, and interpreter exit."""

from __future__ import annotations

import asyncio
import functools
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import looptrace
from looptrace import _export
from looptrace._transport import RetryPolicy
from otlp_server import OtlpTestServer
from pipeline_support import checked_server, install_pipeline, make_spans

FAST_RETRY = RetryPolicy(base_delay=0.02, max_delay=0.2, budget=20.0)
use = functools.partial(install_pipeline, retry=FAST_RETRY)


@pytest.fixture
def server() -> Iterator[OtlpTestServer]:
    """A fresh OTLP server; afterwards, no request failed to decode and looptrace recorded no
    internal error (a loop mix-up would show there)."""
    with checked_server() as srv:
        yield srv
    assert looptrace.statistics().internal_errors == {}


def test_many_asyncio_runs_in_one_process(server: OtlpTestServer) -> None:
    """Each asyncio.run gets spans out without an explicit flush (the flusher on the closing
    loop hands its work to the private thread), and the next asyncio.run starts cleanly."""
    use(server)

    async def work(run: int) -> None:
        for i in range(20):
            with looptrace.span(f"r{run}-{i}"):
                await asyncio.sleep(0)

    for run in range(5):
        asyncio.run(work(run))
        assert server.wait_for_spans(20 * (run + 1), timeout=5), server.accepted_span_count
    assert looptrace.flush_sync(5).ok
    assert server.accepted_span_count == 100
    assert server.accepted_record_count == 100  # each span sent once


def test_each_loop_gets_a_client_but_tls_setup_happens_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every asyncio.run needs its own HTTP connections (they belong to one loop), but
    loading the CA bundle (tens of milliseconds of CPU) is done once per process."""
    import ssl

    import trustme

    from looptrace._transport import settings as _net

    ca = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(tls)

    built: list[object] = []
    real = ssl.create_default_context

    def counting(*args: object, **kwargs: object) -> object:
        built.append(real(*args, **kwargs))  # type: ignore[arg-type]
        return built[-1]

    monkeypatch.setattr(_net, "_ssl_contexts", {})
    monkeypatch.setattr(ssl, "create_default_context", counting)
    with checked_server(tls=tls) as server:
        assert server.endpoint.startswith("https://")
        use(server, certificate=str(ca_file))
        for run in range(3):
            asyncio.run(looptrace.flush(5))  # nothing to send yet: the client is made on use

            async def work(run: int = run) -> looptrace.FlushResult:
                make_spans(5, f"c{run}-")
                return await looptrace.flush(5)

            assert asyncio.run(work()).ok
        assert server.accepted_span_count == 15
        assert server.connections_opened == 3  # one per loop, kept alive within it
    assert len(built) == 1
    assert looptrace.statistics().internal_errors == {}


def test_a_runner_per_test_like_pytest_asyncio(server: OtlpTestServer) -> None:
    """A fresh event loop per 'test', its leftover tasks cancelled and the loop closed after it
    (what pytest-asyncio's runner does), flushing inside each: no loop mix-ups, no loss."""
    use(server)
    for n in range(4):

        async def body(n: int = n) -> looptrace.FlushResult:
            make_spans(10, f"t{n}-")
            return await looptrace.flush(5)

        assert asyncio.run(body()).ok
    assert server.accepted_span_count == 40


def test_threads_without_a_loop(server: OtlpTestServer) -> None:
    """Spans ended on several plain threads all go out through the private flusher thread."""
    use(server)
    threads = [threading.Thread(target=make_spans, args=(250, f"th{t}-")) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert looptrace.flush_sync(5).ok
    assert server.accepted_span_count == 1000


def test_threads_each_with_their_own_loop(server: OtlpTestServer) -> None:
    """Several threads running asyncio.run at the same time share one pipeline safely."""
    use(server)

    async def work(tag: int) -> None:
        for i in range(50):
            with looptrace.span(f"L{tag}-{i}"):
                await asyncio.sleep(0)
        await looptrace.flush(5)

    threads = [threading.Thread(target=asyncio.run, args=(work(t),)) for t in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert looptrace.flush_sync(5).ok
    assert server.accepted_span_count == 150


def test_trio_programs_use_the_private_thread(server: OtlpTestServer) -> None:
    """Under trio (no asyncio loop) spans go through the private thread and
    ``await looptrace.flush()`` works."""
    trio = pytest.importorskip("trio")
    use(server)

    async def main() -> looptrace.FlushResult:
        for i in range(30):
            with looptrace.span(f"trio{i}"):
                await trio.sleep(0)
        return await looptrace.flush(5)

    result = trio.run(main)
    assert result.ok
    assert result.sent == 30
    assert server.accepted_span_count == 30
    pipeline = _export.current()
    assert pipeline is not None
    assert pipeline.flusher.homes.primary is not None
    assert pipeline.flusher.homes.primary.private


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_fork_child_starts_empty_and_parent_spans_are_sent_once(server: OtlpTestServer) -> None:
    """After fork the child has an empty buffer and its own flusher; the parent's pending spans
    are sent by the parent only (exactly once)."""
    use(server, flush_interval=2.0)  # the parent's spans are still pending at fork time
    make_spans(10, "parent")
    assert looptrace.statistics().queued_spans == 10
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            if looptrace.statistics().queued_spans == 0:
                make_spans(5, "child")
                result = looptrace.flush_sync(5)
                code = 0 if result.ok and result.sent == 5 else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert looptrace.flush_sync(5).ok
    names = server.span_names()
    assert names == sorted([f"parent{i}" for i in range(10)] + [f"child{i}" for i in range(5)])
    assert server.accepted_record_count == 15


async def test_long_roots_are_sent_in_progress_then_final(server: OtlpTestServer) -> None:
    """A root open longer than in_progress_after is sent as an in-progress record; its final
    record follows when it ends. A short root is sent once (start and end coalesce)."""
    use(server, send_in_progress=True, in_progress_after=0.1)
    with looptrace.span("short"):
        pass
    with looptrace.span("long") as long_root:
        await asyncio.to_thread(server.wait_for_requests, 1, 5)
        for _ in range(100):
            records = [r for r in server.all_records() if r.name == "long"]
            if records:
                break
            await asyncio.to_thread(server.wait_for_requests, len(server.requests) + 1, 0.5)
        assert records, "no in-progress record arrived"
        assert records[0].end_time_unix_nano == 0 or any(
            kv.key == "looptrace.in_progress" and kv.value.bool_value
            for kv in records[0].attributes
        )
        assert records[0].span_id == long_root.span_id.to_bytes(8, "big")
    assert (await looptrace.flush(5)).ok
    by_name: dict[str, int] = {}
    for record in server.all_records():
        by_name[record.name] = by_name.get(record.name, 0) + 1
    assert by_name == {"short": 1, "long": 2}
    final = server.accepted_spans()
    assert {s.name for s in final} == {"short", "long"}
    assert all(s.end_time_unix_nano > 0 for s in final)


def test_in_progress_is_off_for_other_backends_by_default(server: OtlpTestServer) -> None:
    """With an OTLP endpoint and no setting, nothing is sent before a root ends."""
    pipeline = use(server, in_progress_after=0.01)
    assert not pipeline.cfg.sends_in_progress
    with looptrace.span("root"):
        make_spans(3)
    assert looptrace.flush_sync(5).ok
    assert server.accepted_record_count == 4


@pytest.mark.parametrize("configured", [True, False])
async def test_first_flush_after_configure_hands_nothing_to_a_thread(
    server: OtlpTestServer, monkeypatch: pytest.MonkeyPatch, configured: bool
) -> None:
    """configure() is the start-up call: after it, the first flush on the application's loop
    sets up the encoder right there; a thread for it would hold the GIL against the loop.
    Without it (a pipeline built by hand), that setup still goes to a thread. Either way the
    spans arrive."""
    handed: list[object] = []
    real = _export.flusher.off_loop

    async def watched(fn: object, *args: object) -> object:
        handed.append(fn)
        return await real(fn, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(_export.flusher, "off_loop", watched)
    if configured:
        looptrace.configure(endpoint=server.endpoint, flush_interval=0.05, offload=True)
        make_spans(3)
    else:
        monkeypatch.setattr(
            _export.otlp_http.OtlpHttpExporter, "loaded_cheaply", lambda self: False
        )
        use(server)
        make_spans(3)
    assert (await looptrace.flush(5)).ok
    assert server.accepted_span_count == 3
    loads = [fn for fn in handed if getattr(fn, "__name__", "") == "load"]
    assert len(loads) == (0 if configured else 1)


async def test_shutdown_flushes_then_stops(server: OtlpTestServer) -> None:
    """shutdown() sends what is held, stops the flusher, and leaves the statistics readable;
    the next span starts a fresh pipeline."""
    pipeline = use(server)
    make_spans(15)
    result = await looptrace.shutdown(5)
    assert result.ok
    assert result.sent == 15
    assert pipeline.lifecycle.closed
    assert all(h.done.is_set() for h in pipeline.flusher.homes.all)
    assert looptrace.statistics().spans_sent == 15
    assert server.accepted_span_count == 15
    make_spans(1, "after")
    assert _export.current() is not pipeline
    assert (await looptrace.shutdown(5)).sent == 1


def test_shutdown_deadline_drops_and_counts_what_is_left(server: OtlpTestServer) -> None:
    """When the server holds every request, shutdown returns at its deadline and counts the
    unsent spans as dropped (reason: shutdown), without a spool (with one they go there)."""
    use(server, max_concurrent_requests=1, max_batch_spans=5, spool=False)
    server.hold()
    make_spans(20)
    result = looptrace.shutdown_sync(0.5)
    server.release()
    assert result.dropped["shutdown"] == 20
    assert not result.ok
    assert looptrace.statistics().dropped["shutdown"] == 20


def _run_script(body: str, tmp_path: Path, **env_extra: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "app.py"
    script.write_text(textwrap.dedent(body))
    env = {k: v for k, v in os.environ.items() if k != "LOOPTRACE_RAISE_INTERNAL_ERRORS"}
    env.update(env_extra)
    env["PYTHONASYNCIODEBUG"] = "1"
    return subprocess.run(
        [sys.executable, "-W", "error::RuntimeWarning", str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_exit_drains_everything_with_no_loop_warnings(
    server: OtlpTestServer, tmp_path: Path
) -> None:
    """A program mixing asyncio.run calls, threads and sync code, with no flush at all, gets
    every span out at exit, and asyncio reports nothing (no destroyed pending task, no loop
    mix-up)."""
    proc = _run_script(
        """
        import asyncio, threading, looptrace

        async def work(tag):
            for i in range(30):
                with looptrace.span(f"{tag}-{i}"):
                    await asyncio.sleep(0)

        for run in range(3):
            asyncio.run(work(f"run{run}"))
        t = threading.Thread(target=lambda: [looptrace.span(f"thread-{i}").__enter__().end() for i in range(30)])
        t.start(); t.join()
        for i in range(30):
            with looptrace.span(f"sync-{i}"):
                pass
        """,
        tmp_path,
        LOOPTRACE_ENDPOINT=server.endpoint,
        LOOPTRACE_FLUSH_INTERVAL="5",
    )
    assert proc.returncode == 0, proc.stderr
    assert server.accepted_span_count == 150
    assert server.accepted_record_count == 150
    for bad in ("Task was destroyed", "Traceback", "different loop", "never awaited"):
        assert bad not in proc.stderr, proc.stderr


@pytest.mark.parametrize("size", [10, 2_000_000])
def test_asyncio_run_ends_right_after_a_span(
    server: OtlpTestServer, tmp_path: Path, size: int
) -> None:
    """A span that ends just before ``asyncio.run`` returns (after an earlier flush, so the
    flusher sleeps on its event) wakes the flusher in the same turn in which asyncio.run
    cancels it. The cancellation must win: the program finishes, and the span goes out at
    exit. Small spans, and large ones that a worker sends."""
    proc = _run_script(
        f"""
        import asyncio, looptrace

        @looptrace.traced
        async def handle(request):
            return "ok"

        async def main():
            await handle("a" * {size})
            await looptrace.flush()
            await handle("b" * {size})

        asyncio.run(main())
        print("asyncio.run returned", flush=True)
        """,
        tmp_path,
        LOOPTRACE_ENDPOINT=server.endpoint,
    )
    assert proc.returncode == 0, proc.stderr
    assert "asyncio.run returned" in proc.stdout
    assert server.accepted_span_count == 2
    for bad in ("Task was destroyed", "Traceback", "never awaited"):
        assert bad not in proc.stderr, proc.stderr


async def _a_batch_then(turns: int) -> None:
    """Twenty spans, the batch size, then the program ends ``turns`` loop turns later."""
    with looptrace.span("first"):
        pass
    for _ in range(5):  # the flusher starts on this loop and waits for a batch
        await asyncio.sleep(0)
    for i in range(19):
        with looptrace.span(f"s{i}"):
            pass
    for _ in range(turns):
        await asyncio.sleep(0)


@pytest.mark.parametrize("steps", range(10))
def test_asyncio_run_ending_at_any_step_of_a_drain_loses_no_span(
    server: OtlpTestServer, steps: int
) -> None:
    """``asyncio.run`` cancels every task of its loop at once, a request's sender among them
    even before its first step: that sender's batch is sent from the private thread, not
    left in flight forever. The program ends ``steps`` loop turns after the span that
    completes a batch, so one of them ends it in the turn the flusher starts a request."""
    use(server, flush_interval=30.0, max_batch_spans=20)
    asyncio.run(_a_batch_then(steps))
    result = looptrace.flush_sync(5)
    assert result.ok, result
    assert server.accepted_span_count == 20


@pytest.mark.parametrize("turns", [4, 10, 20, 40])
def test_asyncio_run_ending_while_a_batch_is_encoded_loses_no_span(
    server: OtlpTestServer, monkeypatch: pytest.MonkeyPatch, turns: int
) -> None:
    """A batch whose encoding the end of ``asyncio.run`` interrupts (the flusher yields
    between spans) goes back as spans, and the private thread encodes and sends it: every span
    arrives, in requests that hold them all (none empty)."""
    monkeypatch.setattr(_export.exporter, "SLICE_SECONDS", 0.0)  # a pause after every span
    use(server, flush_interval=30.0, max_batch_spans=20)
    # 20 spans, three turns a pause: the end falls while the batch is encoded.
    asyncio.run(_a_batch_then(turns))
    result = looptrace.flush_sync(5)
    assert result.ok, result
    assert server.accepted_span_count == 20
    assert all(r.spans for r in server.requests)


def test_asyncio_run_ending_while_a_split_batch_waits_for_a_slot_loses_no_span(
    server: OtlpTestServer,
) -> None:
    """Spans that encode larger than estimated leave a batch in several requests, each
    waiting for a free slot. ``asyncio.run`` ending during that wait cancels the drain: the
    requests it had not started yet are sent from the private thread, not left in flight."""
    pipeline = use(
        server,
        flush_interval=30.0,
        max_batch_bytes=16_000,
        max_concurrent_requests=1,
    )
    server.hold()

    async def main() -> None:
        for i in range(10):
            with looptrace.span(f"s{i}") as s:
                # Estimated as one small nested value; 4 KB once encoded.
                s.set_inputs({"doc": {"text": "x" * 4000}})
        flushing = asyncio.ensure_future(looptrace.flush(30))  # drains now; asyncio.run ends it
        for _ in range(5000):  # until the batch is split and its first request is held
            if pipeline.buffer.in_flight_batches >= 2 and server.wait_for_active(1, 0):
                break
            await asyncio.sleep(0.001)
        assert pipeline.buffer.in_flight_batches >= 2
        assert not flushing.done()

    asyncio.run(main())
    server.release()
    result = looptrace.flush_sync(5)
    assert result.ok, result
    assert server.accepted_span_count == 10
