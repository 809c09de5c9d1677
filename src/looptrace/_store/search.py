"""The search index: what makes a trace findable by a span attribute (``key=value``) or by a
word in its spans' names, attribute values and error messages, without reading the spans.

Two tables. ``search_terms (id, term)`` numbers each distinct term once; ``trace_terms
(term_id, trace_key)``, keyed by both, lists the traces (``traces.rowid``) that hold a term.
A lookup is a range of a key, whatever the number of traces; and since a new trace gets the
next rowid, a write appends at the end of each term's range instead of splitting pages all
over the index (several times cheaper than keying by the trace id's text). A term is one of

    "a" SEP key SEP value   an attribute of a span of the trace, its value as text (strings as
                            they are, other values as JSON, each element of a list on its own),
                            cut to ``MAX_VALUE`` characters
    "w" SEP word            a word (a run of letters, digits and "_", lowercased, cut to
                            ``MAX_WORD`` characters) of a span's name, status message, string
                            attribute values, or an exception event's type and message

Payloads (``input.value``, ``output.value``), their ``*.mime_type`` and resource attributes
are not indexed: payloads can be megabytes, their format says nothing, and the resource is the
same for every span of a process (the service has its own filter). Only the first ``MAX_TEXT`` characters of a value give words.

The terms of a span are made in ``write._prepare``, outside the write lock (those of a
repeated attribute value, and of a span repeating another's name and attributes, come from
bounded caches), deduplicated per trace and batch, and inserted one statement per distinct
set of terms in the batch (the traces holding that set, crossed with its terms). Deleting a trace deletes its rows by making its
terms again from its stored spans (an index by trace would double the cost of every insert
for the sake of the rare delete), and the terms no trace holds any more.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
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


# (key, value) -> its terms, for the short values that repeat from span to span (function
# names, routes, kinds): most spans then cost a dict lookup per attribute, not a regex.
_ATTR_CACHE: dict[tuple[str, Any], tuple[str, ...]] = {}
_ATTR_CACHE_MAX = 8192
_CACHEABLE = 64
# Format metadata on every span with a payload (application/json): three index rows per span
# that no one searches for.
_UNINDEXED = frozenset({sc.INPUT_MIME_TYPE, sc.OUTPUT_MIME_TYPE})


def _attr_terms(key: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, list):
        out: list[str] = []
        for item in value:
            out.extend(_attr_terms(key, item))
        return tuple(out)
    text = value_text(value)
    if text is None:
        return ()
    if isinstance(value, str):
        return (ATTR + key + SEP + text, *[WORD + w for w in words(value)])
    return (ATTR + key + SEP + text,)


def _name_terms(name: str) -> tuple[str, ...]:
    key = ("", name)
    found = _ATTR_CACHE.get(key)
    if found is None:
        if len(_ATTR_CACHE) >= _ATTR_CACHE_MAX:
            _ATTR_CACHE.clear()
        found = _ATTR_CACHE[key] = tuple(WORD + w for w in words(name))
    return found


def span_terms(
    name: str, status_message: str, attributes: Mapping[str, Any], events: Sequence[Any]
) -> set[str]:
    """The terms one span adds to its trace (``attributes`` without the payloads)."""
    cache = _ATTR_CACHE
    terms = set(_name_terms(name))
    if status_message:
        terms.update(WORD + w for w in words(status_message))
    for item in attributes.items():
        if item[0] in _UNINDEXED:
            continue
        value = item[1]
        if type(value) is str and len(value) <= _CACHEABLE:
            found = cache.get(item)
            if found is None:
                if len(cache) >= _ATTR_CACHE_MAX:
                    cache.clear()
                found = cache[item] = _attr_terms(*item)
            terms.update(found)
        else:
            terms.update(_attr_terms(*item))
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


# A term held by at most this many traces is read whole, and the list is looked up by those
# traces' rows; a commoner one is checked trace by trace while the list is walked newest first
# (where a page of 50 fills within about 50 x traces / RARE traces walked). The two costs meet
# near the square root of 50 x the number of traces: 1,000 suits stores of 10,000 to a million.
RARE = 1000


class SearchPlan:
    """How ``list_traces`` applies a search: ``where`` clauses and their ``params`` on the
    ``traces`` table, and, when the candidates are few, ``found`` (a JSON array of their rows
    in ``traces``): the list is then read from those rows and sorted, never walked."""

    __slots__ = ("found", "params", "where")

    def __init__(self) -> None:
        self.where: list[str] = []
        self.params: list[Any] = []
        self.found: str | None = None

    def source(self, columns: str) -> str:
        """The ``SELECT ... FROM`` of the list: with ``found``, those rows first (CROSS JOIN
        fixes SQLite's join order, so no other filter's index can make it walk the table),
        its parameter to go before the others."""
        if self.found is None:
            return f"SELECT {columns} FROM traces"
        return (
            f"SELECT {columns} FROM json_each(?) AS found "
            "CROSS JOIN traces ON traces.rowid = found.value"
        )


def search_plan(
    conn: sqlite3.Connection, attrs: Sequence[tuple[str, str]], text: str | None
) -> SearchPlan:
    """The plan for attribute filters and a text search: every attribute and every word must
    match (AND); each word of ``text`` matches a word that starts with it, so ``time`` finds
    "timeout". Each filter is a set of term ids; a filter whose traces number at most
    ``RARE`` is read whole and the sets intersected in Python, the others become a point
    lookup per trace walked."""
    plan = SearchPlan()
    filters: list[list[int]] = []
    for key, value in attrs:
        row = conn.execute(
            "SELECT id FROM search_terms WHERE term = ?", (attr_term(key, value),)
        ).fetchone()
        filters.append([row[0]] if row else [])
    for word in dict.fromkeys(words(text or "")):
        filters.append(
            [
                r[0]
                for r in conn.execute(
                    "SELECT id FROM search_terms WHERE term >= ? AND term < ?",
                    (WORD + word, WORD + word + _TOP),
                )
            ]
        )
    if not filters:
        return plan
    if any(not ids for ids in filters):
        plan.where.append("0")  # a term no trace holds: nothing matches
        return plan
    found: set[int] | None = None
    common: list[list[int]] = []
    for ids in filters:
        keys = [
            r[0]
            for r in conn.execute(
                "SELECT trace_key FROM trace_terms WHERE term_id IN "
                "(SELECT value FROM json_each(?)) LIMIT ?",
                (orjson.dumps(ids).decode(), RARE + 1),
            )
        ]
        if len(keys) > RARE:
            common.append(ids)
        else:
            found = set(keys) if found is None else found & set(keys)
    if found is not None:
        plan.found = orjson.dumps(sorted(found)).decode()
    for ids in common:
        plan.where.append(
            "EXISTS (SELECT 1 FROM trace_terms WHERE trace_key = traces.rowid AND term_id IN "
            "(SELECT value FROM json_each(?)))"
        )
        plan.params.append(orjson.dumps(ids).decode())
    return plan


def trace_terms_of_rows(rows: Iterable[Sequence[Any]]) -> set[str]:
    """The terms of stored spans, from ``(name, status_message, attributes, events)`` rows
    (the JSON columns as stored): what deleting their trace must remove."""
    from .columns import loads

    terms: set[str] = set()
    for name, message, attributes, events in rows:
        terms |= span_terms(name, message, loads(attributes) or {}, loads(events) or [])
    return terms


_EPOCH = "search_terms_epoch"


class TermIndex:
    """The writer's side of the index: the ids of the terms it has met (a bounded cache,
    dropped when a delete may have removed terms), and the rows of a batch."""

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}
        self._epoch: Any = None

    def forget(self) -> None:
        """Drop the cache (after a rollback: it may name rows that are gone)."""
        self._ids.clear()
        self._epoch = None

    def add(self, conn: sqlite3.Connection, trace_terms: Mapping[str, AbstractSet[str]]) -> None:
        """Index ``trace_terms`` (trace id -> its terms in this batch), inside the writer's
        transaction, after the traces' rows exist."""
        if not trace_terms:
            return
        # A delete that removed terms bumps the epoch: cached ids may then be gone. Read
        # inside the write transaction, so no delete can come between the check and the use.
        epoch = conn.execute("SELECT value FROM meta WHERE key = ?", (_EPOCH,)).fetchone()
        if epoch != self._epoch or len(self._ids) > 200_000:
            self._ids.clear()
            self._epoch = epoch
        ids = self._ids
        missing = {t for terms in trace_terms.values() for t in terms if t not in ids}
        if missing:
            ordered = sorted(missing)
            conn.executemany(
                "INSERT OR IGNORE INTO search_terms (term) VALUES (?)", [(t,) for t in ordered]
            )
            ids.update(
                (term, term_id)
                for term_id, term in conn.execute(
                    "SELECT id, term FROM search_terms WHERE term IN "
                    "(SELECT value FROM json_each(?))",
                    (orjson.dumps(ordered).decode(),),
                )
            )
        keys = dict(
            conn.execute(
                "SELECT trace_id, rowid FROM traces WHERE trace_id IN "
                "(SELECT value FROM json_each(?))",
                (orjson.dumps(list(trace_terms)).decode(),),
            ).fetchall()
        )
        # The traces holding the same terms (the calls of one function, each its own trace)
        # are one statement: every term of the set for every trace of the group, made by
        # SQLite from two JSON arrays instead of bound row by row from Python.
        groups: dict[frozenset[str], list[int]] = {}
        for trace_id, terms in trace_terms.items():
            key = keys.get(trace_id)
            if key is not None:
                group = groups.get(terms := frozenset(terms))
                if group is None:
                    groups[terms] = [key]
                else:
                    group.append(key)
        conn.executemany(
            "INSERT OR IGNORE INTO trace_terms (term_id, trace_key) "
            "SELECT t.value, k.value FROM json_each(?) AS t, json_each(?) AS k",
            [
                (orjson.dumps([ids[t] for t in terms]).decode(), orjson.dumps(tkeys).decode())
                for terms, tkeys in groups.items()
            ],
        )


