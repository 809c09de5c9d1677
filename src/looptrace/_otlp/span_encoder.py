"""The OTLP exporter's per-span step: plan how to serialize a span, then write its encoded chunk.

Not imported by ``_otlp``'s package root: a worker process encodes with ``_otlp`` and needs
none of capture, which this module reads spans from. It writes from what ``_serialize`` offers
it by name (``attributes_into``, ``code_attributes``, ``context_attributes``, ``payloads``,
``dumps``...), never from that package's private modules.

    enc = SpanEncoder(cfg)
    flags = enc.plan(span)      -> OFFLOAD | CLEAN | HOOKED | LARGE   one bounded walk
    chunk = enc.encode(span, flags)  -> bytes         what encode_request splices in
    chunk = yield from enc.steps(span, flags)         the same, LARGE or HOOKED: long JSON in steps

Two routes to the same bytes. The general one is ``_otlp.encode_span(_serialize.to_wire(...))``:
a :class:`~looptrace._wire.WireSpan` first, then its encoding; it handles everything (events,
links, in-progress records, OTLP/JSON). Most spans are a name, ids, times, the attributes their
decorator fixed, perhaps a few of their own, and an input and an output: for those, in protobuf,
``encode`` writes the message straight from the span. The decorator's attributes are encoded
once per call site and reused; the payloads go from orjson's bytes to the wire with no str in
between; no WireSpan, attribute list or tuple is built. The planning walk also settles whether
the payloads can hold a secret key, so their JSON is scanned for one only when it might. That is
most of the flusher's CPU per span (docs/performance.md). The tests check both routes give
identical bytes.
"""

from __future__ import annotations

import datetime
import decimal
import itertools
import uuid
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

from .. import _serialize
from .._capture.attributes import ContextAttributes
from .._capture.spans import UNSET, CallSite, Deferred, Span
from .._semconv import (
    INPUT_MIME_TYPE,
    INPUT_VALUE,
    OI_CHAIN,
    OPENINFERENCE_SPAN_KIND,
    OUTPUT_MIME_TYPE,
    OUTPUT_VALUE,
)
from .._wire import AttrValue, WireSpan
from .pb import _ATTR_CACHE as _PIECES
from .pb import (
    _SHORT,
    MIME_PIECE,
    payload_attributes,
    span_attributes,
    span_head,
    span_tail,
    string_attribute,
)
from .request import ScopedChunk, encode_span

if TYPE_CHECKING:
    from .._config import Config

__all__ = ["CLEAN", "HOOKED", "LARGE", "OFFLOAD", "SpanEncoder"]

OFFLOAD = 1
"""Enough string/bytes payload (``offload_threshold_bytes``) to serialize in a worker process,
or, where no worker takes it, in :meth:`SpanEncoder.steps`. Only with ``offload`` on."""
CLEAN = 2
"""The walk saw every object key the input and output can produce, and none is secret: their
JSON need not be scanned for secret keys."""
HOOKED = 4
"""A ``process_inputs``/``process_outputs`` hook applies to this span."""
LARGE = 8
"""Long enough JSON to be worth :meth:`SpanEncoder.steps`: the walk stopped short of the end of
a payload (more containers and values than it visits), or its strings, bytes and arrays came to
:data:`_STEPS_FROM_BYTES` or more."""

_WALK_BUDGET = 256
# String, bytes and array payload (or, in :meth:`SpanEncoder.steps`, JSON) from which a span
# no worker takes is written in steps (:data:`LARGE`): orjson's pass, the key scan, the masking
# and the message are each about a millisecond or less for a 2.5 MB image, where in one step
# they held the loop for 2-4 ms.
_STEPS_FROM_BYTES = 256 * 1024
# What the walk passes over: scalars (no size, no keys) and an unset input or output.
_SKIP = frozenset((int, float, bool, type(None), type(UNSET)))
# Leaves whose JSON can never hold an object key (so never a secret one).
_KEYLESS = frozenset(
    (
        str,
        bytes,
        bytearray,
        datetime.datetime,
        datetime.date,
        datetime.time,
        datetime.timedelta,
        uuid.UUID,
        decimal.Decimal,
    )
)

_span_head = span_head
_span_attributes = span_attributes
_string_attribute = string_attribute
_dumps = _serialize.dumps
_FLAGS = (span_tail(0, "", False), span_tail(0, "", True))
_IN_MIME = MIME_PIECE[INPUT_MIME_TYPE]
_OUT_MIME = MIME_PIECE[OUTPUT_MIME_TYPE]


