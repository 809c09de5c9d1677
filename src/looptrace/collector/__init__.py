"""``looptrace serve``: an OTLP/HTTP receiver that writes into the local store, plus the JSON API
the viewer reads. Needs the ``server`` extra (starlette, uvicorn): ``pip install 'looptrace[server]'``.

    from looptrace.collector import create_app, serve
    app = create_app("traces.db", token="s3cret")      # any ASGI server can run it
    serve(host="127.0.0.1", port=4318)                 # or let looptrace run uvicorn

Importing this package does not import starlette; ``create_app`` and ``serve`` do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .app import create_app, serve

__all__ = ["MissingServerExtra", "create_app", "serve"]

INSTALL_HINT = "pip install 'looptrace[server]'"


class MissingServerExtra(ImportError):
    """starlette or uvicorn is not installed."""


def _require_server_extra() -> None:
    missing = []
    for name in ("starlette", "uvicorn"):
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise MissingServerExtra(
            f"looptrace serve needs {' and '.join(missing)}: install them with {INSTALL_HINT}"
        )


def __getattr__(name: str) -> Any:
    if name in ("create_app", "serve"):
        _require_server_extra()
        from . import app

        return getattr(app, name)
    raise AttributeError(name)
