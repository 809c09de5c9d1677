"""Shared by the LLM instrumentation tests: the fake API, the OTLP server the spans go to, and
reading them back by name."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest

import looptrace
from fake_llm_server import FakeLlmServer
from looptrace._transport import RetryPolicy
from otlp_server import OtlpTestServer
from pipeline_support import checked_server, install_pipeline

FAST_RETRY = RetryPolicy(base_delay=0.01, max_delay=0.05, budget=10.0)


@pytest.fixture
def llm() -> Iterator[FakeLlmServer]:
    with FakeLlmServer() as server:
        yield server


@pytest.fixture
def otlp() -> Iterator[OtlpTestServer]:
    with checked_server() as server:
        install_pipeline(server, retry=FAST_RETRY)
        yield server


@pytest.fixture
def unused_port() -> int:
    """A port on 127.0.0.1 with nothing listening (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def received(otlp: OtlpTestServer, count: int) -> dict[str, Any]:
    """The spans at the OTLP server, by name (the caller's span is ``caller``)."""
    result = looptrace.flush_sync(5)
    assert result.ok
    assert otlp.wait_for_spans(count)
    spans = otlp.accepted_spans()
    assert len(spans) == count, [s.name for s in spans]
    return {s.name: s for s in spans}
