"""``looptrace prune`` and ``looptrace delete``: housekeeping of the local store.

Both work on a store that a collector or a program is writing at the same time: traces are
deleted in batches of a few hundred, each in a short transaction of its own, and each waits
for the writer at most the store's busy timeout (then fails with exit code 1, changing
nothing more).
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any, NoReturn

import click

from ._common import (
    _EPILOG,
    EXIT_NOT_FOUND,
    EXIT_USAGE,
    _dump_json,
    _fail,
    _open_store,
    parse_duration,
)


def _experiment_ids(store: Any, text: str) -> list[str]:
    """An experiment's id (or a unique prefix of it), else every run with that name."""
    matches = store.find_experiment_ids(text.strip())
    if len(matches) > 1:
        _fail(f"{text!r} matches more than one experiment id; give more digits", EXIT_USAGE)
    if matches:
        return list(matches)
    named: list[str] = store.experiment_ids_named(text)
    if not named:
        _fail(f"no experiment with the id or name {text!r} in {store.path}", EXIT_NOT_FOUND)
    return named


def _store_busy(exc: sqlite3.OperationalError) -> NoReturn:
    _fail(f"the store stayed busy past its timeout ({exc}); nothing more was deleted")


@click.command(epilog=_EPILOG)
@click.option(
    "--older-than",
    "older_than",
    default=None,
    metavar="DURATION",
    help="Delete traces that started longer ago than this: 30m, 2h, 7d, 2w.",
)
@click.option("--service", default=None, help="Only traces whose root's service.name is this.")
@click.option(
    "--experiment",
    default=None,
    metavar="ID_OR_NAME",
    help="Only traces of this experiment (an id, a unique prefix of one, or a name: every run "
    "with that name).",
)
@click.option("--dry-run", is_flag=True, help="Count what would be deleted; delete nothing.")
@click.option("--json", "as_json", is_flag=True, help='Print {"traces": N, "spans": N}.')
@click.pass_context
def prune(
    ctx: click.Context,
    older_than: str | None,
    service: str | None,
    experiment: str | None,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Delete traces by age, service and experiment (every option given must hold), and
    print how many traces and spans went. Refuses to run with no option at all."""
    if older_than is None and service is None and experiment is None:
        _fail(
            "prune needs --older-than, --service or --experiment (it never empties the "
            "store on its own)",
            EXIT_USAGE,
        )
    before_ns = None
    if older_than is not None:
        try:
            seconds = parse_duration(older_than)
        except ValueError as exc:
            _fail(f"--older-than: {exc}", EXIT_USAGE)
        before_ns = time.time_ns() - int(seconds * 1e9)
    store = _open_store(ctx)
    total = {"traces": 0, "spans": 0}
    with store:
        ids: list[str | None] = [None]
        if experiment is not None:
            ids = list(_experiment_ids(store, experiment))
        try:
            for exp_id in ids:
                done = store.prune_traces(
                    before_ns=before_ns, service=service, experiment=exp_id, dry_run=dry_run
                )
                total["traces"] += done["traces"]
                total["spans"] += done["spans"]
        except sqlite3.OperationalError as exc:
            _store_busy(exc)
    if as_json:
        _dump_json({**total, "dry_run": dry_run})
        return
    parts = []
    if older_than is not None:
        parts.append(f"older than {older_than.strip()}")
    if service is not None:
        parts.append(f"of service {service!r}")
    if experiment is not None:
        parts.append(f"of experiment {experiment!r}")
    verb = "Would delete" if dry_run else "Deleted"
    click.echo(f"{verb} {total['traces']} traces ({total['spans']} spans) {', '.join(parts)}.")


@click.command(epilog=_EPILOG)
@click.argument("trace_ids", nargs=-1, metavar="[TRACE_ID]...")
@click.option(
    "--experiment",
    default=None,
    metavar="ID_OR_NAME",
    help="Delete this experiment and every trace of it (an id, a unique prefix of one, or a "
    "name: every run with that name).",
)
@click.option("--json", "as_json", is_flag=True, help="Print what was deleted as JSON.")
@click.pass_context
def delete(
    ctx: click.Context, trace_ids: tuple[str, ...], experiment: str | None, as_json: bool
) -> None:
    """Delete traces by id (each may be abbreviated to a unique prefix), or an experiment
    with --experiment. Exit code 3 when one of them does not exist (nothing is deleted)."""
    if bool(trace_ids) == (experiment is not None):
        _fail("give trace ids, or --experiment ID_OR_NAME (not both)", EXIT_USAGE)
    store = _open_store(ctx)
    with store:
        if experiment is not None:
            exp_ids = _experiment_ids(store, experiment)
            try:
                deleted = {e: store.delete_experiment(e) or 0 for e in exp_ids}
            except sqlite3.OperationalError as exc:
                _store_busy(exc)
            if as_json:
                _dump_json({"experiments": [{"id": e, "traces": n} for e, n in deleted.items()]})
                return
            for exp_id, n in deleted.items():
                click.echo(f"Deleted experiment {exp_id} ({n} traces).")
            return
        # Every id is resolved before anything is deleted: a typo deletes nothing.
        resolved = []
        for raw in trace_ids:
            matches = store.find_trace_ids(raw.strip(), limit=2)
            if not matches:
                _fail(f"no trace {raw!r} in {store.path}", EXIT_NOT_FOUND)
            if len(matches) > 1:
                _fail(f"{raw!r} matches more than one trace; give more digits", EXIT_USAGE)
            resolved.append(matches[0])
        resolved = list(dict.fromkeys(resolved))
        try:
            n = store.delete_traces(resolved)
        except sqlite3.OperationalError as exc:
            _store_busy(exc)
    if as_json:
        _dump_json({"traces": resolved, "deleted": n})
        return
    for trace_id in resolved:
        click.echo(f"Deleted trace {trace_id}.")
