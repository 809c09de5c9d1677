"""``looptrace traces``, ``looptrace show`` and ``looptrace sessions``: the traces in the local
store, listed or one as a tree, and the sessions they belong to."""

from __future__ import annotations

import os
import time
from typing import Any

import click

from ._common import (
    _EPILOG,
    EXIT_NOT_FOUND,
    EXIT_USAGE,
    _dump_json,
    _fail,
    _open_store,
    duration_option,
    key_value_option,
)
from ._format import _clip, _table, fmt_cost, fmt_duration, fmt_time, fmt_tokens, render_tree


@click.command(epilog=_EPILOG)
@click.option("-n", "--limit", default=20, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--offset", default=0, type=click.IntRange(0))
@click.option("--name", default=None, help="Only traces whose root name contains this.")
@click.option(
    "--status",
    type=click.Choice(["ok", "error", "unset", "in_progress"]),
    default=None,
    help="ok: nothing failed; error: the root or any span failed; unset: nothing failed and "
    "the root's status was never set; in_progress: still running.",
)
@click.option(
    "--lag", "include_lag", is_flag=True, help="Include the lag monitor's summary traces."
)
@click.option("--experiment", default=None, help="Only traces of this experiment id.")
@click.option("--user", default=None, help="Only traces of this user.id.")
@click.option("--session", default=None, help="Only traces whose session.id is SESSION.")
@click.option(
    "--tag", "tags", multiple=True, help="Only traces with this tag (tag.tags); repeatable."
)
@click.option(
    "--meta",
    "metadata",
    multiple=True,
    metavar="KEY=VALUE",
    callback=key_value_option,
    help="Only traces whose metadata has KEY equal to VALUE (non-strings as JSON: n=3, "
    "ok=true); repeatable.",
)
@click.option(
    "--attr",
    "attrs",
    multiple=True,
    metavar="KEY=VALUE",
    callback=key_value_option,
    help="Only traces with a span whose attribute KEY equals VALUE (numbers and booleans as "
    "JSON: http.status_code=503, retry=true); repeatable, all must match.",
)
@click.option(
    "--search",
    "text",
    default=None,
    metavar="TEXT",
    help="Only traces in which every word of TEXT starts a word of a span's name, attribute "
    "value, status or exception message (case-insensitive; payloads are not searched).",
)
@click.option("--service", default=None, help="Only traces whose root's service.name is this.")
@click.option(
    "--since",
    default=None,
    metavar="DURATION",
    callback=duration_option,
    help="Only traces that started within DURATION of now: 30m, 2h, 7d, 1h30m.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON (the /api/traces shape).")
@click.pass_context
def traces(
    ctx: click.Context,
    limit: int,
    offset: int,
    name: str | None,
    status: str | None,
    experiment: str | None,
    user: str | None,
    session: str | None,
    tags: tuple[str, ...],
    metadata: list[tuple[str, str]],
    attrs: list[tuple[str, str]],
    text: str | None,
    service: str | None,
    since: float | None,
    include_lag: bool,
    as_json: bool,
) -> None:
    """List recent traces, newest first: name, start, duration, status, span count; and, when
    the traces have them, LLM tokens and cost, scores, session and user. Every filter given
    must hold."""
    since_ns = None if since is None else time.time_ns() - int(since * 1e9)
    store = _open_store(ctx)
    with store:
        rows = store.list_traces(
            limit,
            offset,
            name=name,
            status=status,
            experiment=experiment,
            include_lag=include_lag,
            user=user,
            session=session,
            tags=tags,
            metadata=metadata,
            attrs=attrs,
            text=text,
            service=service,
            since_ns=since_ns,
        )
    if as_json:
        _dump_json({"traces": rows, "limit": limit, "offset": offset})
        return
    if not rows:
        filtered = (
            name
            or status
            or experiment
            or user
            or session
            or tags
            or metadata
            or attrs
            or text
            or service
            or since is not None
        )
        click.echo("No traces match." if filtered else "No traces yet.")
        return
    # Columns for what these traces carry, so a store without LLM calls or sessions reads as
    # before.
    llm = any(
        r["input_tokens"] is not None or r["output_tokens"] is not None or r["cost_usd"] is not None
        for r in rows
    )
    scored = any(r["score_count"] for r in rows)
    people = any(r["session_id"] or r["user_id"] for r in rows)
    headers = ["TRACE ID", "NAME", "START", "DURATION", "STATUS", "SPANS"]
    headers += ["TOKENS", "COST"] if llm else []
    headers += ["SCORES"] if scored else []
    headers += ["SESSION", "USER"] if people else []
    table = []
    for r in rows:
        row = [
            r["trace_id"],
            _clip(r["name"], 40),
            fmt_time(r["start_ns"]),
            fmt_duration(r["duration_ns"]),
            r["status"] + (f" ({r['error_count']} failed)" if r["error_count"] else ""),
            str(r["span_count"]),
        ]
        if llm:
            row += [
                fmt_tokens(r["input_tokens"], r["output_tokens"]),
                fmt_cost(r["cost_usd"], r["uncosted_calls"]),
            ]
        if scored:
            row.append(str(r["score_count"] or ""))
        if people:
            row += [_clip(r["session_id"], 24), _clip(r["user_id"], 24)]
        table.append(row)
    click.echo(_table(headers, table))


@click.command(epilog=_EPILOG)
@click.argument("session_id", required=False)
@click.option("-n", "--limit", default=20, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--offset", default=0, type=click.IntRange(0))
@click.option("--user", default=None, help="Only sessions in which this user.id has a trace.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (the /api/sessions shapes).")
@click.pass_context
def sessions(
    ctx: click.Context,
    session_id: str | None,
    limit: int,
    offset: int,
    user: str | None,
    as_json: bool,
) -> None:
    """List sessions (session.id), the most recently active first: traces, users, first start,
    tokens and cost. With SESSION_ID, that session's traces in conversation order, each with
    the start of its input and output."""
    store = _open_store(ctx)
    with store:
        if session_id is not None:
            one = store.get_session(session_id, preview=200, limit=limit)
            if one is None:
                _fail(f"no session {session_id!r} in {store.path}", EXIT_NOT_FOUND)
        else:
            rows = store.list_sessions(limit, offset, user=user)
    if session_id is not None:
        _print_session(one, as_json)
        return
    if as_json:
        _dump_json({"sessions": rows, "limit": limit, "offset": offset})
        return
    if not rows:
        click.echo("No sessions match." if user else "No sessions yet.")
        return
    table = [
        (
            _clip(r["session_id"], 36),
            str(r["trace_count"]),
            _clip(", ".join(r["user_ids"]), 30)
            + (f" +{r['user_count'] - len(r['user_ids'])}" if r["user_count"] > 20 else ""),
            fmt_time(r["first_start_ns"]),
            fmt_time(r["last_ns"]),
            fmt_tokens(r["input_tokens"], r["output_tokens"]),
            fmt_cost(r["cost_usd"], r["uncosted_calls"]),
        )
        for r in rows
    ]
    headers = ("SESSION", "TRACES", "USERS", "FIRST", "LAST", "TOKENS", "COST")
    click.echo(_table(headers, table))


def _print_session(session: dict[str, Any], as_json: bool) -> None:
    if as_json:
        _dump_json(session)
        return
    head = (
        f"session {session['session_id']}  {session['trace_count']} traces  "
        f"{fmt_time(session['first_start_ns'])} .. {fmt_time(session['last_ns'])}"
    )
    tokens = fmt_tokens(session["input_tokens"], session["output_tokens"])
    if tokens:
        head += f"  tokens {tokens}"
    cost = fmt_cost(session["cost_usd"], session["uncosted_calls"])
    if cost:
        head += f"  cost {cost}"
    if session["user_ids"]:
        head += f"  users {', '.join(session['user_ids'])}"
    lines = [head, ""]
    for i, t in enumerate(session["traces"], 1):
        facts = [
            f"{i}.",
            t["trace_id"],
            _clip(t["name"], 40),
            fmt_time(t["start_ns"]),
            fmt_duration(t["duration_ns"]),
            t["status"],
        ]
        tokens = fmt_tokens(t["input_tokens"], t["output_tokens"])
        if tokens:
            facts.append(f"tokens {tokens}")
        cost = fmt_cost(t["cost_usd"], t["uncosted_calls"])
        if cost:
            facts.append(f"cost {cost}")
        if t["score_count"]:
            facts.append(f"{t['score_count']} scores")
        lines.append("  ".join(facts))
        if t["input"] is not None:
            lines.append(f"    in:  {_clip(t['input'], 100)}")
        if t["output"] is not None:
            lines.append(f"    out: {_clip(t['output'], 100)}")
    if session["truncated"]:
        lines.append(f"(the first {len(session['traces'])} of {session['trace_count']} traces)")
    click.echo("\n".join(lines))


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
    tokens = fmt_tokens(summary["input_tokens"], summary["output_tokens"])
    if tokens:
        head += f"  tokens {tokens}"
    cost = fmt_cost(summary["cost_usd"], summary["uncosted_calls"])
    if cost:
        head += f"  cost {cost}"
    if summary["session_id"]:
        head += f"  session {summary['session_id']}"
    if summary["user_id"]:
        head += f"  user {summary['user_id']}"
    lines = [head, ""]
    lines.extend(render_tree(spans, width))
    click.echo("\n".join(lines))


def _terminal_width() -> int:
    try:
        return max(40, os.get_terminal_size().columns)
    except OSError:
        return 120
