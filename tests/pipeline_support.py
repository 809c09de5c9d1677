"""Helpers the pipeline tests share: install a pipeline aimed at a test server, make spans."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import looptrace
from looptrace import _export
from looptrace._transport import RetryPolicy
from otlp_server import OtlpTestServer

# Retries fast enough for a test, with a budget a loaded machine stays inside.
FAST_RETRY = RetryPolicy(base_delay=0.01, max_delay=0.05, budget=10.0)


@contextlib.contextmanager
def checked_server(**options: Any) -> Iterator[OtlpTestServer]:
    """A fresh OTLP server; on leaving, every request it answered must have decoded (a
    connection reset on purpose is not a decoding failure)."""
    with OtlpTestServer(**options) as srv:
        yield srv
        srv.release()
    bad = [r.error for r in srv.requests if r.error not in (None, "reset")]
    assert not bad, f"requests that did not decode: {bad}"


def install_pipeline(server: OtlpTestServer, *, retry: RetryPolicy, **cfg: Any) -> _export.Pipeline:
    """Install a pipeline sending to ``server`` (a short flush interval unless given)."""
    cfg.setdefault("flush_interval", 0.05)
    config = looptrace.Config.from_env(endpoint=server.endpoint, **cfg)
    return _export.install(_export.Pipeline(config, retry_policy=retry))


def make_spans(count: int, prefix: str = "s", payload: str = "") -> None:
    """End ``count`` root spans named prefix0, prefix1...; each carries ``payload`` if given."""
    for i in range(count):
        with looptrace.span(f"{prefix}{i}") as s:
            if payload:
                s.set_attribute("payload", payload)
