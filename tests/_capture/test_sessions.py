"""Sessions, users, tags, metadata, cost and scores attached after the fact, in the store, the
collector's JSON API and the command line: what traced code writes (``session.id``,
``user.id``, ``tag.tags``, ``metadata``, ``llm.cost.*``, score spans) read back as the viewer
and ``looptrace traces`` / ``sessions`` show it."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

import looptrace
from looptrace import _semconv as sc
from looptrace import cli
from looptrace._store import SCHEMA_VERSION, Store
from store_support import decoded_span

NOW = time.time_ns()
MS = 10**6


def _context(session: str, user: str, tags: list[str], **metadata: Any) -> dict[str, Any]:
    """What ``looptrace.attributes(...)`` writes on every span of its block."""
    return {
        sc.SESSION_ID: session,
        sc.USER_ID: user,
        sc.TAG_TAGS: tags,
        sc.METADATA: json.dumps(metadata),
    }


def _llm(tokens_in: int, tokens_out: int, cost: float | None) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        sc.GEN_AI_OPERATION_NAME: "chat",
        sc.GEN_AI_REQUEST_MODEL: "gpt-4o-mini",
        sc.GEN_AI_USAGE_INPUT_TOKENS: tokens_in,
        sc.GEN_AI_USAGE_OUTPUT_TOKENS: tokens_out,
    }
    if cost is not None:
        attrs[sc.LLM_COST_TOTAL] = cost
    return attrs


def _score(name: str, value: float | None, label: str | None, comment: str) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        sc.SPAN_TYPE: sc.SPAN_TYPE_SCORE,
        sc.OPENINFERENCE_SPAN_KIND: sc.OI_EVALUATOR,
        sc.GEN_AI_EVALUATION_NAME: name,
        sc.GEN_AI_EVALUATION_EXPLANATION: comment,
    }
    if value is not None:
        attrs[sc.GEN_AI_EVALUATION_SCORE_VALUE] = value
    if label is not None:
        attrs[sc.GEN_AI_EVALUATION_SCORE_LABEL] = label
    return attrs


async def _chat(path: Path) -> dict[str, str]:
    """Traced code: three turns of session "s-1" (user "ada"; the last one's LLM call is of a
    model with no known price), one of "s-2" (user "bob") whose session only its LLM span
    names, and a thumbs-up on the second turn, attached after it ended. Returns the ids."""
    looptrace.configure(store_path=str(path), flush_interval=0.05, service_name="chat")
    ids: dict[str, str] = {}

    @looptrace.traced
    async def answer(message: str, context: dict[str, Any], cost: float | None) -> str:
        root = looptrace.current_span()
        for key, value in context.items():
            root.set_attribute(key, value)
        with looptrace.span("chat gpt-4o-mini") as llm:
            for key, value in {**context, **_llm(100, 10, cost)}.items():
                llm.set_attribute(key, value)
        ids[message] = f"{root.trace_id:032x}"
        ids[message + " span"] = f"{root.span_id:016x}"
        return message.upper()

    ada = _context("s-1", "ada", ["support", "beta"], plan="pro", seats=3)
    await answer("hello", ada, 0.001)
    await answer("my order?", ada, 0.002)
    await answer("thanks", ada, None)

    @looptrace.traced
    async def other(message: str) -> str:
        with looptrace.span("chat gpt-4o-mini") as llm:
            for key, value in {
                **_context("s-2", "bob", ["support"], plan="free"),
                **_llm(50, 5, 0.0005),
            }.items():
                llm.set_attribute(key, value)
            ids[message] = f"{llm.trace_id:032x}"
        return message

    await other("reset password")

    # Minutes later, a handler that has the span's context scores it.
    target = looptrace.SpanContext(
        int(ids["my order?"], 16), int(ids["my order? span"], 16), is_remote=True
    )
    with looptrace.span("gen_ai.evaluation.result", parent=target) as feedback:
        for key, value in _score("helpful", 1.0, "thumbs up", "fixed it").items():
            feedback.set_attribute(key, value)
    assert (await looptrace.flush(10)).ok
    return ids


@pytest.fixture
def chat_store(tmp_path: Path) -> Iterator[tuple[Store, dict[str, str]]]:
    import asyncio

    path = tmp_path / "chat.db"
    ids = asyncio.run(_chat(path))
    looptrace.shutdown_sync(10)
    with Store(path) as store:
        yield store, ids


# --------------------------------------------------------------------------------------------
# the store


def test_a_session_lists_its_traces_users_tokens_and_cost(
    chat_store: tuple[Store, dict[str, str]],
) -> None:
    """Traces join the session their root names, or, when the root names none, the one any of
    their spans names; a session sums its traces' tokens and known costs, counts the LLM
    calls of unknown price apart (never as 0), and lists its users; the most recently active
    session comes first."""
    store, _ = chat_store
    sessions = store.list_sessions()
    assert [s["session_id"] for s in sessions] == ["s-2", "s-1"]
    s2, s1 = sessions
    assert (s1["trace_count"], s1["user_ids"], s1["user_count"]) == (3, ["ada"], 1)
    assert (s1["input_tokens"], s1["output_tokens"]) == (300, 30)
    assert s1["cost_usd"] == pytest.approx(0.003)
    assert s1["uncosted_calls"] == 1
    assert s1["score_count"] == 1
    assert json.loads(s1["first_input"])["message"] == "hello"
    assert (s2["trace_count"], s2["user_ids"], s2["cost_usd"]) == (1, ["bob"], 0.0005)
    assert store.list_sessions(user="bob") == [s2]
    assert store.list_sessions(limit=1, offset=1)[0]["session_id"] == "s-1"
    assert store.stats()["sessions"] == 2


def test_a_sessions_traces_come_in_conversation_order_with_their_inputs_and_outputs(
    chat_store: tuple[Store, dict[str, str]],
) -> None:
    """One session: its traces by start time, each with the start of its root's input and
    output, its tokens, cost (None for the unpriced call) and score count."""
    store, ids = chat_store
    session = store.get_session("s-1")
    assert session is not None
    traces = session["traces"]
    assert [t["trace_id"] for t in traces] == [ids["hello"], ids["my order?"], ids["thanks"]]
    assert [json.loads(t["output"]) for t in traces] == ["HELLO", "MY ORDER?", "THANKS"]
    assert json.loads(traces[0]["input"])["message"] == "hello"
    assert [t["cost_usd"] for t in traces] == [0.001, 0.002, None]
    assert [t["uncosted_calls"] for t in traces] == [0, 0, 1]
    assert [t["score_count"] for t in traces] == [0, 1, 0]
    assert session["truncated"] is False
    short = store.get_session("s-1", limit=2)
    assert short is not None and short["truncated"] and len(short["traces"]) == 2
    assert store.get_session("nope") is None


def test_a_score_is_neither_a_span_of_the_count_nor_the_end_of_its_trace(
    chat_store: tuple[Store, dict[str, str]],
) -> None:
    """A score span attached to a finished trace is counted as a score; the trace keeps its
    span count and its end (a thumbs-up later does not make the request longer); the trace's
    span list still holds it, parented to the scored span."""
    store, ids = chat_store
    trace = store.get_trace_summary(ids["my order?"])
    assert trace is not None
    spans = store.get_trace(ids["my order?"])
    (score,) = [s for s in spans if s["attributes"].get(sc.SPAN_TYPE) == sc.SPAN_TYPE_SCORE]
    assert score["parent_span_id"] == ids["my order? span"]
    assert trace["span_count"] == len(spans) - 1 == 2
    assert trace["score_count"] == 1
    assert trace["end_ns"] < score["end_ns"]
    assert trace["duration_ns"] == max(s["end_ns"] for s in spans if s is not score) - min(
        s["start_ns"] for s in spans
    )


def test_the_trace_list_filters_by_user_session_tag_and_metadata(
    chat_store: tuple[Store, dict[str, str]],
) -> None:
    """Each filter keeps the traces that have it (on the root or any span); several filters
    must all match; a metadata value that is not a string compares as its JSON text."""
    store, ids = chat_store

    def listed(**kw: Any) -> set[str]:
        return {t["trace_id"] for t in store.list_traces(**kw)}

    ada = {ids["hello"], ids["my order?"], ids["thanks"]}
    assert listed(user="ada") == ada
    assert listed(user="bob") == listed(session="s-2") == {ids["reset password"]}
    assert listed(session="s-1") == ada
    assert listed(tags=["support"]) == ada | {ids["reset password"]}
    assert listed(tags=["support", "beta"]) == ada
    assert listed(metadata=[("plan", "free")]) == {ids["reset password"]}
    assert listed(metadata=[("seats", "3"), ("plan", "pro")]) == ada
    assert listed(metadata=[("seats", "03")]) == set()
    assert listed(user="bob", tags=["beta"]) == set()
    (row,) = store.list_traces(user="bob")
    assert (row["session_id"], row["user_id"]) == ("s-2", "bob")
    assert (row["input_tokens"], row["output_tokens"], row["cost_usd"]) == (50, 5, 0.0005)


def test_cost_and_tokens_are_none_where_nothing_reported_them(tmp_path: Path) -> None:
    """A trace without LLM calls has no tokens and no cost (None, not 0); an agent's span that
    repeats its calls' usage is not counted twice."""
    with Store(tmp_path / "s.db") as store:
        store.write(
            [
                decoded_span(1, 1, None, "plain", NOW, NOW + MS),
                decoded_span(
                    2,
                    1,
                    None,
                    "agent",
                    NOW,
                    NOW + 3 * MS,
                    attributes={
                        sc.GEN_AI_OPERATION_NAME: sc.GEN_AI_OP_INVOKE_AGENT,
                        sc.GEN_AI_USAGE_INPUT_TOKENS: 30,
                        sc.GEN_AI_USAGE_OUTPUT_TOKENS: 3,
                        sc.LLM_COST_TOTAL: 0.3,
                    },
                ),
                decoded_span(2, 2, 1, "call", NOW, NOW + MS, attributes=_llm(10, 1, 0.1)),
                decoded_span(2, 3, 1, "call", NOW + MS, NOW + 2 * MS, attributes=_llm(20, 2, 0.2)),
            ]
        )
        plain = store.get_trace_summary(f"{1:032x}")
        agent = store.get_trace_summary(f"{2:032x}")
    assert plain is not None and agent is not None
    assert (plain["input_tokens"], plain["output_tokens"], plain["cost_usd"]) == (None, None, None)
    assert plain["uncosted_calls"] == 0
    assert (agent["input_tokens"], agent["output_tokens"]) == (30, 3)
    assert agent["cost_usd"] == pytest.approx(0.3)


