"""Attribute names looptrace writes, in one place so every module and backend agrees.

Payloads follow the OpenInference / OpenTelemetry GenAI conventions (``input.value``,
``output.value``) so other backends show them; looptrace's own facts live under ``looptrace.``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

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
# (GENAI_INPUT_TOKENS / GENAI_OUTPUT_TOKENS, with the GenAI names below.)
# A score is the double at SCORE_PREFIX + name; its comment is the string at
# SCORE_PREFIX + name + SCORE_COMMENT_SUFFIX (told apart by type: scores are never strings).
SCORE_COMMENT_SUFFIX = ".comment"
SCORER_ERROR_PREFIX = "looptrace.scorer_error."

# -- OpenTelemetry GenAI semantic conventions (v1.41) ---------------------------------------
# LLM call spans (looptrace._genai) and the scores and experiments built on them use these
# names; tests/_genai/test_semconv.py checks each against opentelemetry-semantic-conventions.
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"
# Replaced by gen_ai.provider.name; sent as well unless the latest conventions are opted into.
GEN_AI_SYSTEM = "gen_ai.system"
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_CONVERSATION_ID = "gen_ai.conversation.id"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_REQUEST_TEMPERATURE = "gen_ai.request.temperature"
GEN_AI_REQUEST_TOP_P = "gen_ai.request.top_p"
GEN_AI_REQUEST_TOP_K = "gen_ai.request.top_k"
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_STOP_SEQUENCES = "gen_ai.request.stop_sequences"
GEN_AI_REQUEST_FREQUENCY_PENALTY = "gen_ai.request.frequency_penalty"
GEN_AI_REQUEST_PRESENCE_PENALTY = "gen_ai.request.presence_penalty"
GEN_AI_REQUEST_SEED = "gen_ai.request.seed"
GEN_AI_REQUEST_CHOICE_COUNT = "gen_ai.request.choice.count"
GEN_AI_REQUEST_ENCODING_FORMATS = "gen_ai.request.encoding_formats"
GEN_AI_REQUEST_STREAM = "gen_ai.request.stream"
GEN_AI_RESPONSE_ID = "gen_ai.response.id"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
# Seconds (a double) from the request to the first chunk of a streamed response.
GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK = "gen_ai.response.time_to_first_chunk"
# Input tokens include the cached ones; output tokens include the reasoning ones.
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS = "gen_ai.usage.cache_read.input_tokens"
GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS = "gen_ai.usage.cache_creation.input_tokens"
GEN_AI_USAGE_REASONING_OUTPUT_TOKENS = "gen_ai.usage.reasoning.output_tokens"
GENAI_INPUT_TOKENS = GEN_AI_USAGE_INPUT_TOKENS
GENAI_OUTPUT_TOKENS = GEN_AI_USAGE_OUTPUT_TOKENS
GEN_AI_INPUT_MESSAGES = "gen_ai.input.messages"
GEN_AI_OUTPUT_MESSAGES = "gen_ai.output.messages"
GEN_AI_SYSTEM_INSTRUCTIONS = "gen_ai.system_instructions"
GEN_AI_TOOL_DEFINITIONS = "gen_ai.tool.definitions"
GEN_AI_EMBEDDINGS_DIMENSION_COUNT = "gen_ai.embeddings.dimension.count"
GEN_AI_AGENT_NAME = "gen_ai.agent.name"
GEN_AI_TOOL_NAME = "gen_ai.tool.name"
GEN_AI_TOOL_CALL_ID = "gen_ai.tool.call.id"
# An evaluation result: an event (or span) of this name, parented to the evaluated operation.
GEN_AI_EVALUATION_RESULT = "gen_ai.evaluation.result"
GEN_AI_EVALUATION_NAME = "gen_ai.evaluation.name"
GEN_AI_EVALUATION_SCORE_VALUE = "gen_ai.evaluation.score.value"
GEN_AI_EVALUATION_SCORE_LABEL = "gen_ai.evaluation.score.label"
GEN_AI_EVALUATION_EXPLANATION = "gen_ai.evaluation.explanation"
# gen_ai.operation.name values.
GEN_AI_OP_CHAT = "chat"
GEN_AI_OP_EMBEDDINGS = "embeddings"
GEN_AI_OP_INVOKE_AGENT = "invoke_agent"
GEN_AI_OP_EXECUTE_TOOL = "execute_tool"
# gen_ai.provider.name values.
GEN_AI_PROVIDER_OPENAI = "openai"
GEN_AI_PROVIDER_ANTHROPIC = "anthropic"

# Stable general attributes the GenAI spans carry.
ERROR_TYPE = "error.type"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"

# OTEL_SEMCONV_STABILITY_OPT_IN holds a comma-separated list; this value asks for the newest
# GenAI conventions only (no deprecated duplicates).
SEMCONV_OPT_IN_ENV = "OTEL_SEMCONV_STABILITY_OPT_IN"
GEN_AI_LATEST_EXPERIMENTAL = "gen_ai_latest_experimental"


def gen_ai_latest_experimental(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``OTEL_SEMCONV_STABILITY_OPT_IN`` lists ``gen_ai_latest_experimental``."""
    value = (os.environ if environ is None else environ).get(SEMCONV_OPT_IN_ENV, "")
    return GEN_AI_LATEST_EXPERIMENTAL in {v.strip().lower() for v in value.split(",")}


