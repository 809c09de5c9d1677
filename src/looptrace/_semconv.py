"""Attribute names looptrace writes, in one place so every module and backend agrees.

Payloads follow the OpenInference / OpenTelemetry GenAI conventions (``input.value``,
``output.value``) so other backends show them; looptrace's own facts live under ``looptrace.``.
"""

from __future__ import annotations

INPUT_VALUE = "input.value"
INPUT_MIME_TYPE = "input.mime_type"
OUTPUT_VALUE = "output.value"
OUTPUT_MIME_TYPE = "output.mime_type"
JSON_MIME = "application/json"

EXCEPTION_EVENT = "exception"
EXCEPTION_TYPE = "exception.type"
EXCEPTION_MESSAGE = "exception.message"
EXCEPTION_STACKTRACE = "exception.stacktrace"

CODE_FUNCTION = "code.function"
CODE_NAMESPACE = "code.namespace"

# A span whose generator yielded more items than were kept says how many there were.
GENERATOR_ITEMS = "looptrace.generator.items"
GENERATOR_CLOSED_EARLY = "looptrace.generator.closed_early"
CANCELLED = "looptrace.cancelled"
# Sent for a long-running root before it ends; the final record replaces it.
IN_PROGRESS = "looptrace.in_progress"
LOOP_LAG_MAX_MS = "looptrace.loop.lag_max_ms"
SPAN_TYPE = "looptrace.span.type"

EXPERIMENT_ID = "looptrace.experiment.id"
EXPERIMENT_NAME = "looptrace.experiment.name"
CASE_INDEX = "looptrace.case.index"
EXPECTED_VALUE = "looptrace.expected.value"
SCORE_PREFIX = "looptrace.score."

# Evaluations (see docs/evals.md; the store reads these, keep them stable).
SPAN_TYPE_EXPERIMENT = "experiment"
SPAN_TYPE_CASE = "case"
EXPERIMENT_METADATA = "looptrace.experiment.metadata"
EXPERIMENT_TAGS = "looptrace.experiment.tags"
EXPERIMENT_CASES = "looptrace.experiment.cases"
EXPERIMENT_ERRORS = "looptrace.experiment.errors"
CASE_REPETITION = "looptrace.case.repetition"
CASE_METADATA = "looptrace.case.metadata"
CASE_ERROR = "looptrace.case.error"
CASE_DURATION_MS = "looptrace.case.duration_ms"
# GenAI token usage summed over the spans of a case's trace (gen_ai.usage.* on each LLM span).
CASE_INPUT_TOKENS = "looptrace.case.input_tokens"
CASE_OUTPUT_TOKENS = "looptrace.case.output_tokens"
GENAI_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GENAI_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
# A score is the double at SCORE_PREFIX + name; its comment is the string at
# SCORE_PREFIX + name + SCORE_COMMENT_SUFFIX (told apart by type: scores are never strings).
SCORE_COMMENT_SUFFIX = ".comment"
SCORER_ERROR_PREFIX = "looptrace.scorer_error."
