"""``looptrace.attributes``: a session, a user, tags and metadata for every span of a block.

The merged values of the blocks active in a context are one immutable
:class:`ContextAttributes`, kept in a ContextVar, so they follow ``await``, tasks and
``to_thread`` the way the active span does. A span takes a reference to it as it is created
(one ContextVar read, nothing copied, nothing serialized); the exporter writes it out, once
per block and policy, under the names the backends read:

    session.id     the session (OpenInference; Langfuse reads it too)
    user.id        the user (OpenInference; Langfuse reads it too)
    tag.tags       the tags, a list of strings (OpenInference; Langfuse reads it too)
    metadata       the metadata as a JSON string (OpenInference)
    langfuse.trace.metadata   the same JSON string (Langfuse reads no other plain key for it)

An attribute the span sets itself with the same name wins.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
from collections.abc import (
    AsyncGenerator,
    Awaitable,
    Callable,
    Generator,
    Iterable,
    Mapping,
)
from types import MappingProxyType, TracebackType
from typing import Any, TypeVar

from .._semconv import METADATA, SESSION_ID, TAG_TAGS, USER_ID

F = TypeVar("F", bound=Callable[..., Any])

_EMPTY: Mapping[str, Any] = MappingProxyType({})


class ContextAttributes:
    """The session, user, tags and metadata in force: immutable, shared by every span that
    starts while it is active. ``wire`` is the exporter's cache of its encoded form."""

    __slots__ = ("metadata", "session_id", "tags", "user_id", "wire")

    def __init__(
        self,
        session_id: str | None,
        user_id: str | None,
        tags: tuple[str, ...],
        metadata: Mapping[str, Any],
    ) -> None:
        self.session_id = session_id
        self.user_id = user_id
        self.tags = tags
        self.metadata = metadata
        self.wire: Any = None

    def __repr__(self) -> str:
        return (
            f"ContextAttributes(session_id={self.session_id!r}, user_id={self.user_id!r}, "
            f"tags={self.tags!r}, metadata={dict(self.metadata)!r})"
        )

    def merged(self, inner: ContextAttributes) -> ContextAttributes:
        """These values with ``inner``'s over them: its session and user replace these when it
        has them, tags are the union (in order of first appearance), metadata merges key by
        key with the inner value winning."""
        if self.metadata and inner.metadata:
            metadata: Mapping[str, Any] = MappingProxyType({**self.metadata, **inner.metadata})
        else:
            metadata = inner.metadata or self.metadata
        return ContextAttributes(
            inner.session_id if inner.session_id is not None else self.session_id,
            inner.user_id if inner.user_id is not None else self.user_id,
            tuple(dict.fromkeys((*self.tags, *inner.tags))) if inner.tags else self.tags,
            metadata,
        )

    def as_attributes(self) -> dict[str, Any]:
        """The span attributes these values become (before serialization)."""
        out: dict[str, Any] = {}
        if self.session_id is not None:
            out[SESSION_ID] = self.session_id
        if self.user_id is not None:
            out[USER_ID] = self.user_id
        if self.tags:
            out[TAG_TAGS] = list(self.tags)
        if self.metadata:
            # A dict value is written as one JSON string (redacted like any payload); the
            # exporter writes that string under LANGFUSE_TRACE_METADATA too.
            out[METADATA] = dict(self.metadata)
        return out


ATTRIBUTES: contextvars.ContextVar[ContextAttributes | None] = contextvars.ContextVar(
    "looptrace_attributes", default=None
)
# Bound once: every span reads it as it is created.
get_attributes = ATTRIBUTES.get
_set = ATTRIBUTES.set
_reset = ATTRIBUTES.reset


def _own(session_id: Any, user_id: Any, tags: Any, metadata: Any) -> ContextAttributes | None:
    """One block's own values, checked and frozen; None when it sets nothing."""
    if isinstance(tags, str):
        tags = (tags,)  # one tag, not its characters
    elif tags is not None:
        if not isinstance(tags, Iterable):
            raise TypeError(f"tags must be an iterable of strings, got {type(tags).__name__}")
        tags = tuple(dict.fromkeys(str(t) for t in tags))
    if metadata is not None:
        if not isinstance(metadata, Mapping):
            raise TypeError(f"metadata must be a mapping, got {type(metadata).__name__}")
        # Copied now: a caller that changes its dict later does not change these spans.
        metadata = MappingProxyType({str(k): v for k, v in metadata.items()})
    if session_id is None and user_id is None and not tags and not metadata:
        return None
    return ContextAttributes(
        None if session_id is None else str(session_id),
        None if user_id is None else str(user_id),
        tags or (),
        metadata or _EMPTY,
    )


