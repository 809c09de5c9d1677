"""The `looptrace` command: demo end to end, the terminal views, serve's refusals, exit codes."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from looptrace import cli
from looptrace._store import Store
from looptrace._wire import DecodedSpan
from store_support import decoded_span

NOW = time.time_ns()


def dspan(
    trace: int, span: int, parent: int | None = None, name: str = "op", **kw: object
) -> DecodedSpan:
    start = NOW + span * 1000
    return decoded_span(
        trace,
        span,
        parent,
        name,
        start,
        start + int(kw.get("duration", 2_500_000)),  # type: ignore[call-overload]
        attributes=dict(kw.get("attributes", {})),  # type: ignore[call-overload]
        status=int(kw.get("status", 0)),  # type: ignore[call-overload]
        message=str(kw.get("message", "")),
        events=list(kw.get("events", [])),  # type: ignore[call-overload]
        resource={"service.name": "svc"},
        scope=("t", ""),
    )


@pytest.fixture
def store_file(tmp_path: Path) -> Path:
    """A store with one nested trace (a failed child, payloads, lag) and one experiment."""
    path = tmp_path / "cli.db"
    with Store(path) as store:
        store.write(
            [
                dspan(
                    0x1AA1,
                    1,
                    name="handle",
                    attributes={"input.value": '{"q": "hello"}', "output.value": '"bye"'},
                ),
                dspan(
                    0x1AA1,
                    2,
                    parent=1,
                    name="fetch",
                    status=2,
                    message="TimeoutError: slow",
                    attributes={"looptrace.loop.lag_max_ms": 12.5},
                    events=[
                        {
                            "name": "looptrace.loop.stall",
                            "time_ns": NOW + 2000 + 1_000_000,
                            "attributes": {
                                "looptrace.loop.stall.duration_ms": 12.5,
                                "code.function": "parse_page",
                                "code.filepath": "app/scrape.py",
                                "code.lineno": 41,
                            },
                        }
                    ],
                ),
                dspan(0x1AA1, 3, parent=2, name="retry"),
                dspan(0xAA2, 1, name="other"),
                dspan(
                    0xE0,
                    1,
                    name="case 0",
                    attributes={
                        "looptrace.experiment.id": "e" * 32,
                        "looptrace.experiment.name": "qa",
                        "looptrace.case.index": 0,
                        "looptrace.score.exact": 1.0,
                        "output.value": '"Paris"',
                    },
                ),
            ]
        )
    return path


def run(store: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli.main, ["--store", str(store), *args])
    return result.exit_code, result.output


def test_traces_lists_name_start_duration_status_and_span_count(store_file: Path) -> None:
    """`looptrace traces` prints one line per trace, newest first, with the failure count."""
    code, out = run(store_file, "traces")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["TRACE", "ID", "NAME", "START", "DURATION", "STATUS", "SPANS"]
    handle = next(line for line in lines if line.startswith(f"{0x1AA1:032x}"))
    assert "handle" in handle
    assert "ok (1 failed)" in handle
    assert handle.rstrip().endswith("3")
    assert "2.5ms" in handle
    code, out = run(store_file, "traces", "--status", "error", "--json")
    assert code == 0
    assert [t["trace_id"] for t in json.loads(out)["traces"]] == [f"{0x1AA1:032x}"]


def test_show_prints_the_tree_with_status_lag_and_payloads(store_file: Path) -> None:
    """`looptrace show PREFIX` prints parents before children with tree branches, the error
    message, the loop lag, the start of inputs and outputs, and span events: a loop stall with
    the code that blocked it (so the culprit shows in the terminal)."""
    code, out = run(store_file, "show", f"{0x1AA1:032x}"[:-2])
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0].startswith(f"trace {0x1AA1:032x}  handle")
    assert any(
        "event +1.0ms looptrace.loop.stall: parse_page (app/scrape.py:41) blocked the loop "
        "for 12.5ms" in line
        for line in lines
    ), out
    names = [
        line for line in lines if "in:" not in line and "out:" not in line and "event " not in line
    ][2:]
    assert names[0].startswith("handle  2.5ms")
    assert names[1].startswith("└─ fetch  2.5ms  ERROR  lag 12.5ms  TimeoutError: slow")
    assert names[2].startswith("   └─ retry")
    assert any('in:  {"q": "hello"}' in line for line in lines)
    assert any('out: "bye"' in line for line in lines)


def test_show_exit_codes(store_file: Path, tmp_path: Path) -> None:
    """Unknown id: exit 3; a prefix matching two traces: exit 2; a file that is not a store:
    exit 1; no store yet: exit 0 with a hint to run the demo."""
    assert run(store_file, "show", "ffff")[0] == cli.EXIT_NOT_FOUND
    assert run(store_file, "show", "0000")[0] == cli.EXIT_USAGE
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    assert run(junk, "traces")[0] == cli.EXIT_FAILURE
    code, out = run(tmp_path / "absent.db", "traces")
    assert code == 0
    assert "looptrace demo" in out
    assert not (tmp_path / "absent.db").exists()


def test_experiments_lists_scores_and_shows_cases(store_file: Path) -> None:
    """`looptrace experiments` lists experiments with score means; with an id prefix it shows
    the cases by name; an unknown id exits 3."""
    code, out = run(store_file, "experiments")
    assert code == 0
    assert "qa" in out
    assert "exact=1" in out
    code, out = run(store_file, "experiments", "eeee")
    assert code == 0
    assert "experiment qa" in out
    assert '"Paris"' in out
    header, case = [line for line in out.splitlines() if line.startswith(("CASE", "0 "))]
    assert header.split()[:2] == ["CASE", "NAME"] and case.split()[1:3] == ["case", "0"]
    assert run(store_file, "experiments", "0123")[0] == cli.EXIT_NOT_FOUND


def test_show_handles_a_very_deep_trace(tmp_path: Path) -> None:
    """A chain of 3,000 nested spans renders (no recursion limit), one line per span."""
    path = tmp_path / "deep.db"
    with Store(path) as store:
        store.write([dspan(0xD, i + 1, parent=i or None, name=f"s{i}") for i in range(3000)])
    code, out = run(path, "show", f"{0xD:032x}", "--width", "80")
    assert code == 0
    assert sum(1 for line in out.splitlines() if "s2999" in line) == 1


def test_help_everywhere() -> None:
    """Every command answers --help with exit 0 and mentions the exit codes."""
    for command in ([], ["demo"], ["traces"], ["show"], ["experiments"], ["serve"]):
        result = CliRunner().invoke(cli.main, [*command, "--help"])
        assert result.exit_code == 0, command
        assert "Exit codes" in result.output


def test_serve_refuses_a_public_address_without_a_token(tmp_path: Path) -> None:
    """`serve --host 0.0.0.0` with no token exits 2 and says why, before listening."""
    result = CliRunner().invoke(
        cli.main, ["--store", str(tmp_path / "s.db"), "serve", "--host", "0.0.0.0"]
    )
    assert result.exit_code == cli.EXIT_USAGE
    assert "without a token" in result.output


def test_serve_says_how_to_install_the_server_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without starlette/uvicorn, `serve` exits 1 with the pip command that fixes it (the one
    for this install: ``collector.INSTALL_HINT``)."""
    import looptrace.collector as collector

    def missing() -> None:
        raise collector.MissingServerExtra(
            f"looptrace serve needs uvicorn: install them with {collector.INSTALL_HINT}"
        )

    monkeypatch.setattr(collector, "_require_server_extra", missing)
    result = CliRunner().invoke(cli.main, ["serve"])
    assert result.exit_code == cli.EXIT_FAILURE
    assert f"install them with {collector.INSTALL_HINT}" in result.output
    assert "pip install" in collector.INSTALL_HINT


