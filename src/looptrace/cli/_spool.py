"""``looptrace spool``: what the spool holds (per endpoint), ``send`` it now, ``clear`` it.

The spool keeps, on disk, the spans a process could not deliver to its OTLP endpoint (a
backend down at exit, an outage past the memory budget, durable mode); any later looptrace
process exporting to the same endpoint sends them in the background. These commands look at
it and act on it from outside a program.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import click

from .._config import Config
from ._common import _EPILOG, EXIT_FAILURE, _dump_json, _fail
from ._format import _table


def _root(directory: Path | None) -> tuple[Path, Config]:
    cfg = Config.from_env()
    return (directory.expanduser() if directory is not None else cfg.spool_path), cfg


def _age(created_ns: int | None) -> str:
    if created_ns is None:
        return "-"
    seconds = max(0.0, time.time() - created_ns / 1e9)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit} ago"
    return f"{seconds:.0f}s ago"


_DIR_OPTION = click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The spool folder (default: LOOPTRACE_SPOOL_DIR, else `spool` next to the store).",
)


@click.group(invoke_without_command=True, epilog=_EPILOG)
@_DIR_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def spool(ctx: click.Context, directory: Path | None, as_json: bool) -> None:
    """Show what the spool holds, per endpoint: files, spans, bytes, the oldest."""
    if ctx.invoked_subcommand is not None:
        return
    from .._export.spool import summaries

    root, _ = _root(directory)
    found = summaries(root)
    if as_json:
        _dump_json(
            {
                "directory": str(root),
                "endpoints": [
                    {
                        "endpoint": s.endpoint,
                        "folder": str(s.path),
                        "files": s.files,
                        "spans": s.spans,
                        "bytes": s.bytes,
                        "oldest_ns": s.oldest_ns,
                        "claimed": s.claimed,
                        "corrupt": s.corrupt,
                    }
                    for s in found
                ],
            }
        )
        return
    if not any(s.files or s.corrupt for s in found):
        click.echo(f"The spool at {root} is empty.")
        return
    rows = [
        [
            s.endpoint or f"(unreadable) {s.path.name}",
            str(s.files),
            str(s.spans),
            str(s.bytes),
            _age(s.oldest_ns),
            str(s.claimed),
            str(s.corrupt),
        ]
        for s in found
        if s.files or s.corrupt
    ]
    click.echo(f"Spool: {root}")
    click.echo(
        _table(["ENDPOINT", "FILES", "SPANS", "BYTES", "OLDEST", "CLAIMED", "CORRUPT"], rows)
    )


@spool.command(epilog=_EPILOG)
@_DIR_OPTION
@click.option("--endpoint", default=None, help="Only the files for this endpoint URL.")
def send(directory: Path | None, endpoint: str | None) -> None:
    """Send what the spool holds now, oldest first, to the endpoint each file names, with
    the headers and TLS settings of the environment. Exits 1 when a backend cannot take it."""
    from .._export.spool import folder_for, send_folder, summaries

    root, cfg = _root(directory)
    failed = False
    sent_any = False
    for summary in summaries(root):
        if summary.endpoint is None or not summary.files:
            continue
        if endpoint is not None and summary.endpoint != endpoint:
            continue
        sent_any = True
        target = cfg.replace(endpoint=summary.endpoint)

        def progress(files: int, spans: int, total: int, url: str = summary.endpoint) -> None:
            click.echo(f"\r{url}: {files}/{total} file(s), {spans} span(s) sent", nl=False)

        progress(0, 0, summary.files)
        _, _, error = asyncio.run(send_folder(folder_for(root, summary, target), target, progress))
        click.echo("")
        if error is not None:
            failed = True
            click.echo(f"looptrace: {summary.endpoint}: stopped: {error}", err=True)
    if not sent_any:
        click.echo(f"Nothing to send: the spool at {root} is empty.")
    if failed:
        raise SystemExit(EXIT_FAILURE)


@spool.command(epilog=_EPILOG)
@_DIR_OPTION
@click.option("--endpoint", default=None, help="Only the files for this endpoint URL.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def clear(directory: Path | None, endpoint: str | None, yes: bool) -> None:
    """Delete what the spool holds (its spans are never sent)."""
    from .._export.spool import summaries

    root, _ = _root(directory)
    chosen = [s for s in summaries(root) if endpoint is None or s.endpoint == endpoint]
    spans = sum(s.spans for s in chosen)
    if not chosen:
        click.echo(f"Nothing to clear in {root}.")
        return
    if not yes and not click.confirm(
        f"Delete {sum(s.files for s in chosen)} file(s), {spans} span(s), from {root}?"
    ):
        _fail("nothing deleted", EXIT_FAILURE)
    for summary in chosen:
        shutil.rmtree(summary.path, ignore_errors=True)
    click.echo(f"Deleted {spans} span(s) from {root}.")
