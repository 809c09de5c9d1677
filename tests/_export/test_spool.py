"""The spool: spans that cannot be delivered go to disk, and a later process delivers them.

Every program runs in a fresh interpreter, as a user's would, against real servers on
127.0.0.1: a backend down for a whole process's life, a process killed by SIGKILL, several
processes sharing one spool folder, files that do not read back, the bounds, and
``looptrace serve`` receiving a span twice."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from looptrace._export.spool_dir import READY, SpoolDir, endpoint_key, read_file
from otlp_server import OtlpTestServer, decode_body

# Prints what the pipeline did, once looptrace's own exit flush has run: atexit handlers run
# last-registered first, and this one is registered before looptrace is imported.
PRELUDE = """
import atexit, json, os, sys, time
_t = {"end": time.monotonic()}
def _report():
    import looptrace
    s = looptrace.statistics()
    print(json.dumps({
        "exit_s": time.monotonic() - _t["end"], "spooled": s.spooled, "replayed": s.replayed,
        "sent": s.spans_sent, "dropped": {k: v for k, v in s.dropped.items() if v},
        "spool_dropped": {k: v for k, v in s.spool.dropped.items() if v},
    }), flush=True)
atexit.register(_report)
import looptrace
"""

EMIT = """
for i in range({count}):
    with looptrace.span("{prefix}%d" % i):
        pass
_t["end"] = time.monotonic()
"""

# Emits one span (which starts the pipeline, and with it the replayer), then waits until the
# spool's spans have been replayed.
REPLAY = """
with looptrace.span("{prefix}"):
    pass
deadline = time.monotonic() + 30
while looptrace.statistics().replayed < {expect} and time.monotonic() < deadline:
    time.sleep(0.01)
looptrace.flush_sync(5)
_t["end"] = time.monotonic()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def program(tmp_path: Path, body: str, name: str = "app.py") -> Path:
    script = tmp_path / name
    script.write_text(PRELUDE + textwrap.dedent(body))
    return script


def environment(tmp_path: Path, endpoint: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        LOOPTRACE_ENDPOINT=endpoint,
        LOOPTRACE_STORE=str(tmp_path / "store.db"),
        LOOPTRACE_SPOOL_DIR=str(tmp_path / "spool"),
        LOOPTRACE_FLUSH_INTERVAL="0.05",
    )
    env.update(extra)
    return env


