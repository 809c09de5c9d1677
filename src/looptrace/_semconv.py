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
