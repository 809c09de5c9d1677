"""The resource and instrumentation scope every span of a request shares, encoded once."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from .._wire import Attributes
from ._common import JSON_CONTENT_TYPE, PROTOBUF_CONTENT_TYPE
from .jsonenc import _dumps, _json_attrs
from .pb import _kv_body, _tagged, _utf8

if TYPE_CHECKING:
    from .._config import Config


class Resource:
    """What every span in a request shares: resource attributes and the instrumentation scope.

    Immutable; its protobuf and JSON encodings are computed once, at construction, because the
    same resource heads every request.
    """

    __slots__ = ("_json", "_pb_resource", "_pb_scope", "attributes", "scope_name", "scope_version")

    attributes: Attributes
    scope_name: str
    scope_version: str
    _json: bytes
    _pb_resource: bytes
    _pb_scope: bytes

    def __init__(
        self, attributes: Attributes, scope_name: str = "looptrace", scope_version: str = ""
    ) -> None:
        set_ = object.__setattr__
        set_(self, "attributes", list(attributes))
        set_(self, "scope_name", scope_name)
        set_(self, "scope_version", scope_version)
        # ResourceSpans.resource (field 1) and the ScopeSpans.scope (field 1), fully tagged.
        resource_body = b"".join(_tagged(0x0A, _kv_body(k, v)) for k, v in self.attributes)
        scope_body = b""
        if scope_name:
            scope_body += _tagged(0x0A, _utf8(scope_name))
        if scope_version:
            scope_body += _tagged(0x12, _utf8(scope_version))
        set_(self, "_pb_resource", _tagged(0x0A, resource_body))
        set_(self, "_pb_scope", _tagged(0x0A, scope_body))
        scope: dict[str, Any] = {"name": scope_name}
        if scope_version:
            scope["version"] = scope_version
        # The JSON request head up to the spans array, with the resource and scope in place.
        set_(
            self,
            "_json",
            b'{"resourceSpans":[{"resource":{"attributes":'
            + _dumps(_json_attrs(self.attributes))
            + b'},"scopeSpans":[{"scope":'
            + _dumps(scope)
            + b',"spans":[',
        )

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Resource is immutable")

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt from its fields: the default would set the slots one by one (and fail).
        return (Resource, (self.attributes, self.scope_name, self.scope_version))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Resource):
            return NotImplemented
        return (self.attributes, self.scope_name, self.scope_version) == (
            other.attributes,
            other.scope_name,
            other.scope_version,
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"Resource({self.attributes!r}, scope_name={self.scope_name!r}, "
            f"scope_version={self.scope_version!r})"
        )


def _new_instance_id() -> None:
    _instance[0] = os.urandom(16).hex()


# service.instance.id: one per process (a forked child gets its own), so what one run of a
# program sent (its lag summaries, say) can be told from another's.
_instance = [""]
_new_instance_id()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_instance_id)


def default_resource(cfg: Config) -> Resource:
    """The resource looptrace sends: service.name, ``cfg.resource_attributes``, then
    service.instance.id (unless configured) and the telemetry.sdk.* facts. ``service.name``
    from ``resource_attributes`` is used only when no service name was configured (the
    OpenTelemetry rule: OTEL_SERVICE_NAME wins)."""
    from .. import __version__

    extra = dict(cfg.resource_attributes)
    service = cfg.service_name
    if service == "unknown_service" and extra.get("service.name"):
        service = extra["service.name"]
    extra.pop("service.name", None)
    attrs: Attributes = [("service.name", service)]
    attrs.extend(extra.items())
    if "service.instance.id" not in extra:
        attrs.append(("service.instance.id", _instance[0]))
    attrs.append(("telemetry.sdk.name", "looptrace"))
    attrs.append(("telemetry.sdk.language", "python"))
    attrs.append(("telemetry.sdk.version", __version__))
    return Resource(attrs, "looptrace", __version__)


def content_type(encoding: str) -> str:
    """The Content-Type header for a request body in ``encoding``."""
    return JSON_CONTENT_TYPE if encoding == "json" else PROTOBUF_CONTENT_TYPE
