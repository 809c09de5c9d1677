"""Reads of experiments: the list with case, error, token and score summaries, one experiment's
cases a page at a time, and a scorer's trend over the last runs of the same experiment.

A case is a row of the experiment's table: the root span of its own trace that carries the
experiment's id and a case index (``looptrace.case.index``); its children may carry both too,
and are not rows. Every summary is one SQL aggregate over those rows (the ``spans_by_case``
index narrows the scan to the experiment), so an experiment of 10,000 cases is summed in the
store, never sent to the viewer to be summed there.

Errors come apart: a *task error* is a case whose task raised (``looptrace.case.error``, or a
failed status with no scorer to blame); a *scorer error* is a case on which at least one
scorer raised (``looptrace.scorer_error.<scorer>``; every failing scorer is named). The counts
match the summary an experiment prints when it ends ("errors 2  scorer errors 4").
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from collections.abc import Sequence
from typing import Any

from .. import _semconv as sc
from .columns import loads
from .connection import Connections
from .traces import TRACE_SELECT, trace_dict

# The experiment's case rows: roots of their traces, with a case index.
_CASES = "experiment_id = ? AND case_index IS NOT NULL AND parent_span_id IS NULL"
_ERROR_PATH = f'$."{sc.CASE_ERROR}"'
_REPETITION_PATH = f'$."{sc.CASE_REPETITION}"'
_SCORER_ERRORS = sc.SCORER_ERROR_PREFIX.replace("*", "[*]") + "*"
# Scorers that raised on the case, counted from its attributes (only failed cases carry any:
# a scorer that raises marks the case's status as failed).
_FAILED_SCORERS = f"(SELECT count(*) FROM json_each(attributes) WHERE key GLOB '{_SCORER_ERRORS}')"
# A task error: the case says so, or it failed and no scorer is to blame.
_TASK_ERROR = (
    f"(status_code = 2 AND (json_extract(attributes, '{_ERROR_PATH}') IS NOT NULL "
    f"OR {_FAILED_SCORERS} = 0))"
)
# The same, as 0/1 sums that look into the attributes of failed cases only.
_GUARDED_TASK_ERROR = (
    f"CASE WHEN status_code = 2 THEN (json_extract(attributes, '{_ERROR_PATH}') IS NOT NULL "
    f"OR {_FAILED_SCORERS} = 0) ELSE 0 END"
)
_GUARDED_SCORER_ERROR = f"CASE WHEN status_code = 2 THEN {_FAILED_SCORERS} > 0 ELSE 0 END"
# A case dropped by more than this since the previous run is a regression; a scorer's mean
# dropping by more than this is called out (scores are compared as stored, typically 0..1).
DEFAULT_REGRESSION_THRESHOLD = 0.05
# Cases filtered by their outcome (``case_filter``): what the experiment page's menu offers.
CASE_FILTERS = ("task_error", "scorer_error", "error", "ok")


class ExperimentReads(Connections):
    """The store's experiment queries."""

    def find_experiment_ids(self, prefix: str, limit: int = 2) -> list[str]:
        """Experiment ids starting with ``prefix`` (so the CLI accepts a short id)."""
        with self._reader() as conn:
            return [
                r[0]
                for r in conn.execute(
                    "SELECT id FROM experiments WHERE substr(id, 1, ?) = ? LIMIT ?",
                    (len(prefix), prefix, limit),
                )
            ]

    def list_experiments(self, limit: int = 50, offset: int = 0) -> list[dict[str, Any]]:
        """Experiments, newest first, each with case/error counts and the mean of each score."""
        with self._reader() as conn:
            rows = conn.execute(
                "SELECT id, name, created_ns, metadata, tags FROM experiments "
                "ORDER BY created_ns DESC LIMIT ? OFFSET ?",
                (limit, offset),
            ).fetchall()
            return [self._experiment_head(conn, row) for row in rows]

    def _experiment_head(self, conn: sqlite3.Connection, row: Sequence[Any]) -> dict[str, Any]:
        exp_id = row[0]
        # One pass over the case rows. The cost is summed over the cases that have one: None
        # when none has (never 0). The scorers that raised come as one string of names
        # (separated by \x1f), read from the attributes of failed cases only.
        (
            cases,
            dataset,
            running,
            task_errors,
            scorer_cases,
            tokens_in,
            tokens_out,
            cost,
            costed,
            failed_scorers,
        ) = conn.execute(
            "SELECT count(*), count(DISTINCT case_index), coalesce(sum(in_progress), 0), "
            f"coalesce(sum({_GUARDED_TASK_ERROR}), 0), "
            f"coalesce(sum({_GUARDED_SCORER_ERROR}), 0), "
            "coalesce(sum(json_extract(attributes, ?)), 0), "
            "coalesce(sum(json_extract(attributes, ?)), 0), "
            "sum(json_extract(attributes, ?)), count(json_extract(attributes, ?)), "
            "group_concat(CASE WHEN status_code = 2 THEN (SELECT group_concat(substr(key, "
            f"{len(sc.SCORER_ERROR_PREFIX) + 1}), char(31)) FROM json_each(attributes) "
            f"WHERE key GLOB '{_SCORER_ERRORS}') END, char(31)) "
            f"FROM spans WHERE {_CASES}",
            (
                f'$."{sc.CASE_INPUT_TOKENS}"',
                f'$."{sc.CASE_OUTPUT_TOKENS}"',
                f'$."{sc.CASE_COST_USD}"',
                f'$."{sc.CASE_COST_USD}"',
                exp_id,
            ),
        ).fetchone()
        scorer_errors = dict(sorted(Counter((failed_scorers or "").split("\x1f")).items()))
        scorer_errors.pop("", None)
        return {
            "id": exp_id,
            "name": row[1],
            "created_ns": row[2],
            "metadata": loads(row[3]),
            "tags": loads(row[4]),
            "case_count": cases,
            # Distinct dataset rows: fewer than case_count when cases were repeated.
            "dataset_cases": dataset,
            "in_progress": running,
            "error_count": task_errors,
            "scorer_error_count": scorer_cases,
            # Per scorer, the cases on which it raised.
            "scorer_errors": scorer_errors,
            "input_tokens": tokens_in,
            "output_tokens": tokens_out,
            "cost_usd": cost,
            "costed_cases": costed,
            "scores": _score_aggregates(conn, exp_id),
        }

    def get_experiment(
        self,
        experiment_id: str,
        preview: int = 200,
        *,
        limit: int | None = None,
        offset: int = 0,
        case_filter: str | None = None,
    ) -> dict[str, Any] | None:
        """One experiment with its score aggregates and its cases in case order (then by start,
        which is repetition order), or None.

        ``limit``/``offset`` page the cases (``limit=None``: all of them); ``case_filter``
        (one of ``CASE_FILTERS``) keeps the cases with that outcome. ``case_rows`` is how many
        cases the filter keeps, ``cases`` the page of them.
        """
        if case_filter is not None and case_filter not in CASE_FILTERS:
            raise ValueError(f"case_filter must be one of {', '.join(CASE_FILTERS)}")
        with self._reader() as conn:
            row = conn.execute(
                "SELECT id, name, created_ns, metadata, tags FROM experiments WHERE id = ?",
                (experiment_id,),
            ).fetchone()
            if row is None:
                return None
            head = self._experiment_head(conn, row)
            where = _CASES + _filter_sql(case_filter)
            if case_filter is None:
                head["case_rows"] = head["case_count"]
            else:
                head["case_rows"] = conn.execute(
                    f"SELECT count(*) FROM spans WHERE {where}", (experiment_id,)
                ).fetchone()[0]
            head["cases"] = _case_page(conn, experiment_id, where, preview, limit, offset)
            summary = conn.execute(
                TRACE_SELECT + " WHERE trace_id = ?", (experiment_id,)
            ).fetchone()
        head["limit"] = limit
        head["offset"] = offset
        head["case_filter"] = case_filter
        # The experiment's own span is the root of the trace whose id is the experiment id.
        head["trace"] = None if summary is None else trace_dict(summary)
        return head

    def experiment_trend(
        self,
        experiment_id: str,
        runs: int = 10,
        threshold: float = DEFAULT_REGRESSION_THRESHOLD,
        max_cases: int = 50,
    ) -> dict[str, Any] | None:
        """Each scorer over the last ``runs`` runs of the experiment named like this one, up
        to and including it (oldest first), and what regressed since the run before it.

        ``runs[i]``: id, created_ns, how many cases it ran and how many failed (task or
        scorer), and per scorer its mean and count.
        ``regressions[name]``: the mean's change since the previous run, whether it dropped by
        more than ``threshold`` (``mean_regressed``), how many cases (matched by case index,
        their repetitions averaged) scored more than ``threshold`` lower, and the worst
        ``max_cases`` of them. None when there is no such experiment.
        """
        with self._reader() as conn:
            row = conn.execute(
                "SELECT id, name, created_ns FROM experiments WHERE id = ?", (experiment_id,)
            ).fetchone()
            if row is None:
                return None
            _, name, created = row
            # Runs of the same experiment share its name; an unnamed one is its own series.
            if name is None:
                series = [(experiment_id, created)]
            else:
                series = conn.execute(
                    "SELECT id, created_ns FROM experiments WHERE name = ? AND "
                    "(created_ns < ? OR (created_ns = ? AND id <= ?)) "
                    "ORDER BY created_ns DESC, id DESC LIMIT ?",
                    (name, created, created, experiment_id, runs),
                ).fetchall()
            series.reverse()
            out_runs = []
            for run_id, run_created in series:
                # From the traces' summary rows (an index scan, no span read): a case is a
                # trace of the experiment other than the experiment's own.
                cases, failed = conn.execute(
                    "SELECT count(*), coalesce(sum(status_code = 2), 0) FROM traces "
                    "WHERE experiment_id = ? AND trace_id != ?",
                    (run_id, run_id),
                ).fetchone()
                out_runs.append(
                    {
                        "id": run_id,
                        "created_ns": run_created,
                        "case_count": cases,
                        "failed_count": failed,
                        "scores": _score_aggregates(conn, run_id),
                    }
                )
            regressions: dict[str, Any] = {}
            if len(out_runs) >= 2:
                prev, cur = out_runs[-2], out_runs[-1]
                for score in sorted(set(prev["scores"]) | set(cur["scores"])):
                    regressions[score] = _regression(conn, prev, cur, score, threshold, max_cases)
        return {
            "id": experiment_id,
            "name": name,
            "threshold": threshold,
            "runs": out_runs,
            "previous": out_runs[-2]["id"] if len(out_runs) >= 2 else None,
            "regressions": regressions,
        }