def run(
    tmp_path: Path, body: str, endpoint: str, name: str = "app.py", **extra: str
) -> tuple[dict[str, Any], list[str]]:
    """Run ``body`` in a fresh interpreter; what it reported at exit, and its stderr lines."""
    script = program(tmp_path, body, name)
    proc = subprocess.run(
        [sys.executable, str(script)],
        env=environment(tmp_path, endpoint, **extra),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return report(proc.stdout), proc.stderr.splitlines()


def report(stdout: str) -> dict[str, Any]:
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    assert lines, stdout
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def folder(tmp_path: Path, endpoint: str) -> Path:
    return tmp_path / "spool" / endpoint_key(endpoint)


def spooled_files(tmp_path: Path, endpoint: str) -> list[Path]:
    path = folder(tmp_path, endpoint)
    return sorted(path.glob(f"*{READY}")) if path.exists() else []


def spans_in(files: list[Path]) -> int:
    return sum(read_file(f).spans for f in files)


def names_in(path: Path) -> set[str]:
    """The names of the spans in a spool file, decoded by opentelemetry-proto."""
    record = read_file(path)
    request = decode_body(record.body, "application/x-protobuf", "")
    return {s.name for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans}


def looptrace_lines(stderr: list[str]) -> list[str]:
    return [line for line in stderr if line.startswith("looptrace")]


def test_a_backend_down_for_a_whole_life_spools_everything_and_the_next_process_sends_it(
    tmp_path: Path,
) -> None:
    """Process A never reaches its backend: it exits in well under a second (not the 5 s
    shutdown timeout) with every span in the spool and none dropped, and says so in one line
    naming the folder. Process B, with the backend up, sends all of them, none twice."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1/traces"
    a, stderr = run(tmp_path, EMIT.format(count=300, prefix="a"), url)
    assert a["spooled"] == 300 and a["dropped"] == {} and a["sent"] == 0
    assert a["exit_s"] < 1.0, a
    exit_lines = [line for line in stderr if "before exit" in line]
    assert len(exit_lines) == 1
    assert f"300 span(s) could not be sent to {url} before exit (spooled=300)" in exit_lines[0]
    assert str(folder(tmp_path, url)) in exit_lines[0]
    files = spooled_files(tmp_path, url)
    assert files and spans_in(files) == 300

    server = OtlpTestServer()
    server.port = port
    with server:
        b, stderr = run(tmp_path, REPLAY.format(prefix="b", expect=300), url, "b.py")
        assert b["replayed"] == 300 and b["dropped"] == {} and b["spooled"] == 0
        names = server.span_names()
        assert sorted(names) == sorted([f"a{i}" for i in range(300)] + ["b"])
        # Every span id arrived once.
        assert server.accepted_record_count == server.accepted_span_count == 301
    assert spooled_files(tmp_path, url) == []
    assert not [line for line in looptrace_lines(stderr) if "Traceback" in line]


def test_durable_mode_keeps_what_a_sigkill_would_lose(tmp_path: Path) -> None:
    """Durable mode, the backend down: process A is killed with SIGKILL while it emits; B
    delivers every span A emitted more than a flush interval before the kill, each once."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1/traces"
    body = """
    import itertools
    for i in range(200):
        with looptrace.span("early%d" % i):
            pass
    deadline = time.monotonic() + 20
    while looptrace.statistics().spooled < 200 and time.monotonic() < deadline:
        time.sleep(0.01)
    print("spooled", looptrace.statistics().spooled, flush=True)
    for i in itertools.count():  # until killed
        with looptrace.span("late%d" % i):
            pass
        time.sleep(0.001)
    """
    script = program(tmp_path, body)
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        env=environment(tmp_path, url, LOOPTRACE_SPOOL_DURABLE="true"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip() == "spooled 200", (line, proc.stderr.read() if proc.stderr else "")
        # Let the late spans run through a few flush intervals, then kill mid-outage.
        deadline = time.monotonic() + 10
        while spans_in(spooled_files(tmp_path, url)) < 400:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    on_disk = spans_in(spooled_files(tmp_path, url))
    assert on_disk >= 400

    server = OtlpTestServer()
    server.port = port
    with server:
        b, _ = run(tmp_path, REPLAY.format(prefix="b", expect=on_disk), url, "b.py")
        assert b["replayed"] == on_disk
        names = set(server.span_names())
    assert {f"early{i}" for i in range(200)} <= names
    late = sorted(int(n[4:]) for n in names if n.startswith("late"))
    # What was spooled is what had ended before the last drains: the first late spans, with
    # no gap among them (the ones lost are the newest only).
    assert late == list(range(len(late))) and len(late) >= 200
    assert server.accepted_record_count == server.accepted_span_count


def test_durable_mode_sends_each_batch_once_and_leaves_nothing_behind(tmp_path: Path) -> None:
    """With the backend up, durable mode writes each batch before it is sent and removes it
    once acknowledged: everything arrives once and the folder ends empty."""
    with OtlpTestServer() as server:
        a, _ = run(
            tmp_path,
            EMIT.format(count=500, prefix="d"),
            server.endpoint,
            LOOPTRACE_SPOOL_DURABLE="true",
            LOOPTRACE_MAX_BATCH_SPANS="50",
        )
        assert a["sent"] == 500 and a["spooled"] == 0 and a["dropped"] == {}
        assert server.accepted_record_count == server.accepted_span_count == 500
    left = list(folder(tmp_path, server.endpoint).iterdir())
    assert left == []


def test_four_processes_write_one_spool_and_four_replay_it_with_no_span_twice(
    tmp_path: Path,
) -> None:
    """Four processes spool into one folder at once, then four processes send it at once:
    every span arrives exactly once (claims are renames: one process sends each file)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1/traces"
    env = environment(tmp_path, url, LOOPTRACE_MAX_BATCH_SPANS="40")

    def start(prefix: str, body: str) -> subprocess.Popen[str]:
        script = program(tmp_path, body, f"{prefix}.py")
        return subprocess.Popen(
            [sys.executable, str(script)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def finish(procs: list[subprocess.Popen[str]]) -> list[dict[str, Any]]:
        try:
            reports = []
            for proc in procs:
                out, err = proc.communicate(timeout=60)
                assert proc.returncode == 0, err
                reports.append(report(out))
            return reports
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(10)

    writers = [start(f"w{n}", EMIT.format(count=200, prefix=f"w{n}-")) for n in range(4)]
    assert [r["spooled"] for r in finish(writers)] == [200] * 4
    files = spooled_files(tmp_path, url)
    assert spans_in(files) == 800
    assert len({f.name for f in files}) == len(files) >= 4 * 5

    server = OtlpTestServer()
    server.port = port
    with server:
        # Each replayer stops once the folder is empty (whoever sent the files).
        body = """
        with looptrace.span("r"):
            pass
        import looptrace._export as ex
        folder = ex.current().spool.dir.path
        deadline = time.monotonic() + 30
        while any(folder.iterdir()) and time.monotonic() < deadline:
            time.sleep(0.01)
        looptrace.flush_sync(5)
        """
        readers = [start(f"r{n}", body) for n in range(4)]
        assert sum(r["replayed"] for r in finish(readers)) == 800
        assert server.accepted_span_count == 800 + 4
        assert server.accepted_record_count == 800 + 4  # none twice
    assert spooled_files(tmp_path, url) == []


def test_a_corrupt_spool_file_is_one_line_set_aside_and_the_program_goes_on(
    tmp_path: Path,
) -> None:
    """A file whose body does not match its checksum, one cut short mid-header and one that is
    not a spool file at all: each is one line, moved to corrupt/, counted; the good file is
    still sent and the program runs on."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1/traces"
    run(tmp_path, EMIT.format(count=30, prefix="g"), url, LOOPTRACE_MAX_BATCH_SPANS="10")
    files = spooled_files(tmp_path, url)
    assert len(files) == 3
    flipped, cut, good = files
    kept = names_in(good)
    data = bytearray(flipped.read_bytes())
    data[-5] ^= 0xFF
    flipped.write_bytes(bytes(data))
    cut.write_bytes(cut.read_bytes()[:9])
    stranger = flipped.with_name(f"{10**22:023d}-1-000001-7{READY}")
    stranger.write_bytes(b"hello, not a spool file")

    server = OtlpTestServer()
    server.port = port
    with server:
        b, stderr = run(tmp_path, REPLAY.format(prefix="b", expect=10), url, "b.py")
        assert set(server.span_names()) == kept | {"b"}
    said = [line for line in stderr if "is unreadable" in line]
    assert len(said) == 3, stderr
    assert any("checksum mismatch" in line for line in said)
    assert any("cut short" in line for line in said)
    assert any("not a looptrace spool file" in line for line in said)
    assert "Traceback" not in "\n".join(stderr)
    assert b["spool_dropped"] == {"corrupt": 10 + 10 + 7}
    aside = sorted(p.name.split(".")[0] for p in (folder(tmp_path, url) / "corrupt").iterdir())
    assert aside == sorted(p.name.split(".")[0] for p in (flipped, cut, stranger))
    assert not good.exists()


def test_the_spool_is_bounded_in_bytes_oldest_first_counted(tmp_path: Path) -> None:
    """Past LOOPTRACE_SPOOL_MAX_BYTES the oldest files go, counted as spool_full and said; the
    newest spans are the ones kept."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1/traces"
    # One file of 10 spans here is about 1 KB: room for three.
    a, stderr = run(
        tmp_path,
        EMIT.format(count=100, prefix="o"),
        url,
        LOOPTRACE_MAX_BATCH_SPANS="10",
        LOOPTRACE_SPOOL_MAX_BYTES="3500",
    )
    files = spooled_files(tmp_path, url)
    kept = spans_in(files)
    assert 10 <= kept < 100
    assert a["spool_dropped"] == {"spool_full": 100 - kept}
    assert a["spooled"] == 100  # written to the spool; the bound removed the oldest since
    assert sum(f.stat().st_size for f in files) <= 3500
    assert any("spool full" in line for line in stderr)
    # The newest are kept: file names sort oldest first.
    assert files[-1].name.endswith(f"-10{READY}")


def test_files_older_than_the_age_bound_are_dropped_and_counted(tmp_path: Path) -> None:
    """A file older than LOOPTRACE_SPOOL_MAX_AGE_HOURS is not sent: it is removed and counted
    as spool_expired."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1/traces"
    run(tmp_path, EMIT.format(count=20, prefix="e"), url, LOOPTRACE_MAX_BATCH_SPANS="10")
    old, new = spooled_files(tmp_path, url)
    kept = names_in(new)
    # The first file is made four days old (its name carries its creation time).
    four_days = 4 * 24 * 3600 * 10**9
    created = int(old.name.split("-")[0])
    old.rename(old.with_name(f"{created - four_days:023d}" + old.name[23:]))
    server = OtlpTestServer()
    server.port = port
    with server:
        b, _ = run(tmp_path, REPLAY.format(prefix="b", expect=10), url, "b.py")
        assert set(server.span_names()) == kept | {"b"}
    assert b["spool_dropped"] == {"spool_expired": 10}


def test_a_spool_can_be_turned_off(tmp_path: Path) -> None:
    """LOOPTRACE_SPOOL=false: what cannot be sent at exit is dropped and counted, as without
    a spool, and nothing is written."""
    url = f"http://127.0.0.1:{free_port()}/v1/traces"
    a, stderr = run(tmp_path, EMIT.format(count=5, prefix="x"), url, LOOPTRACE_SPOOL="false")
    assert a["spooled"] == 0 and a["dropped"] == {"shutdown": 5}
    assert not (tmp_path / "spool").exists()
    assert any("(shutdown=5)" in line for line in stderr)


def test_a_spool_folder_given_as_text_to_configure_is_used(tmp_path: Path) -> None:
    """configure(spool_dir="...") with a string, as a user writes it: the spans a dead backend
    did not take are spooled there, not lost to a pipeline that cannot start."""
    url = f"http://127.0.0.1:{free_port()}/v1/traces"
    where = tmp_path / "elsewhere"
    body = f"looptrace.configure(endpoint={url!r}, spool_dir={str(where)!r})\n" + EMIT.format(
        count=5, prefix="t"
    )
    a, _ = run(tmp_path, body, url)
    assert a["spooled"] == 5 and a["dropped"] == {}
    assert spans_in(sorted((where / endpoint_key(url)).glob(f"*{READY}"))) == 5


def test_a_claim_whose_process_is_gone_is_taken_over(tmp_path: Path) -> None:
    """A file claimed by a process that died (mid-send) is sent by the next process."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1/traces"
    run(tmp_path, EMIT.format(count=10, prefix="c"), url)
    (ready,) = spooled_files(tmp_path, url)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    ready.rename(ready.with_name(f"{ready.name}.{int(dead.stdout)}.claim"))
    server = OtlpTestServer()
    server.port = port
    with server:
        b, _ = run(tmp_path, REPLAY.format(prefix="b", expect=10), url, "b.py")
        assert b["replayed"] == 10
    assert list(folder(tmp_path, url).iterdir()) == []


def test_the_collector_stores_a_span_replayed_twice_once(tmp_path: Path) -> None:
    """`looptrace serve` as the backend, the same spooled request delivered twice (at least
    once delivery): each span is stored once and the trace counts it once."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1/traces"
    body = """
    with looptrace.span("root"):
        for i in range(4):
            with looptrace.span("child%d" % i):
                pass
    _t["end"] = time.monotonic()
    """
    run(tmp_path, body, url)
    (original,) = spooled_files(tmp_path, url)
    twin = original.with_name(original.name.replace("-000001-", "-000002-"))
    shutil.copy(original, twin)
    store = tmp_path / "collector.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPTRACE_")}
    collector = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "looptrace.cli",
            "--store",
            str(store),
            "serve",
            "--port",
            str(port),
            "--no-viewer",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                assert time.monotonic() < deadline and collector.poll() is None
                time.sleep(0.02)
        b, _ = run(
            tmp_path,
            REPLAY.format(prefix="b", expect=10),
            url,
            "b.py",
            LOOPTRACE_SEND_IN_PROGRESS="false",
        )
        assert b["replayed"] == 10
    finally:
        collector.terminate()
        collector.wait(10)
    import sqlite3

    with sqlite3.connect(store) as db:
        names = sorted(r[0] for r in db.execute("SELECT name FROM spans WHERE name != 'b'"))
        counts = [r[0] for r in db.execute("SELECT span_count FROM traces WHERE name = 'root'")]
    assert names == ["child0", "child1", "child2", "child3", "root"]
    assert counts == [5]


