"""``looptrace experiments``: the experiments in the local store, with their scores and cases."""

from __future__ import annotations

from typing import Any

import click

from ._common import _EPILOG, EXIT_NOT_FOUND, EXIT_USAGE, _dump_json, _fail, _open_store
from ._format import _clip, _table, fmt_duration, fmt_time


@click.command(epilog=_EPILOG)
@click.argument("experiment_id", required=False)
@click.option("-n", "--limit", default=20, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--json", "as_json", is_flag=True, help="Print JSON (the /api/experiments shape).")
@click.pass_context
def experiments(ctx: click.Context, experiment_id: str | None, limit: int, as_json: bool) -> None:
    """List experiments with their scores, or, given an EXPERIMENT_ID, its cases."""
    store = _open_store(ctx)
    with store:
        if experiment_id is not None:
            matches = store.find_experiment_ids(experiment_id.strip())
            if not matches:
                _fail(f"no experiment {experiment_id!r} in {store.path}", EXIT_NOT_FOUND)
            if len(matches) > 1:
                _fail(f"{experiment_id!r} matches more than one experiment", EXIT_USAGE)
            exp = store.get_experiment(matches[0])
            assert exp is not None
            rows = []
        else:
            exp = None
            rows = store.list_experiments(limit)
    if exp is not None:
        _show_experiment(exp, as_json)
        return
    if as_json:
        _dump_json({"experiments": rows, "limit": limit, "offset": 0})
        return
    if not rows:
        click.echo("No experiments yet. Run `looptrace demo` to make one.")
        return
    table = [
        (
            r["id"],
            _clip(r["name"] or "", 30),
            fmt_time(r["created_ns"]),
            str(r["case_count"]),
            str(r["error_count"]),
            str(r.get("scorer_error_count", 0)),
            "  ".join(f"{k}={v['mean']:.3g}" for k, v in r["scores"].items()),
        )
        for r in rows
    ]
    click.echo(
        _table(
            (
                "EXPERIMENT ID",
                "NAME",
                "CREATED",
                "CASES",
                "ERRORS",
                "SCORER ERRORS",
                "SCORES (mean)",
            ),
            table,
        )
    )


def _show_experiment(exp: dict[str, Any], as_json: bool) -> None:
    if as_json:
        _dump_json(exp)
        return
    click.echo(
        f"experiment {exp['name']}  id {exp['id']}  {fmt_time(exp['created_ns'])}  "
        f"{exp['case_count']} cases, {exp['error_count']} errors, "
        f"{exp.get('scorer_error_count', 0)} scorer errors"
    )
    for scorer, count in exp.get("scorer_errors", {}).items():
        click.echo(f"  scorer {scorer} raised on {count} case{'s' if count != 1 else ''}")
    if exp.get("input_tokens") or exp.get("output_tokens"):
        click.echo(f"  LLM tokens: {exp['input_tokens']} in / {exp['output_tokens']} out")
    for name, agg in exp["scores"].items():
        click.echo(
            f"  {name}: mean {agg['mean']:.3g}  min {agg['min']:.3g}  max {agg['max']:.3g}  "
            f"({agg['count']} scored)"
        )
    click.echo("")
    names = sorted({n for c in exp["cases"] for n in c["scores"]})
    table = [
        (
            str(c["case_index"]),
            _clip(c["name"] or "", 40),
            c["trace_id"],
            fmt_duration(c["duration_ns"]),
            c["status"],
            *(f"{c['scores'][n]:.3g}" if n in c["scores"] else "-" for n in names),
            _clip(c["error"] or c["output"], 40),
        )
        for c in exp["cases"]
    ]
    click.echo(
        _table(("CASE", "NAME", "TRACE ID", "DURATION", "STATUS", *names, "OUTPUT / ERROR"), table)
    )