def test_an_experiment_sums_the_cost_of_its_priced_cases_only(tmp_path: Path) -> None:
    """Experiments and their cases carry ``looptrace.case.cost_usd``: the experiment's cost is
    the sum over the cases that have one, with how many did; with none, it is None."""
    exp = "e" * 32
    common = {sc.EXPERIMENT_ID: exp, sc.EXPERIMENT_NAME: "qa"}
    spans = [decoded_span(0xE, 1, None, "qa", NOW, NOW + 10 * MS, attributes=common)]
    for i, cost in enumerate([0.25, None, 0.5]):
        attrs = {**common, sc.CASE_INDEX: i, sc.CASE_REPETITION: 0}
        if cost is not None:
            attrs[sc.CASE_COST_USD] = cost
        spans.append(
            decoded_span(0xE0 + i, 1, None, f"case {i}", NOW + i, NOW + MS, attributes=attrs)
        )
    with Store(tmp_path / "s.db") as store:
        store.write(spans)
        (head,) = store.list_experiments()
        full = store.get_experiment(exp)
        store.write(
            [
                decoded_span(
                    0xF,
                    1,
                    None,
                    "x",
                    NOW,
                    NOW + 1,
                    attributes={**common, sc.EXPERIMENT_ID: "f" * 32, sc.CASE_INDEX: 0},
                )
            ]
        )
        unpriced = store.get_experiment("f" * 32)
    assert (head["cost_usd"], head["costed_cases"], head["case_count"]) == (0.75, 2, 3)
    assert full is not None
    assert [c["cost_usd"] for c in full["cases"]] == [0.25, None, 0.5]
    assert unpriced is not None and unpriced["cost_usd"] is None