def test_demo_runs_end_to_end_on_a_fresh_store(tmp_path: Path) -> None:
    """`looptrace demo` on a store that does not exist yet: prints the summary and the next
    commands, and leaves an experiment with 8 cases (one failed, with its exception), nested
    spans with loop lag, and lag summaries, under the service `looptrace-demo`; it never
    imports the server extra; and the `show` command it suggests works."""
    path = tmp_path / "fresh" / "demo.db"
    env = {**os.environ, "LOOPTRACE_STORE": str(path)}
    for name in ("OTEL_SERVICE_NAME", "LOOPTRACE_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES"):
        env.pop(name, None)
    script = (
        "import sys\n"
        "from looptrace.cli import main\n"
        "try:\n"
        "    main(['demo'])\n"
        "except SystemExit as exc:\n"
        "    assert not exc.code, exc.code\n"
        "assert 'starlette' not in sys.modules and 'uvicorn' not in sys.modules\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "experiment 'capitals-demo'" in out
    assert "cases 8  errors 1" in out
    # The next command, named as this process was run (here: the interpreter with -c).
    assert re.search(r"looptrace(\.cli)? show [0-9a-f]{12}", out)
    with Store(path) as store:
        (exp,) = store.list_experiments()
        assert (exp["case_count"], exp["error_count"]) == (8, 1)
        assert set(exp["scores"]) == {"exact_match", "brevity"}
        detail = store.get_experiment(exp["id"])
        assert detail is not None
        failed = [c for c in detail["cases"] if c["status"] == "error"]
        assert len(failed) == 1
        assert "LookupError" in failed[0]["error"]
        spans = store.get_trace(failed[0]["trace_id"])
        assert {s["name"] for s in spans} >= {"case 2", "answer", "parse", "retrieve"}
        assert any(e["name"] == "exception" for s in spans for e in s["events"])
        assert all(s["lag_max_ms"] is not None for s in spans)
        assert store.lag_summaries()["summaries"]
        # Under a service name of its own, so `looptrace prune --service` can clear it.
        assert {t["service_name"] for t in store.list_traces(limit=100)} == {"looptrace-demo"}
    hint = re.search(r"looptrace(?:\.cli)? show ([0-9a-f]{12})", out)
    assert hint is not None
    shown = hint.group(1)
    code, tree = run(path, "show", shown)
    assert code == 0
    assert "LookupError" in tree


def test_serve_takes_the_token_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With LOOPTRACE_TOKEN set, `serve --host 0.0.0.0` starts, and the collector gets the
    token (and the store path); the token is never printed."""
    import looptrace.collector.app as app

    calls: list[tuple[tuple[object, ...], dict[str, object]]] = []
    monkeypatch.setattr(app, "serve", lambda *a, **kw: calls.append((a, kw)))
    monkeypatch.setenv("LOOPTRACE_TOKEN", "tok-123")
    result = CliRunner().invoke(
        cli.main, ["--store", str(tmp_path / "s.db"), "serve", "--host", "0.0.0.0"]
    )
    assert result.exit_code == 0, result.output
    ((args, kwargs),) = calls
    assert args[:3] == ("0.0.0.0", 4318, tmp_path / "s.db")
    assert kwargs["token"] == "tok-123"
    assert "tok-123" not in result.output


def serve_command(store: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "looptrace.cli", "--store", str(store), "serve", *args]


def test_serve_on_a_taken_port_exits_4_without_announcing(tmp_path: Path) -> None:
    """`serve --port N` where N is taken: one line naming the address and the error, no
    banner, and exit status 4, which --help documents as "cannot listen"."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            serve_command(tmp_path / "s.db", "--port", str(port), "--no-viewer"),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode == cli.EXIT_CANNOT_LISTEN == 4
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"looptrace: cannot listen on 127.0.0.1:{port}: ")
    assert len(line) > len(f"looptrace: cannot listen on 127.0.0.1:{port}: ")  # the OS's reason
    assert "looptrace collector" not in proc.stdout + proc.stderr
    helped = CliRunner().invoke(cli.main, ["serve", "--help"])
    assert "4 cannot listen" in " ".join(helped.output.split())


