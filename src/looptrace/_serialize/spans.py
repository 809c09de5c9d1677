"""A span's values as OTLP-ready attributes: payloads, hooks, events, links, the per-span
cap."""

from __future__ import annotations

import types
from collections.abc import Callable, Generator, Mapping
from typing import TYPE_CHECKING, Any

from .._capture.attributes import ContextAttributes
from .._capture.spans import UNSET, CallSite, Deferred, Span
from .._errors import format_exception
from .._semconv import (
    CODE_FUNCTION,
    CODE_NAMESPACE,
    EXCEPTION_EVENT,
    EXCEPTION_MESSAGE,
    EXCEPTION_STACKTRACE,
    EXCEPTION_TYPE,
    IN_PROGRESS,
    INPUT_MIME_TYPE,
    INPUT_VALUE,
    JSON_MIME,
    LANGFUSE_TRACE_METADATA,
    METADATA,
    OI_CHAIN,
    OPENINFERENCE_SPAN_KIND,
    OUTPUT_MIME_TYPE,
    OUTPUT_VALUE,
)
from .._wire import Attributes, AttrValue, WireEvent, WireLink, WireSpan
from ._common import _CACHE_MAX, _INT64_MIN, _STACKTRACE_MAX, REDACTED, counted, logger, stats
from .convert import _cut_str, _qualified_type, _safe_str, placeholder
from .policy import Policy, policy
from .walk import _big_int, _dumps, _preview, dumps_or_steps

if TYPE_CHECKING:
    from .._config import Config


# --------------------------------------------------------------------------- spans


def _attr(value: Any, pol: Policy, keys_clean: bool = False) -> AttrValue | None:
    cls = type(value)
    if cls is str:
        return _cut_str(value, pol.max_value_bytes)
    if cls is bool or cls is float:
        return value  # type: ignore[no-any-return]
    if cls is int:
        return value if _INT64_MIN <= value < (1 << 63) else _big_int(value)
    if value is None:
        return None
    if isinstance(value, Deferred):
        return _attr(value.resolve(), pol)
    if (cls is list or cls is tuple) and value:
        kinds = {type(x) for x in value}
        if len(kinds) == 1:
            kind = kinds.pop()
            if kind is str and sum(len(x) for x in value) <= pol.max_value_bytes:
                return list(value)
            if kind is bool or kind is float:
                return list(value)
            if kind is int and all(_INT64_MIN <= x < (1 << 63) for x in value):
                return list(value)
    return _dumps(value, pol, keys_clean).decode("utf-8")


def _attributes(
    src: Mapping[str, Any] | None,
    pol: Policy,
    out: dict[str, AttrValue],
    keys_clean: bool = False,
) -> None:
    """``src`` as OTLP attribute values into ``out``, each secret-named key redacted.
    ``keys_clean``: a walk of the values already showed that no dict in them has a secret
    key (see :meth:`~looptrace._otlp.span_encoder.SpanEncoder.plan`), so the JSON of a
    structured value is not scanned for one."""
    if not src:
        return
    redact = pol.redact
    # is_secret's own cache, read here: the same few keys come back on every span.
    known = pol._key_cache
    for k, v in src.items():
        if type(k) is not str:
            k = _safe_str(k)
        if redact and (known.get(k) or (k not in known and pol.is_secret(k))):
            stats["redactions"] += 1
            out[k] = REDACTED
            continue
        try:
            a = _attr(v, pol, keys_clean)
        except Exception:
            a = placeholder(v)
        if a is not None:
            out[k] = a


def _attr_list(src: Mapping[str, Any] | None, pol: Policy) -> Attributes:
    out: dict[str, AttrValue] = {}
    _attributes(src, pol, out)
    return list(out.items())


_warned_hooks: set[str] = set()


def _run_hook(hook: Callable[[Any], Any], value: Any, which: str) -> Any:
    try:
        return hook(value)
    except Exception as exc:
        # Fail closed: the raw value might be exactly what the hook was meant to hide.
        stats["hook_errors"] += 1
        name = getattr(hook, "__qualname__", repr(hook))
        if name not in _warned_hooks:
            _warned_hooks.add(name)
            logger.warning(
                "looptrace: %s hook %s raised; value replaced", which, name, exc_info=exc
            )
        return f"<{which} failed: {type(exc).__name__}>"


