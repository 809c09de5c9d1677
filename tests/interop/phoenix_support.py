"""Starting a real Arize Phoenix server for the interoperability tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

# Phoenix's first start creates its database (migrations) and imports a large stack: about
# 15 s on a quiet 2-core machine, near a minute on a busy one.
START_TIMEOUT = 150.0


@dataclass(frozen=True)
class Phoenix:
    url: str
    log: Path

    def log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-3000:]
        except OSError:
            return "<no log>"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.fixture(scope="session")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Phoenix]:
    """``phoenix serve`` on 127.0.0.1, on free ports, with its working directory and SQLite
    database in a temporary directory, telemetry and every request to the internet off."""
    home = tmp_path_factory.mktemp("phoenix")
    port, grpc_port = _free_port(), _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PHOENIX_", "OTEL_"))}
    env.update(
        PHOENIX_HOST="127.0.0.1",
        PHOENIX_PORT=str(port),
        PHOENIX_GRPC_PORT=str(grpc_port),
        PHOENIX_WORKING_DIR=str(home),
        PHOENIX_SQL_DATABASE_URL=f"sqlite:///{home / 'phoenix.db'}",
        # No telemetry pixels, web fonts or downloads: nothing leaves this machine.
        PHOENIX_TELEMETRY_ENABLED="false",
        PHOENIX_ALLOW_EXTERNAL_RESOURCES="false",
        PHOENIX_DISABLE_AGENT_ASSISTANT="true",
        PHOENIX_AGENTS_DISABLE_BASH="true",
        PHOENIX_AGENTS_DISABLE_WEB_ACCESS="true",
        PYTHONUNBUFFERED="1",
    )
    log = home / "server.log"
    server = Phoenix(f"http://127.0.0.1:{port}", log)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "phoenix.server.main", "serve"],
            env=env,
            cwd=home,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT
        with httpx.Client(timeout=2.0) as client:
            while True:
                if proc.poll() is not None:
                    pytest.fail(f"phoenix exited with {proc.returncode}:\n{server.log_tail()}")
                try:
                    if client.get(f"{server.url}/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    pytest.fail(
                        f"phoenix did not answer in {START_TIMEOUT:.0f} s:\n{server.log_tail()}"
                    )
                time.sleep(0.25)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
