"""looptrace inside programs it did not write: a setting it cannot use, a backend that is down
or does not resolve, a disabled switch, an exception formatted on another thread. Each is said
once, in one line that names what the user set, and what it costs is counted.

The programs run in fresh processes, as a user's would: the settings are read on first use."""

from __future__ import annotations

import ast
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from unittest import mock

import pytest

from looptrace._errors import format_exception
from otlp_server import OtlpTestServer

# A program that traces five calls, flushes, and prints what flush() and statistics() say.
PROGRAM = """
import asyncio, json, looptrace

@looptrace.traced
async def work(i):
    return i

async def main():
    for i in range(5):
        await work(i)
    result = await looptrace.flush(5)
    stats = looptrace.statistics()
    print(json.dumps({
        "ok": result.ok,
        "dropped": {k: v for k, v in stats.dropped.items() if v},
        "sent": stats.spans_sent,
    }))

asyncio.run(main())
"""


def run(body: str, tmp_path: Path, **env: str) -> tuple[dict[str, object], list[str], float]:
    """Run ``body`` in a fresh interpreter; its JSON line, its stderr lines, its wall time."""
    script = tmp_path / "app.py"
    script.write_text(textwrap.dedent(body))
    full = {k: v for k, v in os.environ.items() if k != "LOOPTRACE_RAISE_INTERNAL_ERRORS"}
    full.update(env)
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(script)], env=full, capture_output=True, text=True, timeout=60
    )
    took = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr
    import json

    out = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    return (json.loads(out[-1]) if out else {}), proc.stderr.splitlines(), took