def forget_traces(conn: sqlite3.Connection, trace_ids: Sequence[str]) -> None:
    """Delete the index rows of these traces (inside the caller's transaction, before their
    spans and summaries go), and the terms that no trace holds any more."""
    rows: list[tuple[int, int]] = []
    for trace_id in trace_ids:
        row = conn.execute("SELECT rowid FROM traces WHERE trace_id = ?", (trace_id,)).fetchone()
        if row is None:
            continue
        terms = trace_terms_of_rows(
            conn.execute(
                "SELECT name, status_message, attributes, events FROM spans WHERE trace_id = ?",
                (trace_id,),
            )
        )
        rows.extend(
            (term_id, row[0])
            for (term_id,) in conn.execute(
                "SELECT id FROM search_terms WHERE term IN (SELECT value FROM json_each(?))",
                (orjson.dumps(sorted(terms)).decode(),),
            )
        )
    if not rows:
        return
    rows.sort()
    conn.executemany("DELETE FROM trace_terms WHERE term_id = ? AND trace_key = ?", rows)
    gone = conn.executemany(
        "DELETE FROM search_terms WHERE id = ? AND NOT EXISTS "
        "(SELECT 1 FROM trace_terms WHERE term_id = ?)",
        [(t, t) for t in sorted({t for t, _ in rows})],
    ).rowcount
    if gone:
        conn.execute(
            "INSERT INTO meta (key, value) VALUES (?, '1') "
            "ON CONFLICT (key) DO UPDATE SET value = CAST(value AS INTEGER) + 1",
            (_EPOCH,),
        )
