"""Reading the settings from the environment: every change a user makes is seen, however often
the settings are read."""

from __future__ import annotations

from pathlib import Path

import pytest

from looptrace._config import Config


def test_settings_follow_every_change_to_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Variables set, changed or removed after the settings were first read (a user who
    configures after importing) are what the next read returns; the same variables give the
    same settings."""
    for name in ("LOOPTRACE_SERVICE_NAME", "OTEL_SERVICE_NAME", "LOOPTRACE_STORE"):
        monkeypatch.delenv(name, raising=False)
    first = Config.from_env()
    assert first.service_name == "unknown_service"
    assert Config.from_env() == first
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-otel")
    assert Config.from_env().service_name == "from-otel"
    monkeypatch.setenv("LOOPTRACE_SERVICE_NAME", "checkout")
    assert Config.from_env().service_name == "checkout"
    monkeypatch.setenv("LOOPTRACE_SERVICE_NAME", "checkout-2")
    assert Config.from_env().service_name == "checkout-2"
    monkeypatch.delenv("LOOPTRACE_SERVICE_NAME")
    assert Config.from_env().service_name == "from-otel"
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "ca.pem"))
    assert Config.from_env().certificate == str(tmp_path / "ca.pem")
    assert Config.from_env(service_name="override").service_name == "override"
    assert Config.from_env({"LOOPTRACE_SERVICE_NAME": "given"}).service_name == "given"


def test_the_default_store_follows_the_home_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Where ``~`` and the data folder point is read again with the settings."""
    monkeypatch.delenv("LOOPTRACE_STORE", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "a"))
    assert Config.from_env().store_path == tmp_path / "a" / "looptrace" / "traces.db"
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "b"))
    assert Config.from_env().store_path == tmp_path / "b" / "looptrace" / "traces.db"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("USERPROFILE", str(tmp_path / "home"))
    monkeypatch.setenv("LOOPTRACE_STORE", "~/traces.db")
    assert Config.from_env().store_path == tmp_path / "home" / "traces.db"
