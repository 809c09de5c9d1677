"""Reads of sessions: the conversations that traces belong to (``session.id``), listed with
their totals, and one session's traces in conversation order.

A trace belongs to the session its root names, else the one any of its spans names (the
``traces.session_id`` column, kept on write); everything here reads the ``traces`` table
through its ``(session_id, start_ns)`` index, never the spans of a session, except the root
span of each trace listed, for its input and output.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from .connection import Connections
from .traces import TRACE_COLUMNS, trace_dict

# Per session: its traces, users, first start and last activity, and the trace totals.
_SESSION_AGGREGATES = (
    "count(*), json_group_array(DISTINCT user_id) FILTER (WHERE user_id IS NOT NULL), "
    "min(start_ns), max(max(start_ns, end_ns)), sum(input_tokens), sum(output_tokens), "
    "sum(cost_usd), sum(uncosted_calls), sum(status_code = 2 OR error_count > 0), "
    "sum(score_count), sum(in_progress)"
)
# How many user ids a session's summary names (the count is always exact).
_USERS_SHOWN = 20
# How many of the newest traces the session list walks before it sorts every session instead.
_WALK_ROWS = 2000


def _session_dict(session_id: str, row: Sequence[Any]) -> dict[str, Any]:
    count, users, first, last, tokens_in, tokens_out, cost, uncosted, errors, scores, running = row
    user_ids = orjson.loads(users) if users else []
    return {
        "session_id": session_id,
        "trace_count": count,
        "user_count": len(user_ids),
        "user_ids": sorted(user_ids)[:_USERS_SHOWN],
        "first_start_ns": first,
        "last_ns": last,
        "input_tokens": tokens_in,
        "output_tokens": tokens_out,
        # None when no trace of the session has a known cost; uncosted_calls counts the LLM
        # calls whose price is unknown, which the sum leaves out.
        "cost_usd": cost,
        "uncosted_calls": uncosted or 0,
        "error_count": errors or 0,
        "score_count": scores or 0,
        "in_progress": bool(running),
    }


class SessionReads(Connections):
    """The store's session queries."""

    def list_sessions(
        self,
        limit: int = 50,
        offset: int = 0,
        *,
        user: str | None = None,
        since_ns: int | None = None,
        preview: int = 200,
    ) -> list[dict[str, Any]]:
        """Sessions, the most recently active first (by their latest trace's start), each with
        its trace count, users (ids and count), first start and last activity (``last_ns``),
        summed tokens and cost, failed traces, scores, and ``first_input``: the start of its
        first trace's input. ``user`` keeps the sessions in which that user has a trace;
        ``since_ns`` those with a trace started since."""
        # The page is found by walking traces newest first (the start_ns index) until enough
        # distinct sessions are seen, and only its sessions are summed (the session index).
        # Where the walk would be long (a deep page, sessions rare among recent traces), it
        # stops after _WALK_ROWS and the page is taken from the latest start of every session
        # instead (the session index alone, no table rows).
        where = ["session_id IS NOT NULL"]
        params: list[Any] = []
        if user is not None:
            where.append("session_id IN (SELECT session_id FROM traces WHERE user_id = ?)")
            params.append(user)
        if since_ns is not None:
            where.append("start_ns >= ?")
            params.append(since_ns)
        want = offset + limit
        page: list[str] = []
        n = int(preview)
        with self._reader() as conn:
            seen: set[str] = set()
            rows = conn.execute(
                f"SELECT session_id FROM traces WHERE {' AND '.join(where)} "
                f"ORDER BY start_ns DESC LIMIT {_WALK_ROWS}",
                params,
            ).fetchall()
            for (session_id,) in rows:
                if session_id not in seen:
                    seen.add(session_id)
                    if len(seen) > offset:
                        page.append(session_id)
                    if len(seen) >= want:
                        break
            if len(seen) < want and len(rows) == _WALK_ROWS:
                page = [
                    r[0]
                    for r in conn.execute(
                        f"SELECT session_id FROM traces WHERE {' AND '.join(where)} "
                        "GROUP BY session_id ORDER BY max(start_ns) DESC, session_id "
                        "LIMIT ? OFFSET ?",
                        (*params, limit, offset),
                    )
                ]
            if not page:
                return []
            marks = ", ".join("?" * len(page))
            heads = {
                row[0]: row[1:]
                for row in conn.execute(
                    f"SELECT session_id, {_SESSION_AGGREGATES} FROM traces "
                    f"WHERE session_id IN ({marks}) GROUP BY session_id",
                    page,
                )
            }
            firsts = {
                session_id: conn.execute(
                    f"SELECT substr(s.input, 1, {n}) FROM traces f JOIN spans s "
                    "ON s.trace_id = f.trace_id AND s.span_id = f.root_span_id "
                    "WHERE f.session_id = ? ORDER BY f.start_ns LIMIT 1",
                    (session_id,),
                ).fetchone()
                for session_id in page
            }
        out = []
        for session_id in page:
            session = _session_dict(session_id, heads[session_id])
            first = firsts[session_id]
            session["first_input"] = first[0] if first else None
            out.append(session)
        return out

    def get_session(
        self, session_id: str, preview: int = 200, limit: int = 1000
    ) -> dict[str, Any] | None:
        """One session (the ``list_sessions`` summary) with ``traces``: its first ``limit``
        traces in conversation order (by start time), each the trace list's summary plus
        ``input`` and ``output``, the first ``preview`` characters of its root span's payloads;
        ``truncated`` says whether the session has more. None if no trace names it."""
        n = int(preview)
        with self._reader() as conn:
            head = conn.execute(
                f"SELECT {_SESSION_AGGREGATES} FROM traces WHERE session_id = ?", (session_id,)
            ).fetchone()
            if head is None or not head[0]:
                return None
            columns = ", ".join(f"t.{c.strip()}" for c in TRACE_COLUMNS.split(","))
            rows = conn.execute(
                f"SELECT {columns}, substr(s.input, 1, {n}), substr(s.output, 1, {n}) "
                "FROM traces t LEFT JOIN spans s "
                "ON s.trace_id = t.trace_id AND s.span_id = t.root_span_id "
                "WHERE t.session_id = ? ORDER BY t.start_ns, t.trace_id LIMIT ?",
                (session_id, int(limit) + 1),
            ).fetchall()
        session = _session_dict(session_id, head)
        traces = []
        for row in rows[:limit]:
            trace = trace_dict(row[:19])
            trace["input"] = row[19]
            trace["output"] = row[20]
            traces.append(trace)
        session["traces"] = traces
        session["truncated"] = len(rows) > limit
        return session
