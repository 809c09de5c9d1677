"""Shared by the agent-framework tests: a scripted fake OpenAI API, and the received spans as
a tree."""

from __future__ import annotations

import asyncio
from typing import Any

import looptrace
from fake_llm_server import FakeLlmServer, attributes
from otlp_server import OtlpTestServer


class ScriptedLlm(FakeLlmServer):
    """The fake OpenAI API of tests/fake_llm_server.py, answering as a model in a tool loop
    does: a request that offers tools gets a ``get_weather`` call back (a ``transfer_to_*``
    call when a handoff is offered), unless its last message is a tool's result, which gets
    the text reply."""

    handoff: str | None = None

    def _chat(self, model: str, tools: bool) -> dict[str, Any]:
        doc = super()._chat(model, tools)
        if tools and self.handoff is not None:
            call = doc["choices"][0]["message"]["tool_calls"][0]
            call["function"] = {"name": self.handoff, "arguments": "{}"}
        return doc

    def _handle(self, h: Any, body: dict[str, Any]) -> None:
        offered = [(t.get("function") or t).get("name") for t in body.get("tools") or () if t]
        self.handoff = next(
            (n for n in offered if isinstance(n, str) and n.startswith("transfer_to_")), None
        )
        messages = body.get("messages") or body.get("input")
        if isinstance(messages, list) and messages:
            last = messages[-1]
            if isinstance(last, dict) and (
                last.get("role") == "tool" or last.get("type") == "function_call_output"
            ):
                body = {**body, "tools": []}
        super()._handle(h, body)


class Tree:
    """The spans an OTLP server received, by name, with their parents."""

    def __init__(self, spans: list[Any]) -> None:
        self.spans = spans
        self.by_id = {s.span_id: s for s in spans}

    def named(self, name: str) -> list[Any]:
        return [s for s in self.spans if s.name == name]

    def one(self, name: str) -> Any:
        found = self.named(name)
        assert len(found) == 1, (name, self.names())
        return found[0]

    def names(self) -> list[str]:
        return sorted(s.name for s in self.spans)

    def parent(self, span: Any) -> Any:
        return self.by_id.get(span.parent_span_id)

    def parent_name(self, span: Any) -> str | None:
        parent = self.parent(span)
        return None if parent is None else parent.name

    def attrs(self, name: str) -> dict[str, Any]:
        return attributes(self.one(name))

    def assert_one_trace(self) -> None:
        assert len({s.trace_id for s in self.spans}) == 1, self.names()
        assert len({s.span_id for s in self.spans}) == len(self.spans), "a span sent twice"
        roots = [s for s in self.spans if not s.parent_span_id]
        assert len(roots) == 1, [r.name for r in roots]
        for span in self.spans:
            assert not span.parent_span_id or span.parent_span_id in self.by_id, span.name


def tree(otlp: OtlpTestServer, count: int) -> Tree:
    """The ``count`` spans sent to ``otlp`` (after a flush), as a tree. From synchronous
    code: a test on an event loop uses :func:`atree`."""
    result = looptrace.flush_sync(5)
    assert result.ok
    return _received(otlp, count)


async def atree(otlp: OtlpTestServer, count: int) -> Tree:
    """:func:`tree` for a test on an event loop (looptrace's pipeline may run on that loop:
    the flush is awaited, and the wait for the server happens in a thread)."""
    result = await looptrace.flush(5)
    assert result.ok
    return await asyncio.to_thread(_received, otlp, count)


async def sent(otlp: OtlpTestServer) -> int:
    """How many spans the server has once everything ended so far is flushed."""
    result = await looptrace.flush(5)
    assert result.ok
    return len(otlp.accepted_spans())


def _received(otlp: OtlpTestServer, count: int) -> Tree:
    assert otlp.wait_for_spans(count)
    spans = otlp.accepted_spans()
    assert len(spans) == count, sorted(s.name for s in spans)
    for span in spans:
        assert span.end_time_unix_nano >= span.start_time_unix_nano > 0, span.name
        assert not any(kv.key == "looptrace.in_progress" for kv in span.attributes), span.name
    return Tree(spans)
