"""The object keys in orjson's output, found from their ends; keys seen before cost one regex
attempt each.

Every object key orjson writes ends in an unescaped ``":`` and starts right after ``{`` or
``,`` (compact output, no spaces). Read backwards, each key end is ``:"`` followed by the key
reversed, so one regex over the reversed bytes can attempt a match at every key end and fail
at once when the key is one it already knows to be plain: about 30 ns a key, in C, however
long the values between keys are. Only the other key ends come back to Python, where the key
is read back and checked exactly (:meth:`~looptrace._serialize.policy.Policy._secret_raw`).
Structure-heavy payloads repeat a small set of keys (rows, messages, tool schemas), so after
the first payload of a shape nothing comes back at all.

Why a known key cannot hide another one: the pattern skips a key end only when the text
before it is ``{"K"`` or ``,"K"`` for a known plain key ``K``. The first of those two quotes
follows a character that is not a backslash, and the second follows ``K``, whose backslashes
come in the pairs and escapes it was learned with: neither is escaped, and no unescaped quote
lies between them. Unescaped quotes alternate, opening and closing strings; so either they
hold the string ``K`` and the ``:`` makes it a key, or the first closes a string and the
second opens one (a value starting with ``:``) and no key ends there at all. A key end whose
quote is escaped (``\\":`` inside a string, such as JSON carried as text) ends no key and
is skipped too.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Generator

from ._common import _CACHE_MAX

# The keys the pattern skips, at most: compiling takes about 7 us a key (sre parses the
# pattern in Python, on the flusher's time), and a trie keeps each attempt's cost flat as the
# set grows.
_KNOWN_MAX = 64
# Scans a full pattern serves before keys it cannot hold may replace it: a process whose first
# payloads filled the pattern with keys it never sees again would otherwise send every later
# shape's keys back to Python, and past ``_MISSES_MAX`` to the word scan, for good. At most one
# compile per this many scans, so two shapes taking turns cannot make every scan compile.
_RELEARN_AFTER = 16
# Longer keys are checked from the per-key cache on every payload instead.
_KNOWN_KEY_BYTES = 64
# Key ends one scan may hand back to Python (each ~1 us) without learning from them, before
# the caller's word scan decides instead: output whose keys never repeat (ids as keys) costs
# little more than that scan.
_MISSES_MAX = 32
# Hits on keys met before that show a repeating shape: the pattern is rebuilt there and then
# with every key this scan met, so a long list of records pays the Python check for its first
# records only. One compile per scan at most, so no payload pays for more than one.
_STALE_REBUILD = 8

# After ``:"`` (reversed): an odd run of backslashes means the quote was escaped.
_ESCAPED = rb"(?!\\(?:\\\\)*(?!\\))"


def _trie(keys: list[bytes]) -> bytes:
    """An alternation of ``keys`` factored by common prefix (sre tries each branch in turn,
    with a one-byte check for those that start with a literal)."""
    groups: dict[bytes, list[bytes]] = {}
    ends = False
    for k in keys:
        if k:
            groups.setdefault(k[:1], []).append(k[1:])
        else:
            ends = True
    alts = [re.escape(first) + _trie(rest) for first, rest in groups.items()]
    if ends:
        alts.append(b"")
    if len(alts) == 1:
        return alts[0]
    return b"(?:" + b"|".join(alts) + b")"


def _compile(known: list[bytes]) -> re.Pattern[bytes]:
    skip = rb"(?!" + _trie([k[::-1] for k in known]) + rb'"[{,])' if known else b""
    return re.compile(rb':"' + skip + _ESCAPED)


def _escaped(out: bytes, q: int) -> bool:
    """Whether the quote at ``q`` is preceded by an odd number of backslashes."""
    slashes = 0
    while q - 1 - slashes >= 0 and out[q - 1 - slashes] == 92:
        slashes += 1
    return slashes % 2 == 1


def key_ending_at(out: bytes, q: int) -> bytes:
    """The raw text of the key whose closing quote is at ``q`` (back to the previous
    unescaped quote; all of the text before ``q`` when there is none)."""
    s = out.rfind(b'"', 0, q)
    while s != -1 and _escaped(out, s):
        s = out.rfind(b'"', 0, s)
    return out[s + 1 : q]


class KeyEnds:
    """The key ends of one policy's output, with the plain keys it has learned to skip.

    Learning is shared by every thread that serializes under the policy: the pattern only
    ever names keys checked plain, and it is replaced together with the set of keys it names,
    so a race can lose a key from both (to be learned again), never admit a secret."""

    __slots__ = ("_compiled_at", "_scans", "_seen", "_state")

    def __init__(self) -> None:
        self._seen: set[bytes] = set()
        self._state: tuple[dict[bytes, None], re.Pattern[bytes]] = ({}, _compile([]))
        # Scans started, and the count when the pattern was last compiled (racy counts between
        # threads only move when a full pattern may be replaced).
        self._scans = 0
        self._compiled_at = 0

    @property
    def known(self) -> dict[bytes, None]:
        """The keys the pattern skips."""
        return self._state[0]

    def find_secret(
        self,
        out: bytes,
        secret: Callable[[bytes], bool],
        step_bytes: int = 0,
        every: list[int] | None = None,
    ) -> Generator[None, None, bool | None]:
        """Whether some object key in ``out`` (orjson output) is secret by ``secret`` (which
        takes a key's raw text); None when too many keys were unknown to tell cheaply.

        A generator that returns the answer: with ``step_bytes`` it yields after each run of
        about that many bytes, and before compiling the keys it learned, so a caller on an
        event loop can let other tasks run between them; with 0 it never yields (run it with
        ``complete``).

        A plain key that comes back twice (in this output or an earlier one) is learned:
        keys that never repeat, such as ids, are never compiled into the pattern.

        With ``every``, the scan goes on past a secret key: the position of each secret key's
        closing quote is appended to it (what masking in the text needs)."""
        # A reversed slice copies in one pass: half the time of a bytearray copied, then
        # reversed in place (70 against 126 us for 166 KB).
        rev = out[::-1]
        n = len(out)
        self._scans += 1
        known, pattern = self._state
        seen = self._seen
        met: dict[bytes, None] = {}  # plain keys this scan handed back
        repeated: dict[bytes, None] = {}  # those met in an earlier scan or twice in this one
        stale = misses = 0
        rebuilt = False
        pos = 0
        end = _step_end(rev, pos, step_bytes)
        while True:
            m = pattern.search(rev, pos, end)
            if m is None:
                if end >= n:
                    break
                # A ':"' across the step's end starts at end - 1.
                pos = max(pos, end - 1)
                end = _step_end(rev, end, step_bytes)
                yield
                continue
            p = m.start()
            pos = p + 2
            raw = key_ending_at(out, n - 2 - p)
            if secret(raw):
                if every is not None:
                    every.append(n - 2 - p)
                    continue
                yield from self._finish(rebuilt, repeated, step_bytes)
                return True
            if len(raw) <= _KNOWN_KEY_BYTES:
                if raw in known:
                    # Compiled in: it came back because a step's end cut it from the pattern's
                    # view. A scan in small steps is not a scan of keys that never repeat.
                    continue
                if raw in met or raw in seen:
                    repeated[raw] = None
                    if not rebuilt:
                        stale += 1
                        # A full pattern makes room only for a whole shape: its keys are
                        # gathered first, or a rebuild would swap in the first few and no more.
                        if stale >= (_KNOWN_MAX if len(known) >= _KNOWN_MAX else _STALE_REBUILD):
                            met.update(repeated)
                            pattern = yield from self._learn_steps(met, step_bytes)
                            known = self._state[0]
                            rebuilt = True
                        continue
                else:
                    met[raw] = None
                    if len(seen) >= _CACHE_MAX:
                        seen.clear()
                    seen.add(raw)
            misses += 1
            if misses > _MISSES_MAX:
                yield from self._finish(rebuilt, repeated, step_bytes)
                return None
        yield from self._finish(rebuilt, repeated, step_bytes)
        return bool(every)

    def _finish(
        self, rebuilt: bool, repeated: dict[bytes, None], step_bytes: int
    ) -> Generator[None, None, None]:
        if not rebuilt:
            yield from self._learn_steps(repeated, step_bytes)

    def _learn_steps(
        self, keys: dict[bytes, None], step_bytes: int
    ) -> Generator[None, None, re.Pattern[bytes]]:
        """:meth:`_learn`; when it compiles and the scan is in steps, a step of its own, with a
        yield before and after: sre parses the pattern in Python, 0.3-0.4 ms for ten keys, as
        long as a step of the scan itself. Run inside the step that made the scan learn, a
        process's first payload of a shape held the loop for 2 ms."""
        if not (step_bytes and self._added(keys)):
            return self._learn(keys)
        yield
        pattern = self._learn(keys)
        yield
        return pattern

    def _added(self, keys: dict[bytes, None]) -> list[bytes]:
        """The keys of ``keys`` that :meth:`_learn` would add to the pattern."""
        known = self._state[0]
        new = [k for k in keys if k not in known]
        if len(known) + len(new) > _KNOWN_MAX and self._scans - self._compiled_at < _RELEARN_AFTER:
            return new[: max(_KNOWN_MAX - len(known), 0)]
        return new[:_KNOWN_MAX]

    def _learn(self, keys: dict[bytes, None]) -> re.Pattern[bytes]:
        """Add ``keys`` (checked plain) to the pattern, compiling it only if one is new.

        When they do not fit, the pattern keeps the keys learned last: the ones met again in
        this scan, then the most recent of the others. Memory stays bounded, and a flood of
        keys that never come back cannot keep a later shape out."""
        known, pattern = self._state
        added = self._added(keys)
        if added:
            grown = {**known, **dict.fromkeys(added)}
            if len(grown) > _KNOWN_MAX:
                grown = dict.fromkeys(list(grown)[-_KNOWN_MAX:])
            try:
                pattern = _compile(list(grown))
            except Exception:
                # Whatever sre refuses is simply not skipped: it keeps coming back to Python.
                return pattern
            self._state = (grown, pattern)
            self._compiled_at = self._scans
        return pattern


def _step_end(rev: bytes, start: int, step_bytes: int) -> int:
    """Where a step of the scan that starts at ``start`` stops searching (its ``endpos``).

    The pattern cannot look past it, and is exact anyway: a known key cut there is not
    recognised, so its end comes back to Python, which reads the key from the whole text; and
    the step never stops inside a run of backslashes (cut short, an even run would read as
    odd and a key's closing quote as escaped) or just after a quote (a ``:"`` there would
    come back without its escape checked)."""
    n = len(rev)
    if step_bytes <= 0:
        return n
    end = start + step_bytes
    while end < n and rev[end - 1] in _NO_CUT:
        end += 1
    return min(end, n)


_NO_CUT = frozenset(b'\\"')
