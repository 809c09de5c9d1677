"""Serialization: every type, hostile values, caps, redaction, hooks, and the span record."""

from __future__ import annotations

import base64
import dataclasses
import datetime
import decimal
import enum
import ipaddress
import json
import math
import uuid
from collections import OrderedDict, deque
from pathlib import Path, PurePosixPath
from types import MappingProxyType
from typing import Any, NamedTuple

import attrs
import numpy as np
import orjson
import pydantic
import pydantic.v1
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import looptrace
from looptrace import _serialize
from looptrace._capture.spans import Span, SpanContext
from looptrace._config import Config
from looptrace._semconv import (
    CODE_FUNCTION,
    CODE_NAMESPACE,
    EXCEPTION_MESSAGE,
    EXCEPTION_STACKTRACE,
    EXCEPTION_TYPE,
    IN_PROGRESS,
    INPUT_MIME_TYPE,
    INPUT_VALUE,
    OPENINFERENCE_SPAN_KIND,
    OUTPUT_MIME_TYPE,
    OUTPUT_VALUE,
)
from looptrace._serialize import REDACTED, estimate_size, to_json, to_wire
from looptrace.testing import capture_spans
from steps_support import run_steps

CFG = Config()


def js(value: Any, cfg: Config = CFG) -> Any:
    """Serialize and parse back (also proves the text is valid JSON)."""
    return json.loads(to_json(value, cfg))


@pytest.fixture(autouse=True)
def _fresh_stats() -> None:
    _serialize.stats.clear()


# ----------------------------------------------------------------------------- types


@dataclasses.dataclass
class Point:
    x: int
    y: list[int]
    _private: int = 0


class Model(pydantic.BaseModel):
    name: str
    when: datetime.date
    tags: set[str] = set()


class Weird:
    def __repr__(self) -> str:
        return "Weird()"


