"""Turn whatever user code recorded into OTLP-ready attributes: total, bounded, redacted.

    to_json(value, cfg)   -> str       one value as JSON text; never raises
    to_wire(span, cfg)    -> WireSpan  a whole span (attributes, payloads, events, links)
    estimate_size(span)   -> int       O(top-level arguments) guess for buffer accounting

Two paths. The fast path is one ``orjson.dumps`` call with a ``default`` hook for the types
orjson does not know; it covers almost every value. When orjson refuses (a cycle, nesting past
its limit, a lone surrogate, an integer wider than 64 bits, a key it cannot write), when the
output holds something that looks like a secret key, or when the output is over the size cap,
the careful path walks the value once, converting, redacting and cutting as it goes, and then
dumps the result. A value that defeats both becomes a placeholder naming its type, and
``stats["placeholders"]`` counts it. See docs/serialization.md for every rule.

The parts: ``policy`` (secret keys and the scan for them), ``keys`` (the scan that finds the
keys of long output from their ends and skips those it has learned), ``convert`` (types orjson
does not know), ``walk`` (the fast and the careful path for one value), ``spans`` (a span's
attributes, payloads, events and links) and ``sizing`` (the buffer's estimate).
"""

from __future__ import annotations

from ._common import REDACTED, TRUNCATED_KEY, counted, logger, stats
from .convert import placeholder
from .policy import Policy, has_policy, policy
from .sizing import estimate_size, leaf_size, learn_sizes
from .spans import _attributes as attributes_into
from .spans import _code_attributes as code_attributes
from .spans import _context_attributes as context_attributes
from .spans import _payloads as payloads
from .spans import _site_attributes as site_attributes
from .spans import (
    capped,
    finish,
    finish_payloads,
    prepare,
    to_wire,
    to_wire_or_steps,
)
from .walk import _dumps as dumps
from .walk import dumps_or_steps, snapshot, to_json

__all__ = [
    "REDACTED",
    "TRUNCATED_KEY",
    "Policy",
    "attributes_into",
    "capped",
    "code_attributes",
    "context_attributes",
    "counted",
    "dumps",
    "dumps_or_steps",
    "estimate_size",
    "finish",
    "finish_payloads",
    "has_policy",
    "leaf_size",
    "learn_sizes",
    "logger",
    "payloads",
    "placeholder",
    "policy",
    "prepare",
    "site_attributes",
    "snapshot",
    "stats",
    "to_json",
    "to_wire",
    "to_wire_or_steps",
]
