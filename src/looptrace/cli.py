"""The ``looptrace`` command: a demo, a collector, and a terminal view of the local store.

Exit codes: 0 success; 1 something failed (an unusable store, a missing extra); 2 bad usage (an
unknown option, a configuration that is refused, such as a public address without a token);
3 not found (no trace or experiment with that id).
"""

from __future__ import annotations

import base64
import datetime
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

import click
import orjson

from ._config import Config

EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3

_EPILOG = (
    "Exit codes: 0 success, 1 failure, 2 bad usage, 3 not found. "
    "The store is LOOPTRACE_STORE, or ~/.local/share/looptrace/traces.db."
)


def _fail(message: str, code: int = EXIT_FAILURE) -> NoReturn:
    click.echo(f"looptrace: {message}", err=True)
    sys.exit(code)


def _store_path(ctx: click.Context) -> Path:
    path: Path | None = ctx.obj.get("store") if ctx.obj else None
    return path if path is not None else Config.from_env().store_path


def _open_store(ctx: click.Context, must_exist: bool = True) -> Any:
    from ._store import Store, StoreError

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


def _jsonable(value: Any) -> Any:
    # Bytes attributes are the one value JSON has no form for: base64, as the /api does.
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    raise TypeError(type(value).__name__)


def _dump_json(value: Any) -> None:
    click.echo(orjson.dumps(value, default=_jsonable, option=orjson.OPT_INDENT_2).decode())


# --------------------------------------------------------------------------------------------
# formatting


def fmt_duration(ns: int | None) -> str:
    """A duration for people: 850us, 12.3ms, 1.24s, 3m05s."""
    if ns is None:
        return "running"
    if ns < 1_000_000:
        return f"{ns / 1000:.0f}us"
    if ns < 1_000_000_000:
        return f"{ns / 1e6:.1f}ms"
    if ns < 60_000_000_000:
        return f"{ns / 1e9:.2f}s"
    minutes, seconds = divmod(int(ns // 1_000_000_000), 60)
    return f"{minutes}m{seconds:02d}s"


def fmt_time(ns: int) -> str:
    """A wall-clock time in the local zone, to the second."""
    return datetime.datetime.fromtimestamp(ns / 1e9).strftime("%Y-%m-%d %H:%M:%S")


def _clip(text: str | None, width: int) -> str:
    if text is None:
        return ""
    text = " ".join(text.split())
    return text if len(text) <= width else text[: max(0, width - 3)] + "..."


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    for row in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return "\n".join(lines)


def render_tree(spans: Sequence[dict[str, Any]], width: int = 100) -> Iterator[str]:
    """The span tree of one trace, one span per line (inputs and outputs below), parents before
    children, siblings by start time. Spans whose parent is missing are shown as roots."""
    ids = {s["span_id"] for s in spans}
    children: dict[str | None, list[dict[str, Any]]] = {}
    for s in spans:  # already ordered by start time
        parent = s["parent_span_id"] if s["parent_span_id"] in ids else None
        children.setdefault(parent, []).append(s)
    # Iterative walk: a 10,000-deep chain must not hit the recursion limit.
    roots = children.get(None, [])
    stack = [(s, "", True, True) for s in reversed(roots)]
    while stack:
        span, prefix, last, is_root = stack.pop()
        branch = "" if is_root else ("└─ " if last else "├─ ")
        parts = [f"{prefix}{branch}{span['name']}", fmt_duration(span["duration_ns"])]
        # Only what needs attention: OpenTelemetry's OK and UNSET both read as fine.
        if span["status"] == "error":
            parts.append("ERROR")
        if span["lag_max_ms"] is not None:
            parts.append(f"lag {span['lag_max_ms']:.1f}ms")
        if span["status"] == "error" and span["status_message"]:
            parts.append(_clip(span["status_message"], 80))
        yield "  ".join(parts)
        child_prefix = prefix if is_root else prefix + ("   " if last else "│  ")
        kids = children.get(span["span_id"], [])
        detail = child_prefix + ("│    " if kids else "     ")
        room = max(20, width - len(detail) - 5)
        llm = _llm_line(span.get("attributes") or {})
        if llm:
            yield f"{detail}{_clip(llm, room + 5)}"
        if span["input"] is not None:
            yield f"{detail}in:  {_clip(span['input'], room)}"
        if span["output"] is not None:
            yield f"{detail}out: {_clip(span['output'], room)}"
        for event in span.get("events") or ():
            yield f"{detail}{_event_line(event, span['start_ns'], room)}"
        for i in range(len(kids) - 1, -1, -1):
            stack.append((kids[i], child_prefix, i == len(kids) - 1, False))


def _llm_line(attrs: dict[str, Any]) -> str:
    """For an LLM call (GenAI attributes, see docs/genai.md): model, tokens, first chunk."""
    model = attrs.get("gen_ai.response.model") or attrs.get("gen_ai.request.model")
    if not model or "gen_ai.operation.name" not in attrs:
        return ""
    text = f"llm: {attrs.get('gen_ai.provider.name', '?')} {model}"
    tokens_in = attrs.get("gen_ai.usage.input_tokens")
    tokens_out = attrs.get("gen_ai.usage.output_tokens")
    if tokens_in is not None or tokens_out is not None:
        text += f"  tokens {tokens_in if tokens_in is not None else '?'} in"
        text += f" / {tokens_out if tokens_out is not None else '?'} out"
    first = attrs.get("looptrace.genai.time_to_first_chunk_ms")
    if isinstance(first, (int, float)):
        text += f"  first chunk {first:.1f}ms"
    reasons = attrs.get("gen_ai.response.finish_reasons")
    if isinstance(reasons, list) and reasons:
        text += f"  finish {','.join(str(r) for r in reasons)}"
    return text


def _event_line(event: dict[str, Any], span_start_ns: int, room: int) -> str:
    """One event of a span: when (from the span's start), its name, and what says most about
    it: a loop stall names the code that blocked (where, how long), an exception its type and
    message."""
    attrs = event.get("attributes") or {}
    when = event.get("time_ns") or span_start_ns
    text = f"event +{fmt_duration(max(0, when - span_start_ns))} {event.get('name', '')}"
    if "looptrace.loop.stall.duration_ms" in attrs:
        where = f"{attrs.get('code.filepath', '?')}:{attrs.get('code.lineno', '?')}"
        text += (
            f": {attrs.get('code.function', '?')} ({where}) blocked the loop for "
            f"{float(attrs['looptrace.loop.stall.duration_ms']):.1f}ms"
        )
    elif "exception.type" in attrs:
        text += f": {attrs['exception.type']}: {attrs.get('exception.message', '')}"
    return _clip(text, room + 5)


# --------------------------------------------------------------------------------------------
# commands


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


@main.command(epilog=_EPILOG)
@click.option("--cases", default=8, show_default=True, type=click.IntRange(2, 1000))
@click.pass_context
def demo(ctx: click.Context, cases: int) -> None:
    """Run a small traced async evaluation into the local store and show how to look at it."""
    from ._demo import run_demo

    path = _store_path(ctx)
    try:
        run_demo(path, cases=cases)
    except Exception as exc:
        _fail(f"the demo failed: {type(exc).__name__}: {exc}")


@main.command(epilog=_EPILOG)
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


@main.command(epilog=_EPILOG)
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


@main.command(epilog=_EPILOG)
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
            "  ".join(f"{k}={v['mean']:.3g}" for k, v in r["scores"].items()),
        )
        for r in rows
    ]
    click.echo(
        _table(("EXPERIMENT ID", "NAME", "CREATED", "CASES", "ERRORS", "SCORES (mean)"), table)
    )