def _filter_sql(case_filter: str | None) -> str:
    if case_filter is None:
        return ""
    return {
        "task_error": f" AND {_TASK_ERROR}",
        "scorer_error": f" AND status_code = 2 AND {_FAILED_SCORERS} > 0",
        "error": " AND status_code = 2",
        "ok": " AND status_code != 2",
    }[case_filter]


def _score_aggregates(conn: sqlite3.Connection, exp_id: str) -> dict[str, dict[str, Any]]:
    return {
        name: {"mean": mean, "min": lo, "max": hi, "count": n}
        for name, mean, lo, hi, n in conn.execute(
            "SELECT name, avg(value), min(value), max(value), count(value) FROM scores "
            "WHERE experiment_id = ? GROUP BY name ORDER BY name",
            (exp_id,),
        )
    }


def _case_page(
    conn: sqlite3.Connection,
    experiment_id: str,
    where: str,
    preview: int,
    limit: int | None,
    offset: int,
) -> list[dict[str, Any]]:
    n = int(preview)
    case_rows = conn.execute(
        "SELECT start_ns, trace_id, span_id, case_index, name, end_ns, duration_ns, "
        f"status_code, status_message, substr(input, 1, {n}), substr(output, 1, {n}), "
        "json_extract(attributes, ?), in_progress, json_extract(attributes, ?), "
        "json_extract(attributes, ?), json_extract(attributes, ?), "
        "json_extract(attributes, ?), json_extract(attributes, ?), "
        "CASE WHEN status_code = 2 THEN attributes END, length(input), length(output) "
        f"FROM spans WHERE {where} "
        # A case's repetitions start in order: ordering by start skips reading each skipped
        # row's repetition out of its attributes (a page far down costs half as much).
        "ORDER BY case_index, start_ns LIMIT ? OFFSET ?",
        (
            f'$."{sc.EXPECTED_VALUE}"',
            _REPETITION_PATH,
            _ERROR_PATH,
            f'$."{sc.CASE_INPUT_TOKENS}"',
            f'$."{sc.CASE_OUTPUT_TOKENS}"',
            f'$."{sc.CASE_COST_USD}"',
            experiment_id,
            -1 if limit is None else limit,
            offset,
        ),
    ).fetchall()
    scores: dict[tuple[str, int | None], dict[str, float]] = {}
    comments: dict[tuple[str, int | None], dict[str, str]] = {}
    trace_ids = sorted({r[1] for r in case_rows})
    # The page's scores only, by their traces (the scores table's primary key).
    for start in range(0, len(trace_ids), 500):
        chunk = trace_ids[start : start + 500]
        for trace_id, case_index, name, value, comment in conn.execute(
            "SELECT trace_id, case_index, name, value, comment FROM scores "
            f"WHERE trace_id IN ({', '.join('?' * len(chunk))}) AND experiment_id = ? "
            "ORDER BY name",
            (*chunk, experiment_id),
        ):
            scores.setdefault((trace_id, case_index), {})[name] = value
            if comment is not None:
                comments.setdefault((trace_id, case_index), {})[name] = comment
    return [_case_dict(r, scores, comments) for r in case_rows]