def _payloads(span: Span, cfg: Config) -> tuple[tuple[bool, Any], tuple[bool, Any]]:
    site = span.site
    return (
        _processed(
            span.inputs,
            site.process_inputs if site is not None else None,
            cfg.process_inputs,
            "process_inputs",
        ),
        _processed(
            span.output,
            site.process_outputs if site is not None else None,
            cfg.process_outputs,
            "process_outputs",
        ),
    )


def _processed(
    value: Any,
    own: Callable[[Any], Any] | None,
    everywhere: Callable[[Any], Any] | None,
    which: str,
) -> tuple[bool, Any]:
    """(present, value after the decorator's hook, then the global one)."""
    if value is UNSET:
        return (False, None)
    if own is not None:
        value = _run_hook(own, value, which)
    if everywhere is not None:
        value = _run_hook(everywhere, value, which)
    return (True, value)


_code_cache: dict[CallSite, tuple[tuple[str, AttrValue], ...]] = {}


def _code_attributes(site: CallSite) -> tuple[tuple[str, AttrValue], ...]:
    found = _code_cache.get(site)
    if found is not None:
        return found
    prefix, _, function = site.qualname.rpartition(".")
    attrs: list[tuple[str, AttrValue]] = []
    if function:
        attrs.append((CODE_FUNCTION, function))
    namespace = site.module
    if prefix and "<locals>" not in prefix:
        namespace = f"{namespace}.{prefix}" if namespace else prefix
    if namespace:
        attrs.append((CODE_NAMESPACE, namespace))
    if len(_code_cache) >= _CACHE_MAX:
        _code_cache.clear()
    found = _code_cache[site] = tuple(attrs)
    return found


def _events(span: Span, pol: Policy) -> list[WireEvent]:
    if not span.events:
        return []
    events = []
    for ev in span.events:
        attrs: dict[str, AttrValue] = {}
        if ev.exception is not None and ev.name == EXCEPTION_EVENT:
            exc = ev.exception
            attrs[EXCEPTION_TYPE] = _qualified_type(exc)
            attrs[EXCEPTION_MESSAGE] = _cut_str(_safe_str(exc), pol.max_value_bytes)
            attrs[EXCEPTION_STACKTRACE] = _stacktrace(exc, ev.traceback)
        _attributes(ev.attributes, pol, attrs)
        events.append(WireEvent(ev.name, ev.time_ns, list(attrs.items())))
    return events


def _stacktrace(exc: BaseException, tb: types.TracebackType | None) -> str:
    try:
        text = format_exception(exc, tb)
    except Exception:
        return f"{_qualified_type(exc)}: <traceback could not be formatted>"
    if len(text) > _STACKTRACE_MAX:
        # The end of a traceback (the raise site and the message) matters most.
        text = f"<truncated: {len(text)} chars>...{text[-_STACKTRACE_MAX:]}"
    return text


def _context_attributes(
    shared: ContextAttributes, pol: Policy
) -> tuple[tuple[str, AttrValue], ...]:
    """A ``looptrace.attributes`` block's values as wire attributes: worked out by the first
    span of the block exported under ``pol`` and reused by the rest (every span of a session
    carries them, so the metadata's JSON is written once, not once per span)."""
    cached = shared.wire
    if cached is not None and cached[0] is pol:
        return cached[1]  # type: ignore[no-any-return]
    out: dict[str, AttrValue] = {}
    _attributes(shared.as_attributes(), pol, out)
    metadata = out.get(METADATA)
    if metadata is not None:
        out[LANGFUSE_TRACE_METADATA] = metadata  # the same string: encoded once
    encoded = tuple(out.items())
    shared.wire = (pol, encoded)  # a race computes the same value twice, nothing worse
    return encoded


class _SiteAttributes:
    """A call site's attributes as the general route writes them under one policy: its
    decorator's, converted, then ``code.*``; ``alone``, the same with the kind a span of
    looptrace's own says when none is given; ``counts``, what converting them counted
    (redactions, truncations), counted again for every span that carries them."""

    __slots__ = ("alone", "counts", "items", "pol")

    def __init__(self, site: CallSite, pol: Policy) -> None:
        attrs: dict[str, AttrValue] = {}
        with counted() as counts:
            _attributes(site.attributes, pol, attrs)
        # Taken back here, added again by each span that carries them.
        stats.subtract(counts)
        for key in counts:
            if stats[key] <= 0:
                del stats[key]
        attrs.update(_code_attributes(site))
        self.pol = pol
        self.counts = counts
        self.items = tuple(attrs.items())
        if OPENINFERENCE_SPAN_KIND not in attrs:
            attrs[OPENINFERENCE_SPAN_KIND] = OI_CHAIN
        self.alone = tuple(attrs.items())


