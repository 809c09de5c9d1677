"""Configuration: one frozen, validated value object, and the one place that reads the environment.

``Config.from_env()`` reads every ``LOOPTRACE_*`` variable (and the standard ``OTEL_*`` ones as
fallbacks); ``docs/configuration.md`` lists them all. Code passes overrides to
``looptrace.configure(...)``, which always wins over the environment.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from ._errors import ConfigurationError

Encoding = Literal["protobuf", "json"]
# Headers for each request, over the configured ones (a token that refreshes): a function or a
# coroutine function, called on the exporter's loop, that must not block.
HeadersProvider = Callable[[], "Mapping[str, str] | Awaitable[Mapping[str, str]]"]
Compression = Literal["auto", "gzip", "zstd", "none"]

DEFAULT_REDACT_KEYS: tuple[str, ...] = (
    "api_key",
    "apikey",
    "password",
    "passwd",
    "secret",
    "token",
    "authorization",
    "cookie",
    "credential",
    "private_key",
)


def _homes() -> tuple[str | None, str | None, str | None]:
    """The variables that say where ``~`` and the default store are."""
    env = os.environ
    return (env.get("XDG_DATA_HOME"), env.get("HOME"), env.get("USERPROFILE"))


def default_store_path() -> Path:
    """Where the local store lives when ``LOOPTRACE_STORE`` is not set."""
    where = _homes()
    path = _store_paths.get(where)
    if path is None:
        # Joining and expanding costs more than the three lookups: done once per home.
        base = where[0] or os.path.join(os.path.expanduser("~"), ".local", "share")
        if len(_store_paths) > 16:
            _store_paths.clear()
        path = _store_paths[where] = Path(base) / "looptrace" / "traces.db"
    return path


_store_paths: dict[tuple[str | None, ...], Path] = {}

# What ``Config.from_env()`` returned last, with the class and the variables it read.
_last_read: tuple[type, tuple[dict[str, str], tuple[str | None, ...]], Config] | None = None

# Every variable ``Config.from_env`` reads starts with one of these.
_ENV_PREFIXES = ("LOOPTRACE_", "OTEL_", "SSL_CERT_")


def _environ() -> dict[str, str]:
    """The variables ``Config.from_env`` may read, found in one pass over the names: a lookup
    per setting in ``os.environ`` encodes the name and raises KeyError inside for each absent
    one, and about seventy such lookups made the settings cost hundreds of microseconds."""
    env = os.environ
    found = {}
    for name in env:
        if name.startswith(_ENV_PREFIXES):
            value = env.get(name)
            if value is not None:
                found[name] = value
    return found


@dataclasses.dataclass(frozen=True)
class Config:
    """Every looptrace setting. Build with ``Config.from_env(**overrides)``; never mutate."""

    # -- identity --
    service_name: str = "unknown_service"
    resource_attributes: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # -- capture --
    disabled: bool = False
    sample_rate: float = 1.0
    capture_inputs: bool = True
    capture_outputs: bool = True
    max_generator_items: int = 100
    # Message content of LLM calls (prompts, completions, tool arguments); metadata stays.
    capture_genai_content: bool = True
    # -- serialization --
    max_value_bytes: int = 8 * 1024 * 1024
    max_span_bytes: int = 16 * 1024 * 1024
    max_depth: int = 32
    redact: bool = True
    redact_keys: tuple[str, ...] = DEFAULT_REDACT_KEYS
    process_inputs: Callable[[Any], Any] | None = None
    process_outputs: Callable[[Any], Any] | None = None
    offload: bool = True
    offload_threshold_bytes: int = 4 * 1024 * 1024
    # -- export --
    endpoint: str | None = None
    headers: Mapping[str, str] = dataclasses.field(default_factory=dict, repr=False)
    headers_provider: HeadersProvider | None = dataclasses.field(default=None, repr=False)
    encoding: Encoding = "protobuf"
    compression: Compression = "auto"
    export_timeout: float = 10.0
    # TLS: the CA bundle (or directory) that verifies the backend, and a client certificate.
    certificate: str | None = None
    certificate_dir: str | None = None
    client_certificate: str | None = None
    client_key: str | None = dataclasses.field(default=None, repr=False)
    flush_interval: float = 0.2
    max_batch_spans: int = 2048
    max_batch_bytes: int = 4 * 1024 * 1024
    max_concurrent_requests: int = 4
    max_buffer_spans: int = 200_000
    max_buffer_bytes: int = 256 * 1024 * 1024
    backpressure_bytes: int = 10 * 1000 * 1000
    retry_budget: float = 60.0
    shutdown_timeout: float = 5.0
    send_in_progress: bool | None = None
    in_progress_after: float = 5.0
    # -- spool (OTLP endpoints only): what could not be sent, on disk for a later process --
    spool: bool = True
    spool_dir: Path | None = None  # None: a "spool" folder next to the local store's file
    spool_max_bytes: int = 256 * 1024 * 1024
    spool_max_age_hours: float = 72.0
    spool_durable: bool = False
    # -- local store --
    store_path: Path = dataclasses.field(default_factory=default_store_path)
    store_max_age_days: float | None = 30.0
    store_max_bytes: int | None = 1024 * 1024 * 1024
    # The token `looptrace serve` requires on every request (never shown in repr).
    collector_token: str | None = dataclasses.field(default=None, repr=False)
    # -- lag monitor --
    lag_monitor: bool = False
    lag_interval: float = 0.01
    lag_culprits: bool = False
    lag_culprit_threshold: float = 0.1
    lag_summary_interval: float = 10.0

    def __post_init__(self) -> None:
        # A path given as text (configure(spool_dir="/var/spool/app")) is used as a Path: the
        # pipeline joins and creates folders under it.
        for name in ("store_path", "spool_dir"):
            value = getattr(self, name)
            if isinstance(value, str):
                object.__setattr__(self, name, Path(value).expanduser())
        _check(0.0 <= self.sample_rate <= 1.0, "sample_rate must be between 0 and 1", "sample_rate")
        for name in (
            "max_generator_items",
            "max_value_bytes",
            "max_span_bytes",
            "max_depth",
            "max_batch_spans",
            "max_batch_bytes",
            "max_concurrent_requests",
            "max_buffer_spans",
            "max_buffer_bytes",
            "backpressure_bytes",
            "offload_threshold_bytes",
            "spool_max_bytes",
            "spool_max_age_hours",
        ):
            _check(getattr(self, name) > 0, f"{name} must be positive", name)
        for name in (
            "export_timeout",
            "flush_interval",
            "shutdown_timeout",
            "in_progress_after",
            "lag_interval",
            "lag_culprit_threshold",
            "lag_summary_interval",
        ):
            _check(getattr(self, name) > 0, f"{name} must be a positive number of seconds", name)
        _check(
            self.client_key is None or self.client_certificate is not None,
            "client_key needs client_certificate",
            "client_key",
        )
        _check(self.retry_budget >= 0, "retry_budget must not be negative", "retry_budget")
        _check(
            self.encoding in ("protobuf", "json"),
            "encoding must be 'protobuf' or 'json'",
            "encoding",
        )
        _check(
            self.compression in ("auto", "gzip", "zstd", "none"),
            "compression must be 'auto', 'gzip', 'zstd' or 'none'",
            "compression",
        )
        for name, value in self.headers.items():
            check_header(name, value)
        if self.endpoint is not None:
            parsed = urllib.parse.urlsplit(self.endpoint)
            _check(
                parsed.scheme in ("http", "https") and bool(parsed.netloc),
                f"endpoint {self.endpoint!r} is not an http(s) URL (such as "
                "http://localhost:4318/v1/traces)",
                "endpoint",
            )

    def __repr__(self) -> str:
        # Headers carry API keys: show only their names.
        fields = ", ".join(
            f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self) if f.repr
        )
        return f"Config({fields}, headers=<{len(self.headers)} redacted>)"

    @property
    def traces_url(self) -> str | None:
        """The full ``/v1/traces`` URL, or None when spans go to the local store."""
        return self.endpoint

    @property
    def sends_in_progress(self) -> bool:
        """Whether long-running roots are sent before they end (default: only to looptrace)."""
        if self.send_in_progress is not None:
            return self.send_in_progress
        return self.endpoint is None

    @property
    def spool_path(self) -> Path:
        """The spool's folder (each endpoint has a folder of its own inside it)."""
        return self.spool_dir if self.spool_dir is not None else self.store_path.parent / "spool"

    def replace(self, **changes: Any) -> Config:
        """A copy with some settings changed (validated again)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Config:
        """Settings from ``LOOPTRACE_*`` (then ``OTEL_*``) variables, with ``overrides`` on top."""
        if environ is not None or overrides:
            return cls._read(_environ() if environ is None else environ, overrides)
        # The same variables give the same settings: the first traced call reads them again
        # after ``@traced`` read them to prepare, and building a Config from them costs more
        # than finding them. Where ``~`` and the default store point is part of the answer.
        global _last_read
        env = _environ()
        key = (env, _homes())
        last = _last_read
        if last is not None and last[0] is cls and last[1] == key:
            return last[2]
        cfg = cls._read(env, overrides)
        _last_read = (cls, key, cfg)
        return cfg

    @classmethod
    def _read(cls, env: Mapping[str, str], overrides: Mapping[str, Any]) -> Config:
        values: dict[str, Any] = {}

        # Which variable each setting came from, so that an invalid value is reported under
        # the name the user set (OTEL_EXPORTER_OTLP_PROTOCOL, not LOOPTRACE_ENCODING).
        sources: dict[str, tuple[str, str]] = {}

        def get(*names: str) -> tuple[str, str] | None:
            for name in names:
                raw = env.get(name)
                if raw is not None and raw.strip() != "":
                    return name, raw.strip()
            return None

        def put(field: str, conv: Callable[[str, str], Any], *names: str) -> None:
            found = get(*names)
            if found is not None:
                name, raw = found
                sources[field] = found
                values[field] = conv(name, raw)

        put("service_name", _str, "LOOPTRACE_SERVICE_NAME", "OTEL_SERVICE_NAME")
        put(
            "resource_attributes",
            _pairs,
            "LOOPTRACE_RESOURCE_ATTRIBUTES",
            "OTEL_RESOURCE_ATTRIBUTES",
        )
        put("disabled", _bool, "LOOPTRACE_DISABLED", "OTEL_SDK_DISABLED")
        put("sample_rate", _float, "LOOPTRACE_SAMPLE_RATE")
        put("capture_inputs", _bool, "LOOPTRACE_CAPTURE_INPUTS")
        put("capture_outputs", _bool, "LOOPTRACE_CAPTURE_OUTPUTS")
        put("max_generator_items", _int, "LOOPTRACE_MAX_GENERATOR_ITEMS")
        put("capture_genai_content", _bool, "LOOPTRACE_CAPTURE_GENAI_CONTENT")
        put("max_value_bytes", _int, "LOOPTRACE_MAX_VALUE_BYTES")
        put("max_span_bytes", _int, "LOOPTRACE_MAX_SPAN_BYTES")
        put("max_depth", _int, "LOOPTRACE_MAX_DEPTH")
        put("redact", _bool, "LOOPTRACE_REDACT")
        put("redact_keys", _keys, "LOOPTRACE_REDACT_KEYS")
        put("offload", _bool, "LOOPTRACE_OFFLOAD")
        put("offload_threshold_bytes", _int, "LOOPTRACE_OFFLOAD_THRESHOLD_BYTES")
        traces_endpoint = get("LOOPTRACE_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        if traces_endpoint is not None:
            sources["endpoint"] = traces_endpoint
            values["endpoint"] = traces_endpoint[1]
        else:
            base = get("OTEL_EXPORTER_OTLP_ENDPOINT")
            if base is not None:
                sources["endpoint"] = base
                # The spec: a base endpoint gets the signal path appended.
                values["endpoint"] = base[1].rstrip("/") + "/v1/traces"
        put(
            "headers",
            _pairs,
            "LOOPTRACE_HEADERS",
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
            "OTEL_EXPORTER_OTLP_HEADERS",
        )
        put(
            "encoding",
            _encoding,
            "LOOPTRACE_ENCODING",
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        )
        put(
            "compression",
            _compression,
            "LOOPTRACE_COMPRESSION",
            "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
            "OTEL_EXPORTER_OTLP_COMPRESSION",
        )
        put("export_timeout", _float, "LOOPTRACE_EXPORT_TIMEOUT")
        put(
            "certificate",
            _str,
            "LOOPTRACE_CERTIFICATE",
            "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
            "OTEL_EXPORTER_OTLP_CERTIFICATE",
            "SSL_CERT_FILE",
        )
        put("certificate_dir", _str, "SSL_CERT_DIR")
        put(
            "client_certificate",
            _str,
            "LOOPTRACE_CLIENT_CERTIFICATE",
            "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
            "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
        )
        put(
            "client_key",
            _str,
            "LOOPTRACE_CLIENT_KEY",
            "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY",
            "OTEL_EXPORTER_OTLP_CLIENT_KEY",
        )
        put("flush_interval", _float, "LOOPTRACE_FLUSH_INTERVAL")
        put("max_batch_spans", _int, "LOOPTRACE_MAX_BATCH_SPANS")
        put("max_batch_bytes", _int, "LOOPTRACE_MAX_BATCH_BYTES")
        put("max_concurrent_requests", _int, "LOOPTRACE_MAX_CONCURRENT_REQUESTS")
        put("max_buffer_spans", _int, "LOOPTRACE_MAX_BUFFER_SPANS")
        put("max_buffer_bytes", _int, "LOOPTRACE_MAX_BUFFER_BYTES")
        put("backpressure_bytes", _int, "LOOPTRACE_FLUSH_BACKPRESSURE_BYTES")
        put("retry_budget", _float, "LOOPTRACE_RETRY_BUDGET")
        put("shutdown_timeout", _float, "LOOPTRACE_SHUTDOWN_TIMEOUT")
        put("send_in_progress", _bool, "LOOPTRACE_SEND_IN_PROGRESS")
        put("in_progress_after", _float, "LOOPTRACE_IN_PROGRESS_AFTER")
        put("spool", _bool, "LOOPTRACE_SPOOL")
        put("spool_dir", _path, "LOOPTRACE_SPOOL_DIR")
        put("spool_max_bytes", _int, "LOOPTRACE_SPOOL_MAX_BYTES")
        put("spool_max_age_hours", _float, "LOOPTRACE_SPOOL_MAX_AGE_HOURS")
        put("spool_durable", _bool, "LOOPTRACE_SPOOL_DURABLE")
        put("store_path", _path, "LOOPTRACE_STORE")
        put("store_max_age_days", _float, "LOOPTRACE_STORE_MAX_AGE_DAYS")
        put("store_max_bytes", _int, "LOOPTRACE_STORE_MAX_BYTES")
        put("collector_token", _str, "LOOPTRACE_TOKEN")
        put("lag_monitor", _bool, "LOOPTRACE_LAG_MONITOR")
        put("lag_interval", _float, "LOOPTRACE_LAG_INTERVAL")
        put("lag_culprits", _bool, "LOOPTRACE_LAG_CULPRITS")
        put("lag_culprit_threshold", _float, "LOOPTRACE_LAG_CULPRIT_THRESHOLD")
        put("lag_summary_interval", _float, "LOOPTRACE_LAG_SUMMARY_INTERVAL")
        _warn_about(sources, values.get("endpoint"))
        values.update(overrides)
        try:
            return cls(**values)
        except TypeError as exc:
            raise ConfigurationError(str(exc)) from None
        except ConfigurationError as exc:
            source = sources.get(exc.field or "") if exc.field not in overrides else None
            if source is None:
                raise
            name, raw = source
            shown = raw if exc.field not in _SECRET_FIELDS else "<redacted>"
            raise ConfigurationError(f"{name}={shown!r}: {exc}", exc.field) from None


# Settings whose value is never echoed in a message.
_SECRET_FIELDS = frozenset(("headers", "client_key", "collector_token"))


def _check(ok: bool, message: str, field: str | None = None) -> None:
    if not ok:
        raise ConfigurationError(message, field)


_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_UNSAFE_VALUE = re.compile(r"[\r\n\0]")


def check_header(name: str, value: str) -> None:
    """Raise :class:`ConfigurationError` unless ``name: value`` can go in a request head as it
    is: a line break in a value would end the head there and start a header of its own."""
    _check(
        type(name) is str and _TOKEN.fullmatch(name) is not None,
        f"header name {name!r} is not a valid HTTP field name",
    )
    # The value itself is never shown: headers carry API keys.
    _check(
        type(value) is str and not _UNSAFE_VALUE.search(value) and value == value.strip(),
        f"the value of header {name!r} must be a string with no line break, NUL or "
        "surrounding whitespace",
    )


def _str(name: str, raw: str) -> str:
    return raw


def _bool(name: str, raw: str) -> bool:
    low = raw.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ConfigurationError(f"{name} must be true or false, got {raw!r}")


def _int(name: str, raw: str) -> int:
    try:
        return int(raw.replace("_", ""))
    except ValueError:
        raise ConfigurationError(f"{name} must be an integer, got {raw!r}") from None


def _float(name: str, raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise ConfigurationError(f"{name} must be a number, got {raw!r}") from None


def _path(name: str, raw: str) -> Path:
    return Path(raw).expanduser()


def _keys(name: str, raw: str) -> tuple[str, ...]:
    return tuple(k.strip().lower() for k in raw.split(",") if k.strip())


def _pairs(name: str, raw: str) -> dict[str, str]:
    # W3C-baggage-like "k=v,k2=v2" with percent-encoding, as the OTLP exporter spec says.
    out: dict[str, str] = {}
    for item in raw.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            # Never echo the value: it may be an API key.
            raise ConfigurationError(f"{name} must be comma-separated key=value pairs")
        out[urllib.parse.unquote(key.strip())] = urllib.parse.unquote(value.strip())
    return out


def _encoding(name: str, raw: str) -> Encoding:
    low = raw.lower()
    if low in ("protobuf", "http/protobuf"):
        return "protobuf"
    if low == "grpc" and name.startswith("OTEL_"):
        # Deployments set the OTEL_ protocol for every SDK in a process or pod; looptrace is an
        # OTLP/HTTP client, so it sends protobuf over HTTP and says so once (_warn_about).
        return "protobuf"
    if low in ("json", "http/json"):
        return "json"
    raise ConfigurationError(
        f"{name} must be protobuf or json (http/protobuf, http/json), got {raw!r}"
    )


_warned: set[tuple[str, str]] = set()


def _warn_about(sources: Mapping[str, tuple[str, str]], endpoint: str | None) -> None:
    """One line, once per process, for settings looptrace uses otherwise than they read."""
    lines = []
    name, raw = sources.get("encoding", ("", ""))
    if raw.lower() == "grpc":
        to = f"to {endpoint}" if endpoint else "(no endpoint is set: spans go to the local store)"
        hint = ""
        if endpoint and urllib.parse.urlsplit(endpoint).port == 4317:
            hint = "; port 4317 is OTLP/gRPC's, an OpenTelemetry Collector takes OTLP/HTTP on 4318"
        lines.append(
            (name, f"{name}=grpc: looptrace sends OTLP over HTTP only, as http/protobuf {to}{hint}")
        )
    name, raw = sources.get("endpoint", ("", ""))
    if name == "OTEL_EXPORTER_OTLP_ENDPOINT" and raw.rstrip("/").endswith("/v1/traces"):
        lines.append(
            (
                name,
                f"{name}={raw!r} is a base URL, to which /v1/traces is added ({endpoint}); for "
                "the full URL of traces set OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or "
                "LOOPTRACE_ENDPOINT instead",
            )
        )
    for key in lines:
        if key not in _warned:
            _warned.add(key)
            logging.getLogger("looptrace").warning("looptrace: %s", key[1])


def _compression(name: str, raw: str) -> Compression:
    low = raw.lower()
    if low in ("auto", "gzip", "zstd", "none"):
        return low  # type: ignore[return-value]
    raise ConfigurationError(f"{name} must be auto, gzip, zstd or none, got {raw!r}")
