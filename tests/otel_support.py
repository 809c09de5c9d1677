"""Shared by the OpenTelemetry bridge tests: looptrace's provider installed for one test, and
what a real OTLP server received, read with the instrumentation scope of each span."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan

import looptrace
from otlp_server import OtlpTestServer


@pytest.fixture
def otel() -> Iterator[None]:
    """looptrace is the OpenTelemetry API's provider during the test, and not after it."""
    assert looptrace.instrument_opentelemetry() is True
    yield
    looptrace.uninstrument_opentelemetry()


@dataclasses.dataclass
class Arrived:
    span: ProtoSpan
    scope: tuple[str, str]
    attributes: dict[str, Any]

    @property
    def span_id(self) -> int:
        return int.from_bytes(self.span.span_id, "big")

    @property
    def parent_id(self) -> int:
        return int.from_bytes(self.span.parent_span_id, "big") if self.span.parent_span_id else 0

    @property
    def trace_id(self) -> int:
        return int.from_bytes(self.span.trace_id, "big")


def value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def arrived(server: OtlpTestServer) -> list[Arrived]:
    """Every span record of every accepted request, with its scope."""
    out = []
    for request in server.requests:
        if request.request is None or not 200 <= request.status < 300:
            continue
        for rs in request.request.resource_spans:
            for ss in rs.scope_spans:
                for span in ss.spans:
                    attrs = {kv.key: value(kv.value) for kv in span.attributes}
                    out.append(Arrived(span, (ss.scope.name, ss.scope.version), attrs))
    return out


def by_name(server: OtlpTestServer) -> dict[str, Arrived]:
    """The spans that arrived, by name; a name (or a span) arriving twice fails the test."""
    spans = arrived(server)
    ids = [(s.trace_id, s.span_id) for s in spans]
    assert len(ids) == len(set(ids)), "a span arrived twice"
    names = [s.span.name for s in spans]
    assert len(names) == len(set(names)), f"names repeat: {sorted(names)}"
    return {s.span.name: s for s in spans}