# Worked out by the first span of a site and reused by the rest: a traced function's
# decorator attributes and code.* are the same on every call. The OTLP encoder's site blocks
# encode these.
_site_cache: dict[CallSite, _SiteAttributes] = {}


def _site_attributes(site: CallSite, pol: Policy) -> _SiteAttributes:
    """``site``'s attributes under ``pol``, from the cache; a span that carries them adds
    their ``counts`` to :data:`stats` itself."""
    found = _site_cache.get(site)
    if found is None or found.pol is not pol:
        if len(_site_cache) >= _CACHE_MAX:
            _site_cache.clear()
        found = _site_cache[site] = _SiteAttributes(site, pol)
    return found


def _skeleton(span: Span, cfg: Config, pol: Policy) -> WireSpan:
    """Everything about a span except its input and output values."""
    shared = span.context_attributes
    site = span.site
    if site is not None:
        block = _site_attributes(site, pol)
        if block.counts:
            stats.update(block.counts)
        if (
            shared is None
            and not span.attributes
            and span.scope is None
            and span.end_ns
            and not span.events
            and not span.links
        ):
            # A traced call with nothing of its own: the most common span of all.
            return _wire_for(span, list(block.alone), [], [])
    attrs: dict[str, AttrValue] = {}
    if shared is not None:
        attrs.update(_context_attributes(shared, pol))
    if site is not None:
        attrs.update(block.items)
    _attributes(span.attributes, pol, attrs)
    if span.scope is None and OPENINFERENCE_SPAN_KIND not in attrs:
        # looptrace's own spans (traced functions, span blocks, experiments and cases) are
        # CHAIN unless they say otherwise; spans of other instrumentations keep their own.
        attrs[OPENINFERENCE_SPAN_KIND] = OI_CHAIN
    if not span.end_ns:
        attrs[IN_PROGRESS] = True
    links = []
    for link in span.links or ():
        ctx = link.context
        links.append(
            WireLink(
                ctx.trace_id,
                ctx.span_id,
                ctx.trace_state,
                _attr_list(link.attributes, pol),
                ctx.is_remote,
            )
        )
    return _wire_for(span, list(attrs.items()), _events(span, pol), links)


def _wire_for(
    span: Span, attributes: Attributes, events: list[WireEvent], links: list[WireLink]
) -> WireSpan:
    """The span's identity, timing and status, with the given attributes, events and links."""
    return WireSpan(
        span.trace_id,
        span.span_id,
        span.parent_span_id,
        span.name,
        span.kind,
        span.start_ns,
        span.end_ns,
        attributes,
        events,
        links,
        span.status_code,
        span.status_message,
        span.trace_state,
        0,
        span.parent_is_remote,
        span.scope,
    )


def prepare(
    span: Span, cfg: Config
) -> tuple[WireSpan, tuple[bool, Any], tuple[bool, Any], Policy, int]:
    """The parent's half of ``to_wire``: run user hooks, build everything but the payloads.

    The result pickles (no tracebacks, no hook functions) so :func:`finish` can run in a
    worker process and produce exactly the bytes it would produce here."""
    pol = policy(cfg)
    inputs, output = _payloads(span, cfg)
    return _skeleton(span, cfg, pol), inputs, output, pol, cfg.max_span_bytes


def finish(
    wire: WireSpan,
    inputs: tuple[bool, Any],
    output: tuple[bool, Any],
    pol: Policy,
    max_span_bytes: int,
    bodies: tuple[bytes, bytes] | None = None,
) -> WireSpan:
    """Serialize the payloads into ``wire`` and apply the per-span cap. ``bodies``: the
    payloads' JSON, when it was written already (b"" for one that is absent)."""
    attrs = wire.attributes
    for key, mime, body in finish_payloads(wire, inputs, output, pol, max_span_bytes, bodies):
        attrs.append((key, body.decode("utf-8")))
        attrs.append((mime, JSON_MIME))
    return wire


