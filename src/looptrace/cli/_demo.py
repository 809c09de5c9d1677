"""``looptrace demo``: a small traced evaluation into the local store."""

from __future__ import annotations

import click

from ._common import _EPILOG, _fail, _store_path


@click.command(epilog=_EPILOG)
@click.option("--cases", default=8, show_default=True, type=click.IntRange(2, 1000))
@click.pass_context
def demo(ctx: click.Context, cases: int) -> None:
    """Run a small traced async evaluation into the local store and show how to look at it."""
    from .._demo import run_demo

    path = _store_path(ctx)
    try:
        run_demo(path, cases=cases)
    except Exception as exc:
        _fail(f"the demo failed: {type(exc).__name__}: {exc}")
