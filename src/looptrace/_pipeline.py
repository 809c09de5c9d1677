"""Placeholder: replaced by the export pipeline (issue 3)."""

from __future__ import annotations

from typing import Any

from . import _state
from ._config import Config


def configure(**overrides: Any) -> Config:
    """Apply settings (environment first, then ``overrides``) and return them."""
    cfg = Config.from_env(**overrides)
    _state.apply_config(cfg)
    return cfg


def get_config() -> Config:
    """The settings in force (read from the environment on first use)."""
    if _state.config is None:
        return configure()
    return _state.config
