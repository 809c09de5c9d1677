"""``looptrace serve``: an OTLP/HTTP receiver that writes into the local store, plus the JSON API
the viewer reads. Needs the ``server`` extra (starlette, uvicorn, opentelemetry-proto):
``pip install '.[server]'`` from a clone (:data:`INSTALL_HINT` is the command for this install).

    from looptrace.collector import create_app, serve
    app = create_app("traces.db", token="s3cret")      # any ASGI server can run it
    serve(host="127.0.0.1", port=4318)                 # or let looptrace run uvicorn

Importing this package does not import starlette or protobuf; ``create_app`` and ``serve`` do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._internals import MissingServerExtra

if TYPE_CHECKING:
    from .app import create_app, serve

__all__ = ["MissingServerExtra", "create_app", "serve"]


def _install_hint() -> str:
    from ._internals import install_hint

    return install_hint("server")


# The command that installs the extra from where looptrace itself came from (a clone's folder,
# or the extra's packages by name): looptrace[server] may not be on the user's index.
INSTALL_HINT = _install_hint()


# The module each distribution of the extra provides, by the name pip knows it by.
_SERVER_EXTRA = {
    "starlette": "starlette",
    "uvicorn": "uvicorn",
    "opentelemetry-proto": "opentelemetry.proto.collector.trace.v1.trace_service_pb2",
}


def _require_server_extra() -> None:
    missing = []
    for name, module in _SERVER_EXTRA.items():
        try:
            __import__(module)
        except ImportError:
            missing.append(name)
    if missing:
        raise MissingServerExtra(
            f"looptrace serve needs {_listed(missing)}: install them with {INSTALL_HINT}"
        )


def _listed(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def __getattr__(name: str) -> Any:
    if name in ("create_app", "serve"):
        _require_server_extra()
        from . import app

        return getattr(app, name)
    raise AttributeError(name)