def test_a_version_1_store_is_migrated_with_its_sessions_costs_and_labels(tmp_path: Path) -> None:
    """A store written before sessions existed (schema version 1) is migrated on open: its
    spans' sessions, users, tokens, costs, scores, tags and metadata are read out of their
    attributes, and its traces summed again, so old traces show in the new views."""
    path = tmp_path / "old.db"
    context = _context("old-session", "ada", ["legacy"], plan="pro", n=3)
    score_at = NOW + 60_000 * MS
    with Store(path) as store:
        store.write(
            [
                decoded_span(1, 1, None, "turn", NOW, NOW + 2 * MS, attributes=context),
                decoded_span(1, 2, 1, "chat", NOW, NOW + MS, attributes=_llm(10, 2, 0.01)),
                decoded_span(
                    1, 3, 1, "score", score_at, score_at, attributes=_score("ok", 1, None, "")
                ),
            ]
        )
    # Take the file back to what version 1 wrote: no new columns, no labels, a trace row that
    # counted the score as a span and ended with it.
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("DROP INDEX traces_by_session")
    conn.execute("DROP INDEX traces_by_user")
    conn.execute("DROP TABLE trace_labels")
    for column in (
        "session_id",
        "user_id",
        "span_type",
        "input_tokens",
        "output_tokens",
        "cost_usd",
    ):
        conn.execute(f"ALTER TABLE spans DROP COLUMN {column}")
    for column in (
        "session_id",
        "user_id",
        "input_tokens",
        "output_tokens",
        "cost_usd",
        "uncosted_calls",
        "score_count",
    ):
        conn.execute(f"ALTER TABLE traces DROP COLUMN {column}")
    conn.execute("UPDATE traces SET span_count = 3, end_ns = ?", (score_at,))
    conn.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    conn.close()
    with Store(path) as store:
        assert store.schema_version == SCHEMA_VERSION
        (trace,) = store.list_traces(session="old-session", tags=["legacy"], metadata=[("n", "3")])
        assert (trace["user_id"], trace["input_tokens"], trace["cost_usd"]) == ("ada", 10, 0.01)
        assert (trace["score_count"], trace["span_count"]) == (1, 2)
        assert trace["duration_ns"] == 2 * MS
        assert store.list_sessions()[0]["session_id"] == "old-session"