# -- OpenInference (what Arize Phoenix and other OpenInference backends read) ----------------
OPENINFERENCE_SPAN_KIND = "openinference.span.kind"
# openinference.span.kind values.
OI_CHAIN = "CHAIN"
OI_LLM = "LLM"
OI_EMBEDDING = "EMBEDDING"
OI_TOOL = "TOOL"
OI_AGENT = "AGENT"
OI_EVALUATOR = "EVALUATOR"
OI_RETRIEVER = "RETRIEVER"
OI_RERANKER = "RERANKER"
OI_GUARDRAIL = "GUARDRAIL"
OI_UNKNOWN = "UNKNOWN"
SESSION_ID = "session.id"
USER_ID = "user.id"
TAG_TAGS = "tag.tags"
METADATA = "metadata"
# USD.
LLM_COST_PROMPT = "llm.cost.prompt"
LLM_COST_COMPLETION = "llm.cost.completion"
LLM_COST_TOTAL = "llm.cost.total"
# OpenInference's token counts. LLM spans do not carry them: Phoenix derives them from
# gen_ai.usage.*, and their keys hold the word "token", which default redaction replaces.
LLM_TOKEN_COUNT_PROMPT = "llm.token_count.prompt"
LLM_TOKEN_COUNT_COMPLETION = "llm.token_count.completion"
LLM_TOKEN_COUNT_TOTAL = "llm.token_count.total"
LLM_TOKEN_COUNT_PROMPT_CACHE_READ = "llm.token_count.prompt_details.cache_read"
LLM_TOKEN_COUNT_PROMPT_CACHE_WRITE = "llm.token_count.prompt_details.cache_write"
LLM_TOKEN_COUNT_COMPLETION_REASONING = "llm.token_count.completion_details.reasoning"

# -- looptrace's own facts about an LLM call -------------------------------------------------
# They say "chunk", not "token": attribute keys holding the word "token" are redacted at export.
GENAI_STREAM_CLOSED_EARLY = "looptrace.genai.stream.closed_early"
GENAI_STREAM_ABANDONED = "looptrace.genai.stream.abandoned"
GENAI_LOOP_BLOCKED_MS = "looptrace.genai.loop_blocked_ms"
GENAI_LOOP_BLOCKED_BEFORE_FIRST_CHUNK_MS = "looptrace.genai.loop_blocked_before_first_chunk_ms"
# An event dating a stream's first content chunk.
GENAI_FIRST_CHUNK_EVENT = "gen_ai.first_token"

# -- Scores attached after the fact, and cost per case (the store and the viewer read these) --
# looptrace.span.type of a span that carries one score (GEN_AI_EVALUATION_*) of its parent span.
SPAN_TYPE_SCORE = "score"
# USD summed over the LLM calls of a case's trace that have a known price (absent: none had).
CASE_COST_USD = "looptrace.case.cost_usd"

# -- Langfuse ---------------------------------------------------------------------------------
# Langfuse reads session.id, user.id and tag.tags as they are, but trace metadata only under its
# own key: looptrace.attributes(metadata=...) writes the same JSON string there and at METADATA.
LANGFUSE_TRACE_METADATA = "langfuse.trace.metadata"

# looptrace.traced(as_type=...) / looptrace.span(..., as_type=...): each value and the
# openinference.span.kind it sets (``kind=`` stays the OpenTelemetry SpanKind).
OI_KINDS = {
    "chain": OI_CHAIN,
    "llm": OI_LLM,
    "embedding": OI_EMBEDDING,
    "tool": OI_TOOL,
    "agent": OI_AGENT,
    "evaluator": OI_EVALUATOR,
    "retriever": OI_RETRIEVER,
    "reranker": OI_RERANKER,
    "guardrail": OI_GUARDRAIL,
}

# -- Agent frameworks (looptrace.integrations) ------------------------------------------------
# The GenAI names the agent, tool and retrieval spans of the framework integrations add.
GEN_AI_TOOL_TYPE = "gen_ai.tool.type"
GEN_AI_TOOL_DESCRIPTION = "gen_ai.tool.description"
GEN_AI_TOOL_CALL_ARGUMENTS = "gen_ai.tool.call.arguments"
GEN_AI_TOOL_CALL_RESULT = "gen_ai.tool.call.result"
GEN_AI_DATA_SOURCE_ID = "gen_ai.data_source.id"
GEN_AI_OP_TEXT_COMPLETION = "text_completion"
GEN_AI_OP_RETRIEVAL = "retrieval"
GEN_AI_OP_INVOKE_WORKFLOW = "invoke_workflow"
# What the conventions have no name for: an agent's tools and handoffs (lists of names), a
# handoff's two agents, whether a guardrail tripped, and the framework a span came from.
AGENT_TOOLS = "looptrace.agent.tools"
AGENT_HANDOFFS = "looptrace.agent.handoffs"
AGENT_OUTPUT_TYPE = "looptrace.agent.output_type"
HANDOFF_FROM = "looptrace.handoff.from"
HANDOFF_TO = "looptrace.handoff.to"
GUARDRAIL_TRIGGERED = "looptrace.guardrail.triggered"
FRAMEWORK = "looptrace.framework"
# A framework's own run or span id, so a span can be found from the framework's logs.
FRAMEWORK_RUN_ID = "looptrace.framework.run_id"
# A framework span's own data that has no convention (a custom span's dict, MCP details), JSON.
FRAMEWORK_DATA = "looptrace.framework.data"
# A LangGraph node's name and superstep, on the span of the node's run.
LANGGRAPH_NODE = "looptrace.langgraph.node"
LANGGRAPH_STEP = "looptrace.langgraph.step"
