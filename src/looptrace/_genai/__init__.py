"""LLM calls as spans: ``instrument_openai`` and ``instrument_anthropic``.

Each call of an instrumented SDK method is one CLIENT span under the caller's span, named
``"{operation} {model}"`` and carrying the OpenTelemetry GenAI attributes. The SDKs are the
user's: this package imports one only when asked to instrument it.
"""

from __future__ import annotations

import importlib
from typing import Any

from . import _core, _cost

__all__ = [
    "instrument_anthropic",
    "instrument_openai",
    "uninstrument_anthropic",
    "uninstrument_openai",
]


def _wrapper(cls: type, begin: _core.Begin, done: _core.Done) -> _core.Wrap:
    # The SDKs' async methods sit under a plain decorator (argument checks), so the class,
    # not inspect.iscoroutinefunction, says which kind of wrapper a method needs.
    wrap = _core.wrap_async if cls.__name__.startswith("Async") else _core.wrap_sync
    return lambda original: wrap(original, begin, done)


def _resource(client: Any, path: tuple[str, ...]) -> Any:
    target = client
    for name in path:
        target = getattr(target, name)
    return target


def _apply(module_name: str, client: Any, on: bool) -> None:
    module = importlib.import_module(f"{__name__}.{module_name}")
    if on:
        _core.refresh_conventions()
        # Here, not at the first call: importing genai-prices and loading its table takes a
        # few hundred milliseconds, which must not hold an event loop.
        _cost.load()
    targets = [(cls, name, _wrapper(cls, b, d), path) for cls, name, b, d, path in module.TARGETS]
    for cls, name, path in getattr(module, "STREAM_TARGETS", ()):
        targets.append((cls, name, module._wrap_stream, path))
    for cls, name, wrap, path in targets:
        if client is None:
            if on:
                _core.patch_class(cls, name, wrap)
            else:
                _core.unpatch_class(cls, name)
            continue
        resource = _resource(client, path)
        if not isinstance(resource, cls):
            continue  # the sync resource of a sync client is not the async class
        if on:
            _core.patch_instance(resource, name, wrap)
        else:
            _core.unpatch_instance(resource, name)


def instrument_openai(client: Any = None) -> None:
    """Record a span for every ``chat.completions.create``, ``responses.create`` and
    ``embeddings.create`` call of the OpenAI SDK, plain or streamed, sync or async.

    With no argument every ``OpenAI`` and ``AsyncOpenAI`` client is instrumented (the SDK's
    resource classes are wrapped); with a client, only that one. Calling it again does
    nothing; :func:`uninstrument_openai` undoes it. Requires the ``openai`` package.
    """
    _apply("_openai", client, True)


def uninstrument_openai(client: Any = None) -> None:
    """Undo :func:`instrument_openai` (for every client, or for the client given)."""
    _apply("_openai", client, False)


def instrument_anthropic(client: Any = None) -> None:
    """Record a span for every ``messages.create`` call (plain or ``stream=True``) and every
    ``messages.stream(...)`` block of the Anthropic SDK, sync or async.

    With no argument every ``Anthropic`` and ``AsyncAnthropic`` client is instrumented; with a
    client, only that one. Calling it again does nothing; :func:`uninstrument_anthropic` undoes
    it. Requires the ``anthropic`` package.
    """
    _apply("_anthropic", client, True)


def uninstrument_anthropic(client: Any = None) -> None:
    """Undo :func:`instrument_anthropic` (for every client, or for the client given)."""
    _apply("_anthropic", client, False)