def test_retention_deletes_a_traces_labels_with_it(tmp_path: Path) -> None:
    """A pruned trace leaves no tag or metadata row behind (a filter would find nothing, and
    the table would grow without bound)."""
    old = NOW - 10 * 86400 * 10**9
    labels = _context("s", "u", ["t"], k="v")
    with Store(tmp_path / "s.db", max_age_days=1) as store:
        store.write([decoded_span(1, 1, None, "old", old, old + MS, attributes=labels)])
        store.write([decoded_span(2, 1, None, "new", NOW, NOW + MS, attributes=labels)])
        store.prune()
        assert [t["name"] for t in store.list_traces(tags=["t"])] == ["new"]
        with store._reader() as conn:
            assert {r[0] for r in conn.execute("SELECT trace_id FROM trace_labels")} == {
                f"{2:032x}"
            }


# --------------------------------------------------------------------------------------------
# the JSON API


@pytest.fixture
def api(chat_store: tuple[Store, dict[str, str]]) -> Iterator[tuple[httpx.Client, dict[str, str]]]:
    pytest.importorskip("starlette")
    from collector_support import running_collector

    store, ids = chat_store
    with running_collector(store.path) as url, httpx.Client(base_url=url) as client:
        yield client, ids


def test_the_api_lists_sessions_and_one_session(api: tuple[httpx.Client, dict[str, str]]) -> None:
    """/api/sessions and /api/sessions/{id} answer the store's shapes; an unknown session is a
    404; a user filter and paging apply."""
    client, ids = api
    body = client.get("/api/sessions").json()
    assert [s["session_id"] for s in body["sessions"]] == ["s-2", "s-1"]
    assert (
        client.get("/api/sessions", params={"user": "ada"}).json()["sessions"][0]["trace_count"]
        == 3
    )
    one = client.get("/api/sessions/s-1").json()
    assert [t["trace_id"] for t in one["traces"]] == [ids["hello"], ids["my order?"], ids["thanks"]]
    assert one["cost_usd"] == pytest.approx(0.003)
    assert client.get("/api/sessions/none").status_code == 404
    assert client.get("/api/sessions", params={"limit": "0"}).status_code == 400