def _case_dict(
    r: Sequence[Any],
    scores: dict[tuple[str, int | None], dict[str, float]],
    comments: dict[tuple[str, int | None], dict[str, str]],
) -> dict[str, Any]:
    failed = r[7] == 2
    scorer_errors: dict[str, str] = {}
    if failed and r[18] is not None:
        attributes = loads(r[18]) or {}
        prefix = sc.SCORER_ERROR_PREFIX
        scorer_errors = {
            k[len(prefix) :]: str(v) for k, v in sorted(attributes.items()) if k.startswith(prefix)
        }
    # The task's error: the case's own record of it, else a failure no scorer explains.
    task_error = (
        r[14] if r[14] is not None else (r[8] or "failed" if failed and not scorer_errors else None)
    )
    return {
        "case_index": r[3],
        "repetition": r[13],
        "trace_id": r[1],
        "span_id": r[2],
        "name": r[4],
        "start_ns": r[0],
        "end_ns": r[5],
        "duration_ns": r[6],
        "status": "error" if failed else "ok",
        "error": task_error,
        "scorer_errors": scorer_errors,
        "input": r[9],
        "output": r[10],
        "input_size": r[19],
        "output_size": r[20],
        "expected": r[11],
        "in_progress": bool(r[12]),
        "scores": scores.get((r[1], r[3]), {}),
        "comments": comments.get((r[1], r[3]), {}),
        "input_tokens": r[15],
        "output_tokens": r[16],
        "cost_usd": r[17],
    }