def _show_experiment(exp: dict[str, Any], as_json: bool) -> None:
    if as_json:
        _dump_json(exp)
        return
    click.echo(
        f"experiment {exp['name']}  id {exp['id']}  {fmt_time(exp['created_ns'])}  "
        f"{exp['case_count']} cases, {exp['error_count']} failed"
    )
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


@main.command(epilog=_EPILOG)
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
    to it: OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318."""
    from .collector import MissingServerExtra, _require_server_extra

    try:
        _require_server_extra()
    except MissingServerExtra as exc:
        _fail(str(exc))
    from .collector.app import is_loopback
    from .collector.app import serve as run_server

    if token is None:
        token = Config.from_env().collector_token

    if not is_loopback(host) and not token:
        _fail(
            f"refusing to listen on {host} without a token: anyone who can reach it could write "
            "and read traces. Pass --token (or set LOOPTRACE_TOKEN), or use --host 127.0.0.1.",
            EXIT_USAGE,
        )
    path = _store_path(ctx)
    extra = [] if no_viewer else _viewer_routes()
    shown = "localhost" if host in ("127.0.0.1", "::1") else host
    click.echo(f"looptrace collector: http://{shown}:{port}  (store: {path})", err=True)
    click.echo(f"  send OTLP/HTTP to http://{shown}:{port}/v1/traces", err=True)
    if extra:
        click.echo(f"  viewer: http://{shown}:{port}/", err=True)
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
        )
    except OSError as exc:
        _fail(f"cannot listen on {host}:{port}: {exc}")


def _viewer_routes() -> list[Any]:
    import importlib.util

    if importlib.util.find_spec("looptrace.collector.viewer") is None:
        return []
    from .collector import viewer

    routes: list[Any] = viewer.routes()
    return routes


def _terminal_width() -> int:
    try:
        return max(40, os.get_terminal_size().columns)
    except OSError:
        return 120


if __name__ == "__main__":  # pragma: no cover
    main()