def test_the_api_filters_traces_by_user_session_tag_and_metadata(
    api: tuple[httpx.Client, dict[str, str]],
) -> None:
    """/api/traces takes user, session, tag (repeatable) and meta=key=value (repeatable); a
    meta without "=" is a 400 that says so."""
    client, ids = api

    def listed(params: Any) -> set[str]:
        response = client.get("/api/traces", params=params)
        assert response.status_code == 200, response.text
        return {t["trace_id"] for t in response.json()["traces"]}

    ada = {ids["hello"], ids["my order?"], ids["thanks"]}
    assert listed({"user": "ada"}) == ada
    assert listed({"session": "s-2"}) == {ids["reset password"]}
    assert listed([("tag", "support"), ("tag", "beta")]) == ada
    assert listed([("meta", "plan=pro"), ("meta", "seats=3")]) == ada
    assert listed({"meta": "plan=free", "user": "ada"}) == set()
    bad = client.get("/api/traces", params={"meta": "plan"})
    assert bad.status_code == 400
    assert "key=value" in bad.json()["error"]


def test_a_session_id_with_a_slash_opens(tmp_path: Path) -> None:
    """A session id is the application's string: one holding "/" or spaces is found by its
    page's API path."""
    pytest.importorskip("starlette")
    from collector_support import running_collector

    path = tmp_path / "s.db"
    with Store(path) as store:
        store.write(
            [decoded_span(1, 1, None, "t", NOW, NOW + MS, attributes={sc.SESSION_ID: "team/a b"})]
        )
    with running_collector(path) as url:
        response = httpx.get(f"{url}/api/sessions/team%2Fa%20b")
    assert response.status_code == 200
    assert response.json()["trace_count"] == 1


# --------------------------------------------------------------------------------------------
# the command line


def _run(store: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli.main, ["--store", str(store), *args])
    return result.exit_code, result.output