def free_port() -> int:
    """A port with nothing listening on it (a backend that is down)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


BAD_ENVIRONMENTS = [
    # (variable, value, what the one line must say)
    (
        "LOOPTRACE_SAMPLE_RATE",
        "2",
        "LOOPTRACE_SAMPLE_RATE='2': sample_rate must be between 0 and 1",
    ),
    ("LOOPTRACE_FLUSH_INTERVAL", "soon", "LOOPTRACE_FLUSH_INTERVAL must be a number, got 'soon'"),
    ("LOOPTRACE_MAX_BATCH_SPANS", "0", "LOOPTRACE_MAX_BATCH_SPANS='0': max_batch_spans must be"),
    ("LOOPTRACE_REDACT", "maybe", "LOOPTRACE_REDACT must be true or false, got 'maybe'"),
    ("LOOPTRACE_ENCODING", "grpc", "LOOPTRACE_ENCODING must be protobuf or json"),
    ("OTEL_EXPORTER_OTLP_COMPRESSION", "brotli", "OTEL_EXPORTER_OTLP_COMPRESSION must be"),
    (
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "localhost:4318",
        "OTEL_EXPORTER_OTLP_ENDPOINT='localhost:4318': endpoint 'localhost:4318/v1/traces' is "
        "not an http(s) URL",
    ),
    ("LOOPTRACE_ENDPOINT", "ftp://x/v1/traces", "LOOPTRACE_ENDPOINT='ftp://x/v1/traces'"),
    ("OTEL_EXPORTER_OTLP_HEADERS", "no-equals-sign", "OTEL_EXPORTER_OTLP_HEADERS must be"),
]


@pytest.mark.parametrize(
    ("name", "value", "line"), BAD_ENVIRONMENTS, ids=[c[0] for c in BAD_ENVIRONMENTS]
)
def test_a_bad_setting_is_one_line_naming_it_and_every_span_is_counted(
    name: str, value: str, line: str, tmp_path: Path
) -> None:
    """A value looptrace cannot use is one line naming the variable the user set and its value
    (never an internal-error traceback); the spans are counted as dropped (invalid_config) and
    flush() is not ok."""
    result, stderr, _ = run(PROGRAM, tmp_path, **{name: value})
    said = [s for s in stderr if "looptrace" in s]
    assert len(said) == 1, stderr
    assert line in said[0]
    assert "Traceback" not in "\n".join(stderr)
    assert result == {"ok": False, "dropped": {"invalid_config": 5}, "sent": 0}


def test_a_header_value_is_never_echoed(tmp_path: Path) -> None:
    """Headers carry API keys: a malformed one is named, its value is not shown."""
    _, stderr, _ = run(PROGRAM, tmp_path, LOOPTRACE_HEADERS="authorization=Bearer sk-123,=x")
    assert "sk-123" not in "\n".join(stderr)


def test_grpc_protocol_sends_http_protobuf_and_says_so_once(tmp_path: Path) -> None:
    """OTEL_EXPORTER_OTLP_PROTOCOL=grpc, set for every SDK of a deployment, does not silence
    looptrace: it sends http/protobuf to the URL it names, in one line, and the spans arrive."""
    with OtlpTestServer() as server:
        result, stderr, _ = run(
            PROGRAM,
            tmp_path,
            OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
            OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{server.port}",
        )
        assert server.wait_for_spans(5, timeout=5)
    said = [s for s in stderr if "looptrace" in s]
    assert said == [
        "looptrace: OTEL_EXPORTER_OTLP_PROTOCOL=grpc: looptrace sends OTLP over HTTP only, as "
        f"http/protobuf to http://127.0.0.1:{server.port}/v1/traces"
    ]
    assert result == {"ok": True, "dropped": {}, "sent": 5}


def test_a_base_endpoint_ending_in_the_traces_path_is_pointed_out(tmp_path: Path) -> None:
    """OTEL_EXPORTER_OTLP_ENDPOINT is a base URL: set to a traces URL, the posts go to
    .../v1/traces/v1/traces, and the one line says so and names the variables to use."""
    with OtlpTestServer() as server:
        base = f"http://127.0.0.1:{server.port}/v1/traces"
        _, stderr, _ = run(PROGRAM, tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT=base)
        paths = {r.path for r in server.requests}
    assert paths <= {"/v1/traces/v1/traces"}
    first = next(s for s in stderr if "OTEL_EXPORTER_OTLP_ENDPOINT" in s)
    assert f"({base}/v1/traces)" in first and "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" in first


@pytest.mark.parametrize("name", ["LOOPTRACE_DISABLED", "OTEL_SDK_DISABLED"])
def test_disabled_records_and_sends_nothing_from_the_first_call(name: str, tmp_path: Path) -> None:
    """Disabled means no span at all, the first traced call included, and no pipeline."""
    body = """
    import asyncio, json, looptrace
    from looptrace import _export

    @looptrace.traced
    async def work():
        return looptrace.current_span().is_recording

    async def main():
        recording = await work()
        with looptrace.span("block") as s:
            block = s.is_recording
        await looptrace.flush(2)
        print(json.dumps({"recording": [recording, block], "pipeline": _export.current() is not None}))

    asyncio.run(main())
    """
    with OtlpTestServer() as server:
        result, _, _ = run(body, tmp_path, **{name: "true", "LOOPTRACE_ENDPOINT": server.url})
        assert server.requests == []  # the process has exited: nothing more can come
    assert result == {"recording": [False, False], "pipeline": False}


def test_a_backend_that_is_down_is_said_while_running_and_exit_is_quick(tmp_path: Path) -> None:
    """A backend that refuses every connection is reported once at WARNING while the program
    runs (URL and error); the exit does not wait out the 5 s shutdown timeout and says what
    was lost in one line (without a spool: with one, tests/_export/test_spool.py)."""
    url = f"http://127.0.0.1:{free_port()}/v1/traces"
    body = PROGRAM.replace("result = await looptrace.flush(5)", "result = await looptrace.flush(1)")
    result, stderr, took = run(body, tmp_path, LOOPTRACE_ENDPOINT=url, LOOPTRACE_SPOOL="false")
    warnings = [s for s in stderr if s.startswith("looptrace: cannot export to")]
    assert len(warnings) == 1 and url in warnings[0] and "Connect" in warnings[0]
    exit_lines = [s for s in stderr if "before exit" in s]
    assert exit_lines == [
        f"looptrace: 5 span(s) could not be sent to {url} before exit (shutdown=5); last error: "
        + exit_lines[0].split("last error: ")[1]
    ]
    assert len([s for s in stderr if s.startswith("looptrace")]) == 2, stderr
    assert result["ok"] is False
    # The flush above waits 1 s; start-up and exit take well under the 5 s timeout.
    assert took < 4.5, took


def test_a_backend_that_comes_back_is_said_once(tmp_path: Path) -> None:
    """The outage's end is said too, and what was kept meanwhile arrives."""
    port = free_port()
    body = f"""
    import asyncio, json, sys, looptrace
    sys.path.insert(0, {str(Path(__file__).parent)!r})
    from otlp_server import OtlpTestServer

    @looptrace.traced
    async def work(i):
        return i

    async def main():
        for i in range(5):
            await work(i)
        first = await looptrace.flush(0.5)  # refused: nothing listens yet
        server = OtlpTestServer()
        server.port = {port}  # the port the endpoint names, refused until now
        with server:
            result = await looptrace.flush(10)
            print(json.dumps({{"first": first.ok, "ok": result.ok, "got": len(server.span_names())}}))

    asyncio.run(main())
    """
    result, stderr, _ = run(body, tmp_path, LOOPTRACE_ENDPOINT=f"http://127.0.0.1:{port}/v1/traces")
    assert result == {"first": False, "ok": True, "got": 5}
    assert len([s for s in stderr if "cannot export to" in s]) == 1
    back = [s for s in stderr if "answers again" in s]
    assert len(back) == 1 and f"127.0.0.1:{port}" in back[0]


