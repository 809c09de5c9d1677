"""An LLM call's price in USD, from the price table of ``genai-prices`` (the ``genai`` extra).

The table ships inside the package: prices change when the package is upgraded, never at run
time (looptrace never starts genai-prices' ``UpdatePrices``, the one part of it that fetches).
A lookup costs about a millisecond of Python (genai-prices splits the usage into priced units
with exact decimals), so the call's path only records what the price needs: the span carries
three :class:`~looptrace._capture.spans.Deferred` values, and the flusher works the price out
when it encodes the span. The module is imported, and the table loaded (a few hundred
milliseconds), by ``instrument_openai`` / ``instrument_anthropic``, never by ``import
looptrace`` nor on the first call.

A model or provider the table does not know gets no cost attributes: no guess.
"""

from __future__ import annotations

import datetime
import logging
import threading
from typing import Any

from .. import _semconv as sc
from .._capture.spans import Deferred, Span
from .._errors import internal_error

logger = logging.getLogger("looptrace")

EXTRA = "genai"

# The genai_prices module once loaded; None until load() ran, False when it is not installed.
_prices: Any = None
# Whether calls get a price: read on every call's path, so a plain bool.
ready = False
_lock = threading.Lock()


def load() -> bool:
    """Import genai-prices and load its table, once (at instrument time: a few hundred
    milliseconds, which must not land on an event loop at the first call). Without the
    package, one line says how to install it, and calls carry no cost."""
    with _lock:
        if _prices is None:
            _load()
        return ready


def _load() -> None:
    global _prices, ready
    try:
        import genai_prices
        from genai_prices import data_snapshot

        data_snapshot.get_snapshot()
    except ImportError:
        from .._install import install_hint

        _prices = False
        logger.warning(
            "looptrace: LLM calls are traced without their cost in USD, which needs the "
            "genai-prices package: %s",
            install_hint(EXTRA),
        )
        return
    except Exception as exc:
        _prices = False
        internal_error("genai.cost.load", exc)
        return
    _prices = genai_prices
    ready = True


class Price:
    """What one call's price needs, recorded on the call's path; the price itself is worked
    out once, by the first of its three attributes the flusher encodes."""

    __slots__ = ("counts", "host", "models", "provider", "result", "start_ns")

    def __init__(
        self,
        provider: str,
        models: tuple[str, ...],
        host: str | None,
        counts: dict[str, int],
        start_ns: int,
    ) -> None:
        self.provider = provider
        self.models = models
        self.host = host
        self.counts = counts
        self.start_ns = start_ns
        # (prompt, completion, total) once worked out; () when the table has no price.
        self.result: tuple[float, float, float] | tuple[()] | None = None

    def get(self) -> tuple[float, float, float] | tuple[()]:
        result = self.result
        if result is None:
            try:
                result = self._calculate()
            except Exception as exc:  # on the flusher: no raise, no guess
                internal_error("genai.cost", exc)
                result = ()
            self.result = result
        return result

    def _calculate(self) -> tuple[float, float, float] | tuple[()]:
        prices = _prices
        if not prices:
            return ()
        snapshot = prices.data_snapshot.get_snapshot()
        provider_id: str | None = self.provider
        url = None if self.host is None else f"https://{self.host}"
        if url is not None:
            # An OpenAI-compatible API elsewhere (Groq, OpenRouter, Azure...) is priced as its
            # host's; an address the table does not know (a proxy, a local server) as the SDK's.
            try:
                snapshot.find_provider(None, None, url)
                provider_id = None
            except LookupError:
                url = None
        usage = prices.Usage(**self.counts)
        when = datetime.datetime.fromtimestamp(self.start_ns / 1e9, datetime.timezone.utc)
        for model in self.models:
            try:
                calc = prices.calc_price(
                    usage,
                    model,
                    provider_id=provider_id,
                    provider_api_url=url,
                    genai_request_timestamp=when,
                )
            except LookupError:
                continue
            return (float(calc.input_price), float(calc.output_price), float(calc.total_price))
        return ()


class CostPart(Deferred):
    """One of a call's ``llm.cost.*`` attributes: 0 prompt, 1 completion, 2 total."""

    __slots__ = ("index", "price")

    def __init__(self, price: Price, index: int) -> None:
        self.price = price
        self.index = index

    def resolve(self) -> float | None:
        result = self.price.get()
        return result[self.index] if result else None

    def __repr__(self) -> str:
        result = self.price.result
        return f"<cost {result[self.index] if result else 'not worked out'}>"


# gen_ai.usage.* -> genai-prices' Usage fields. Both count input with its cached tokens and
# output with its reasoning tokens, so the counts go across as they are.
_COUNTS = (
    (sc.GEN_AI_USAGE_INPUT_TOKENS, "input_tokens"),
    (sc.GEN_AI_USAGE_OUTPUT_TOKENS, "output_tokens"),
    (sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS, "cache_read_tokens"),
    (sc.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS, "cache_write_tokens"),
    (sc.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS, "output_reasoning_tokens"),
)


def attach(span: Span) -> None:
    """Give an LLM span about to end its ``llm.cost.*`` attributes, to be priced at export:
    a few dict reads and four small objects, no lookup."""
    attributes = span.attributes
    if not attributes:
        return
    counts: dict[str, int] = {}
    for key, name in _COUNTS:
        value = attributes.get(key)
        if type(value) is int and value > 0:
            counts[name] = value
    if not counts:
        return
    provider = attributes.get(sc.GEN_AI_PROVIDER_NAME)
    if type(provider) is not str:
        return
    # The model that answered first (a dated snapshot may be priced apart from its alias),
    # then the one asked for.
    answered = attributes.get(sc.GEN_AI_RESPONSE_MODEL)
    asked = attributes.get(sc.GEN_AI_REQUEST_MODEL)
    if type(answered) is not str or not answered:
        if type(asked) is not str or not asked:
            return
        models: tuple[str, ...] = (asked,)
    elif type(asked) is not str or not asked or asked == answered:
        models = (answered,)
    else:
        models = (answered, asked)
    host = attributes.get(sc.SERVER_ADDRESS)
    price = Price(
        provider, models, host if type(host) is str and host else None, counts, span.start_ns
    )
    attributes[sc.LLM_COST_PROMPT] = CostPart(price, 0)
    attributes[sc.LLM_COST_COMPLETION] = CostPart(price, 1)
    attributes[sc.LLM_COST_TOTAL] = CostPart(price, 2)