class _SiteBlock:
    """A call site's attributes (its decorator's, then code.*), encoded once per policy."""

    __slots__ = ("counts", "encoded", "keys", "text_len")

    def __init__(self, site: CallSite, pol: _serialize.Policy) -> None:
        # The general route's conversion, kept per site; what it counted (redactions,
        # truncations...) is counted again on every span that carries these attributes.
        converted = _serialize.site_attributes(site, pol)
        self.counts = converted.counts
        items = converted.items
        parts: list[bytes] = []
        _span_attributes(items, parts)
        self.encoded = b"".join(parts)
        self.keys = frozenset(k for k, _ in items)
        # The per-span cap counts attribute text (as ``finish`` does) against the payloads.
        self.text_len = sum(len(v) for _, v in items if type(v) is str)


class _SharedBlock:
    """A ``looptrace.attributes`` block's attributes (session, user, tags, metadata), encoded
    once per policy for every span started inside it."""

    __slots__ = ("encoded", "keys", "text_len")

    def __init__(self, shared: ContextAttributes, pol: _serialize.Policy) -> None:
        items = list(_serialize.context_attributes(shared, pol))
        parts: list[bytes] = []
        _span_attributes(items, parts)
        self.encoded = b"".join(parts)
        self.keys = frozenset(k for k, _ in items)
        self.text_len = sum(len(v) for _, v in items if type(v) is str)


def _chain_piece() -> bytes:
    parts: list[bytes] = []
    _span_attributes([(OPENINFERENCE_SPAN_KIND, OI_CHAIN)], parts)
    return b"".join(parts)


# What looptrace's own spans say when they name no kind (as _serialize.spans writes it).
_CHAIN = _chain_piece()

_BLOCKS_MAX = 4096