def test_an_unresolvable_host_is_one_line_at_exit(tmp_path: Path) -> None:
    """A host name that does not resolve: no traceback at exit, one line naming the URL."""
    url = "http://no-such-host.invalid:4318/v1/traces"
    body = PROGRAM.replace("result = await looptrace.flush(5)", "result = await looptrace.flush(1)")
    _, stderr, took = run(body, tmp_path, LOOPTRACE_ENDPOINT=url)
    text = "\n".join(stderr)
    assert "Traceback" not in text and "RuntimeError" not in text
    assert len([s for s in stderr if "before exit" in s and url in s]) == 1
    assert took < 4.5, took


def test_a_rejection_names_the_url(tmp_path: Path) -> None:
    """'rejected a batch with HTTP 405' says where it posted."""
    with OtlpTestServer() as server:
        server.fail_next(405)
        _, stderr, _ = run(PROGRAM, tmp_path, LOOPTRACE_ENDPOINT=server.url)
    rejected = [s for s in stderr if "rejected a batch" in s]
    assert len(rejected) == 1
    assert f"{server.url} rejected a batch with HTTP 405" in rejected[0]


# --------------------------------------------------------------------------- stack traces


def _failing() -> BaseException:
    def inner() -> int:
        return {"a": 1}["b"] + (1 // 0)

    try:
        try:
            inner()
        except KeyError as exc:
            raise RuntimeError("while scoring") from exc
    except RuntimeError as exc:
        return exc
    raise AssertionError("unreachable")


def test_stack_traces_are_formatted_without_parsing_source() -> None:
    """looptrace's stack traces keep file, line, function, source and the chain, and parse
    nothing (the ^^^ markers parse the line with ast, which is what races on 3.11)."""
    exc = _failing()
    with mock.patch.object(ast, "parse", wraps=ast.parse) as parse:
        text = format_exception(exc)
    assert parse.call_count == 0
    assert 'return {"a": 1}["b"] + (1 // 0)' in text
    assert "in inner" in text and "KeyError: 'b'" in text
    assert "The above exception was the direct cause" in text
    assert text.rstrip().endswith("RuntimeError: while scoring")
    assert "^" not in text


def test_formatting_on_the_export_thread_never_breaks_another_threads_parse() -> None:
    """Spans that fail, exported by looptrace's thread for several seconds, while this thread
    parses and formats tracebacks as pytest and logging do: not one SystemError."""
    stop = time.monotonic() + 3.0
    errors: list[BaseException] = []
    exc = _failing()

    def background() -> None:
        # What the exporter does with each failed span's event.
        from looptrace._serialize.spans import _stacktrace

        while time.monotonic() < stop:
            _stacktrace(exc, exc.__traceback__)

    thread = threading.Thread(target=background)
    thread.start()
    source = "x = [(a, b) for a in range(3) for b in {k: v for k, v in zip('ab', 'cd')}]\n" * 20
    import traceback

    parses = 0
    while time.monotonic() < stop:
        try:
            ast.parse(source)
            traceback.format_exception(type(exc), exc, exc.__traceback__)
            parses += 1
        except SystemError as e:  # pragma: no cover - the failure this test guards against
            errors.append(e)
    thread.join()
    assert errors == []
    assert parses > 10


# --------------------------------------------------------------------------- the pytest plugin

pytest_plugins = ["pytester"]


def test_a_test_that_closes_every_loop_it_finds_passes_with_the_plugin_on(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """anyio's suite walks gc.get_objects() and closes the event loops it finds: looptrace's
    own background loop must not be one such a test can break (nor fail on)."""
    pytester.makeini(
        "[pytest]\naddopts = -p no:benchmark -p no:hypothesispytest -p no:cacheprovider\n"
    )
    pytester.makepyfile(
        """
import asyncio, gc, threading
import looptrace

@looptrace.traced
def work():
    return 1

def test_spans_first():
    for _ in range(20):
        work()
    # looptrace's thread is running its loop now (it sends these spans).
    assert any(t.name == "looptrace-flusher" for t in threading.enumerate())

def test_closes_every_loop():
    for obj in gc.get_objects():
        if isinstance(obj, asyncio.AbstractEventLoop) and not obj.is_closed():
            obj.close()

def test_tracing_still_works():
    for _ in range(5):
        work()
    assert looptrace.flush_sync(5).ok
"""
    )
    with OtlpTestServer() as server:
        monkeypatch.setenv("LOOPTRACE_ENDPOINT", server.url)
        result = pytester.runpytest_subprocess("--looptrace")
        result.assert_outcomes(passed=3)
        assert server.wait_for_spans(25, timeout=5)


# --------------------------------------------------------------------------- install hints


def test_install_hints_work_from_where_looptrace_came_from(monkeypatch: pytest.MonkeyPatch) -> None:
    """From a folder (a clone): that folder with the extra. From anywhere else: the extra's
    own packages by name, which any index has; never 'looptrace[server]', which it may not."""
    from importlib import metadata

    from looptrace import _install

    class Dist:
        def __init__(self, direct_url: str | None) -> None:
            self.direct_url = direct_url
            self.requires = [
                "httpx>=0.25",
                'starlette>=0.37; extra == "server"',
                "uvicorn >= 0.29 ; extra == 'server'",
                'zstandard>=0.22; extra == "zstd"',
            ]

        def read_text(self, name: str) -> str | None:
            return self.direct_url if name == "direct_url.json" else None

    clone = Dist('{"url": "file:///home/ann/src/looptrace", "dir_info": {"editable": true}}')
    monkeypatch.setattr(metadata, "distribution", lambda name: clone)
    assert _install.install_hint("server").endswith(
        "-m pip install '/home/ann/src/looptrace[server]'"
    )
    wheel = Dist('{"url": "file:///tmp/looptrace-0.1.0-py3-none-any.whl", "archive_info": {}}')
    monkeypatch.setattr(metadata, "distribution", lambda name: wheel)
    assert _install.install_hint("server").endswith(
        "-m pip install 'starlette>=0.37' 'uvicorn>=0.29'"
    )
    assert "looptrace[" not in _install.install_hint("server")


def test_spans_ended_just_before_exit_reach_a_backend_named_by_host_name(tmp_path: Path) -> None:
    """The exit's flush connects to a backend named by host name (localhost): asyncio's name
    lookup runs in an executor that refuses work once the interpreter exits, and every span
    of a program that only flushes at exit was lost."""
    body = """
    import looptrace

    @looptrace.traced
    def work(i):
        return i

    for i in range(10):
        work(i)
    """
    with OtlpTestServer() as server:
        _, stderr, _ = run(
            body, tmp_path, LOOPTRACE_ENDPOINT=f"http://localhost:{server.port}/v1/traces"
        )
        assert server.wait_for_spans(10, timeout=5), stderr
    assert not [s for s in stderr if "looptrace" in s]


def test_a_headers_provider_given_to_configure_signs_every_request_large_spans_included() -> None:
    """looptrace.configure(headers_provider=...) is the documented way to bring a token that
    refreshes: every request carries the provider's current value, the large spans that a
    worker process would otherwise send itself included (the provider lives here)."""
    import asyncio

    import looptrace

    tokens = iter(f"Bearer t{i}" for i in range(1000))

    async def provider() -> dict[str, str]:
        return {"Authorization": next(tokens)}

    with OtlpTestServer() as server:
        looptrace.configure(endpoint=server.url, headers_provider=provider)

        @looptrace.traced
        async def work(payload: str) -> int:
            return len(payload)

        async def main() -> None:
            await work("small")
            await work("x" * (1024 * 1024))  # past the offload threshold
            assert (await looptrace.flush(10)).ok

        asyncio.run(main())
        assert server.wait_for_spans(2, timeout=5)
        auth = [
            {k.lower(): v for k, v in r.headers.items()}.get("authorization", "")
            for r in server.requests
        ]
    assert auth and all(a.startswith("Bearer t") for a in auth)
