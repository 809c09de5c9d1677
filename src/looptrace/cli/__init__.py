"""The ``looptrace`` command: a demo, a collector, and a terminal view of the local store.

Exit codes: 0 success; 1 something failed (an unusable store, a missing extra); 2 bad usage (an
unknown option, a configuration that is refused, such as a public address without a token);
3 not found (no trace or experiment with that id); 4 cannot listen (``serve``: the port is
taken or the address is not this machine's).

The group and its ``--store`` option are here; each command lives in a module of its own
(``_demo``, ``_traces`` for ``traces``, ``show`` and ``sessions``, ``_experiments``, ``_serve``,
``_housekeeping`` for ``prune`` and ``delete``), on what
they share (``_common``: exit codes, failing, the store) and the terminal formatting
(``_format``).
"""

from __future__ import annotations

from pathlib import Path

import click

from ._common import _EPILOG
from ._common import EXIT_CANNOT_LISTEN as EXIT_CANNOT_LISTEN
from ._common import EXIT_FAILURE as EXIT_FAILURE
from ._common import EXIT_NOT_FOUND as EXIT_NOT_FOUND
from ._common import EXIT_USAGE as EXIT_USAGE
from ._demo import demo
from ._experiments import experiments
from ._format import fmt_duration as fmt_duration
from ._format import fmt_time as fmt_time
from ._format import render_tree as render_tree
from ._housekeeping import delete, prune
from ._serve import serve
from ._spool import spool
from ._traces import sessions, show, traces

__all__ = ["main"]


@click.group(epilog=_EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--store",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The store file (default: LOOPTRACE_STORE, else ~/.local/share/looptrace/traces.db).",
)
@click.version_option(package_name="looptrace")
@click.pass_context
def main(ctx: click.Context, store: Path | None) -> None:
    """looptrace: asyncio tracing. Start with `looptrace demo`."""
    ctx.ensure_object(dict)
    ctx.obj["store"] = store.expanduser() if store is not None else None


main.add_command(demo)
main.add_command(traces)
main.add_command(show)
main.add_command(sessions)
main.add_command(experiments)
main.add_command(serve)
main.add_command(spool)
main.add_command(prune)
main.add_command(delete)
