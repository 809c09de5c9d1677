"""What every command shares: exit codes, the help epilog, failing, and opening the store."""

from __future__ import annotations

import base64
import re
import sys
from pathlib import Path
from typing import Any, NoReturn

import click
import orjson

from .._config import Config

EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_CANNOT_LISTEN = 4

_EPILOG = (
    "Exit codes: 0 success, 1 failure, 2 bad usage, 3 not found, 4 cannot listen (serve). "
    "The store is LOOPTRACE_STORE, or ~/.local/share/looptrace/traces.db."
)


def _fail(message: str, code: int = EXIT_FAILURE) -> NoReturn:
    click.echo(f"looptrace: {message}", err=True)
    sys.exit(code)


def _store_path(ctx: click.Context) -> Path:
    path: Path | None = ctx.obj.get("store") if ctx.obj else None
    return path if path is not None else Config.from_env().store_path


def _open_store(ctx: click.Context, must_exist: bool = True) -> Any:
    from .._store import Store, StoreError

    path = _store_path(ctx)
    if must_exist and not path.exists():
        click.echo(f"No traces yet: {path} does not exist. Run `looptrace demo` to make some.")
        sys.exit(0)
    store = Store(path)
    try:
        store.stats()
    except StoreError as exc:
        _fail(str(exc))
    except Exception as exc:  # sqlite3.DatabaseError: not a database, unreadable...
        _fail(f"cannot open the store at {path}: {exc}")
    return store


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")


def parse_duration(text: str) -> float:
    """Seconds in a duration such as ``30s``, ``15m``, ``2h``, ``7d``, ``2w`` or ``1h30m``
    (ValueError otherwise)."""
    raw = text.strip().lower()
    parts = _DURATION.findall(raw)
    if not raw or "".join(n + u for n, u in parts) != raw:
        raise ValueError(
            f"expected a duration such as 30m, 2h, 7d or 1h30m (units s, m, h, d, w), got {text!r}"
        )
    return sum(float(n) * _UNITS[u] for n, u in parts)


def duration_option(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    """A click callback: the option's duration in seconds (None when not given)."""
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def key_value_option(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> list[tuple[str, str]]:
    """A click callback: ``KEY=VALUE`` options as pairs, split at the first "="."""
    out = []
    for raw in values:
        key, sep, value = raw.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {raw!r}")
        out.append((key, value))
    return out


def _jsonable(value: Any) -> Any:
    # Bytes attributes are the one value JSON has no form for: base64, as the /api does.
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    raise TypeError(type(value).__name__)


def _dump_json(value: Any) -> None:
    click.echo(orjson.dumps(value, default=_jsonable, option=orjson.OPT_INDENT_2).decode())