def test_serve_with_an_unusable_store_exits_1_before_listening(tmp_path: Path) -> None:
    """A store file that is not a database: `serve` says so in one line and exits 1, without
    announcing or listening."""
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database" * 100)
    proc = subprocess.run(
        serve_command(junk, "--port", "0", "--no-viewer"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == cli.EXIT_FAILURE
    assert "looptrace collector" not in proc.stderr
    assert str(junk) in proc.stderr


def test_serve_announces_only_an_address_it_holds(tmp_path: Path) -> None:
    """`serve --port 0`: the banner names the port the collector holds (the one the system
    picked), which answers at once; SIGTERM stops it."""
    import threading

    import httpx

    proc = subprocess.Popen(
        serve_command(tmp_path / "s.db", "--port", "0", "--no-viewer"),
        stderr=subprocess.PIPE,
        text=True,
    )
    watchdog = threading.Timer(60, proc.kill)
    watchdog.start()
    try:
        assert proc.stderr is not None
        banner = proc.stderr.readline()
        found = re.search(r"http://localhost:(\d+)", banner)
        assert found is not None, banner
        port = int(found.group(1))
        assert port != 0
        answer = httpx.get(f"http://127.0.0.1:{port}/api/stats", timeout=30)
        assert answer.status_code == 200
        proc.terminate()
        code = proc.wait(timeout=30)
    finally:
        watchdog.cancel()
        proc.kill()
        proc.wait()
    if sys.platform != "win32":
        # uvicorn shuts down, then re-raises the signal (older versions return 0).
        assert code in (0, -signal.SIGTERM)


def test_llm_spans_and_experiment_tokens(tmp_path: Path) -> None:
    """`looptrace show` gives an LLM span a line with provider, model, tokens, time to first
    chunk and finish reasons; `looptrace experiments ID` prints the token totals."""
    path = tmp_path / "llm.db"
    llm = {
        "gen_ai.provider.name": "openai",
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "gpt-4o",
        "gen_ai.response.model": "gpt-4o-2024",
        "gen_ai.usage.input_tokens": 12,
        "gen_ai.usage.output_tokens": 5,
        "gen_ai.response.finish_reasons": ["stop"],
        "gen_ai.response.time_to_first_chunk": 0.0425,
    }
    common = {"looptrace.experiment.id": f"{0xE5:032x}", "looptrace.experiment.name": "llm"}
    case = {**common, "looptrace.case.index": 0, "looptrace.case.repetition": 0}
    case |= {"looptrace.case.input_tokens": 12, "looptrace.case.output_tokens": 5}
    with Store(path) as store:
        store.write(
            [
                dspan(0xE5, 1, name="llm", attributes=common),
                dspan(0xE51, 1, name="case 0", attributes=case),
                dspan(0xE51, 2, parent=1, name="chat gpt-4o", attributes=llm),
                dspan(0xE51, 3, parent=1, name="plain step"),
            ]
        )
    code, out = run(path, "show", f"{0xE51:032x}", "--width", "120")
    assert code == 0
    (line,) = [x for x in out.splitlines() if "llm:" in x]
    assert " ".join(line.split()).endswith(
        "llm: openai gpt-4o-2024 tokens 12 in / 5 out first chunk 42.5ms finish stop"
    )
    code, out = run(path, "experiments", f"{0xE5:032x}")
    assert code == 0
    assert "LLM tokens: 12 in / 5 out" in out


def test_traces_filters_by_user_session_tag_and_metadata(tmp_path: Path) -> None:
    """`looptrace traces` takes --user, --session, --tag and --meta KEY=VALUE (both repeatable,
    every one must match); the list then shows tokens, cost, session and user columns, and a
    bad --meta is a usage error."""
    path = tmp_path / "s.db"

    def attrs(session: str, user: str, tags: list[str], plan: str) -> dict[str, object]:
        return {
            "session.id": session,
            "user.id": user,
            "tag.tags": tags,
            "metadata": json.dumps({"plan": plan}),
        }

    llm = {
        "gen_ai.operation.name": "chat",
        "gen_ai.usage.input_tokens": 40,
        "gen_ai.usage.output_tokens": 4,
        "llm.cost.total": 0.0004,
    }
    with Store(path) as store:
        store.write(
            [
                dspan(0x51, 1, name="turn", attributes=attrs("s-1", "ada", ["beta", "vip"], "pro")),
                dspan(0x51, 2, parent=1, name="chat", attributes=llm),
                dspan(0x52, 1, name="turn", attributes=attrs("s-2", "bob", ["beta"], "free")),
                dspan(0x53, 1, name="plain"),
            ]
        )

    def listed(*args: str) -> list[str]:
        code, out = run(path, "traces", "--json", *args)
        assert code == 0, out
        return [t["trace_id"] for t in json.loads(out)["traces"]]

    one, two = f"{0x51:032x}", f"{0x52:032x}"
    assert listed("--user", "ada") == [one]
    assert listed("--session", "s-2") == [two]
    assert sorted(listed("--tag", "beta")) == [one, two]
    assert listed("--tag", "beta", "--tag", "vip") == [one]
    assert listed("--meta", "plan=free") == [two]
    assert listed("--meta", "plan=free", "--user", "ada") == []
    code, out = run(path, "traces", "--user", "ada")
    assert code == 0
    header, row = out.splitlines()
    assert header.split()[-4:] == ["TOKENS", "COST", "SESSION", "USER"]
    assert row.split()[-4:] == ["40/4", "$0.00040", "s-1", "ada"]
    code, out = run(path, "traces", "--user", "nobody")
    assert (code, out.strip()) == (0, "No traces match.")
    code, out = run(path, "traces", "--meta", "plan")
    assert code == 2
    assert "expected KEY=VALUE" in out


def test_traces_filters_by_attribute_text_service_status_and_age(tmp_path: Path) -> None:
    """`looptrace traces` takes --attr KEY=VALUE (repeatable), --search TEXT, --service,
    --status and --since DURATION, each answered by the store and all combinable."""
    path = tmp_path / "f.db"
    hour = 3600 * 10**9

    def at(trace: int, name: str, ago: int, service: str, **kw: object) -> DecodedSpan:
        span = dspan(trace, 1, name=name, **kw)
        span.start_ns -= ago
        span.end_ns -= ago
        span.resource = {"service.name": service}
        return span

    with Store(path) as store:
        store.write(
            [
                at(0x61, "GET /search", 0, "api", attributes={"http.route": "/search"}),
                at(0x62, "GET /items", 3 * hour, "api", attributes={"http.status_code": 503}),
                at(0x63, "charge", 0, "billing", status=2, message="card declined"),
            ]
        )

    def listed(*args: str) -> list[str]:
        code, out = run(path, "traces", "--json", *args)
        assert code == 0, out
        return [t["name"] for t in json.loads(out)["traces"]]

    assert listed("--attr", "http.route=/search") == ["GET /search"]
    assert listed("--attr", "http.status_code=503") == ["GET /items"]
    assert listed("--attr", "http.status_code=503", "--attr", "http.route=/search") == []
    assert listed("--search", "declined") == ["charge"]
    assert listed("--search", "get") == ["GET /search", "GET /items"]
    assert listed("--search", "get", "--since", "2h") == ["GET /search"]
    assert listed("--service", "billing") == ["charge"]
    assert listed("--service", "api", "--status", "ok", "--since", "1h30m") == ["GET /search"]
    assert listed("--status", "error") == ["charge"]
    code, out = run(path, "traces", "--search", "nothing-like-it")
    assert (code, out.strip()) == (0, "No traces match.")
    for bad in (("--since", "2 hours"), ("--since", "h"), ("--attr", "novalue")):
        code, out = run(path, "traces", *bad)
        assert code == 2, (bad, out)


def test_prune_by_age_service_and_experiment(tmp_path: Path) -> None:
    """`looptrace prune` deletes what every given option matches and prints how much; a dry
    run only counts; with no option at all it refuses (exit 2) and deletes nothing."""
    path = tmp_path / "p.db"
    day = 86_400 * 10**9

    def at(trace: int, name: str, ago: int, service: str = "svc", **kw: object) -> DecodedSpan:
        span = dspan(trace, 1, name=name, **kw)
        span.start_ns -= ago
        span.end_ns -= ago
        span.resource = {"service.name": service}
        return span

    exp = {"looptrace.experiment.id": "f" * 32, "looptrace.experiment.name": "nightly"}
    with Store(path) as store:
        store.write(
            [
                at(0x71, "old", 10 * day),
                at(0x72, "old-demo", 10 * day, "looptrace-demo"),
                at(0x73, "new-demo", 0, "looptrace-demo"),
                at(0x74, "case", 0, attributes={**exp, "looptrace.case.index": 0}),
                at(0x75, "new", 0),
            ]
        )

    def names() -> list[str]:
        with Store(path) as store:
            return sorted(t["name"] for t in store.list_traces())

    code, out = run(path, "prune")
    assert code == 2 and "needs --older-than" in out
    assert len(names()) == 5
    code, out = run(path, "prune", "--older-than", "7d", "--dry-run")
    assert (code, out.strip()) == (0, "Would delete 2 traces (2 spans) older than 7d.")
    assert len(names()) == 5
    code, out = run(path, "prune", "--older-than", "7d", "--service", "looptrace-demo")
    assert (code, out.strip()) == (
        0,
        "Deleted 1 traces (1 spans) older than 7d, of service 'looptrace-demo'.",
    )
    assert names() == ["case", "new", "new-demo", "old"]
    code, out = run(path, "prune", "--experiment", "nightly", "--json")
    assert code == 0
    assert json.loads(out) == {"traces": 1, "spans": 1, "dry_run": False}
    assert names() == ["new", "new-demo", "old"]
    code, out = run(path, "prune", "--experiment", "nope")
    assert code == 3
    code, out = run(path, "prune", "--older-than", "1w")
    assert code == 0 and out.startswith("Deleted 1 traces")
    assert names() == ["new", "new-demo"]


def test_delete_traces_and_experiments(tmp_path: Path) -> None:
    """`looptrace delete ID...` deletes traces (short ids accepted); an unknown id is exit 3
    and deletes nothing; `--experiment` deletes an experiment and its traces by id or name."""
    path = tmp_path / "d.db"
    exp = {"looptrace.experiment.id": "a" * 32, "looptrace.experiment.name": "qa"}
    with Store(path) as store:
        store.write(
            [
                dspan(0x81 << 120, 1, name="one"),
                dspan(0x82 << 120, 1, name="two"),
                dspan(0x83 << 120, 1, name="case", attributes={**exp, "looptrace.case.index": 0}),
            ]
        )

    def names() -> list[str]:
        with Store(path) as store:
            return sorted(t["name"] for t in store.list_traces())

    one, two = f"{0x81 << 120:032x}", f"{0x82 << 120:032x}"
    code, out = run(path, "delete", one, "f" * 32)
    assert code == 3 and "no trace" in out
    assert names() == ["case", "one", "two"]
    code, out = run(path, "delete", one[:6])
    assert (code, out.strip()) == (0, f"Deleted trace {one}.")
    assert names() == ["case", "two"]
    code, out = run(path, "delete", "--experiment", "qa")
    assert (code, out.strip()) == (0, f"Deleted experiment {'a' * 32} (1 traces).")
    assert names() == ["two"]
    with Store(path) as store:
        assert store.list_experiments() == []
    code, out = run(path, "delete")
    assert code == 2
    code, out = run(path, "delete", two, "--experiment", "qa")
    assert code == 2
    assert names() == ["two"]


def _otlp_json(trace: int, spans: int, start_ns: int, service: str) -> bytes:
    return json.dumps(
        {
            "resourceSpans": [
                {
                    "resource": {
                        "attributes": [{"key": "service.name", "value": {"stringValue": service}}]
                    },
                    "scopeSpans": [
                        {
                            "scope": {"name": "feeder"},
                            "spans": [
                                {
                                    "traceId": f"{trace:032x}",
                                    "spanId": f"{i + 1:016x}",
                                    "name": f"fed {i}",
                                    "kind": 1,
                                    "startTimeUnixNano": str(start_ns + i),
                                    "endTimeUnixNano": str(start_ns + i + 1000),
                                    "attributes": [
                                        {"key": "feeder.n", "value": {"intValue": str(trace)}}
                                    ],
                                }
                                for i in range(spans)
                            ],
                        }
                    ],
                }
            ]
        }
    ).encode()


def test_prune_while_the_collector_writes(tmp_path: Path) -> None:
    """`looptrace prune` in its own process, on a store that a running `looptrace serve` is
    being fed spans into: prune deletes every old trace, the collector answers every
    request with 200 meanwhile, and every span it acknowledged is there afterwards."""
    import threading

    import httpx

    from store_support import serve_subprocess

    path = tmp_path / "busy.db"
    old = time.time_ns() - 10 * 86_400 * 10**9
    with Store(path) as store:
        for batch in range(6):
            store.write(
                [
                    decoded_span(0x10_0000 + batch * 500 + i, 1, None, "old", old, old + 1000)
                    for i in range(500)
                ]
            )
    sent: list[int] = []
    failures: list[str] = []
    stop = threading.Event()

    def feed(url: str) -> None:
        with httpx.Client(timeout=60) as client:
            trace = 0x20_0000
            while not stop.is_set():
                body = _otlp_json(trace, 20, time.time_ns(), "fed")
                answer = client.post(
                    f"{url}/v1/traces", content=body, headers={"content-type": "application/json"}
                )
                if answer.status_code != 200:
                    failures.append(f"{answer.status_code} {answer.text}")
                    return
                sent.append(trace)
                trace += 1

    def wait_for_more(n: int) -> None:
        deadline = time.monotonic() + 60
        target = len(sent) + n
        while len(sent) < target and not failures and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(sent) >= target, failures

    with serve_subprocess(path) as (_, url):
        feeder = threading.Thread(target=feed, args=(url,))
        feeder.start()
        try:
            wait_for_more(5)
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "looptrace.cli",
                    "--store",
                    str(path),
                    "prune",
                    "--json",
                    "--older-than",
                    "7d",
                ],
                capture_output=True,
                text=True,
                timeout=120,
            )
            wait_for_more(5)
        finally:
            stop.set()
            feeder.join(60)
    assert failures == []
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["traces"] == 3000
    with Store(path) as store:
        assert store.list_traces(limit=10, since_ns=0, until_ns=old + 1) == []
        kept = {t["trace_id"] for t in store.list_traces(limit=10_000, service="fed")}
        assert kept == {f"{t:032x}" for t in sent}
        assert store.stats()["spans"] == 20 * len(sent)
        assert store.list_traces(limit=1, attrs=[("feeder.n", str(sent[-1]))])


def test_experiments_count_task_errors_apart_from_scorer_errors(tmp_path: Path) -> None:
    """`looptrace experiments` says how many cases failed in the task and how many had a scorer
    raise, as the summary an experiment prints, and names every failing scorer."""
    from experiment_support import experiment_spans

    exp_id = f"{0xE7:032x}"
    path = tmp_path / "traces.db"
    with Store(path) as store:
        store.write(
            experiment_spans(
                exp_id,
                "qa-errors",
                time.time_ns(),
                6,
                score=lambda i, rep: 1.0,
                task_errors=frozenset({1, 4}),
                scorer_errors={2: ("exact", "judge"), 3: ("judge",)},
            )
        )
    code, out = run(path, "experiments")
    assert code == 0
    header, row = [line for line in out.splitlines() if line.startswith(("EXPERIMENT", exp_id))]
    assert "SCORER ERRORS" in header
    assert row.split()[-4:-1] == ["6", "2", "2"]  # cases, task errors, scorer errors
    code, out = run(path, "experiments", exp_id)
    assert code == 0
    assert "6 cases, 2 errors, 2 scorer errors" in out
    assert "scorer exact raised on 1 case\n" in out
    assert "scorer judge raised on 2 cases" in out
