"""The redaction policy: which keys are secret, and a cheap scan of JSON output for them."""

from __future__ import annotations

import re
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any

import orjson

from ._common import (
    _CACHE_MAX,
    _FEW_QUOTES,
    _HARD_DEPTH,
    _QUOTE_PROBE_BYTES,
    _REGEX_GATE_BYTES,
    REDACTED,
    complete,
)
from .convert import _convert
from .keys import KeyEnds, _escaped, key_ending_at

if TYPE_CHECKING:
    from .._config import Config


# --------------------------------------------------------------------------- secret keys


def _segments(text: str) -> tuple[str, ...]:
    # Words of a key: runs of ASCII letters, split where a lowercase letter meets an uppercase
    # one (camelCase). "X-Api-Key" -> x, api, key; "accessToken" -> access, token.
    return tuple(m.lower() for m in re.findall(r"[A-Z]+[a-z]*|[a-z]+", text))


# Between two letters of one word: no lowercase-to-uppercase step, where the key's words split
# (``apikEy`` is the words "apik" and "ey", not "apikey").
_NO_SPLIT = rb"(?!(?<=[a-z])[A-Z])"


def _letters(segment: str) -> bytes:
    return _NO_SPLIT.join(b"[" + c.encode() + c.upper().encode() + b"]" for c in segment)


# In orjson's output a separator between words is any non-letter, or an escape such as \n,
# inside one string: an unescaped quote ends it, so a match never runs from one key into the
# next (``"x_api": {"key...``), which the rule would not call secret.
_SEP = rb'(?:(?:[^A-Za-z"\\]|\\[bfnrt"\\/]|\\u00[0-9a-fA-F]{2})+|(?<=[a-z])(?=[A-Z]))'
_AFTER = rb"(?:(?![A-Za-z])|(?<=[a-z])(?=[A-Z]))"
# A key that counts what the word names is no secret: ``token_count``, ``prompt_token_count``,
# ``llm.token_count.prompt`` (how Gemini and OpenInference report LLM usage) are kept.
_COUNTS = ("count", "counts")
_NOT_COUNTED = rb"(?!" + _SEP + rb"[cC][oO][uU][nN][tT][sS]?" + _AFTER + rb")"


class _Word:
    __slots__ = ("first", "pattern", "segments")

    def __init__(self, word: str) -> None:
        self.segments = _segments(word)
        self.first = self.segments[0].encode()
        self.pattern = re.compile(
            _SEP.join(_letters(s) for s in self.segments) + _AFTER + _NOT_COUNTED
        )


