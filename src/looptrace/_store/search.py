"""The search index: what makes a trace findable by a span attribute (``key=value``) or by a
word in its spans' names, attribute values and error messages, without reading the spans.

One table, ``trace_terms (term, trace_id)``, keyed by term: a lookup is a range of the key,
whatever the number of traces. A term is one of

    "a" SEP key SEP value   an attribute of a span of the trace, its value as text (strings as
                            they are, other values as JSON, each element of a list on its own),
                            cut to ``MAX_VALUE`` characters
    "w" SEP word            a word (a run of letters, digits and "_", lowercased, cut to
                            ``MAX_WORD`` characters) of a span's name, status message, string
                            attribute values, or an exception event's type and message

Payloads (``input.value``, ``output.value``) and resource attributes are not indexed: the
first can be megabytes, the second are the same for every span of a process (the service has
its own filter). Only the first ``MAX_TEXT`` characters of a value give words.

The terms of a batch are made in ``write._prepare`` outside the write lock, deduplicated per
trace, and inserted sorted in one ``executemany``. Deleting a trace deletes its terms by
making them again from its stored spans (an index by trace would double the cost of every
insert for the sake of the rare delete).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson

from .. import _semconv as sc

SEP = "\x1f"
ATTR = "a" + SEP
WORD = "w" + SEP
MAX_VALUE = 256
MAX_WORD = 64
MAX_TEXT = 1000

_WORDS = re.compile(r"\w+")
# One past every character a term can hold: the end of a prefix range.
_TOP = "\U0010ffff"


def value_text(value: Any) -> str | None:
    """An attribute value as the index keeps it (None: not indexed, such as bytes)."""
    if isinstance(value, str):
        return value[:MAX_VALUE]
    if isinstance(value, (bool, int, float)):
        return orjson.dumps(value).decode()
    return None


def words(text: str) -> list[str]:
    """The words of ``text`` as the index keeps them."""
    return [w[:MAX_WORD] for w in _WORDS.findall(text[:MAX_TEXT].lower())]


def span_terms(
    name: str, status_message: str, attributes: Mapping[str, Any], events: Sequence[Any]
) -> set[str]:
    """The terms one span adds to its trace (``attributes`` without the payloads)."""
    terms = {WORD + w for w in words(name)}
    if status_message:
        terms.update(WORD + w for w in words(status_message))
    for key, value in attributes.items():
        if isinstance(value, list):
            items: Iterable[Any] = value
        else:
            items = (value,)
        for item in items:
            text = value_text(item)
            if text is None:
                continue
            terms.add(ATTR + key + SEP + text)
            if isinstance(item, str):
                terms.update(WORD + w for w in words(item))
    for event in events:
        if isinstance(event, Mapping) and event.get("name") == sc.EXCEPTION_EVENT:
            attrs = event.get("attributes") or {}
            for key in (sc.EXCEPTION_TYPE, sc.EXCEPTION_MESSAGE):
                text = attrs.get(key)
                if isinstance(text, str):
                    terms.update(WORD + w for w in words(text))
    return terms


def attr_term(key: str, value: str) -> str:
    """The term that ``key=value`` looks up (the value as typed: ``n=3`` finds 3 and "3")."""
    return ATTR + key + SEP + value[:MAX_VALUE]


def parse_attr(raw: str) -> tuple[str, str]:
    """``key=value`` split at its first "=" (ValueError when there is none or no key)."""
    key, sep, value = raw.partition("=")
    if not sep or not key:
        raise ValueError(f"expected key=value, got {raw!r}")
    return key, value


def search_filters(
    attrs: Sequence[tuple[str, str]], text: str | None
) -> tuple[list[str], list[Any]]:
    """WHERE clauses (on ``traces.trace_id``) and their parameters for attribute filters and
    a text search. Every attribute and every word must match (AND); each word of ``text``
    matches a word that starts with it, so ``time`` finds "timeout"."""
    where: list[str] = []
    params: list[Any] = []
    for key, value in attrs:
        where.append("trace_id IN (SELECT trace_id FROM trace_terms WHERE term = ?)")
        params.append(attr_term(key, value))
    for word in dict.fromkeys(words(text or "")):
        where.append("trace_id IN (SELECT trace_id FROM trace_terms WHERE term >= ? AND term < ?)")
        params.extend((WORD + word, WORD + word + _TOP))
    return where, params


def trace_terms_of_rows(rows: Iterable[Sequence[Any]]) -> set[str]:
    """The terms of stored spans, from ``(name, status_message, attributes, events)`` rows
    (the JSON columns as stored): what deleting their trace must remove."""
    from .columns import loads

    terms: set[str] = set()
    for name, message, attributes, events in rows:
        terms |= span_terms(name, message, loads(attributes) or {}, loads(events) or [])
    return terms
