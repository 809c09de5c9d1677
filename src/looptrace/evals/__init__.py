"""Evaluations: run a task over a dataset, score every output, and compare runs, traced end to end.

    async with looptrace.experiment("qa", metadata={"model": "m1"}) as exp:
        await exp.run(answer, dataset, scorers=[exact_match], concurrency=4)
    # a summary is printed here; exp.summary() and exp.results hold the same data

Spans flow through the normal pipeline: there is no flush per case. A case waits before it starts
only while the pipeline's pending plus in-flight bytes exceed ``backpressure_bytes``
(``LOOPTRACE_FLUSH_BACKPRESSURE_BYTES``); leaving the block flushes once, with the shutdown
deadline, and the summary says what could not be sent.

What lands on the spans (attribute names are stable; the store and viewer read them):

Experiment span (a root, named after the experiment):
    looptrace.span.type          "experiment"
    looptrace.experiment.id      the experiment id: this span's trace id, 32 lowercase hex digits
    looptrace.experiment.name    the name
    looptrace.experiment.metadata  the metadata mapping (JSON string on the wire)
    looptrace.experiment.tags    the tags (list of strings)
    looptrace.experiment.cases   cases finished (set when the block ends)
    looptrace.experiment.errors  cases whose task failed (set when the block ends)

Case root (a root of its own trace, named ``case <index>``, linked to the experiment span;
the task's spans nest under it):
    looptrace.span.type          "case"
    looptrace.experiment.id / looptrace.experiment.name   as above
    looptrace.case.index         position in the dataset (unique within the experiment)
    looptrace.case.repetition    0 .. repetitions-1
    input.value / output.value   the input and the task's output (JSON; LOOPTRACE_CAPTURE_INPUTS /
                                 LOOPTRACE_CAPTURE_OUTPUTS=false leave them out)
    looptrace.expected.value     the expected output (JSON unless a primitive; left out with inputs)
    looptrace.case.metadata      the case's metadata, when it has some
    looptrace.case.duration_ms   how long the task ran (scorers excluded; the whole block for a
                                 manual case)
    looptrace.case.input_tokens / looptrace.case.output_tokens   the sums of gen_ai.usage.*
                                 over the spans of the case's trace that ended before the case
                                 (LLM calls, see docs/genai.md), when there are any
    looptrace.case.error         "Type: message" when the task raised or timed out
    looptrace.score.<name>       each score, a double (a bool scores 1.0 / 0.0)
    looptrace.score.<name>.comment   the score's comment, a string, when there is one
    looptrace.scorer_error.<scorer>  "Type: message" when a scorer raised
    status ERROR, with an ``exception`` event, when the task or a scorer raised.
"""

from __future__ import annotations

from ._case import Case
from ._experiment import Experiment, experiment, run_experiment
from ._results import CaseResult, ExperimentSummary, Score, ScoreSummary

__all__ = [
    "Case",
    "CaseResult",
    "Experiment",
    "ExperimentSummary",
    "Score",
    "ScoreSummary",
    "experiment",
    "run_experiment",
]
