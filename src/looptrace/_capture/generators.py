"""``@traced`` on generators, sync and async: one span for the whole iteration, active only
while the generator's own code runs, with the first items it yielded as its output."""

from __future__ import annotations

import functools
from collections.abc import AsyncGenerator, Awaitable, Callable, Generator
from typing import Any

from .. import _state
from .._semconv import GENERATOR_CLOSED_EARLY, GENERATOR_ITEMS
from .context import reset_current as _reset_current
from .context import set_current as _set_current
from .spans import Span
from .start import _activate, _bridge_exit, _deactivate


def _finish_items(s: Span, items: list[Any], count: int, keep: bool) -> None:
    if s.is_recording:
        if keep:
            s.output = items
        s.set_attribute(GENERATOR_ITEMS, count)


def _wrap_generator(
    fn: Callable[..., Generator[Any, Any, Any]],
    begin: Callable[[tuple[Any, ...], dict[str, Any]], Span],
    keep_output: Callable[[], bool],
) -> Callable[..., Generator[Any, Any, Any]]:
    @functools.wraps(fn)
    def gen_wrapper(*args: Any, **kwargs: Any) -> Generator[Any, Any, Any]:
        if _state.disabled:
            return (yield from fn(*args, **kwargs))
        s = begin(args, kwargs)
        keep = keep_output()
        limit = _state.max_generator_items
        items: list[Any] = []
        count = 0
        # The span is active only while the generator's own code runs, never between yields,
        # so the caller's spans do not nest under it.
        token = _activate(s)
        try:
            gen = fn(*args, **kwargs)
        except BaseException as exc:
            s.fail(exc)
            s.end()
            raise
        finally:
            _deactivate(token)
        send: Callable[[Any], Any] = gen.send
        value: Any = None
        try:
            while True:
                # Activation written out (as in the decorators' wrappers): it runs for every
                # item, and the two calls and their tuple were a quarter of an item's cost.
                ctx_token = _set_current(s)
                bridge = _state.bridge
                bridged = bridge.enter(s) if bridge is not None else None
                try:
                    item = send(value)
                except StopIteration as stop:
                    return stop.value
                finally:
                    if bridge is not None:
                        _bridge_exit(bridge, bridged)
                    _reset_current(ctx_token)
                count += 1
                if keep and len(items) < limit:
                    items.append(item)
                try:
                    value = yield item
                    send = gen.send
                except GeneratorExit:
                    s.set_attribute(GENERATOR_CLOSED_EARLY, True)
                    token = _activate(s)
                    try:
                        gen.close()
                    finally:
                        _deactivate(token)
                    raise
                except BaseException as exc:
                    send, value = gen.throw, exc
        except GeneratorExit:
            raise
        except BaseException as exc:
            s.fail(exc)
            raise
        finally:
            _finish_items(s, items, count, keep)
            s.end()

    return gen_wrapper


def _wrap_async_generator(
    fn: Callable[..., AsyncGenerator[Any, Any]],
    begin: Callable[[tuple[Any, ...], dict[str, Any]], Span],
    keep_output: Callable[[], bool],
) -> Callable[..., AsyncGenerator[Any, Any]]:
    @functools.wraps(fn)
    async def agen_wrapper(*args: Any, **kwargs: Any) -> AsyncGenerator[Any, Any]:
        if _state.disabled:
            agen0 = fn(*args, **kwargs)
            try:
                async for item in agen0:
                    yield item
            finally:
                await agen0.aclose()
            return
        s = begin(args, kwargs)
        keep = keep_output()
        limit = _state.max_generator_items
        items: list[Any] = []
        count = 0
        token = _activate(s)
        try:
            agen = fn(*args, **kwargs)
        finally:
            _deactivate(token)
        send: Callable[[Any], Awaitable[Any]] = agen.asend
        value: Any = None
        try:
            while True:
                ctx_token = _set_current(s)  # written out, as for a generator's items
                bridge = _state.bridge
                bridged = bridge.enter(s) if bridge is not None else None
                try:
                    item = await send(value)
                except StopAsyncIteration:
                    return
                finally:
                    if bridge is not None:
                        _bridge_exit(bridge, bridged)
                    _reset_current(ctx_token)
                count += 1
                if keep and len(items) < limit:
                    items.append(item)
                try:
                    value = yield item
                    send = agen.asend
                except GeneratorExit:
                    s.set_attribute(GENERATOR_CLOSED_EARLY, True)
                    token = _activate(s)
                    try:
                        await agen.aclose()
                    finally:
                        _deactivate(token)
                    raise
                except BaseException as exc:
                    send, value = agen.athrow, exc
        except GeneratorExit:
            raise
        except BaseException as exc:
            s.fail(exc)
            raise
        finally:
            _finish_items(s, items, count, keep)
            s.end()

    return agen_wrapper
