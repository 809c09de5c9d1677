"""What the framework integrations share: the open spans of a framework's runs (bounded), the
activation that makes work done inside a run nest under its span, and an LLM span's usage,
error and cost.

Every callback a framework makes into looptrace runs on the framework's path (often its event
loop): it creates, activates or ends a span and keeps references to what it records. Nothing
here serializes, locks for long, or does I/O.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from .. import _semconv as sc
from .. import _state
from .._capture.spans import Span
from .._capture.start import _activate, _deactivate, _release
from .._errors import internal_error
from .._genai import _core, _cost

logger = logging.getLogger("looptrace")

F = TypeVar("F", bound=Callable[..., Any])

# Open spans kept per integration at most: a framework that starts runs and never ends them
# (a bug, or runs abandoned mid-way) costs this many entries, then its new runs go untraced,
# counted and said once.
MAX_OPEN = 10_000

content_enabled = _core.content_enabled
error_type = _core.error_type


def guarded(where: str) -> Callable[[F], F]:
    """A framework callback that never raises into the framework: a failure is counted and
    logged once as a looptrace internal error, and the callback returns None."""

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except Exception as exc:
                internal_error(where, exc)
                return None

        return wrapper  # type: ignore[return-value]

    return decorate


class Open:
    """One open span of a framework run, the tokens that made it the active span, and the
    object the run was handed as its input (for a framework whose child runs are often handed
    the very same object: recorded once, on the outermost span)."""

    __slots__ = ("first_ns", "inputs", "span", "tokens")

    def __init__(self, span: Span, tokens: tuple[Any, Any, Any] | None) -> None:
        self.span = span
        self.tokens = tokens
        self.first_ns = 0
        self.inputs: Any = None


class Runs:
    """The open spans of one integration, by the framework's id of each run; at most
    :data:`MAX_OPEN` at once (past it, a run is untraced and counted in ``dropped``)."""

    def __init__(self, name: str, limit: int = MAX_OPEN) -> None:
        self.name = name
        self.limit = limit
        self.dropped = 0
        self._open: dict[Any, Open] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._open)

    def add(self, key: Any, entry: Open) -> bool:
        with self._lock:
            if len(self._open) >= self.limit:
                self.dropped += 1
                first = self.dropped == 1
            else:
                self._open[key] = entry
                return True
        if first:
            logger.warning(
                "looptrace: %s has %d runs open that never ended; new runs go untraced, "
                "and are counted, until some end",
                self.name,
                self.limit,
            )
        return False

    def get(self, key: Any) -> Open | None:
        return self._open.get(key)

    def pop(self, key: Any) -> Open | None:
        with self._lock:
            return self._open.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._open.clear()


def activate(span: Span) -> tuple[Any, Any, Any] | None:
    """Make ``span`` the active span in the calling context, so what the framework runs inside
    it (a tool's code, an instrumented SDK call, ``@traced`` functions) nests under it."""
    if not span.is_recording:
        return None
    return _activate(span)


def deactivate(tokens: tuple[Any, Any, Any] | None, span: Span | None = None) -> None:
    """Undo :func:`activate`; ``span``: the span it activated, ending now (before
    ``span.end()``). A run that ends in another context than the one it started in (LangChain
    ends an async run in a copy of the caller's context) leaves it the active span of that
    context, which looptrace cannot reach from here: the span is marked, and spans started
    there later go under the span that was active before it, not under the ended run."""
    if tokens is None:
        return
    if span is not None:
        _release(span, tokens)
        return
    try:
        _deactivate(tokens)
    except ValueError:
        pass  # a span that never ran (not added): nothing was started under it


def disabled() -> bool:
    return _state.disabled


def set_usage(
    attributes: dict[str, Any],
    input_tokens: Any,
    output_tokens: Any,
    cache_read: Any = None,
    cache_creation: Any = None,
    reasoning: Any = None,
) -> None:
    """Token counts as the GenAI conventions count them (input includes cached tokens, output
    includes reasoning tokens); absent or non-integer counts are left out."""
    if type(input_tokens) is int:
        attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] = input_tokens
    if type(output_tokens) is int:
        attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] = output_tokens
    _core.set_count(attributes, sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS, cache_read)
    _core.set_count(attributes, sc.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS, cache_creation)
    _core.set_count(attributes, sc.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS, reasoning)


def fail(span: Span, exc: BaseException) -> None:
    """Record a failure: the exception event, status ERROR and ``error.type``."""
    span.set_attribute(sc.ERROR_TYPE, error_type(exc))
    span.fail(exc)


def price(span: Span) -> None:
    """Give an LLM span its ``llm.cost.*`` from genai-prices' table (worked out at export),
    when the table is loaded and the span has no cost of its own."""
    attributes = span.attributes
    if _cost.ready and attributes is not None and sc.LLM_COST_TOTAL not in attributes:
        _cost.attach(span)


_prices_loading = False


def load_prices() -> None:
    """Load the price table, once per process: a few hundred milliseconds of import and file
    reading, which must not land on an event loop. Called on a thread with a running loop, the
    table is loaded by a thread of its own instead (LLM spans that end before it is ready have
    no cost)."""
    global _prices_loading
    _core.refresh_conventions()
    if _cost.ready or _prices_loading:
        return
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        _cost.load()
        return
    _prices_loading = True
    threading.Thread(target=_cost.load, name="looptrace-prices", daemon=True).start()


# The provider names frameworks use -> gen_ai.provider.name (the conventions' values, which
# genai-prices also reads). A name not listed is written as the framework gives it.
PROVIDERS = {
    "openai": sc.GEN_AI_PROVIDER_OPENAI,
    "text-completion-openai": sc.GEN_AI_PROVIDER_OPENAI,
    "azure": "azure.ai.openai",
    "azure_openai": "azure.ai.openai",
    "anthropic": sc.GEN_AI_PROVIDER_ANTHROPIC,
    "bedrock": "aws.bedrock",
    "amazon_bedrock": "aws.bedrock",
    "vertex_ai": "gcp.vertex_ai",
    "google_vertexai": "gcp.vertex_ai",
    "gemini": "gcp.gemini",
    "google_genai": "gcp.gen_ai",
    "cohere": "cohere",
    "mistral": "mistral_ai",
    "mistralai": "mistral_ai",
    "groq": "groq",
    "deepseek": "deepseek",
    "xai": "x_ai",
    "perplexity": "perplexity",
    "watsonx": "ibm.watsonx.ai",
}


def provider_name(raw: Any) -> str | None:
    if not isinstance(raw, str) or not raw:
        return None
    return PROVIDERS.get(raw.lower(), raw)


def llm_attributes(operation: str, provider: str | None, model: str | None) -> dict[str, Any]:
    """What an LLM span starts with: operation, provider, model and the OpenInference kind."""
    attributes: dict[str, Any] = {
        sc.OPENINFERENCE_SPAN_KIND: sc.OI_LLM,
        sc.GEN_AI_OPERATION_NAME: operation,
    }
    if provider:
        attributes[sc.GEN_AI_PROVIDER_NAME] = provider
        if not _core.latest:
            attributes[sc.GEN_AI_SYSTEM] = provider
    if model:
        attributes[sc.GEN_AI_REQUEST_MODEL] = model
    return attributes