class LooseModel(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(arbitrary_types_allowed=True)
    thing: Weird


class OldModel(pydantic.v1.BaseModel):
    a: int
    b: str


@attrs.define
class AttrsThing:
    a: int
    b: str


class Pair(NamedTuple):
    left: int
    right: str


class Color(enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 3


def test_dataclass_fields_as_object() -> None:
    """A dataclass is an object of its public fields (orjson's rule: _private is left out)."""
    assert js(Point(1, [2])) == {"x": 1, "y": [2]}


def test_pydantic_v2_uses_the_compiled_serializer() -> None:
    """A pydantic v2 model is its JSON-mode dump (dates as ISO text, sets as lists)."""
    assert js(Model(name="a", when=datetime.date(2024, 1, 2), tags={"t"})) == {
        "name": "a",
        "when": "2024-01-02",
        "tags": ["t"],
    }


def test_pydantic_v2_with_arbitrary_field_falls_back_to_our_hook() -> None:
    """A field pydantic cannot write as JSON is still serialized, by our own rules."""
    assert js(LooseModel(thing=Weird())) == {"thing": "Weird()"}


def test_pydantic_v1_model() -> None:
    """A pydantic v1 model (pydantic.v1) is its .dict()."""
    assert js(OldModel(a=1, b="x")) == {"a": 1, "b": "x"}


def test_attrs_class() -> None:
    """An attrs instance is an object of its attributes."""
    assert js(AttrsThing(1, "x")) == {"a": 1, "b": "x"}


def test_namedtuple_keeps_field_names() -> None:
    """A NamedTuple is an object keyed by its field names."""
    assert js(Pair(1, "r")) == {"left": 1, "right": "r"}
    assert js([Pair(1, "r")]) == [{"left": 1, "right": "r"}]


def test_enums_are_their_values() -> None:
    """Enum members serialize as their values."""
    assert js([Color.RED, Level.HIGH]) == ["red", 3]


def test_numpy_arrays_and_scalars() -> None:
    """Arrays become nested lists (also non-contiguous and complex ones); scalars their value."""
    arr = np.arange(6, dtype=np.int64).reshape(2, 3)
    assert js(arr) == [[0, 1, 2], [3, 4, 5]]
    assert js(arr[:, 0]) == [0, 3]
    assert js(np.array([1 + 2j])) == ["(1+2j)"]
    assert js([np.int64(4), np.float32(0.5), np.bool_(True)]) == [4, 0.5, True]


def test_numpy_array_over_the_value_cap_is_described() -> None:
    """An array bigger than max_value_bytes is described (shape, dtype, size), not dumped."""
    cfg = CFG.replace(max_value_bytes=1000)
    out = js(np.zeros(1000), cfg)
    assert "truncated" in out
    assert "8000 bytes" in out


def test_time_types() -> None:
    """datetime/date/time are ISO 8601 text; timedelta is seconds."""
    assert js(
        [
            datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc),
            datetime.date(2024, 1, 2),
            datetime.time(3, 4),
            datetime.timedelta(minutes=1, milliseconds=500),
        ]
    ) == ["2024-01-02T03:04:05+00:00", "2024-01-02", "03:04:00", 60.5]


def test_text_like_scalars() -> None:
    """UUID, Decimal (exact digits), paths and IP addresses are their text."""
    u = uuid.UUID(int=5)
    values = [
        u,
        decimal.Decimal("1.10000000000000000001"),
        Path("/tmp/x"),
        PurePosixPath("a/b"),
        ipaddress.ip_address("10.0.0.1"),
        ipaddress.ip_address("::1"),
        ipaddress.ip_network("10.0.0.0/8"),
    ]
    assert js(values) == [
        str(u),
        "1.10000000000000000001",
        "/tmp/x",
        "a/b",
        "10.0.0.1",
        "::1",
        "10.0.0.0/8",
    ]


def test_bytes_like_are_base64() -> None:
    """bytes, bytearray and memoryview become base64 text."""
    data = b"\x00\xffhello"
    expected = base64.b64encode(data).decode()
    assert js([data, bytearray(data), memoryview(data)]) == [expected] * 3


def test_bytes_over_the_cap_are_cut_and_keep_their_size() -> None:
    """Bytes longer than the cap keep a base64 prefix and say how long they were."""
    cfg = CFG.replace(max_value_bytes=400)
    out = js(b"a" * 5000, cfg)
    assert out.endswith("...<truncated: 5000 bytes>")
    assert len(to_json(b"a" * 5000, cfg)) <= 400
    assert _serialize.stats["truncations"] >= 1


def test_sets_are_sorted_lists() -> None:
    """Sets and frozensets become lists, sorted when their items allow it."""
    assert js({"b", "a", "c"}) == ["a", "b", "c"]
    assert js(frozenset({3, 1})) == [1, 3]
    assert sorted(js({1, "a"}), key=str) == [1, "a"]


def test_exceptions_are_type_and_message() -> None:
    """An exception is its (qualified) type and message."""
    assert js(ValueError("bad")) == {"type": "ValueError", "message": "bad"}
    assert js(json.JSONDecodeError("m", "d", 0))["type"] == "json.decoder.JSONDecodeError"


def test_non_string_keys() -> None:
    """Keys that are not strings are written as text: numbers, None, tuples, objects."""
    assert js({1: "a", None: "b", 2.5: "c"}) == {"1": "a", "null": "b", "2.5": "c"}
    assert js({(1, 2): "t", Color.RED: "e"}) == {"(1, 2)": "t", "red": "e"}


def test_nan_and_infinities_are_null() -> None:
    """JSON has no NaN or infinity: they become null (as in JavaScript), never invalid JSON."""
    text = to_json([math.nan, math.inf, -math.inf, np.float64("nan")], CFG)
    assert json.loads(text) == [None, None, None, None]


def test_lone_surrogates_are_escaped() -> None:
    """A string with a lone surrogate (invalid UTF-8) keeps the rest and shows the escape."""
    assert js({"k": "a\ud800b"}) == {"k": "a\\ud800b"}
    assert js({"\udfff": 1}) == {"\\udfff": 1}


def test_integers_beyond_64_bits() -> None:
    """Integers orjson cannot hold are written as their digits; absurd ones by bit length."""
    assert js([2**64 - 1, 2**64, -(2**70)]) == [2**64 - 1, str(2**64), str(-(2**70))]
    assert js(10**5000) == "<int: 16610 bits>"


def test_generators_and_iterators_are_described_not_consumed() -> None:
    """A generator or iterator is described; the caller can still read every item."""

    def gen() -> Any:
        yield 1
        yield 2

    g = gen()
    it = iter([1, 2, 3])
    out = js({"g": g, "it": it})
    assert out["g"].startswith("<generator")
    assert "gen" in out["g"]
    assert out["it"] == "<list_iterator>"
    assert list(g) == [1, 2]
    assert list(it) == [1, 2, 3]


def test_other_containers() -> None:
    """Mappings, deques and other sequences serialize by content."""
    assert js(MappingProxyType({"a": 1})) == {"a": 1}
    assert js(OrderedDict(b=1)) == {"b": 1}
    assert js(deque([1, 2])) == [1, 2]
    assert js(range(3)) == [0, 1, 2]


def test_repr_that_raises_becomes_a_placeholder() -> None:
    """An unknown object whose __repr__ raises is a placeholder, counted."""

    class Bad:
        def __repr__(self) -> str:
            raise RuntimeError("no")

    assert js([Bad()]) == ["<repr failed: Bad>"]
    assert _serialize.stats["placeholders"] == 1


def test_anything_else_is_a_bounded_repr() -> None:
    """Unknown objects are their repr, cut to a bounded length."""

    class Long:
        def __repr__(self) -> str:
            return "L" * 100_000

    out = js(Long())
    assert out.startswith("LLL")
    assert out.endswith("...<truncated: 100000 chars>")
    assert len(out) < 3000


# ----------------------------------------------------------------------------- hostile values


def test_self_referencing_dict_and_list() -> None:
    """Cycles become a marker instead of RecursionError; shared (non-cyclic) values stay."""
    d: dict[str, Any] = {"a": 1}
    d["self"] = d
    lst: list[Any] = [1]
    lst.append(lst)
    shared = [1]
    assert js(d) == {"a": 1, "self": "<cycle: dict>"}
    assert js(lst) == [1, "<cycle: list>"]
    assert js({"x": shared, "y": shared, "c": lst}) == {
        "x": [1],
        "y": [1],
        "c": [1, "<cycle: list>"],
    }


def test_self_referencing_dataclass() -> None:
    """A cycle through objects (not just dicts and lists) is cut too."""

    @dataclasses.dataclass
    class Node:
        name: str
        next: Any = None

    n = Node("a")
    n.next = n
    out = js(n)
    assert out["name"] == "a"
    assert out["next"] == "<cycle: Node>"


def test_depth_beyond_orjson_is_cut_at_max_depth() -> None:
    """Nesting deeper than orjson allows is cut at cfg.max_depth with a marker."""
    deep: list[Any] = []
    cur = deep
    for _ in range(1000):
        nxt: list[Any] = []
        cur.append(nxt)
        cur = nxt
    cfg = CFG.replace(max_depth=5)
    out = js(deep, cfg)
    depth = 0
    while isinstance(out, list):
        out = out[0]
        depth += 1
    assert out == "<max depth: list>"
    assert depth == 5


def test_objects_that_raise_everywhere() -> None:
    """A mapping whose items() raises, a str() that raises, an object whose __class__ lies:
    nothing escapes to the caller."""

    class BadMap(dict):  # type: ignore[type-arg]
        def items(self) -> Any:
            raise RuntimeError("boom")

        def __iter__(self) -> Any:
            raise RuntimeError("boom")

    class BadExc(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    class Liar:
        @property  # type: ignore[misc]
        def __class__(self) -> Any:
            raise RuntimeError("no class")

    d: dict[str, Any] = {"c": None}
    d["c"] = d
    value = {"m": BadMap(a=1), "e": BadExc(), "l": Liar(), "cycle": d, "s": "\ud800"}
    text = to_json(value, CFG)
    parsed = json.loads(text)
    assert parsed["e"]["type"].endswith("BadExc")
    assert "cycle" in parsed


def test_property_nested_values_never_raise_and_stay_in_bounds() -> None:
    """Hypothesis: arbitrary nested values always give valid JSON within max_value_bytes."""
    cfg = CFG.replace(max_value_bytes=2000, max_depth=6)
    leaves = (
        st.none()
        | st.booleans()
        | st.integers(min_value=-(2**80), max_value=2**80)
        | st.floats(allow_nan=True, allow_infinity=True)
        | st.text()
        | st.binary(max_size=50)
        | st.datetimes()
        | st.uuids()
        | st.decimals(allow_nan=False)
        | st.sampled_from([Color.RED, Level.HIGH, Weird(), ValueError("x")])
    )
    keys = st.text(max_size=10) | st.integers() | st.tuples(st.integers())
    values = st.recursive(
        leaves,
        lambda children: (
            st.lists(children, max_size=5)
            | st.dictionaries(keys, children, max_size=5)
            | st.frozensets(st.integers(), max_size=3)
            | st.builds(Point, st.integers(), st.lists(st.integers(), max_size=3))
        ),
        max_leaves=40,
    )

    @settings(max_examples=150, deadline=None)
    @given(values)
    def check(value: Any) -> None:
        text = to_json(value, cfg)
        json.loads(text)
        assert len(text.encode()) <= cfg.max_value_bytes

    check()


def test_property_fast_options_write_what_the_general_ones_write() -> None:
    """Hypothesis: the first try (str keys only, nothing to convert) gives byte for byte
    what one orjson call with every option and the conversion hook gives, and hands any
    other value to that call; conversions are counted once either way."""
    # An array orjson declines (not contiguous) and over the cap is described by the
    # conversion hook, and counted.
    cfg = CFG.replace(redact=False, max_value_bytes=400)
    pol = _serialize.policy(cfg)
    leaves = (
        st.none()
        | st.booleans()
        | st.integers(min_value=-(2**63), max_value=2**63)
        | st.floats(allow_nan=True, allow_infinity=True)
        | st.text()
        | st.datetimes()
        | st.uuids()
        | st.binary(max_size=20)
        | st.sampled_from([Color.RED, Level.HIGH, Weird(), Point(1, [2]), np.arange(400)[::2]])
    )
    keys = st.text(max_size=6) | st.integers() | st.booleans() | st.none()
    values = st.recursive(
        leaves,
        lambda children: (
            st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=4)
        ),
        max_leaves=30,
    )

    @settings(max_examples=200, deadline=None)
    @given(values)
    def check(value: Any) -> None:
        _serialize.stats.clear()
        try:
            expected = orjson.dumps(value, default=pol.default, option=_serialize._common._OPTS)
        except orjson.JSONEncodeError:
            return  # the careful path's business
        if len(expected) > cfg.max_value_bytes:
            return  # so is a value over the cap
        once = dict(_serialize.stats)
        _serialize.stats.clear()
        assert _serialize.dumps(value, pol) == expected
        assert dict(_serialize.stats) == once

    check()


def test_property_secret_prefilter_never_misses_a_secret_key() -> None:
    """Hypothesis: whenever a key is secret, the cheap scan of orjson's output says so;
    keys that are not secret do not trigger it when only a few keys are present."""
    pol = _serialize.policy(CFG)
    alphabet = st.sampled_from(
        [*list('aAkKeEyYpPiI_- .\n\t"\\é0'), "token", "Token", "api", "Key", "password"]
    )
    keys = st.lists(alphabet, max_size=8).map("".join)

    # Text that mentions every redaction word, as values: only keys may count.
    document = "tokenpassword api_key: Authorization cookie session " * 400
    # Long JSON: the word scan, not the per-key check.
    rows = [{"id": i, "name": f"row {i}", "tags": ["a", "b"]} for i in range(600)]

    @settings(max_examples=250, deadline=None)
    @given(keys)
    def check(key: str) -> None:
        # Few keys (each read back) and many keys (the word scan) take different paths; a key
        # may come after a long string or far into the text.
        shapes = [
            {"outer": {key: 1}},
            {**{f"k{i}": i for i in range(200)}, key: 1},
            {"doc": document, key: 1},
            {"rows": rows, "last": {key: 1}},
        ]
        if pol.is_secret(key):
            for shape in shapes:
                assert pol.maybe_secret(orjson.dumps(shape))
        else:
            assert not pol.maybe_secret(orjson.dumps({"outer": {key: 1}}))
            assert not pol.maybe_secret(orjson.dumps({"doc": document, key: 1}))

    check()


def test_secret_key_found_in_long_rows_after_near_misses() -> None:
    """Many records (the word scan over long text): words in values, words not at a word
    boundary and words in keys that are not secret come first; the one secret key is last,
    and is found. Without it, the same text is ruled out."""
    pol = _serialize.policy(CFG)
    rows = [
        {"id": i, "note": "token password api_key", "tokenizer": "x", "mytoken": i}
        for i in range(500)
    ]
    clean = orjson.dumps({"rows": rows})
    assert len(clean) > 16 * 1024
    assert not pol.maybe_secret(clean)
    assert pol.maybe_secret(orjson.dumps({"rows": rows, "last": {"API-Key": 1}}))
    out = js({"rows": rows[:3], "padding": rows, "auth": {"session_token": "abc"}})
    assert out["auth"]["session_token"] == REDACTED
    assert out["rows"][0]["note"] == "token password api_key"


def fresh_policy(cfg: Config = CFG) -> _serialize.Policy:
    """A policy that has learned no keys yet (``policy(cfg)`` is shared by the whole run)."""
    return _serialize.Policy(cfg.max_value_bytes, cfg.max_depth, cfg.redact, cfg.redact_keys)


def records(n: int) -> list[dict[str, Any]]:
    """Rows of the shape agent frameworks pass around: many keys, the same few repeated."""
    return [
        {"id": i, "name": f"item-{i}", "tags": ["a", "b"], "meta": {"rank": i % 7, "ok": True}}
        for i in range(n)
    ]


def test_key_scan_reads_keys_back_exactly_when_they_are_escaped() -> None:
    """Many keys (the key-end scan): keys whose JSON text has escapes are decoded before the
    rule applies, so a key that only reads as secret once unescaped is found, and one whose
    escapes merely sit next to a word is not flagged."""
    rows = records(300)
    secret_once_decoded = [
        "api\nkey",  # \n in the JSON text: letters 'n' + 'key' until decoded
        'api"key',  # an escaped quote between the words
        "api\\key",  # an escaped backslash
        "pass\x00word\x01token",  # \u0000 and \u0001: unicode escapes split the words
        "x\u2028secret",  # a separator orjson writes as UTF-8, not escaped
        "\tAuthorization\r",
    ]
    plain_despite_escapes = ["tok\nen", "pass\x00word", 'max"tokens', "\\nkey", "x\\napikey"]
    pol = fresh_policy()
    for key in secret_once_decoded:
        assert pol.is_secret(key), key
        for shape in ({"rows": rows, "last": {key: 1}}, {key: 1, "rows": rows}):
            out = orjson.dumps(shape)
            assert out.count(b'"', 0, 8192) > 256  # the many-keys path
            assert pol.maybe_secret(out), key
        assert js({"rows": rows[:2], "pad": rows, "x": {key: "v"}})["x"][key] == REDACTED
    for key in plain_despite_escapes:
        assert not pol.is_secret(key), key
        assert not pol.maybe_secret(orjson.dumps({"rows": rows, "last": {key: 1}})), key


def test_key_scan_ignores_secret_words_and_key_text_inside_values() -> None:
    """Values are never keys: words, quoted keys and JSON carried as text (``\":`` inside a
    string) in values neither trigger the careful walk nor get redacted."""
    pol = fresh_policy()
    embedded = orjson.dumps({"password": "x", "api_key": "y"}).decode()
    rows = [
        {"id": i, "note": 'the "token": and "password": fields', "raw": embedded, "l": [":", ":x"]}
        for i in range(400)
    ]
    out = orjson.dumps({"rows": rows})
    assert not pol.maybe_secret(out)
    assert not pol.maybe_secret(out)  # and again, with the keys learned
    _serialize.stats.clear()
    assert js({"rows": rows}) == {"rows": rows}
    assert _serialize.stats["slow_paths"] == 0
    assert _serialize.stats["redactions"] == 0


def test_key_scan_finds_nested_secrets_after_learning_the_shape() -> None:
    """Once the rows' keys are known (skipped in C), a secret key anywhere is still found:
    deep inside one row, as the first or the last key, or in a row of another shape."""
    pol = fresh_policy()
    rows = records(2000)
    out = orjson.dumps({"rows": rows})
    for _ in range(3):
        assert not pol.maybe_secret(out)
    for where in (0, 999, 1999):
        changed = [dict(r) for r in rows]
        changed[where]["meta"] = {"rank": 1, "ok": True, "auth": {"accessToken": "s"}}
        assert pol.maybe_secret(orjson.dumps({"rows": changed}))
        masked = js({"rows": changed})
        assert masked["rows"][where]["meta"]["auth"]["accessToken"] == REDACTED
        assert masked["rows"][where - 1]["meta"] == rows[where - 1]["meta"]
    assert pol.maybe_secret(orjson.dumps({"password": 1, "rows": rows}))
    assert pol.maybe_secret(orjson.dumps({"rows": rows, "Cookie": 1}))
    assert pol.maybe_secret(orjson.dumps([{"id": 1, "ok": True, "secret": 2}, *rows]))


def test_known_keys_never_hide_a_secret_key_that_ends_like_them() -> None:
    """A learned key's text can end a longer key (after an escaped quote) or follow a
    string ending in '{' or ','; the scan only skips it where it is the whole key."""
    pol = fresh_policy()
    rows = [{"name": i, "x": i, ",": i, "": i, "{": i} for i in range(500)]
    out = orjson.dumps({"rows": rows})
    for _ in range(3):
        assert not pol.maybe_secret(out)
    for key in ['password"name', 'token",name', 'secret{"name', 'api_key",', 'cookie"', "passwd{"]:
        assert pol.is_secret(key)
        assert pol.maybe_secret(orjson.dumps({"rows": rows, "last": {key: 1}})), key
        assert pol.maybe_secret(orjson.dumps([{key: 1}, *rows])), key


def test_key_scan_on_very_large_dicts() -> None:
    """50,000 distinct keys (ids as keys, none repeating) and a wide dict of records: the
    secret key is found first, in the middle and last; without it nothing is flagged."""
    pol = fresh_policy()
    wide = {f"user-{i}": {"n": i} for i in range(50_000)}
    assert not pol.maybe_secret(orjson.dumps(wide))
    for where in (0, 25_000, 49_999):
        keys = list(wide)
        changed = {(k if i != where else f"token-{i}"): v for i, (k, v) in enumerate(wide.items())}
        assert pol.maybe_secret(orjson.dumps(changed)), where
        assert keys[where] in wide
    assert pol.maybe_secret(orjson.dumps({**wide, "deep": {"a": [{"b": {"PRIVATE_KEY": 1}}]}}))
    big = {f"k{i}": records(3) for i in range(5000)}
    assert not pol.maybe_secret(orjson.dumps(big))
    big["k2500"] = [{"apiKey": 1}]
    out = js(big)
    assert out["k2500"] == [{"apiKey": REDACTED}]
    assert out["k2499"] == records(3)


def test_key_scan_of_distinct_keys_reads_each_key_alone() -> None:
    """Where keys do not repeat (ids as keys), the scan looks for the redaction words in the
    text. A match stays inside one key: a secret key whose value starts with "count" is
    still found (``"secret":"count..."`` is not ``secret_count``), and two plain keys in a
    row do not make a secret one (``"x_api":{"key":...}`` is not ``x_api_key``)."""
    pol = fresh_policy()
    # The word scan itself (what the key scan falls back to when it cannot tell).
    assert pol._scan_words(orjson.dumps({"secret": "count of users"}))
    assert pol._scan_words(orjson.dumps({"meta": {"token": "counted"}}))
    assert not pol._scan_words(orjson.dumps({"x_api": {"key": 1}}))
    wide = {f"user-{i}": {"n": i} for i in range(50_000)}
    assert pol.maybe_secret(orjson.dumps({**wide, "secret": "count of users"}))
    assert not pol.maybe_secret(orjson.dumps({**wide, "x_api": {"key": 1}}))
    assert not pol.maybe_secret(orjson.dumps({**wide, "by_api": ["key"]}))
    # An escaped backslash is part of the key's text, not an escape of the letter after it.
    assert not pol.is_secret("\\ntoken")
    assert not pol.maybe_secret(orjson.dumps({**wide, "\\ntoken": 1}))
    assert pol.maybe_secret(orjson.dumps({**wide, "\ntoken": 1}))
    # A word split by case is two words: "apikEy" is apik + ey.
    assert not pol.is_secret("apikEy")
    assert not pol.maybe_secret(orjson.dumps({**wide, "apikEy": 1}))
    assert pol.maybe_secret(orjson.dumps({**wide, "apiKey": 1}))


def test_a_flood_of_unrelated_keys_cannot_keep_later_secret_keys_unlearned() -> None:
    """Keys learned plain are bounded; when earlier payloads filled that room with keys that
    never come back, a later shape's keys still get learned (so its scans answer from the keys,
    not the word scan), its secret keys are masked in every payload, and the room stays
    bounded."""
    from looptrace._serialize import keys
    from looptrace._serialize._common import complete

    pol = fresh_policy()
    ends = pol._key_ends
    for batch in range(20):
        flood = [{f"flood_{batch}_{k}": k for k in range(10)} for _ in range(20)]
        assert not pol.maybe_secret(orjson.dumps({"rows": flood}))
        assert len(ends.known) <= keys._KNOWN_MAX
    assert len(ends.known) == keys._KNOWN_MAX
    shape = [{"api_key": "sk-1"} | {f"field_{k}": k for k in range(60)} for _ in range(30)]
    out = orjson.dumps({"request": shape})
    answers = []
    for _ in range(3 * keys._RELEARN_AFTER):
        masked = pol.mask(out)
        assert masked is not None and masked[1] == len(shape)
        assert {row["api_key"] for row in orjson.loads(masked[0])["request"]} == {REDACTED}
        answers.append(complete(ends.find_secret(out, pol._secret_raw)))
        assert len(ends.known) <= keys._KNOWN_MAX
    assert answers[-1] is True  # found from the keys, in C: no word scan
    assert b"field_7" in ends.known and b"flood_0_1" not in ends.known


def test_key_scan_failing_falls_back_to_the_word_scan(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pattern sre refuses is not learned, and a key scan that fails leaves the decision to
    the word scan: secret keys are still found, plain output still passes."""
    from looptrace._serialize import keys

    def refuse(known: list[bytes]) -> Any:
        raise RecursionError("too deep")

    pol = fresh_policy()
    rows = records(500)
    monkeypatch.setattr(keys, "_compile", refuse)
    for _ in range(3):
        assert not pol.maybe_secret(orjson.dumps({"rows": rows}))
    assert pol._key_ends.known == {}
    assert pol.maybe_secret(orjson.dumps({"rows": rows, "x": {"api-key": 1}}))

    def broken(self: Any, out: bytes, secret: Any) -> bool | None:
        raise MemoryError

    monkeypatch.setattr(keys.KeyEnds, "find_secret", broken)
    assert pol.maybe_secret(orjson.dumps({"rows": rows, "x": {"api-key": 1}}))
    assert not pol.maybe_secret(orjson.dumps({"rows": rows}))


def scan_in_steps(pol: _serialize.Policy, out: bytes, step_bytes: int) -> tuple[bool, int]:
    """``maybe_secret_steps`` run to its answer, with the number of steps it yielded after."""
    return run_steps(pol.maybe_secret_steps(out, step_bytes))


def test_key_scan_in_steps_finds_a_secret_key_wherever_a_step_ends() -> None:
    """The scan of long output in steps (the flusher's, so that other tasks run in between)
    stops searching at each step's end: a secret key, an escaped quote or a run of backslashes
    cut there is still read exactly, at every step size, and a scan of plain keys it knows
    yields once per step."""
    rows = records(40)
    tricky = {'a\\"b': 1, "x\\": 2, "\\": 3, 'q"': 4}
    # A key that ends in a backslash ends in an even run of them in JSON: cut inside that run,
    # its closing quote would look escaped.
    for key in ("API_KEY", "API_KEY\\", "API_KEY\\\\"):
        secret = orjson.dumps({"rows": rows, "t": tricky, "x": {key: 1}, "z": rows[:3]})
        for step in range(1, len(secret) + 2):
            assert scan_in_steps(fresh_policy(), secret, step)[0], (key, step)
    plain = orjson.dumps({"rows": rows, "t": tricky, "x": {"API_KE\\": 1}, "z": rows[:3]})
    for step in range(1, len(plain) + 2):
        assert not scan_in_steps(fresh_policy(), plain, step)[0], step
    pol = fresh_policy()
    assert not pol.maybe_secret(plain)  # its keys learned
    # A key met again is learned, compiled in a step of its own: the keys met once in the scan
    # above now, "rows" (once per output) the time after; then nothing is left to learn.
    steps = (len(plain) - 1) // 256
    answers = [scan_in_steps(pol, plain, 256) for _ in range(3)]
    assert answers == [(False, steps + 2), (False, steps + 2), (False, steps)]
    # Keys cut at a step's end come back to Python; known ones are not counted as keys that
    # never repeat, so even one-byte steps answer from the keys, not the word scan.
    for step in (1, 2, 7):
        assert run_steps(pol._key_ends.find_secret(plain, pol._secret_raw, step))[0] is False


def test_key_scan_in_steps_compiles_what_it_learned_in_a_step_of_its_own() -> None:
    """Learning a shape's keys compiles a pattern, which takes as long as a step of the scan:
    in a scan in steps the compile runs between two yields, not inside a step that searched
    (with steps longer than the output, the search alone would never yield)."""
    pol = fresh_policy()
    ends = pol._key_ends
    out = orjson.dumps({"rows": records(40)})
    scan = ends.find_secret(out, pol._secret_raw, len(out) + 1)
    next(scan)  # searched until the keys repeated
    assert not ends.known
    next(scan)  # compiled
    learned = dict(ends.known)
    assert {b"id", b"name", b"tags"} <= set(learned)
    with pytest.raises(StopIteration) as done:
        next(scan)  # the rest of the search
    assert done.value.value is False
    assert ends.known == learned
    # Without steps, the same scan never yields.
    assert run_steps(fresh_policy()._key_ends.find_secret(out, pol._secret_raw, 0)) == (False, 0)


def test_property_key_scan_in_steps_is_exact() -> None:
    """Hypothesis: scanned in steps of any size, long output is flagged exactly when the rule
    calls one of its keys secret."""
    pol = fresh_policy()
    alphabet = st.sampled_from([*list('aAkKeEyY_- .\n"\\:0'), "token", "api", "Key", "id"])
    keys = st.lists(alphabet, max_size=8).map("".join)
    rows = records(60)

    @settings(max_examples=200, deadline=None)
    @given(keys, st.integers(min_value=0, max_value=59), st.integers(min_value=1, max_value=300))
    def check(key: str, where: int, step: int) -> None:
        changed = [dict(r) for r in rows]
        changed[where] = {**changed[where], key: {key: 1}}
        out = orjson.dumps({"rows": changed})
        assert scan_in_steps(pol, out, step)[0] == pol.is_secret(key)

    check()


def test_property_key_scan_is_exact_on_many_keys() -> None:
    """Hypothesis: with many keys (the key-end scan) and a policy that keeps learning across
    examples, a key is flagged exactly when the rule calls it secret, wherever it sits."""
    pol = fresh_policy()
    alphabet = st.sampled_from(
        [*list('aAkKeEyYnN_- .\n"\\{},:é0\x00'), "token", "Token", "api", "Key", "name", "id"]
    )
    keys = st.lists(alphabet, max_size=8).map("".join)
    rows = records(200)

    @settings(max_examples=300, deadline=None)
    @given(keys, keys, st.integers(min_value=0, max_value=199))
    def check(key: str, other: str, where: int) -> None:
        changed = [dict(r) for r in rows]
        changed[where] = {**changed[where], other: {key: [key]}}
        out = orjson.dumps({"rows": changed, key: 1})
        assert pol.maybe_secret(out) == (pol.is_secret(key) or pol.is_secret(other))

    check()


# ----------------------------------------------------------------------------- limits


def test_long_string_is_cut_and_says_its_size() -> None:
    """A string over max_value_bytes is cut; the text says it was and how long it was."""
    cfg = CFG.replace(max_value_bytes=1000)
    out = js({"text": "x" * 50_000, "n": 1}, cfg)
    assert out["n"] == 1
    assert out["text"].startswith("xxx")
    assert out["text"].endswith("<truncated: 50000 chars>")
    assert len(to_json({"text": "x" * 50_000}, cfg)) <= 1000


def test_value_too_big_after_cutting_strings_becomes_a_preview() -> None:
    """A value of many small items still over the cap becomes a marked preview with its size."""
    cfg = CFG.replace(max_value_bytes=1000)
    value = list(range(5000))
    full = len(orjson.dumps(value))
    out = js(value, cfg)
    assert out["looptrace.truncated"] is True
    assert out["original_bytes"] == full
    assert out["preview"].startswith("[0,1,2")
    assert len(to_json(value, cfg)) <= 1000


def test_span_cap_shrinks_the_biggest_payload() -> None:
    """When input + output exceed max_span_bytes the bigger one is cut; the small one stays."""
    cfg = CFG.replace(max_span_bytes=5000)
    span = Span("s", 1, 2, 0, 10)
    span.end_ns = 20
    span.inputs = {"q": "small"}
    span.output = "y" * 20_000
    attrs = dict(to_wire(span, cfg).attributes)
    assert json.loads(str(attrs[INPUT_VALUE])) == {"q": "small"}
    out = json.loads(str(attrs[OUTPUT_VALUE]))
    assert out["looptrace.truncated"] is True
    assert out["original_bytes"] == 20_002
    assert sum(len(str(v)) for v in attrs.values()) <= 5000


# ----------------------------------------------------------------------------- redaction


def test_secret_keys_are_masked_at_any_depth() -> None:
    """Keys that look secret are masked wherever they are, in any spelling; lookalikes stay."""
    value = {
        "user": "ann",
        "password": "hunter2",
        "nested": [{"X-Api-Key": "k", "accessToken": "t", "Authorization": "Bearer x"}],
        "max_tokens": 512,
        "tokenizer": "bpe",
        "point": Point(1, [2]),
    }
    assert js(value) == {
        "user": "ann",
        "password": REDACTED,
        "nested": [{"X-Api-Key": REDACTED, "accessToken": REDACTED, "Authorization": REDACTED}],
        "max_tokens": 512,
        "tokenizer": "bpe",
        "point": {"x": 1, "y": [2]},
    }
    assert _serialize.stats["redactions"] == 4


def test_flat_arguments_are_judged_by_their_keys_and_masked_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A traced call's arguments and result are most often a few scalars by name: their keys
    settle whether the JSON can hold a secret, so its text is not scanned, and what is written
    is what the scan would have written, secret keys masked."""
    from looptrace._serialize.walk import _dumps, _redacted, flat_clean

    pol = fresh_policy()
    words = ["question", "i", "user", "max_tokens", "password", "api_key", "Authorization", "n"]

    @settings(max_examples=200, deadline=None)
    @given(
        st.dictionaries(
            st.sampled_from(words),
            st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.text(max_size=5)),
            max_size=6,
        )
    )
    def same(value: dict[str, Any]) -> None:
        out = orjson.dumps(value)
        scanned = _redacted(value, pol, out) if pol.maybe_secret(out) else out
        assert _dumps(value, pol) == scanned
        assert flat_clean(value, pol) == (not any(pol.is_secret(k) for k in value))

    same()
    # Nested values, other key types, many keys and values of other types are left to the scan.
    assert not flat_clean({"q": {"api_key": "k"}}, pol)
    assert not flat_clean({"q": ["a"]}, pol)
    assert not flat_clean({1: "a"}, pol)
    assert not flat_clean({f"k{i}": i for i in range(65)}, pol)
    assert not flat_clean({"when": datetime.date(2026, 1, 1)}, pol)
    assert flat_clean("just text", pol)

    scans: list[bytes] = []
    real = _serialize.Policy.maybe_secret
    monkeypatch.setattr(
        _serialize.Policy,
        "maybe_secret",
        lambda self, out, found=None: scans.append(out) or real(self, out, found),
    )

    @looptrace.traced
    def ask(question: str, i: int, password: str = "") -> dict[str, int]:
        return {"answer": 4, "i": i}

    with capture_spans() as spans:
        ask("what is 2+2?", 1)
        ask("what is 2+2?", 2, password="hunter2")
    clean = dict(to_wire(spans[0], CFG).attributes)
    masked = dict(to_wire(spans[1], CFG).attributes)
    assert json.loads(str(clean[INPUT_VALUE])) == {"question": "what is 2+2?", "i": 1}
    assert json.loads(str(masked[INPUT_VALUE]))["password"] == REDACTED
    assert json.loads(str(masked[OUTPUT_VALUE])) == {"answer": 4, "i": 2}
    # Only the arguments holding a secret key were scanned.
    assert scans == [b'{"question":"what is 2+2?","i":2,"password":"hunter2"}']


def test_secret_fields_of_models_are_masked() -> None:
    """Field names of models and dataclasses count as keys."""

    class Login(pydantic.BaseModel):
        user: str
        password: str

    assert js(Login(user="a", password="p")) == {"user": "a", "password": REDACTED}


def test_redaction_can_be_turned_off_or_customised() -> None:
    """cfg.redact=False keeps values; cfg.redact_keys replaces the word list."""
    assert js({"password": "p"}, CFG.replace(redact=False)) == {"password": "p"}
    custom = CFG.replace(redact_keys=("ssn",))
    assert js({"password": "p", "user_ssn": "1"}, custom) == {"password": "p", "user_ssn": REDACTED}


def test_value_text_mentioning_a_secret_word_is_kept() -> None:
    """Only keys are matched: a value that says 'password' is not masked."""
    assert js({"note": "reset your password", "list": ["token"]}) == {
        "note": "reset your password",
        "list": ["token"],
    }


# ----------------------------------------------------------------------------- spans and hooks


def test_to_wire_for_a_traced_call() -> None:
    """A traced call gives code.*, site and span attributes, JSON input/output with mime types."""

    @looptrace.traced(attributes={"team": "a", "api_key": "k"})
    def work(a: int, b: str, password: str) -> dict[str, int]:
        looptrace.current_span().set_attributes(
            {"n": 3, "tags": ["x", "y"], "obj": {"k": 1}, "none": None, "big": 2**70}
        )
        return {"r": a}

    with capture_spans() as spans:
        work(1, "b", password="p")
    wire = to_wire(spans[0], CFG)
    attrs = dict(wire.attributes)
    assert attrs[CODE_FUNCTION] == "work"
    assert attrs[CODE_NAMESPACE] == __name__
    assert attrs["team"] == "a"
    assert attrs["api_key"] == REDACTED
    assert attrs["n"] == 3
    assert attrs["tags"] == ["x", "y"]
    assert attrs["obj"] == '{"k":1}'
    assert "none" not in attrs
    assert attrs["big"] == str(2**70)
    assert json.loads(str(attrs[INPUT_VALUE])) == {"a": 1, "b": "b", "password": REDACTED}
    assert attrs[INPUT_MIME_TYPE] == "application/json"
    assert json.loads(str(attrs[OUTPUT_VALUE])) == {"r": 1}
    assert IN_PROGRESS not in attrs


def test_a_sites_attributes_are_written_once_and_counted_on_every_span() -> None:
    """The calls of one traced function carry its decorator's attributes: each call's span
    has them in the same place, around its own payloads; a secret-named one is masked and
    counted on every span; under a policy with other secret words they are written anew."""

    @looptrace.traced(attributes={"team": "a", "api_key": "k"})
    def work(n: int) -> int:
        return n

    with capture_spans() as spans:
        work(1)
        work(2)
    before = _serialize.stats["redactions"]
    first, second = (to_wire(span, CFG).attributes for span in spans)
    assert _serialize.stats["redactions"] - before == 2
    order = ["team", "api_key", CODE_FUNCTION, CODE_NAMESPACE, OPENINFERENCE_SPAN_KIND]
    order += [INPUT_VALUE, INPUT_MIME_TYPE, OUTPUT_VALUE, OUTPUT_MIME_TYPE]
    assert [k for k, _ in first] == [k for k, _ in second] == order
    assert dict(second)["api_key"] == REDACTED
    assert json.loads(str(dict(second)[INPUT_VALUE])) == {"n": 2}
    assert dict(second)[OUTPUT_VALUE] == "2"

    other = Config(redact_keys=("team",))
    attrs = dict(to_wire(spans[1], other).attributes)
    assert (attrs["team"], attrs["api_key"]) == (REDACTED, "k")
    # Its own attributes and a block's go where they went: the block's first, then the site's.
    with capture_spans() as spans, looptrace.attributes(session_id="s-1"):
        work(3)
        looptrace.current_span()
    spans[0].attributes = {"mine": 1}
    keys = [k for k, _ in to_wire(spans[0], CFG).attributes]
    assert keys.index("session.id") < keys.index("team") < keys.index(CODE_NAMESPACE)
    assert keys.index(CODE_NAMESPACE) < keys.index("mine") < keys.index(OPENINFERENCE_SPAN_KIND)


def test_to_wire_exception_event_and_links() -> None:
    """An exception event carries type, message and a formatted stack; links keep ids."""

    @looptrace.traced
    def boom() -> None:
        raise KeyError("missing")

    with capture_spans() as spans, pytest.raises(KeyError):
        boom()
    span = spans[0]
    span.links = None
    span.end_ns = 0
    span.add_link(SpanContext(7, 8, True, "", True), {"why": "retry"})
    wire = to_wire(span, CFG)
    (event,) = wire.events
    attrs = dict(event.attributes)
    assert attrs[EXCEPTION_TYPE] == "KeyError"
    assert attrs[EXCEPTION_MESSAGE] == "'missing'"
    assert "raise KeyError" in str(attrs[EXCEPTION_STACKTRACE])
    assert wire.status_code == 2
    (link,) = wire.links
    assert (link.trace_id, link.span_id, link.is_remote) == (7, 8, True)
    assert dict(link.attributes) == {"why": "retry"}
    assert dict(wire.attributes)[IN_PROGRESS] is True


def test_site_and_global_hooks_run_in_order() -> None:
    """The decorator's process_inputs runs first, then cfg.process_inputs; outputs likewise."""

    @looptrace.traced(process_inputs=lambda d: {**d, "site": True}, process_outputs=lambda o: o * 2)
    def f(a: int) -> int:
        return a

    cfg = CFG.replace(
        process_inputs=lambda d: {**d, "global": True}, process_outputs=lambda o: o + 1
    )
    with capture_spans() as spans:
        f(5)
    attrs = dict(to_wire(spans[0], cfg).attributes)
    assert json.loads(str(attrs[INPUT_VALUE])) == {"a": 5, "site": True, "global": True}
    assert attrs[OUTPUT_VALUE] == "11"


def test_hooks_fail_closed() -> None:
    """A hook that raises replaces the value with an error marker; the raw value never leaves."""

    def bad(value: Any) -> Any:
        raise ValueError("hook bug")

    @looptrace.traced(process_inputs=bad, process_outputs=bad)
    def f(secret_thing: str) -> str:
        return "raw-output"

    with capture_spans() as spans:
        f("raw-input")
    attrs = dict(to_wire(spans[0], CFG).attributes)
    assert json.loads(str(attrs[INPUT_VALUE])) == "<process_inputs failed: ValueError>"
    assert json.loads(str(attrs[OUTPUT_VALUE])) == "<process_outputs failed: ValueError>"
    assert "raw-" not in repr(attrs)
    assert _serialize.stats["hook_errors"] == 2


def test_snapshot_keeps_what_was_passed() -> None:
    """snapshot() copies top-level containers, so appending after the call does not show;
    without it the record shows the caller's later change (the cost of deferring JSON)."""
    messages = [{"role": "user", "content": "hi"}]
    bound = {"messages": messages, "n": 1}
    snap = _serialize.snapshot(bound)
    deferred = {"messages": messages, "n": 1}
    messages.append({"role": "assistant", "content": "hello"})
    assert js(snap) == {"messages": [{"role": "user", "content": "hi"}], "n": 1}
    assert len(js(deferred)["messages"]) == 2
    untouched = {"n": 1, "s": "x"}
    assert _serialize.snapshot(untouched) is untouched


# ----------------------------------------------------------------------------- sizing


def test_estimate_size_counts_top_level_text_only() -> None:
    """estimate_size grows with top-level strings/bytes and ignores what is nested."""
    span = Span("s", 1, 2, 0, 10)
    base = estimate_size(span)
    span.inputs = {"a": "x" * 10_000, "b": b"y" * 5_000}
    assert estimate_size(span) >= base + 15_000
    span.inputs = {"a": ["x" * 10_000]}
    assert estimate_size(span) < base + 1_000


def test_estimate_takes_the_encoded_size_of_the_last_large_span_of_a_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A nested image is invisible to the top-level look; once a span of that name has been
    encoded large, the next ones weigh as much until one of them comes out small. Names are
    kept within a bound."""
    from looptrace._serialize import learn_sizes, sizing

    monkeypatch.setattr(sizing, "_large", {})
    monkeypatch.setattr(sizing, "_MAX_NAMES", 2)
    span = Span("describe", 1, 2, 0, 10)
    span.inputs = {"request": {"image": "x" * 2_000_000}}
    blind = estimate_size(span)
    assert blind < 1_000
    learn_sizes([span], [b"e" * 2_000_100])
    assert estimate_size(span) == 2_000_100
    assert estimate_size(Span("other", 1, 3, 0, 10)) < 1_000
    learn_sizes([span], [b"e" * 900])  # this call's request was small: forgotten
    assert estimate_size(span) == blind
    learn_sizes([span], [b"e" * 100_000])
    learn_sizes([Span(n, 1, 4, 0, 10) for n in ("a", "b")], [b"e" * 100_000] * 2)
    assert len(sizing._large) <= 2


def test_remote_parent_flag_reaches_the_wire() -> None:
    """The local root of a distributed trace says its parent is remote (OTLP span flags);
    an ordinary child does not."""
    import looptrace
    from looptrace._config import Config
    from looptrace._serialize import to_wire
    from looptrace.testing import capture_spans

    ctx = looptrace.extract(
        {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    )
    with capture_spans() as spans, looptrace.span("server", parent=ctx), looptrace.span("inner"):
        pass
    cfg = Config.from_env()
    wires = {s.name: to_wire(s, cfg) for s in spans}
    assert wires["server"].parent_is_remote
    assert not wires["inner"].parent_is_remote


def test_default_redaction_keeps_what_llm_applications_group_and_count_by() -> None:
    """session_id, user_id and token counts (OpenAI's, Gemini's, OpenInference's) stay
    readable by default; credentials under the same words are still masked."""
    out = js(
        {
            "session_id": "conv-42",
            "user_id": "ann",
            "session": "conv-42",
            "usage": {"prompt_tokens": 12, "prompt_token_count": 12, "total_token_count": 30},
            "llm.token_count.prompt": 12,
            "headers": {"Authorization": "Bearer sk-1", "X-Session-Token": "t"},
            "access_token": "a",
            "token": "b",
        }
    )
    assert (
        out["session_id"] == "conv-42" and out["user_id"] == "ann" and out["session"] == "conv-42"
    )
    assert out["usage"] == {"prompt_tokens": 12, "prompt_token_count": 12, "total_token_count": 30}
    assert out["llm.token_count.prompt"] == 12
    assert out["headers"] == {"Authorization": REDACTED, "X-Session-Token": REDACTED}
    assert out["access_token"] == REDACTED and out["token"] == REDACTED


_json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**6), 10**6), st.text(max_size=12)
)
_keys = st.sampled_from(
    [
        *("role", "content", "api_key", "Authorization", "prompt_tokens", "token", 'pass"word'),
        *("x\ny", "session_id", "X-Api-Key", "note", "accessToken", "token_count", "tokenizer"),
        *("{", ","),
    ]
)
_json_values = st.recursive(
    _json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_keys, children, max_size=5),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None)
@given(_json_values)
def test_masking_the_text_gives_what_the_careful_walk_gives(value: Any) -> None:
    """Redaction on orjson's text (Policy.mask) and the careful walk of the value agree, for
    any nesting of secret and plain keys, escapes and values that look like keys; no
    credential survives either."""
    from looptrace._serialize.walk import _careful

    pol = fresh_policy()
    out = orjson.dumps(value)
    masked = pol.mask(out)
    assert masked is not None
    assert orjson.loads(masked[0]) == orjson.loads(_careful(value, pol, out))


def test_a_payload_with_a_credential_is_masked_without_the_careful_walk() -> None:
    """A structure-heavy payload holding api_key and Authorization among thousands of plain
    keys is masked in the text: the slow path is not taken, and nothing of the secrets goes
    out."""
    rows = records(2000)
    value = {
        "rows": rows,
        "request": {"headers": {"Authorization": "Bearer sk-1"}, "api_key": {"k": "sk-2"}},
    }
    before = _serialize.stats["slow_paths"]
    out = _serialize.to_json(value, CFG)
    assert _serialize.stats["slow_paths"] == before
    assert "sk-1" not in out and "sk-2" not in out
    doc = json.loads(out)
    assert doc["request"] == {"headers": {"Authorization": REDACTED}, "api_key": REDACTED}
    assert doc["rows"] == rows


def test_a_large_image_request_with_credentials_is_masked_and_the_image_kept_whole() -> None:
    """A multimodal request (a data URL of megabytes, a few keys) with an API key in its
    headers: the credentials are masked wherever they sit, before or after the long strings,
    the image comes out byte for byte, and a long string holding JSON as text (escaped
    quotes, '":' inside) is not read as keys. No careful walk is taken."""
    image = "data:image/png;base64," + base64.b64encode(bytes(range(256)) * 8_000).decode()
    quoted_json = orjson.dumps({"api_key": "not-a-key-here", "x": image[:5000]}).decode()
    value = {
        "headers": {"Authorization": "Bearer sk-live-1", "Accept": "application/json"},
        "messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": image}}]},
            {"role": "tool", "content": quoted_json},
        ],
        "api_key": {"value": "sk-live-2", "scopes": ["read"]},
        "usage": {"prompt_tokens": 1_105, "completion_tokens": 61},
    }
    before = _serialize.stats["slow_paths"]
    out = to_json(value, CFG.replace(max_value_bytes=8_000_000))
    assert _serialize.stats["slow_paths"] == before
    assert "sk-live" not in out
    doc = json.loads(out)
    assert doc["headers"] == {"Authorization": REDACTED, "Accept": "application/json"}
    assert doc["api_key"] == REDACTED
    assert doc["messages"][0]["content"][0]["image_url"]["url"] == image
    assert doc["messages"][1]["content"] == quoted_json
    assert doc["usage"] == value["usage"]


@pytest.mark.parametrize("size", [2_000, 200_000])
def test_a_payload_with_credentials_is_scanned_once_and_masked_as_before(
    monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    """A request carrying an API key and an Authorization header among many records (a chat
    payload): the scan that finds its secret keys goes on to the end and hands their places
    to the masking, so the text is scanned once, as a payload without them is; what is
    written is what masking after a scan of its own writes, each secret masked and counted."""
    from looptrace._serialize import keys as _keys
    from looptrace._serialize.walk import _dumps, dumps_or_steps

    pol = fresh_policy()
    value = {
        "request": {"headers": {"api_key": "sk-live", "Authorization": "Bearer t"}, "n": 2},
        "messages": [{"role": "user", "content": "x" * 20, "i": i} for i in range(size // 40)],
        "session": {"api_key": "sk-second"},
    }
    out = orjson.dumps(value)
    expected = pol.mask(out)
    assert expected is not None and expected[1] == 3
    scans: list[int] = []
    real = _keys.KeyEnds.find_secret

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        scans.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(_keys.KeyEnds, "find_secret", counted)
    redactions = _serialize.stats["redactions"]
    written = dumps_or_steps(value, pol)
    if not isinstance(written, bytes):
        written = run_steps(written)[0]
    assert written == expected[0]
    assert json.loads(written)["session"] == {"api_key": REDACTED}
    assert _serialize.stats["redactions"] - redactions == 3
    assert len(scans) == 1
    scans.clear()
    assert _dumps(value, pol) == expected[0]
    assert len(scans) == 1


def test_a_large_request_with_few_keys_and_a_credential_is_read_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A multimodal request (a few keys around an image as a data URL) holding an API key:
    its keys are read back between the quotes once, and the masking takes the places found
    then, as the same request without the key is read once."""
    from looptrace._serialize.walk import dumps_or_steps

    pol = fresh_policy()
    image = "data:image/png;base64," + "A" * 300_000
    value = {
        "model": "gpt-4o",
        "messages": [{"role": "user", "content": [{"type": "image_url", "url": image}]}],
        "headers": {"api_key": "sk-live", "x-request-id": "r1"},
    }
    out = orjson.dumps(value)
    expected = pol.mask(out)
    assert expected is not None and expected[1] == 1
    reads: list[int] = []
    real = _serialize.Policy._keys_by_quotes

    def counted(self: Any, *args: Any) -> Any:
        reads.append(1)
        return real(self, *args)

    monkeypatch.setattr(_serialize.Policy, "_keys_by_quotes", counted)
    written = dumps_or_steps(value, pol)
    if not isinstance(written, bytes):
        written = run_steps(written)[0]
    assert written == expected[0]
    assert json.loads(written)["headers"] == {"api_key": REDACTED, "x-request-id": "r1"}
    assert len(reads) == 1