def test_spool_dir_writes_whole_files_and_bounds_them(tmp_path: Path) -> None:
    """The folder's own rules, in one process: a file reads back as written; names sort
    oldest first; past the byte bound the oldest ready files go (never a claimed one)."""
    spool = SpoolDir(tmp_path, "http://x/v1/traces", max_bytes=1400, max_age=3600)
    first = spool.write([b"a" * 100, b"b" * 100], "protobuf", 3)
    assert first is not None
    record = read_file(first)
    assert (record.endpoint, record.encoding, record.spans, record.body) == (
        "http://x/v1/traces",
        "protobuf",
        3,
        b"a" * 100 + b"b" * 100,
    )
    claimed = spool.write([b"c" * 300], "json", 2, claimed=True)
    assert claimed is not None and claimed.name.endswith(f".{os.getpid()}.claim")
    third = spool.write([b"d" * 300], "protobuf", 4)
    assert third is not None and third.name > first.name
    assert spool.write([b"e" * 2000], "protobuf", 1) is None  # alone over the bound
    fourth = spool.write([b"f" * 300], "protobuf", 5)
    assert fourth is not None
    assert not first.exists() and claimed.exists()  # oldest ready first; claims stay
    assert spool.dropped["spool_full"] == 3
    assert spool.claim_oldest() == third.with_name(f"{third.name}.{os.getpid()}.claim")


