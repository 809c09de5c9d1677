"""How large strings and bytes reach the worker: the shared-memory ring (regions handed out
first in, first out, never overwritten while in use) and direct reads (nothing copied), with
values that come back out exactly as they went in."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from looptrace import _offload, _offload_child, _ring

SIZE = 1 << 20
BIG = 64 * 1024


@pytest.fixture
def ring() -> Iterator[_ring.Ring]:
    r = _ring.create(SIZE)
    assert r is not None, "shared memory is available on the machines we test on"
    yield r
    r.close()


@pytest.fixture
def reader(ring: _ring.Ring) -> _ring.Reader:
    return _ring.Reader(ring.name, ring.size)


def test_values_round_trip(ring: _ring.Ring, reader: _ring.Reader) -> None:
    text = "A" * BIG
    raw = bytes(range(256)) * 256
    for value in (text, raw, bytearray(raw)):
        slot = ring.put(value)
        assert slot is not None
        out = reader.value(slot)
        assert type(out) is type(value) and out == value


def test_values_it_does_not_carry(ring: _ring.Ring) -> None:
    """Non-ASCII strings would need a UTF-8 copy first, and other types are not flat."""
    assert ring.put("é" * BIG) is None
    assert ring.put(memoryview(b"x" * BIG)) is None
    assert ring.put(["x"] * BIG) is None


def test_full_ring_says_no_and_wraps_once_space_frees(ring: _ring.Ring) -> None:
    quarter = "q" * (SIZE // 4)
    slots = [ring.put(quarter) for _ in range(4)]
    assert all(s is not None for s in slots)
    assert ring.put(quarter) is None  # full: the caller pickles instead
    ring.release(slots[1].off)  # type: ignore[union-attr]
    assert ring.put(quarter) is None  # the oldest region still holds the head of the ring
    ring.release(slots[0].off)  # type: ignore[union-attr]
    wrapped = ring.put(quarter)
    assert wrapped is not None and wrapped.off == 0
    assert ring.put("r" * (SIZE // 4)) is not None  # [quarter, half) was freed as well
    assert ring.put("x") is None


def test_regions_in_use_are_never_overwritten(ring: _ring.Ring, reader: _ring.Reader) -> None:
    """Under churn with out-of-order releases, every live region still reads back intact."""
    live: dict[int, tuple[_ring.Slot, bytes]] = {}
    for i in range(200):
        value = bytes([i % 251]) * (BIG + (i * 7919) % (SIZE // 5))
        slot = ring.put(value)
        if slot is None:
            oldest = min(live)
            ring.release(live.pop(oldest)[0].off)
            continue
        live[i] = (slot, value)
        if i % 3 == 0 and len(live) > 1:
            newest = max(live)
            ring.release(live.pop(newest)[0].off)
        for s, v in live.values():
            assert reader.value(s) == v
    assert ring.busy == len(live)


def test_closed_ring_takes_nothing(ring: _ring.Ring) -> None:
    ring.close()
    assert ring.put("x" * BIG) is None
    ring.close()  # twice is fine


payloads = st.recursive(
    st.one_of(
        st.integers(),
        st.text(max_size=5),
        st.sampled_from(["a" * BIG, b"b" * BIG, bytearray(b"c" * BIG), "é" * 10]),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.tuples(inner, inner),
        st.dictionaries(st.text(max_size=3), inner, max_size=4),
    ),
    max_leaves=12,
)


def test_direct_slots_read_back_without_a_copy() -> None:
    """A direct slot names the value's own buffer; reading it (here from this very process)
    gives an equal value of the same type, one that behaves as any other (the reader builds
    it in place)."""
    direct = _ring.Direct()
    reader = _ring.Reader(None, 0, os.getpid())
    text, raw = "T" * BIG, bytes(range(256)) * 256
    for value in (text, raw, "", b""):
        slot = direct.put(value)
        assert slot is not None and slot.n == len(value)
        out = reader.value(slot)
        assert type(out) is type(value) and out == value
        assert hash(out) == hash(value) and {value: 1}[out] == 1
        as_text = out if isinstance(out, str) else out.hex()
        assert orjson.dumps(as_text) == orjson.dumps(
            value if isinstance(value, str) else value.hex()
        )
    assert direct.put(text).off == direct.put(text).off  # type: ignore[union-attr]


def test_direct_refuses_what_could_change_or_has_no_buffer() -> None:
    direct = _ring.Direct()
    assert direct.put("é" * BIG) is None  # no UTF-8 buffer until one is made
    assert direct.put(bytearray(b"x" * BIG)) is None  # the caller could change it later
    assert direct.put(memoryview(b"x" * BIG)) is None


def test_reading_a_bad_address_is_an_error_not_garbage() -> None:
    reader = _ring.Reader(None, 0, os.getpid())
    with pytest.raises(OSError, match="process_vm_readv"):
        reader.value(_ring.Slot(8, 100, _ring._DIRECT_STR))
    with pytest.raises(LookupError):
        reader.value(_ring.Slot(0, 100, _ring._STR))  # a ring slot, but no ring mapped


@pytest.mark.parametrize("direct", [False, True], ids=["ring", "direct"])
@given(value=payloads)
def test_lift_then_restore_gives_back_the_value(value: Any, direct: bool) -> None:
    """What the parent lifts, the worker restores: an equal value of the same types, whatever
    the nesting and whichever way each piece crossed; the parent's value is left untouched."""
    ring = _ring.create(4 * SIZE)
    assert ring is not None
    try:
        reader = _ring.Reader(ring.name, ring.size, os.getpid())
        lifter = _offload._Lifter(_ring.Direct() if direct else ring)
        before = repr(value)
        lifted = lifter.lift(value)
        assert repr(value) == before
        restored = _offload_child.restore(lifted, reader, [lifter.slots, _offload.LIFT_BUDGET])
        assert restored == value and repr(restored) == repr(value)
        if direct:
            assert ring.busy == 0 and lifter.regions == []  # nothing copied
        else:
            assert ring.busy == len(lifter.regions)
    finally:
        ring.close()


def test_lift_stays_within_its_budget(ring: _ring.Ring) -> None:
    """A self-referencing dict is walked at most LIFT_BUDGET values deep, without error, and
    its string is copied into the ring once."""
    d: dict[str, Any] = {"image": "i" * BIG}
    d["self"] = d
    lifter = _offload._Lifter(ring)
    lifted = lifter.lift(d)
    assert lifted is not d and d["image"] == "i" * BIG
    assert lifter.slots > 1 and len(lifter.regions) == 1 and ring.busy == 1