def _regression(
    conn: sqlite3.Connection,
    prev: dict[str, Any],
    cur: dict[str, Any],
    score: str,
    threshold: float,
    max_cases: int,
) -> dict[str, Any]:
    before = prev["scores"].get(score, {}).get("mean")
    after = cur["scores"].get(score, {}).get("mean")
    delta = None if before is None or after is None else after - before
    # Cases matched by dataset index; a case's repetitions are averaged first.
    per_case = (
        "SELECT case_index, avg(value) AS v FROM scores WHERE experiment_id = ? AND name = ? "
        "AND value IS NOT NULL AND case_index IS NOT NULL GROUP BY case_index"
    )
    # The worst cases and, on each row, how many dropped in all: one pass, not two.
    worst = conn.execute(
        f"SELECT case_index, p.v, c.v, count(*) OVER () FROM ({per_case}) AS p "
        f"JOIN ({per_case}) AS c USING (case_index) WHERE c.v < p.v - ? "
        "ORDER BY c.v - p.v, case_index LIMIT ?",
        (prev["id"], score, cur["id"], score, threshold, max_cases),
    ).fetchall()
    count = worst[0][3] if worst else 0
    return {
        "previous_mean": before,
        "mean": after,
        "delta": delta,
        "mean_regressed": delta is not None and delta < -threshold,
        "cases_dropped": count,
        "dropped": [{"case_index": i, "previous": p, "score": c} for i, p, c, _ in worst],
    }
