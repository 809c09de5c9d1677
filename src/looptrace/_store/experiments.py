"""Reads of experiments: the list with case, error, token and score summaries, and one
experiment's cases in case order."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from .. import _semconv as sc
from .columns import loads
from .connection import Connections
from .traces import TRACE_SELECT, trace_dict


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
        cases, errors = conn.execute(
            "SELECT count(*), coalesce(sum(status_code = 2), 0) FROM ("
            "SELECT min(start_ns), status_code FROM spans "
            "WHERE experiment_id = ? AND case_index IS NOT NULL GROUP BY trace_id, case_index)",
            (exp_id,),
        ).fetchone()
        # The cost is summed over the cases that have one: None when none has (never 0).
        tokens_in, tokens_out, cost, costed = conn.execute(
            "SELECT coalesce(sum(i), 0), coalesce(sum(o), 0), sum(c), count(c) FROM ("
            "SELECT min(start_ns), json_extract(attributes, ?) AS i, "
            "json_extract(attributes, ?) AS o, json_extract(attributes, ?) AS c FROM spans "
            "WHERE experiment_id = ? AND case_index IS NOT NULL GROUP BY trace_id, case_index)",
            (
                f'$."{sc.CASE_INPUT_TOKENS}"',
                f'$."{sc.CASE_OUTPUT_TOKENS}"',
                f'$."{sc.CASE_COST_USD}"',
                exp_id,
            ),
        ).fetchone()
        scores = {
            name: {"mean": mean, "min": lo, "max": hi, "count": n}
            for name, mean, lo, hi, n in conn.execute(
                "SELECT name, avg(value), min(value), max(value), count(value) FROM scores "
                "WHERE experiment_id = ? GROUP BY name ORDER BY name",
                (exp_id,),
            )
        }
        return {
            "id": exp_id,
            "name": row[1],
            "created_ns": row[2],
            "metadata": loads(row[3]),
            "tags": loads(row[4]),
            "case_count": cases,
            "error_count": errors,
            "input_tokens": tokens_in,
            "output_tokens": tokens_out,
            "cost_usd": cost,
            "costed_cases": costed,
            "scores": scores,
        }

    def get_experiment(self, experiment_id: str, preview: int = 200) -> dict[str, Any] | None:
        """One experiment with its cases (in case order) and score aggregates, or None."""
        with self._reader() as conn:
            row = conn.execute(
                "SELECT id, name, created_ns, metadata, tags FROM experiments WHERE id = ?",
                (experiment_id,),
            ).fetchone()
            if row is None:
                return None
            head = self._experiment_head(conn, row)
            n = int(preview)
            case_rows = conn.execute(
                "SELECT min(start_ns), trace_id, span_id, case_index, name, end_ns, duration_ns, "
                f"status_code, status_message, substr(input, 1, {n}), substr(output, 1, {n}), "
                "json_extract(attributes, ?), in_progress, json_extract(attributes, ?), "
                "json_extract(attributes, ?), json_extract(attributes, ?), "
                "json_extract(attributes, ?), json_extract(attributes, ?) FROM spans "
                "WHERE experiment_id = ? AND case_index IS NOT NULL "
                "GROUP BY trace_id, case_index ORDER BY case_index, min(start_ns)",
                (
                    f'$."{sc.EXPECTED_VALUE}"',
                    f'$."{sc.CASE_REPETITION}"',
                    f'$."{sc.CASE_ERROR}"',
                    f'$."{sc.CASE_INPUT_TOKENS}"',
                    f'$."{sc.CASE_OUTPUT_TOKENS}"',
                    f'$."{sc.CASE_COST_USD}"',
                    experiment_id,
                ),
            ).fetchall()
            scores: dict[tuple[str, int | None], dict[str, float]] = {}
            comments: dict[tuple[str, int | None], dict[str, str]] = {}
            for trace_id, case_index, name, value, comment in conn.execute(
                "SELECT trace_id, case_index, name, value, comment FROM scores "
                "WHERE experiment_id = ? ORDER BY name",
                (experiment_id,),
            ):
                scores.setdefault((trace_id, case_index), {})[name] = value
                if comment is not None:
                    comments.setdefault((trace_id, case_index), {})[name] = comment
            summary = conn.execute(
                TRACE_SELECT + " WHERE trace_id = ?", (experiment_id,)
            ).fetchone()
        head["cases"] = [
            {
                "case_index": r[3],
                "trace_id": r[1],
                "span_id": r[2],
                "name": r[4],
                "start_ns": r[0],
                "end_ns": r[5],
                "duration_ns": r[6],
                "status": "error" if r[7] == 2 else "ok",
                "error": r[14] if r[14] is not None else (r[8] if r[7] == 2 else None),
                "repetition": r[13],
                "input": r[9],
                "output": r[10],
                "expected": r[11],
                "in_progress": bool(r[12]),
                "scores": scores.get((r[1], r[3]), {}),
                "comments": comments.get((r[1], r[3]), {}),
                "input_tokens": r[15],
                "output_tokens": r[16],
                "cost_usd": r[17],
            }
            for r in case_rows
        ]
        # The experiment's own span is the root of the trace whose id is the experiment id.
        head["trace"] = None if summary is None else trace_dict(summary)
        return head