class Policy:
    """The limits and redaction rules one serialization follows (picklable, for the worker)."""

    __slots__ = (
        "_any_first",
        "_key_cache",
        "_key_ends",
        "_needles",
        "_plain_keys",
        "_raw_cache",
        "_words",
        "default",
        "max_depth",
        "max_value_bytes",
        "redact",
        "redact_keys",
    )

    def __init__(
        self, max_value_bytes: int, max_depth: int, redact: bool, redact_keys: tuple[str, ...]
    ) -> None:
        self.max_value_bytes = max_value_bytes
        self.max_depth = min(max_depth, _HARD_DEPTH)
        self.redact_keys = redact_keys
        self._words = tuple(_Word(k) for k in redact_keys if _segments(k))
        self.redact = redact and bool(self._words)
        firsts = sorted({w.first for w in self._words}, key=len, reverse=True)
        self._any_first = re.compile(b"|".join(re.escape(f) for f in firsts) or b"(?!)")
        self._needles = _needles(self._words)
        self._key_cache: dict[str, bool] = {}
        self._plain_keys: set[str] = set()
        self._raw_cache: dict[bytes, bool] = {}
        self._key_ends = KeyEnds()
        self.default: Callable[[Any], Any] = self._default

    def __reduce__(self) -> tuple[Any, ...]:
        return (Policy, (self.max_value_bytes, self.max_depth, self.redact, self.redact_keys))

    def is_secret(self, key: str) -> bool:
        """Whether ``key`` contains one of the redaction words as whole words."""
        hit = self._key_cache.get(key)
        if hit is None:
            segs = _segments(key)
            hit = any(_contains(segs, w.segments) for w in self._words)
            if len(self._key_cache) >= _CACHE_MAX:
                self._key_cache.clear()
            self._key_cache[key] = hit
        return hit

    def plain_keys(self, d: dict[Any, Any]) -> bool:
        """Whether every key of ``d`` is a string that is not secret. Keys found plain are
        remembered, so a dict with familiar keys is checked by one set comparison, in C."""
        plain = self._plain_keys
        for k in d:
            if k in plain:
                continue
            if type(k) is not str or self.is_secret(k):
                return False
            if len(plain) >= _CACHE_MAX:
                plain.clear()
            plain.add(k)
        return True

    def maybe_secret(self, out: bytes, found: list[int] | None = None) -> bool:
        """Cheap check on orjson output: could any object key in it be secret?

        Never says no when a key is secret (a false yes only costs the careful walk).
        ``found``: as for :meth:`maybe_secret_steps`."""
        screened = self._screen(out, found)
        return complete(self._scan_keys(out, 0, found)) if screened is None else screened

    def maybe_secret_steps(
        self, out: bytes, step_bytes: int, found: list[int] | None = None
    ) -> Generator[None, None, bool]:
        """:meth:`maybe_secret` as a generator that returns the answer, yielding between
        steps of about ``step_bytes`` of the scan (for a caller on an event loop).

        With ``found``, the keys are read to the end of the text past the first secret one
        (by the key scan, or between the quotes where there are few), and each secret key's
        closing quote is appended, which :meth:`mask` then takes instead of reading the text
        again: a payload holding a credential costs one pass, as a clean one does. ``found``
        stays empty where the answer came another way."""
        screened = self._screen(out, found)
        if screened is not None:
            return screened
        return (yield from self._scan_keys(out, step_bytes, found))

    def _screen(self, out: bytes, found: list[int] | None = None) -> bool | None:
        """The answer for output with no keys, no redaction word or few strings; None when
        its keys must be scanned (many strings)."""
        # Every object key in orjson's output ends in '":'; no such pair means no keys at all.
        # find, not `in`: bytes.__contains__ first tries the needle as an int and builds and
        # clears a TypeError, 0.3 us of the 1.2 this screen costs a small payload.
        if out.find(b'":') < 0:
            return False
        if len(out) < _REGEX_GATE_BYTES and self._any_first.search(out.lower()) is None:
            return False
        # Many strings (rows of records, chat messages): find the keys from their ends and
        # check each kind of key once (keys/``KeyEnds``). Searching for the redaction words
        # instead cost a pass over every byte per word: 0.9 ms for 165 KB of records.
        if out.count(b'"', 0, _QUOTE_PROBE_BYTES) > _FEW_QUOTES:
            return None
        screened = self._keys_by_quotes(out, found)
        if screened is None and found:
            found.clear()  # too many quotes after all: the key scan finds them
        return screened

    def _keys_by_quotes(self, out: bytes, every: list[int] | None) -> bool | None:
        """For output with few strings (the usual shape of a big payload: a handful of keys,
        huge values): read each key back from the text and apply the exact rule. Quotes are
        found with memchr speed; unescaped ones alternate open/close, and only a key's close
        is followed by ':'. With ``every``, each secret key's closing quote is appended to it
        and the walk goes on. None past ``_FEW_QUOTES`` quotes (the key scan decides)."""
        q = out.find(b'"')
        seen = 0
        start = -1
        while q != -1:
            seen += 1
            if seen > _FEW_QUOTES:
                return None
            if not _escaped(out, q):
                if start < 0:
                    start = q
                else:
                    if out[q + 1 : q + 2] == b":" and self._secret_raw(out[start + 1 : q]):
                        if every is None:
                            return True
                        every.append(q)
                    start = -1
            q = out.find(b'"', q + 1)
        return bool(every)

    def _secret_raw(self, raw: bytes) -> bool:
        hit = self._raw_cache.get(raw)
        if hit is not None:
            return hit
        try:
            key = orjson.loads(b'"' + raw + b'"') if b"\\" in raw else raw.decode()
        except Exception:
            return True
        hit = self.is_secret(key)
        if len(self._raw_cache) >= _CACHE_MAX:
            self._raw_cache.clear()
        self._raw_cache[raw] = hit
        return hit

    def _scan_keys(
        self, out: bytes, step_bytes: int, every: list[int] | None = None
    ) -> Generator[None, None, bool]:
        try:
            found = yield from self._key_ends.find_secret(out, self._secret_raw, step_bytes, every)
        except Exception:
            found = None  # the word scan decides alone, as it can
        if found is None:
            if every is not None:
                every.clear()  # a scan cut short: mask() finds the keys its own way
            if step_bytes:
                yield  # one pass over the text per word follows
            return self._scan_words(out)
        return found

    def _scan_words(self, out: bytes) -> bool:
        # Many keys that do not repeat (ids as keys): look for the redaction words themselves,
        # then confirm each hit is inside a key, at word boundaries (so max_tokens does not
        # send every LLM payload down the careful path).
        low = out.lower()
        find = low.find
        for needle, words in self._needles:
            p = find(needle, 0)
            while p != -1:
                if _boundary_before(out, p):
                    for w in words:
                        m = w.pattern.match(out, p)
                        if m is not None and _is_key_end(out, m.end()):
                            return True
                p = find(needle, p + 1)
        return False

    def mask(self, out: bytes, found: list[int] | None = None) -> tuple[bytes, int] | None:
        """``out`` (orjson's compact output) with the value of every secret key replaced by
        ``"<redacted>"``, and how many were; None when the text does not read as expected
        (the caller then takes the careful walk).

        Redaction works on the text orjson already wrote, never by a second walk of the value
        in Python: a payload holding a secret key costs about what a clean one costs. The
        secret keys are found by the key scan (:class:`~.keys.KeyEnds`, which skips the keys
        it learned plain in C), or, where keys do not repeat, from the redaction words; each
        is checked by the exact rule. Its value ends where its string, its brackets or its
        scalar end. ``found``: the secret keys' closing quotes, as a completed key scan of
        this very text gave them (:meth:`maybe_secret_steps`); the text is not scanned again."""
        if found:
            return self._masked(out, set(found))
        found = []
        # A few long strings (an image, a document): the keys read back between the quotes,
        # at memchr speed. The key scan would first copy the text reversed and search all of
        # it: 5 ms for a 2.5 MB data URL, ten times orjson's own pass.
        if out.count(b'"', 0, _QUOTE_PROBE_BYTES) <= _FEW_QUOTES:
            scanned = self._keys_by_quotes(out, found)
            if scanned is None:
                found = []
        else:
            scanned = None
        if scanned is None:
            try:
                scanned = complete(self._key_ends.find_secret(out, self._secret_raw, 0, found))
            except Exception:
                scanned = None
        ends = set(found) if scanned is not None else self._word_key_ends(out)
        return self._masked(out, ends)

    @staticmethod
    def _masked(out: bytes, ends: set[int]) -> tuple[bytes, int] | None:
        """``out`` with the value after each of the keys whose closing quotes are ``ends``
        replaced; None when a value does not end where JSON says it must."""
        if not ends:
            return out, 0
        # Views, not slices: the join is then the one copy of the text.
        text = memoryview(out)
        pieces: list[memoryview | bytes] = []
        last = 0
        count = 0
        for q in sorted(ends):
            start = q + 2
            if start <= last:
                continue  # inside a value already masked
            end = _value_end(out, start)
            if end is None:
                return None
            pieces.append(text[last:start])
            pieces.append(REDACTED_JSON)
            last = end
            count += 1
        pieces.append(text[last:])
        return b"".join(pieces), count

    def _word_key_ends(self, out: bytes) -> set[int]:
        """Every secret key's closing quote, found from the redaction words (for output whose
        keys do not repeat enough for the key scan)."""
        low = out.lower()
        ends: set[int] = set()
        for needle, words in self._needles:
            p = low.find(needle)
            while p != -1:
                # As the word scan: a word at word boundaries (so max_tokens, prompt_tokens
                # cost one regex attempt in C, not a key read back in Python).
                hit = _boundary_before(out, p) and any(w.pattern.match(out, p) for w in words)
                q = _closing_quote(out, p) if hit else None
                if (
                    q is not None
                    and out[q + 1 : q + 2] == b":"
                    and q not in ends
                    and self._secret_raw(key_ending_at(out, q))
                ):
                    ends.add(q)
                p = low.find(needle, p + 1)
        return ends

    def _default(self, obj: Any) -> Any:
        return _convert(obj, self)