def test_looptrace_sessions_lists_sessions_and_shows_one_in_order(
    chat_store: tuple[Store, dict[str, str]],
) -> None:
    """`looptrace sessions` prints one line per session (traces, users, tokens, cost with a "+"
    where some calls had no price); `looptrace sessions ID` prints the session's traces in
    conversation order with their inputs and outputs; an unknown id exits 3."""
    store, ids = chat_store
    code, out = _run(store.path, "sessions")
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0].split() == ["SESSION", "TRACES", "USERS", "FIRST", "LAST", "TOKENS", "COST"]
    assert [line.split()[0] for line in lines[1:]] == ["s-2", "s-1"]
    s1 = lines[2].split()
    assert (s1[1], s1[2], s1[-2], s1[-1]) == ("3", "ada", "300/30", "$0.0030+")
    code, out = _run(store.path, "sessions", "--user", "bob", "--json")
    assert [s["session_id"] for s in json.loads(out)["sessions"]] == ["s-2"]

    code, out = _run(store.path, "sessions", "s-1")
    assert code == 0, out
    head, _, *rest = out.splitlines()
    assert head.startswith("session s-1  3 traces")
    assert "tokens 300/30  cost $0.0030+  users ada" in head
    turns = [line for line in rest if not line.startswith(" ")]
    assert [t.split()[1] for t in turns] == [ids["hello"], ids["my order?"], ids["thanks"]]
    assert "cost $0.0020  1 scores" in turns[1]
    assert 'out: "MY ORDER?"' in out
    code, out = _run(store.path, "sessions", "nope")
    assert code == 3


def test_looptrace_show_prints_a_score_under_the_span_it_scores(
    chat_store: tuple[Store, dict[str, str]],
) -> None:
    """`looptrace show` prints a score attached after the fact as a line under its span (name,
    value, label, comment), not as a span of the tree, and the trace's cost in its head."""
    store, ids = chat_store
    code, out = _run(store.path, "show", ids["my order?"], "--width", "120")
    assert code == 0, out
    head, _, root, *rest = out.splitlines()
    assert "tokens 100/10  cost $0.0020  session s-1  user ada" in head
    assert "2 spans" in head
    assert root.startswith("test_sessions._chat.<locals>.answer") or "answer" in root
    assert "│    score helpful = 1 (thumbs up): fixed it" in rest[0]
    assert not any(line.lstrip("│├└─ ").startswith("gen_ai.evaluation.result") for line in rest)
    assert any("cost $0.0020" in line and "llm:" in line for line in rest)


async def test_the_public_attributes_and_score_reach_the_session_views(tmp_path: Path) -> None:
    """End to end through the public API: spans inside ``looptrace.attributes(...)`` join the
    session and user, and match the tag and metadata filters; ``looptrace.score(...)`` on an
    ended span shows as that span's score, counted on its trace, not as one of its spans."""
    path = tmp_path / "public.db"
    looptrace.configure(store_path=str(path), flush_interval=0.05, service_name="chat")

    @looptrace.traced
    async def answer(message: str) -> str:
        with looptrace.span("step"):
            return message[::-1]

    async with looptrace.attributes(
        session_id="conv-9", user_id="ada", tags=["beta"], metadata={"plan": "pro", "seats": 3}
    ):
        await answer("first")
        with looptrace.span("second turn") as turn:
            await answer("second")
    looptrace.score(turn, "helpful", 1.0, label="thumbs up", comment="right answer")
    assert (await looptrace.flush(10)).ok
    with Store(path) as store:
        session = store.get_session("conv-9")
        assert session is not None
        assert (session["trace_count"], session["user_ids"], session["score_count"]) == (
            2,
            ["ada"],
            1,
        )
        listed = store.list_traces(user="ada", tags=["beta"], metadata=[("seats", "3")])
        assert {t["trace_id"] for t in listed} == {t["trace_id"] for t in session["traces"]}
        scored = store.get_trace_summary(f"{turn.trace_id:032x}")
        assert scored is not None and (scored["score_count"], scored["span_count"]) == (1, 3)
        (score,) = [
            s
            for s in store.get_trace(f"{turn.trace_id:032x}")
            if s["attributes"].get(sc.SPAN_TYPE) == sc.SPAN_TYPE_SCORE
        ]
    assert score["parent_span_id"] == f"{turn.span_id:016x}"
    assert score["attributes"][sc.GEN_AI_EVALUATION_NAME] == "helpful"
    assert score["attributes"][sc.GEN_AI_EVALUATION_SCORE_LABEL] == "thumbs up"
