"""The README's quick start and every command of docs/getting-started.md, run as written on a
fresh clone of this repository (what a new user does first)."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [
    pytest.mark.network,  # installs the package and its dependencies from the package index
    pytest.mark.skipif(
        shutil.which("git") is None or not (ROOT / ".git").exists(),
        reason="needs git and a git checkout to clone",
    ),
]


def _commands(text: str, fence: str) -> list[str]:
    """The commands of a document: the lines of its ``sh`` blocks, or the ``$ `` lines of its
    ``console`` and ``text`` blocks (a command shown with its output)."""
    out = []
    fences = ("console", "text") if fence == "console" else (fence,)
    for kind, block in re.findall(r"```(\w+)\n(.*?)```", text, re.S):
        if kind not in fences:
            continue
        for line in block.splitlines():
            if kind == "sh" and line.strip():
                out.append(line.strip())
            elif kind != "sh" and line.startswith("$ "):
                out.append(line[2:].strip())
    return out


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_the_quick_start_and_getting_started_commands_work_on_a_fresh_clone(
    tmp_path: Path,
) -> None:
    """From a fresh clone: the README's first command installs and runs the demo; then each
    command of getting-started (with the demo's own ids where the page shows example ids)
    exits 0, `looptrace serve` answers, and the page's own-code example lands in the store.
    (The README's second command is the one CI itself runs: not run again from here.)"""
    clone = tmp_path / "looptrace"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=120)
    store = tmp_path / "store.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOOPTRACE_", "OTEL_"))}
    env["LOOPTRACE_STORE"] = str(store)
    env["PATH"] = f"{clone / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"  # as activated

    def sh(command: str, timeout: float = 600) -> str:
        done = subprocess.run(
            command,
            shell=True,
            cwd=clone,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            executable="/bin/bash" if os.path.exists("/bin/bash") else None,
        )
        assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
        return done.stdout + done.stderr

    readme = _commands((clone / "README.md").read_text(), "sh")
    assert len(readme) == 2 and readme[1].endswith("nox -s tests")
    demo = sh(readme[0].replace("python3 ", f"{sys.executable} ", 1))
    assert "experiment 'capitals-demo'" in demo
    trace = re.search(r"show ([0-9a-f]{12})", demo)
    experiment = re.search(r"experiments ([0-9a-f]{12})", demo)
    assert trace and experiment

    page = (clone / "docs" / "getting-started.md").read_text()
    ran = []
    for command in _commands(page, "console"):
        if command.startswith(("export ", "curl ")) or "pip install" in command:
            continue  # a remote endpoint; the install is the README's, run above
        if command.endswith("looptrace demo"):
            continue  # run above, by the README's command
        command = re.sub(r"show [0-9a-f]{12}", f"show {trace.group(1)}", command)
        command = re.sub(r"experiments [0-9a-f]{12}", f"experiments {experiment.group(1)}", command)
        if command == "looptrace serve":
            if not _port_free(4318):
                pytest.skip("port 4318 is taken on this machine")
            # Not through a shell: stopping the shell would leave the server running.
            server = subprocess.Popen(
                command.split(), cwd=clone, env=env, stderr=subprocess.DEVNULL
            )
            try:
                deadline = time.monotonic() + 60
                while True:
                    try:
                        if httpx.get("http://127.0.0.1:4318/api/stats").status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    assert server.poll() is None and time.monotonic() < deadline
                    time.sleep(0.1)
                assert httpx.get("http://127.0.0.1:4318/").status_code == 200
            finally:
                server.terminate()
                server.wait(10)
        else:
            sh(command, timeout=120)
        ran.append(command)
    assert "looptrace traces" in ran and "looptrace serve" in ran

    example = re.search(r"## Your own code.*?```python\n(.*?)```", page, re.S)
    assert example is not None
    sh(f"{clone / '.venv' / 'bin' / 'python'} -c {shlex_quote(example.group(1))}", timeout=120)
    assert re.search(r"\bmain\b", sh("looptrace traces", timeout=60))


def shlex_quote(text: str) -> str:
    import shlex

    return shlex.quote(text)