class attributes:
    """Set a session, a user, tags and metadata for every span started inside:
    ``with looptrace.attributes(session_id=..., user_id=...):``, ``async with``, or as a
    decorator (``@looptrace.attributes(tags=["beta"])``) on a function, coroutine function,
    generator or async generator.

    The values follow the block the way the active span does: into tasks (``create_task``,
    ``gather``, task groups), ``asyncio.to_thread`` and ``looptrace.bind_context``, spans made
    through the OpenTelemetry API, LLM calls and experiment cases. Nested blocks merge: an
    inner session or user replaces the outer one, tags add up, metadata merges (the inner
    value of a key wins).

    ``session_id`` and ``user_id`` are strings (other values are converted with ``str``);
    ``tags`` an iterable of strings (a single string is one tag); ``metadata`` a mapping,
    written as one JSON string. A wrong type raises ``TypeError`` here, at the call.
    """

    __slots__ = ("_cache", "_own", "_tokens")

    def __init__(
        self,
        *,
        session_id: str | None = None,
        user_id: str | None = None,
        tags: Iterable[str] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        self._own = _own(session_id, user_id, tags, metadata)
        self._tokens: list[contextvars.Token[ContextAttributes | None]] = []
        # (outer, merged) of the last entry: a decorated function called again under the same
        # outer block merges nothing new.
        self._cache: tuple[ContextAttributes | None, ContextAttributes | None] = (None, None)

    def __repr__(self) -> str:
        return f"<looptrace.attributes {self._own!r}>"

    def _values(self) -> ContextAttributes | None:
        """What a block entered here puts in force (None: leave the context as it is)."""
        own = self._own
        if own is None:
            return None
        outer = get_attributes()
        if outer is None:
            return own
        cached_outer, cached = self._cache
        if cached_outer is outer:
            return cached
        merged = outer.merged(own)
        self._cache = (outer, merged)
        return merged

    def __enter__(self) -> None:
        values = self._values()
        if values is not None:
            self._tokens.append(_set(values))

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._own is None or not self._tokens:
            return
        token = self._tokens.pop()
        try:
            _reset(token)
        except ValueError:
            # Left in another context than it was entered in (a generator resumed elsewhere):
            # the block is over all the same.
            old = token.old_value
            _set(None if old is contextvars.Token.MISSING else old)

    async def __aenter__(self) -> None:
        self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc, tb)

    def __call__(self, fn: F) -> F:
        """Decorate ``fn``: each call runs inside a block of these values (a generator's code
        runs inside it at each step, never the caller's code between steps)."""
        if isinstance(fn, (classmethod, staticmethod)):
            return type(fn)(self(fn.__func__))
        values = self._values
        if inspect.isasyncgenfunction(fn):
            return _wrap_async_generator(fn, values)  # type: ignore[return-value]
        if inspect.isgeneratorfunction(fn):
            return _wrap_generator(fn, values)  # type: ignore[return-value]
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                v = values()
                if v is None:
                    return await fn(*args, **kwargs)
                token = _set(v)
                try:
                    return await fn(*args, **kwargs)
                finally:
                    _reset(token)

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(fn)
        def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
            v = values()
            if v is None:
                return fn(*args, **kwargs)
            token = _set(v)
            try:
                return fn(*args, **kwargs)
            finally:
                _reset(token)

        return sync_wrapper  # type: ignore[return-value]


def _wrap_generator(
    fn: Callable[..., Generator[Any, Any, Any]],
    values: Callable[[], ContextAttributes | None],
) -> Callable[..., Generator[Any, Any, Any]]:
    @functools.wraps(fn)
    def gen_wrapper(*args: Any, **kwargs: Any) -> Generator[Any, Any, Any]:
        v = values()
        if v is None:
            return (yield from fn(*args, **kwargs))
        token = _set(v)
        try:
            gen = fn(*args, **kwargs)
        finally:
            _reset(token)
        send: Callable[[Any], Any] = gen.send
        value: Any = None
        while True:
            token = _set(v)
            try:
                item = send(value)
            except StopIteration as stop:
                return stop.value
            finally:
                _reset(token)
            try:
                value = yield item
                send = gen.send
            except GeneratorExit:
                token = _set(v)
                try:
                    gen.close()
                finally:
                    _reset(token)
                raise
            except BaseException as exc:
                send, value = gen.throw, exc

    return gen_wrapper


def _wrap_async_generator(
    fn: Callable[..., AsyncGenerator[Any, Any]],
    values: Callable[[], ContextAttributes | None],
) -> Callable[..., AsyncGenerator[Any, Any]]:
    @functools.wraps(fn)
    async def agen_wrapper(*args: Any, **kwargs: Any) -> AsyncGenerator[Any, Any]:
        v = values()
        token = _set(v) if v is not None else None
        try:
            agen = fn(*args, **kwargs)
        finally:
            if token is not None:
                _reset(token)
        send: Callable[[Any], Awaitable[Any]] = agen.asend
        value: Any = None
        while True:
            token = _set(v) if v is not None else None
            try:
                item = await send(value)
            except StopAsyncIteration:
                return
            finally:
                if token is not None:
                    _reset(token)
            try:
                value = yield item
                send = agen.asend
            except GeneratorExit:
                token = _set(v) if v is not None else None
                try:
                    await agen.aclose()
                finally:
                    if token is not None:
                        _reset(token)
                raise
            except BaseException as exc:
                send, value = agen.athrow, exc

    return agen_wrapper
