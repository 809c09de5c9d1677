"""``looptrace traces`` and ``looptrace show``: the traces in the local store, listed or one as a
tree."""

from __future__ import annotations

import os

import click

from ._common import _EPILOG, EXIT_NOT_FOUND, EXIT_USAGE, _dump_json, _fail, _open_store
from ._format import _clip, _table, fmt_duration, fmt_time, render_tree


@click.command(epilog=_EPILOG)
@click.option("-n", "--limit", default=20, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--offset", default=0, type=click.IntRange(0))
@click.option("--name", default=None, help="Only traces whose root name contains this.")
@click.option(
    "--status",
    type=click.Choice(["ok", "error", "in_progress"]),
    default=None,
    help="ok: nothing failed; error: the root or any span failed.",
)
@click.option(
    "--lag", "include_lag", is_flag=True, help="Include the lag monitor's summary traces."
)
@click.option("--experiment", default=None, help="Only traces of this experiment id.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (the /api/traces shape).")
@click.pass_context
def traces(
    ctx: click.Context,
    limit: int,
    offset: int,
    name: str | None,
    status: str | None,
    experiment: str | None,
    include_lag: bool,
    as_json: bool,
) -> None:
    """List recent traces, newest first: name, start, duration, status, span count."""
    store = _open_store(ctx)
    with store:
        rows = store.list_traces(
            limit, offset, name=name, status=status, experiment=experiment, include_lag=include_lag
        )
    if as_json:
        _dump_json({"traces": rows, "limit": limit, "offset": offset})
        return
    if not rows:
        click.echo("No traces match." if (name or status or experiment) else "No traces yet.")
        return
    table = [
        (
            r["trace_id"],
            _clip(r["name"], 40),
            fmt_time(r["start_ns"]),
            fmt_duration(r["duration_ns"]),
            r["status"] + (f" ({r['error_count']} failed)" if r["error_count"] else ""),
            str(r["span_count"]),
        )
        for r in rows
    ]
    click.echo(_table(("TRACE ID", "NAME", "START", "DURATION", "STATUS", "SPANS"), table))


@click.command(epilog=_EPILOG)
@click.argument("trace_id")
@click.option(
    "--width", default=None, type=click.IntRange(40), help="Line width (default: terminal)."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON (the /api/traces/ID shape).")
@click.pass_context
def show(ctx: click.Context, trace_id: str, width: int | None, as_json: bool) -> None:
    """Print one trace as a tree: durations, status, loop lag, the start of inputs and outputs.

    TRACE_ID may be abbreviated to any unique prefix.
    """
    store = _open_store(ctx)
    with store:
        matches = store.find_trace_ids(trace_id.strip(), limit=2)
        if not matches:
            _fail(f"no trace {trace_id!r} in {store.path}", EXIT_NOT_FOUND)
        if len(matches) > 1:
            _fail(f"{trace_id!r} matches more than one trace; give more digits", EXIT_USAGE)
        summary = store.get_trace_summary(matches[0])
        width = width or _terminal_width()
        if as_json:
            spans = store.get_trace(matches[0], preview=1000)
        else:
            spans = store.get_tree(matches[0], preview=width)
    assert summary is not None
    if as_json:
        _dump_json({"trace": summary, "spans": spans})
        return
    head = (
        f"trace {summary['trace_id']}  {summary['name']}  {fmt_time(summary['start_ns'])}  "
        f"{fmt_duration(summary['duration_ns'])}  {summary['status']}  "
        f"{summary['span_count']} spans"
    )
    if summary["error_count"]:
        head += f", {summary['error_count']} failed"
    lines = [head, ""]
    lines.extend(render_tree(spans, width))
    click.echo("\n".join(lines))


def _terminal_width() -> int:
    try:
        return max(40, os.get_terminal_size().columns)
    except OSError:
        return 120