class SpanEncoder:
    """:meth:`plan` and :meth:`encode` for one configuration (what a drain needs, looked up
    once instead of once per span)."""

    __slots__ = (
        "_blocks",
        "_shared",
        "_short",
        "cfg",
        "encoding",
        "global_hooks",
        "max_span_bytes",
        "pol",
        "threshold",
    )

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.pol = _serialize.policy(cfg)
        self.encoding = cfg.encoding
        self.threshold = cfg.offload_threshold_bytes if cfg.offload else -1
        self.global_hooks = cfg.process_inputs is not None or cfg.process_outputs is not None
        self.max_span_bytes = cfg.max_span_bytes
        self._blocks: dict[CallSite, _SiteBlock] = {}
        self._shared: dict[ContextAttributes, _SharedBlock] = {}
        # The longest string an attribute's cached piece can hold, unchanged by the value cap.
        self._short = min(_SHORT - 1, self.pol.max_value_bytes) if self.pol.redact else -1

    def plan(self, span: Span) -> int:
        """One bounded walk over a span's values, deciding how it is serialized.

        Visits at most ~256 containers and values. Sums the sizes of strings, bytes and arrays
        (:data:`OFFLOAD` once they pass the offload threshold: structure-heavy values never
        qualify, they serialize faster inline; :data:`LARGE` from a lower size, for
        :meth:`steps`), and checks the keys of each dict it passes
        against the redaction rule (:data:`CLEAN` when the walk finished, every key was a
        string, none was secret, every leaf was of a kind that cannot hold keys and no user
        hook will change the values). It runs for every span, so scalars and strings are
        settled where they are found, only containers are stacked, and a dict's keys are
        checked in one set comparison once they have been seen before."""
        site = span.site
        if self.global_hooks or (
            site is not None and (site.process_inputs or site.process_outputs)
        ):
            hooked, clean = HOOKED, False
        else:
            hooked, clean = 0, True
        pol = self.pol
        threshold = self.threshold
        steps_from = _STEPS_FROM_BYTES
        check_keys = clean and pol.redact
        stack: list[Any] = [span.inputs, span.output]
        if span.attributes:
            # Attribute values count toward the payload size; their top-level keys are not
            # JSON keys (they are redacted by name when the span is encoded). Walked as one
            # tuple: its scalars are settled in the loop over it, not popped one by one.
            stack.append(tuple(span.attributes.values()))
        plain = pol._plain_keys
        total = 0
        budget = _WALK_BUDGET
        skip = _SKIP
        try:
            while stack:
                if budget <= 0:
                    return hooked | LARGE
                v = stack.pop()
                cls = type(v)
                values: Any
                if cls is dict:
                    n = len(v)
                    if n > budget:
                        clean = check_keys = False
                        hooked |= LARGE
                        values = itertools.islice(v.values(), budget)
                    else:
                        values = v.values()
                        if check_keys and not (v.keys() <= plain or pol.plain_keys(v)):
                            clean = check_keys = False
                    budget -= n + 1
                elif cls is list or cls is tuple:
                    n = len(v)
                    if n > budget:
                        clean = check_keys = False
                        hooked |= LARGE
                        values = v[:budget]
                    else:
                        values = v
                    budget -= n + 1
                else:
                    values = (v,)
                    budget -= 1
                for x in values:
                    t = type(x)
                    if t in skip:
                        continue
                    if t is str or t is bytes or t is bytearray:
                        total += len(x)
                    elif t is dict or t is list or t is tuple:
                        stack.append(x)
                        continue
                    else:
                        total += _serialize.leaf_size(x)
                        # A deferred attribute (an LLM call's price) resolves to a scalar.
                        if t not in _KEYLESS and not isinstance(x, Deferred):
                            clean = check_keys = False
                    if total >= threshold >= 0:
                        return OFFLOAD | hooked
        except Exception:
            return hooked
        if total >= steps_from:
            hooked |= LARGE
        return hooked | (CLEAN if clean else 0)

    @staticmethod
    def with_scope(chunk: bytes, span: Span) -> bytes:
        """See :func:`with_scope`."""
        return with_scope(chunk, span)

    def encode(self, span: Span, flags: int, bodies: tuple[bytes, bytes] | None = None) -> bytes:
        """``_otlp.encode_span(_serialize.to_wire(span, cfg), encoding)``, byte for byte;
        faster for the common span. Never raises (as ``to_wire`` never does). ``bodies``: the
        input's and the output's JSON, when :meth:`steps` wrote them already."""
        if self._direct(span):
            try:
                chunk = self._encode_pb(span, flags, bodies)
            except Exception:
                chunk = None  # the general route reports what went wrong, as it always does
            if chunk is not None:
                return with_scope(chunk, span)
        return with_scope(encode_span(_serialize.to_wire(span, self.cfg), self.encoding), span)

    def steps(self, span: Span, flags: int) -> Generator[None, None, bytes]:
        """:meth:`encode` as a generator that returns the chunk, for a :data:`LARGE`,
        :data:`HOOKED` or :data:`OFFLOAD` span that no worker takes: when a payload's JSON is
        long it yields once orjson has written it, between steps of the scan for secret keys,
        before the masking and before the message is written, so that the flusher's loop runs
        other tasks in between. A 165 KB structure is then five steps of at most about 0.5 ms
        instead of one of 1-1.5 ms. A span with a hook (which runs once, in the general route)
        or that the general route writes anyway takes the general route's steps."""
        if flags & HOOKED or not self._direct(span):
            wire = _serialize.to_wire_or_steps(span, self.cfg)
            if not isinstance(wire, WireSpan):
                wire = yield from wire
            return encode_span(wire, self.encoding)
        pol, clean = self.pol, flags & CLEAN != 0
        bodies = [b"", b""]
        for i, value in enumerate((span.inputs, span.output)):
            if value is not UNSET:
                body = _serialize.dumps_or_steps(value, pol, clean)
                bodies[i] = body if isinstance(body, bytes) else (yield from body)
        if len(bodies[0]) + len(bodies[1]) >= _STEPS_FROM_BYTES:
            # The message copies the JSON (and the request copies the message): for an image
            # that is as long as the masking before it, so it is a step of its own.
            yield
        return self.encode(span, flags, (bodies[0], bodies[1]))

    def _direct(self, span: Span) -> bool:
        """Whether :meth:`encode` writes ``span`` itself rather than through a WireSpan."""
        return (
            self.encoding == "protobuf" and bool(span.end_ns) and not span.events and not span.links
        )

    def _own_attributes(self, attributes: dict[str, Any], parts: list[bytes], clean: bool) -> int:
        """A span's own attributes appended to ``parts``; the length of their string values.
        A short string under a key the redaction rule has passed, met before with the same
        value (a model, an operation, an agent's name), is its encoded piece from the
        encoder's cache, with no conversion; the rest are converted as the general route
        does, in order. The plan's walk saw the values' keys too: ``clean`` covers their JSON."""
        pol = self.pol
        known = pol._key_cache
        cache = _PIECES
        limit = self._short
        text = 0
        rest: dict[str, Any] | None = None
        for k, v in attributes.items():
            if type(v) is str and len(v) <= limit and known.get(k) is False:
                piece = cache.get((k, v))
                if piece is not None:
                    if rest:
                        converted: dict[str, AttrValue] = {}
                        _serialize.attributes_into(rest, pol, converted, clean)
                        text += _span_attributes(converted.items(), parts)
                        rest = None
                    parts.append(piece)
                    text += len(v)
                    continue
            if rest is None:
                rest = {k: v}
            else:
                rest[k] = v
        if rest:
            converted = {}
            _serialize.attributes_into(rest, pol, converted, clean)
            text += _span_attributes(converted.items(), parts)
        return text

    def _encode_pb(
        self, span: Span, flags: int, bodies: tuple[bytes, bytes] | None = None
    ) -> bytes | None:
        pol = self.pol
        site = span.site
        parts = _span_head(
            span.trace_id,
            span.span_id,
            span.parent_span_id,
            span.trace_state,
            span.name,
            span.kind,
            span.start_ns,
            span.end_ns,
        )
        text_len = 0
        shared = span.context_attributes
        if shared is not None:
            sblock = self._shared.get(shared) or self._shared_block(shared)
            parts.append(sblock.encoded)
            text_len = sblock.text_len
        if site is not None:
            block = self._blocks.get(site) or self._site_block(site)
            if shared is not None and not sblock.keys.isdisjoint(block.keys):
                return None  # an override, in the overridden attribute's place (as below)
            if block.counts:
                _serialize.stats.update(block.counts)
            parts.append(block.encoded)
            text_len += block.text_len
        attributes = span.attributes
        if attributes:
            if (site is not None and not block.keys.isdisjoint(attributes)) or (
                shared is not None and not sblock.keys.isdisjoint(attributes)
            ):
                # The span overrides one of its decorator's (or its block's) attributes, in
                # that attribute's place: the general route keeps that order.
                return None
            text_len += self._own_attributes(attributes, parts, flags & CLEAN != 0)
        if (
            span.scope is None
            and (not attributes or OPENINFERENCE_SPAN_KIND not in attributes)
            and (site is None or OPENINFERENCE_SPAN_KIND not in block.keys)
        ):
            parts.append(_CHAIN)
            text_len += len(OI_CHAIN)
        inputs, output = span.inputs, span.output
        if flags & HOOKED:
            (has_in, inputs), (has_out, output) = _serialize.payloads(span, self.cfg)
        else:
            has_in, has_out = inputs is not UNSET, output is not UNSET
        if bodies is None:
            clean = flags & CLEAN != 0
            body_in = _dumps(inputs, pol, clean) if has_in else b""
            body_out = _dumps(output, pol, clean) if has_out else b""
        else:
            body_in, body_out = bodies
        if len(body_in) + len(body_out) + text_len <= self.max_span_bytes:
            if has_in:
                parts += _string_attribute(INPUT_VALUE, body_in)
                parts.append(_IN_MIME)
            if has_out:
                parts += _string_attribute(OUTPUT_VALUE, body_out)
                parts.append(_OUT_MIME)
        else:
            payloads = []
            if has_in:
                payloads.append((INPUT_VALUE, INPUT_MIME_TYPE, body_in))
            if has_out:
                payloads.append((OUTPUT_VALUE, OUTPUT_MIME_TYPE, body_out))
            payload_attributes(_serialize.capped(payloads, text_len, self.max_span_bytes), parts)
        if span.status_code or span.status_message:
            parts.append(span_tail(span.status_code, span.status_message, span.parent_is_remote))
        else:
            parts.append(_FLAGS[span.parent_is_remote])
        return b"".join(parts)

    def _shared_block(self, shared: ContextAttributes) -> _SharedBlock:
        blocks = self._shared
        if len(blocks) >= _BLOCKS_MAX:
            blocks.clear()
        block = blocks[shared] = _SharedBlock(shared, self.pol)
        return block

    def _site_block(self, site: CallSite) -> _SiteBlock:
        blocks = self._blocks
        if len(blocks) >= _BLOCKS_MAX:
            blocks.clear()
        block = blocks[site] = _SiteBlock(site, self.pol)
        return block


def with_scope(chunk: bytes, span: Span) -> bytes:
    """``chunk``, marked with the instrumentation scope of a span made through the
    OpenTelemetry API, so that the request puts it under that scope, whichever route (this
    process's encoder or a worker's) encoded it."""
    if span.scope is None:
        return chunk
    scoped = ScopedChunk(chunk)
    scoped.scope = span.scope
    return scoped