REDACTED_JSON = orjson.dumps(REDACTED)
_STRUCTURE = re.compile(rb'["{}\[\]]')
_SCALAR_END = re.compile(rb"[,}\]]")


def _closing_quote(out: bytes, pos: int) -> int | None:
    """The first unescaped quote at or after ``pos``."""
    q = out.find(b'"', pos)
    while q != -1 and _escaped(out, q):
        q = out.find(b'"', q + 1)
    return None if q == -1 else q


def _value_end(out: bytes, i: int) -> int | None:
    """Where the JSON value starting at ``i`` of orjson's compact output ends."""
    if i >= len(out):
        return None
    c = out[i]
    if c == 34:  # a string
        q = _closing_quote(out, i + 1)
        return None if q is None else q + 1
    if c == 123 or c == 91:  # an object or an array: to its matching bracket
        depth = 0
        j = i
        while True:
            m = _STRUCTURE.search(out, j)
            if m is None:
                return None
            j = m.start()
            ch = out[j]
            if ch == 34:
                q = _closing_quote(out, j + 1)
                if q is None:
                    return None
                j = q + 1
                continue
            depth += 1 if ch == 123 or ch == 91 else -1
            j += 1
            if depth == 0:
                return j
    m = _SCALAR_END.search(out, i)
    return len(out) if m is None else m.start()


