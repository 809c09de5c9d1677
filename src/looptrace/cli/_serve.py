"""``looptrace serve``: the collector (OTLP/HTTP receiver, JSON API and viewer) on the store.

The collector and its server extra (Starlette, uvicorn) are imported only when the command
runs, so every other command works without them.
"""

from __future__ import annotations

from typing import Any

import click

from .._config import Config
from ._common import _EPILOG, EXIT_CANNOT_LISTEN, EXIT_USAGE, _fail, _open_store, _store_path


@click.command(epilog=_EPILOG)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=4318, show_default=True, type=click.IntRange(0, 65535))
@click.option(
    "--token",
    default=None,
    help="Require this token on every request (env LOOPTRACE_TOKEN). Needed off loopback.",
)
@click.option(
    "--max-body-bytes", default=32 * 1024 * 1024, show_default=True, type=click.IntRange(1)
)
@click.option(
    "--max-decompressed-bytes", default=128 * 1024 * 1024, show_default=True, type=click.IntRange(1)
)
@click.option(
    "--max-pending-bytes",
    default=256 * 1024 * 1024,
    show_default=True,
    type=click.IntRange(1),
    help="Request bodies held at once, all requests together; past it: 429 with Retry-After.",
)
@click.option(
    "--max-spans-per-request",
    default=50_000,
    show_default=True,
    type=click.IntRange(1),
    help="Spans in one request; past it: 413.",
)
@click.option("--no-viewer", is_flag=True, help="Serve only /v1/traces and /api.")
@click.option(
    "--log-level",
    type=click.Choice(["critical", "error", "warning", "info", "debug"]),
    default="warning",
    show_default=True,
)
@click.pass_context
def serve(
    ctx: click.Context,
    host: str,
    port: int,
    token: str | None,
    max_body_bytes: int,
    max_decompressed_bytes: int,
    max_pending_bytes: int,
    max_spans_per_request: int,
    no_viewer: bool,
    log_level: str,
) -> None:
    """Run the collector: OTLP/HTTP on POST /v1/traces (protobuf or JSON, gzip or zstd) into
    the local store, the JSON API under /api, and the viewer. Any OpenTelemetry SDK can send
    to it: OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318.

    Exits 4 when the address cannot be listened on (the port is taken, the address is not
    this machine's), before announcing anything; 1 when the store cannot be opened."""
    from ..collector import MissingServerExtra, _require_server_extra

    try:
        _require_server_extra()
    except MissingServerExtra as exc:
        _fail(str(exc))
    from ..collector.app import CannotListen, is_loopback
    from ..collector.app import serve as run_server

    if token is None:
        token = Config.from_env().collector_token

    if not is_loopback(host) and not token:
        _fail(
            f"refusing to listen on {host} without a token: anyone who can reach it could write "
            "and read traces. Pass --token (or set LOOPTRACE_TOKEN), or use --host 127.0.0.1.",
            EXIT_USAGE,
        )
    path = _store_path(ctx)
    # An unusable store is said before anything listens (exit 1), not as a failed startup.
    _open_store(ctx, must_exist=False).close()
    extra = [] if no_viewer else _viewer_routes()

    def announce(bound_host: str, bound_port: int) -> None:
        # Called once the socket is bound: the address printed is already ours.
        shown = "localhost" if bound_host in ("127.0.0.1", "::1", "[::1]") else bound_host
        click.echo(f"looptrace collector: http://{shown}:{bound_port}  (store: {path})", err=True)
        click.echo(f"  send OTLP/HTTP to http://{shown}:{bound_port}/v1/traces", err=True)
        if extra:
            click.echo(f"  viewer: http://{shown}:{bound_port}/", err=True)
        if token:
            click.echo("  a token is required on every request", err=True)

    try:
        run_server(
            host,
            port,
            path,
            token=token,
            max_body_bytes=max_body_bytes,
            max_decompressed_bytes=max_decompressed_bytes,
            max_pending_bytes=max_pending_bytes,
            max_spans_per_request=max_spans_per_request,
            extra_routes=extra,
            log_level=log_level,
            ready=announce,
        )
    except CannotListen as exc:
        _fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}", EXIT_CANNOT_LISTEN)
    except RuntimeError as exc:
        _fail(str(exc))


def _viewer_routes() -> list[Any]:
    import importlib.util

    if importlib.util.find_spec("looptrace.collector.viewer") is None:
        return []
    from ..collector import viewer

    routes: list[Any] = viewer.routes()
    return routes
