"""Build the spans a receiver would decode, for tests and benchmarks that fill a store directly."""

from __future__ import annotations

from typing import Any

from looptrace._wire import DecodedSpan


def decoded_span(
    trace: int,
    span: int,
    parent: int | None,
    name: str,
    start_ns: int,
    end_ns: int,
    *,
    attributes: dict[str, Any] | None = None,
    events: list[dict[str, Any]] | None = None,
    status: int = 0,
    message: str = "",
    resource: dict[str, Any] | None = None,
    scope: tuple[str, str] = ("test", "0"),
) -> DecodedSpan:
    """A DecodedSpan with integer ids (formatted as OTLP hex); ``end_ns`` 0 is in progress."""
    return DecodedSpan(
        trace_id=f"{trace:032x}",
        span_id=f"{span:016x}",
        parent_span_id=None if parent is None else f"{parent:016x}",
        name=name,
        kind=1,
        start_ns=start_ns,
        end_ns=end_ns,
        attributes=dict(attributes or {}),
        events=list(events or []),
        links=[],
        status_code=status,
        status_message=message,
        trace_state="",
        resource=dict(resource or {"service.name": "test"}),
        scope_name=scope[0],
        scope_version=scope[1],
    )