def _needles(words: tuple[_Word, ...]) -> tuple[tuple[bytes, tuple[_Word, ...]], ...]:
    """The words grouped by what to search for: words whose first segments share a prefix
    of four letters or more (or one starts the other) share one pass over the text, searching
    for that prefix (each pass costs 60-100 us on 165 KB)."""
    groups: list[tuple[bytes, list[_Word]]] = []
    for w in sorted(words, key=lambda w: len(w.first)):
        for i, (needle, members) in enumerate(groups):
            common = _common_prefix(needle, w.first)
            if common == needle or len(common) >= 4:
                groups[i] = (common, [*members, w])
                break
        else:
            groups.append((w.first, [w]))
    return tuple((needle, tuple(members)) for needle, members in groups)


def _common_prefix(a: bytes, b: bytes) -> bytes:
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return a[:n]


def _contains(segs: tuple[str, ...], word: tuple[str, ...]) -> bool:
    n = len(word)
    return any(
        segs[i : i + n] == word and (i + n == len(segs) or segs[i + n] not in _COUNTS)
        for i in range(len(segs) - n + 1)
    )


def _is_letter(c: int) -> bool:
    return 65 <= c <= 90 or 97 <= c <= 122


def _boundary_before(out: bytes, p: int) -> bool:
    c = out[p - 1]
    if not _is_letter(c):
        return True
    if 97 <= c <= 122 and 65 <= out[p] <= 90:
        return True
    # Preceded by an escape (\n, \u00e9...): the key had a separator there. Not after an
    # escaped backslash: the text \\ntoken is the key backslash-"ntoken", one word.
    return (out[p - 2] == 92 and _escaped(out, p - 1)) or (
        p >= 6 and out[p - 6 : p - 4] == b"\\u" and _escaped(out, p - 5)
    )


def _is_key_end(out: bytes, pos: int) -> bool:
    # Object keys are the only strings orjson follows with ':'.
    q = out.find(b'"', pos)
    while q != -1:
        if not _escaped(out, q):
            return out[q + 1 : q + 2] == b":"
        q = out.find(b'"', q + 1)
    return False


_policies: dict[tuple[Any, ...], Policy] = {}
_last: tuple[Any, Policy] | None = None


def has_policy(cfg: Config) -> bool:
    """Whether :func:`policy` has ``cfg``'s policy built already."""
    return (cfg.max_value_bytes, cfg.max_depth, cfg.redact, cfg.redact_keys) in _policies


def policy(cfg: Config) -> Policy:
    """The :class:`Policy` for a config (cached: configs are immutable)."""
    global _last
    last = _last
    if last is not None and last[0] is cfg:
        return last[1]
    key = (cfg.max_value_bytes, cfg.max_depth, cfg.redact, cfg.redact_keys)
    pol = _policies.get(key)
    if pol is None:
        if len(_policies) > 64:
            _policies.clear()
        pol = _policies[key] = Policy(*key)
    _last = (cfg, pol)
    return pol