@pytest.mark.parametrize("mode", ["off", "default", "durable"])
def test_each_mode_sends_everything_when_the_backend_is_up(tmp_path: Path, mode: str) -> None:
    """Whatever the mode, a healthy backend gets every span once and nothing is spooled."""
    extra = {
        "off": {"LOOPTRACE_SPOOL": "false"},
        "default": {},
        "durable": {"LOOPTRACE_SPOOL_DURABLE": "true"},
    }[mode]
    with OtlpTestServer() as server:
        a, _ = run(tmp_path, EMIT.format(count=100, prefix="m"), server.endpoint, **extra)
        assert a["sent"] == 100 and a["spooled"] == 0
        assert server.accepted_record_count == 100


def test_the_command_shows_sends_and_clears_the_spool(tmp_path: Path) -> None:
    """`looptrace spool` lists each endpoint's files, spans and bytes; `spool send` sends them
    now with a progress line; `spool clear` deletes them."""
    from click.testing import CliRunner

    from looptrace import cli

    port = free_port()
    url = f"http://127.0.0.1:{port}/v1/traces"
    run(tmp_path, EMIT.format(count=25, prefix="k"), url, LOOPTRACE_MAX_BATCH_SPANS="10")
    spool_dir = str(tmp_path / "spool")
    shown = CliRunner().invoke(cli.main, ["spool", "--dir", spool_dir])
    assert shown.exit_code == 0, shown.output
    (row,) = [line for line in shown.output.splitlines() if line.startswith(url)]
    assert row.split()[1:3] == ["3", "25"]  # files, spans
    as_json = CliRunner().invoke(cli.main, ["spool", "--dir", spool_dir, "--json"])
    (entry,) = json.loads(as_json.output)["endpoints"]
    assert (entry["endpoint"], entry["files"], entry["spans"]) == (url, 3, 25)

    refused = CliRunner().invoke(cli.main, ["spool", "send", "--dir", spool_dir])
    assert refused.exit_code == 1 and "stopped: ConnectionRefusedError" in refused.output
    assert spans_in(spooled_files(tmp_path, url)) == 25  # nothing lost by trying

    server = OtlpTestServer()
    server.port = port
    with server:
        sent = CliRunner().invoke(cli.main, ["spool", "send", "--dir", spool_dir])
        assert sent.exit_code == 0, sent.output
        assert f"{url}: 3/3 file(s), 25 span(s) sent" in sent.output
        assert server.accepted_span_count == 25
    empty = CliRunner().invoke(cli.main, ["spool", "--dir", spool_dir])
    assert "is empty" in empty.output

    run(tmp_path, EMIT.format(count=5, prefix="z"), url, "again.py")
    cleared = CliRunner().invoke(cli.main, ["spool", "clear", "--dir", spool_dir, "--yes"])
    assert cleared.exit_code == 0 and "Deleted 5 span(s)" in cleared.output
    assert spooled_files(tmp_path, url) == []


