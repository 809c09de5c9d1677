"""Experiments built span by span (as the collector would store them), for tests and benchmarks
of the experiment pages: many cases, repetitions, task errors, failing scorers, several runs."""

from __future__ import annotations

from typing import Any

from looptrace import _semconv as sc
from looptrace._wire import DecodedSpan
from store_support import decoded_span

MS = 10**6


def experiment_spans(
    exp_id: str,
    name: str,
    start_ns: int,
    cases: int,
    *,
    repetitions: int = 1,
    score: Any = None,
    task_errors: frozenset[int] = frozenset(),
    scorer_errors: dict[int, tuple[str, ...]] | None = None,
    children: int = 1,
    input_chars: int = 0,
) -> list[DecodedSpan]:
    """An experiment ``exp_id`` (32 hex digits) of ``cases`` dataset rows run ``repetitions``
    times: its own span, then per case and repetition a case span (its own trace) with
    ``children`` child spans. ``score(case, repetition)`` gives the ``accuracy`` score (None:
    none; a dict: one score per name); cases in ``task_errors`` fail in the task, and ``scorer_errors[case]`` names the
    scorers that raised on that case (every repetition)."""
    scorer_errors = scorer_errors or {}
    exp_trace = int(exp_id, 16)
    common = {sc.EXPERIMENT_ID: exp_id, sc.EXPERIMENT_NAME: name}
    total = cases * repetitions
    out = [
        decoded_span(
            exp_trace,
            1,
            None,
            name,
            start_ns,
            start_ns + (total + 1) * MS,
            attributes={**common, sc.EXPERIMENT_CASES: total},
            resource={"service.name": "experiments-test"},
        )
    ]
    padding = "x" * input_chars
    for rep in range(repetitions):
        for i in range(cases):
            n = rep * cases + i
            # Case traces get ids of their own, apart from the experiment's and every other run's.
            trace = (exp_trace << 24) + n + 1
            t0 = start_ns + n * MS
            attrs: dict[str, Any] = {
                **common,
                sc.SPAN_TYPE: sc.SPAN_TYPE_CASE,
                sc.CASE_INDEX: i,
                sc.CASE_REPETITION: rep,
                "input.value": f'{{"question": "What is {i} + {i}?", "pad": "{padding}"}}',
                "output.value": f'"{2 * i}"',
                sc.EXPECTED_VALUE: f'"{2 * i}"',
            }
            status, message = 0, ""
            if i in task_errors:
                attrs[sc.CASE_ERROR] = "ValueError: no answer"
                status, message = 2, "ValueError: no answer"
            for scorer in scorer_errors.get(i, ()):
                attrs[sc.SCORER_ERROR_PREFIX + scorer] = f"KeyError: {scorer}"
                if status == 0:
                    status, message = 2, f"scorer {scorer} failed: KeyError: {scorer}"
            value = None if score is None else score(i, rep)
            named = value if isinstance(value, dict) else {"accuracy": value}
            for score_name, v in named.items():
                if v is not None:
                    attrs[sc.SCORE_PREFIX + score_name] = float(v)
            out.append(
                decoded_span(
                    trace,
                    1,
                    None,
                    f"case {i}",
                    t0,
                    t0 + MS,
                    attributes=attrs,
                    status=status,
                    message=message,
                    resource={"service.name": "experiments-test"},
                )
            )
            for c in range(children):
                out.append(
                    decoded_span(
                        trace,
                        2 + c,
                        1,
                        "step",
                        t0 + 10,
                        t0 + MS // 2,
                        attributes={**common, sc.CASE_INDEX: i},
                        resource={"service.name": "experiments-test"},
                    )
                )
    return out
