"""An LLM call's price in USD, from the price table of ``genai-prices`` (the ``genai`` extra).

The table ships inside the package: prices change when the package is upgraded, never at run
time (looptrace never starts genai-prices' ``UpdatePrices``, the one part of it that fetches).
genai-prices' calculation costs over a hundred microseconds of Python (it splits the usage
into priced units with exact decimals), so the call's path only records what the price needs:
the span carries three :class:`~looptrace._capture.spans.Deferred` values, and the flusher works
the price out when it encodes the span. There, a model whose price has no tiers is priced by an
affine function of the token counts, found once per price and token kinds from genai-prices' own
calculation and checked at a further point: a few exact decimal operations a call, the same
figures (see :func:`_affine`). The module is imported, and the table loaded (a few hundred
milliseconds), by ``instrument_openai`` / ``instrument_anthropic``, never by ``import
looptrace`` nor on the first call.

A model or provider the table does not know gets no cost attributes: no guess.
"""

from __future__ import annotations

import datetime
import logging
import threading
from decimal import Decimal
from typing import Any, cast

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
        counts = self.counts
        when = datetime.datetime.fromtimestamp(self.start_ns / 1e9, datetime.timezone.utc)
        for model in self.models:
            try:
                provider, info = snapshot.find_provider_model(model, None, provider_id, url)
            except LookupError:
                continue
            price = info.get_prices(when)
            affine = _affine(prices, provider, price, counts) if _in_range(counts) else None
            if affine is not None:
                cost_in, cost_out, total = _evaluate(affine, counts)
                return (float(cost_in), float(cost_out), float(total))
            calc = info.calc_price(prices.Usage(**counts), provider, genai_request_timestamp=when)
            return (float(calc.input_price), float(calc.output_price), float(calc.total_price))
        return ()


_ZERO = Decimal(0)
# Token counts of the points an affine price is found from: within the range every kind's
# decomposition allows (cached and cache-written input within the input, reasoning within the
# output), and past no tier (a price with tiers is never made affine).
_BASE = {
    "input_tokens": 1_000_000,
    "output_tokens": 1_000_000,
    "cache_read_tokens": 100_000,
    "cache_write_tokens": 100_000,
    "output_reasoning_tokens": 100_000,
}
_STEP = 1_000
_CHECK = {
    "input_tokens": 377_003,
    "output_tokens": 52_711,
    "cache_read_tokens": 91_807,
    "cache_write_tokens": 3_011,
    "output_reasoning_tokens": 20_399,
}
_Affine = tuple[tuple[Decimal, Decimal, Decimal], tuple[tuple[tuple[str, Decimal], ...], ...]]
# (id of the ModelPrice, token kinds) -> (the ModelPrice, kept alive so the id stays its own;
# the affine price, or None where the price is not affine).
_affines: dict[tuple[int, tuple[str, ...]], tuple[Any, _Affine | None]] = {}
_AFFINES_MAX = 512


def _evaluate(affine: _Affine, counts: dict[str, int]) -> tuple[Decimal, Decimal, Decimal]:
    """(input, output, total) of an affine price at ``counts``, exact."""
    (base_in, base_out, base_total), (terms_in, terms_out, terms_total) = affine
    # Written out, not looped over: this runs for every LLM span the flusher encodes.
    return (
        base_in + sum((s * counts[k] for k, s in terms_in), _ZERO),
        base_out + sum((s * counts[k] for k, s in terms_out), _ZERO),
        base_total + sum((s * counts[k] for k, s in terms_total), _ZERO),
    )


def _in_range(counts: dict[str, int]) -> bool:
    """Whether the counts lie where the decomposition into priced units is affine."""
    get = counts.get
    return get("cache_read_tokens", 0) + get("cache_write_tokens", 0) <= get(
        "input_tokens", 0
    ) and get("output_reasoning_tokens", 0) <= get("output_tokens", 0)


def _affine(prices: Any, provider: Any, price: Any, counts: dict[str, int]) -> _Affine | None:
    """The price as (input, output, total) = intercept + slopes . counts, in exact decimals,
    for this ModelPrice and these token kinds; None for a price with tiers, a provider whose
    billing genai-prices adjusts (Groq's minimum audio seconds), or one that is not affine at
    the check point. Found once, from genai-prices' own calculation."""
    kinds = tuple(sorted(counts))
    key = (id(price), kinds)
    hit = _affines.get(key)
    if hit is not None and hit[0] is price:
        return hit[1]
    found: _Affine | None = None
    tiered = prices.types.TieredPrices
    if (
        provider.id != "groq"
        and all(k in _BASE for k in kinds)
        and not any(isinstance(v, tiered) for v in vars(price).values())
    ):
        try:
            found = _fit(prices, price, kinds)
        except Exception:  # genai-prices refuses these kinds for this price: its own path says so
            found = None
    if len(_affines) >= _AFFINES_MAX:
        _affines.clear()
    _affines[key] = (price, found)
    return found


def _fit(prices: Any, price: Any, kinds: tuple[str, ...]) -> _Affine | None:
    def at(point: dict[str, int]) -> tuple[Decimal, Decimal, Decimal]:
        calc = price.calc_price(prices.Usage(**point))
        return (calc["input_price"], calc["output_price"], calc["total_price"])

    base = {k: _BASE[k] for k in kinds}
    at_base = at(base)
    slopes: list[list[tuple[str, Decimal]]] = [[], [], []]
    for k in kinds:
        moved = at({**base, k: base[k] + _STEP})
        for i in range(3):
            slope = (moved[i] - at_base[i]) / _STEP
            if slope:
                slopes[i].append((k, slope))
    intercept = tuple(
        at_base[i] - sum((s * base[k] for k, s in slopes[i]), _ZERO) for i in range(3)
    )
    affine = cast("_Affine", (intercept, tuple(tuple(s) for s in slopes)))
    check = {k: _CHECK[k] for k in kinds}
    return affine if _evaluate(affine, check) == at(check) else None


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