def test_an_outage_past_half_the_buffer_spills_to_the_spool_while_running(tmp_path: Path) -> None:
    """The backend down and the producer paced: once more than half of max_buffer_spans is
    pending, the oldest go to the spool at each drain instead of waiting to be dropped as
    buffer_full; memory stays within the bound, every span is accounted for, and the next
    process sends what was spooled."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1/traces"
    body = """
    worst = 0
    for i in range(1000):
        with looptrace.span("p%d" % i):
            pass
        if i % 50 == 49:
            time.sleep(0.05)  # a paced producer: drains happen in between
            worst = max(worst, looptrace.statistics().queued_spans)
    s = looptrace.statistics()
    print(json.dumps({"running": s.spooled, "worst": worst}), flush=True)
    _t["end"] = time.monotonic()
    """
    script = program(tmp_path, body)
    proc = subprocess.run(
        [sys.executable, str(script)],
        env=environment(tmp_path, url, LOOPTRACE_MAX_BUFFER_SPANS="200"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    running, at_exit = lines[0], lines[-1]
    assert running["running"] >= 500  # most of it went to disk while the program ran
    assert running["worst"] <= 200
    assert at_exit["spooled"] + at_exit["dropped"].get("buffer_full", 0) == 1000
    assert set(at_exit["dropped"]) <= {"buffer_full"}
    on_disk = spans_in(spooled_files(tmp_path, url))
    assert on_disk == at_exit["spooled"]
    server = OtlpTestServer()
    server.port = port
    with server:
        b, _ = run(tmp_path, REPLAY.format(prefix="b", expect=on_disk), url, "b.py")
        assert b["replayed"] == on_disk
        assert server.accepted_record_count == server.accepted_span_count == on_disk + 1