def finish_payloads(
    wire: WireSpan,
    inputs: tuple[bool, Any],
    output: tuple[bool, Any],
    pol: Policy,
    max_span_bytes: int,
    bodies: tuple[bytes, bytes] | None = None,
) -> list[tuple[str, str, bytes]]:
    """The payloads :func:`finish` adds to ``wire``, as (key, mime-type key, JSON), cut to
    the per-span cap: for an encoder that writes the JSON as it is."""
    payloads: list[tuple[str, str, bytes]] = []
    if bodies is None:
        bodies = (
            _dumps(inputs[1], pol) if inputs[0] else b"",
            _dumps(output[1], pol) if output[0] else b"",
        )
    if inputs[0]:
        payloads.append((INPUT_VALUE, INPUT_MIME_TYPE, bodies[0]))
    if output[0]:
        payloads.append((OUTPUT_VALUE, OUTPUT_MIME_TYPE, bodies[1]))
    if not payloads:
        return payloads
    text_len = 0
    for _, v in wire.attributes:
        if type(v) is str:
            text_len += len(v)
    return capped(payloads, text_len, max_span_bytes)


def capped(
    payloads: list[tuple[str, str, bytes]], text_len: int, max_span_bytes: int
) -> list[tuple[str, str, bytes]]:
    """``payloads`` (key, mime type, JSON) cut to fit the per-span cap next to ``text_len``
    characters of other string attributes."""
    total = 0
    for p in payloads:
        total += len(p[2])
    if total + text_len <= max_span_bytes:
        return payloads
    return _fit(payloads, max(max_span_bytes - text_len, 1024))


def _fit(payloads: list[tuple[str, str, bytes]], budget: int) -> list[tuple[str, str, bytes]]:
    # Smallest first: a small input keeps its bytes and the big output gets what is left.
    order = sorted(range(len(payloads)), key=lambda i: len(payloads[i][2]))
    out = list(payloads)
    left = budget
    for n, i in enumerate(order):
        share = left // (len(order) - n)
        key, mime, body = payloads[i]
        if len(body) > share:
            body = _preview(body, len(body), max(share, 256))
        out[i] = (key, mime, body)
        left -= len(body)
    return out


def to_wire(span: Span, cfg: Config) -> WireSpan:
    """The span as OTLP-ready attributes, events and links. Never raises."""
    try:
        return finish(*prepare(span, cfg))
    except Exception as exc:
        return _failed(span, exc)


_Body = bytes | Generator[None, None, bytes]


def to_wire_or_steps(span: Span, cfg: Config) -> WireSpan | Generator[None, None, WireSpan]:
    """:func:`to_wire`'s WireSpan; or, when a payload's JSON is long enough to scan in steps
    (:func:`~looptrace._serialize.walk.dumps_or_steps`), a generator that returns it, yielding
    between the steps. Short spans, the common case, cost no generator. Never raises."""
    try:
        prepared = prepare(span, cfg)
        _, inputs, output, pol, _ = prepared
        body_in = dumps_or_steps(inputs[1], pol) if inputs[0] else b""
        if not isinstance(body_in, bytes):
            return _wire_in_steps(span, prepared, body_in, None)  # the output after its steps
        body_out = dumps_or_steps(output[1], pol) if output[0] else b""
        if not isinstance(body_out, bytes):
            return _wire_in_steps(span, prepared, body_in, body_out)
        return finish(*prepared, (body_in, body_out))
    except Exception as exc:
        return _failed(span, exc)


def _wire_in_steps(
    span: Span,
    prepared: tuple[WireSpan, tuple[bool, Any], tuple[bool, Any], Policy, int],
    body_in: _Body,
    body_out: _Body | None,
) -> Generator[None, None, WireSpan]:
    """The rest of :func:`to_wire_or_steps` once a payload needs steps (``body_out`` None:
    not written yet)."""
    output, pol = prepared[2], prepared[3]
    try:
        if not isinstance(body_in, bytes):
            body_in = yield from body_in
        if body_out is None:
            body_out = dumps_or_steps(output[1], pol) if output[0] else b""
        if not isinstance(body_out, bytes):
            body_out = yield from body_out
        return finish(*prepared, (body_in, body_out))
    except Exception as exc:
        return _failed(span, exc)


def _failed(span: Span, exc: Exception) -> WireSpan:
    from .._errors import internal_error

    internal_error("serialize.to_wire", exc)
    return _wire_for(span, [("looptrace.serialization_error", _qualified_type(exc))], [], [])
