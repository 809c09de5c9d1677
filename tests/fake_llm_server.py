"""A fake OpenAI and Anthropic API on 127.0.0.1, speaking their wire formats (JSON and SSE).

    with FakeLlmServer() as llm:
        client = openai.OpenAI(base_url=llm.openai_url, api_key="sk-test", max_retries=0)

The reply is ``reply`` split into words (one stream chunk per word). A request whose model
contains ``bad-request`` gets a 400 error body, ``rate-limited`` a 429, ``server-error`` a 500.
A request that offers tools gets a tool call back. ``cached_tokens``, ``cache_creation_tokens``
and ``reasoning_tokens``, when set, are reported in the usage the way each API reports them. ``hold()`` makes streams stop after their first content chunk until
``release()``, so a test can act (close, cancel) at a known point without timing anything;
``one_write`` sends a whole stream in one write instead, so the client has read all of it
before the caller sees its first chunk.
"""

from __future__ import annotations

import base64
import http.server
import json
import struct
import threading
from typing import Any

USAGE_IN = 12
TOOL_ARGUMENTS = '{"city": "Paris"}'


class FakeLlmServer:
    def __init__(self, reply: str = "Hello from the fake model") -> None:
        self.reply = reply
        self.cached_tokens = 0
        self.cache_creation_tokens = 0
        self.reasoning_tokens = 0
        self.one_write = False
        self.requests: list[tuple[str, dict[str, str], Any]] = []
        self.keep_requests = True
        self._gate = threading.Event()
        self._gate.set()
        self.first_chunk_sent = threading.Event()
        self.stream_ended = threading.Event()
        self._server: http.server.ThreadingHTTPServer | None = None

    # -- control ---------------------------------------------------------------------------

    def hold(self) -> None:
        self._gate.clear()
        self.first_chunk_sent.clear()
        self.stream_ended.clear()

    def release(self) -> None:
        self._gate.set()

    @property
    def openai_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def anthropic_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.server_address[1]

    def pieces(self) -> list[str]:
        words = self.reply.split(" ")
        return [w if i == 0 else " " + w for i, w in enumerate(words)]

    # -- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> FakeLlmServer:
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out as separate writes

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length)
                if self.path == "/v1/traces":
                    fake._handle(self, {})
                    return
                body = json.loads(raw or b"{}")
                if fake.keep_requests:
                    fake.requests.append((self.path, dict(self.headers), body))
                try:
                    fake._handle(self, body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client went away mid-stream, on purpose

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass

        self._server = Server(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._gate.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    # -- responses -------------------------------------------------------------------------

    def _handle(self, h: http.server.BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        path = h.path
        if path == "/v1/traces":  # a span sink for benchmarks: accept and discard
            h.send_response(200)
            h.send_header("content-type", "application/x-protobuf")
            h.send_header("content-length", "0")
            h.end_headers()
            return
        model = str(body.get("model", ""))
        anthropic = path.startswith("/v1/messages")
        status = _ERRORS.get(next((k for k in _ERRORS if k in model), ""), 0)
        if status:
            if anthropic:
                kind = {400: "invalid_request_error", 429: "rate_limit_error"}.get(
                    status, "api_error"
                )
                error: dict[str, Any] = {
                    "type": "error",
                    "error": {"type": kind, "message": f"fake {status}"},
                }
            else:
                error = {"error": {"message": f"fake {status}", "type": "invalid", "code": None}}
            _send_json(h, error, status)
            return
        tools = bool(body.get("tools"))
        if path == "/v1/chat/completions":
            if body.get("stream"):
                self._stream(h, self._chat_chunks(model, tools, body))
            else:
                _send_json(h, self._chat(model, tools))
        elif path == "/v1/responses":
            if body.get("stream"):
                self._stream(h, self._responses_events(model), named=True)
            else:
                _send_json(h, self._response(model, self.reply))
        elif path == "/v1/embeddings":
            _send_json(h, self._embeddings(model, body))
        elif anthropic:
            if body.get("stream"):
                self._stream(h, self._message_events(model, tools), named=True)
            else:
                _send_json(h, self._message(model, tools))
        else:
            _send_json(h, {"error": {"message": "not found"}}, 404)

    def _stream(self, h: Any, events: list[Any], named: bool = False) -> None:
        h.send_response(200)
        h.send_header("content-type", "text/event-stream")
        h.send_header("transfer-encoding", "chunked")
        h.end_headers()
        content_seen = False
        if self.one_write:  # the body and its end in one write: the client reads all of it at once
            data = "".join(_sse(event, named) for event in events).encode()
            h.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n0\r\n\r\n")
            h.wfile.flush()
            self.stream_ended.set()
            return
        for event in events:
            _chunk(h, _sse(event, named).encode())
            if _is_content(event) and not content_seen:
                content_seen = True
                self.first_chunk_sent.set()
                self._gate.wait(30)
        _chunk(h, b"")
        self.stream_ended.set()

    # -- OpenAI ----------------------------------------------------------------------------

    def _chat(self, model: str, tools: bool) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.reply}
        reason = "stop"
        if tools:
            message = {"role": "assistant", "content": None, "tool_calls": [_openai_tool()]}
            reason = "tool_calls"
        return {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": model + "-2024",
            "choices": [{"index": 0, "message": message, "finish_reason": reason}],
            "usage": self._chat_usage(),
        }

    def _chat_usage(self) -> dict[str, Any]:
        n = len(self.pieces())
        usage: dict[str, Any] = {
            "prompt_tokens": USAGE_IN,
            "completion_tokens": n,
            "total_tokens": USAGE_IN + n,
        }
        if self.cached_tokens or self.reasoning_tokens:
            usage["prompt_tokens_details"] = {"cached_tokens": self.cached_tokens}
            usage["completion_tokens_details"] = {"reasoning_tokens": self.reasoning_tokens}
        return usage

    def _chat_chunks(self, model: str, tools: bool, body: dict[str, Any]) -> list[Any]:
        def chunk(delta: dict[str, Any], reason: str | None = None) -> dict[str, Any]:
            return {
                "id": "chatcmpl-1",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": model + "-2024",
                "choices": [{"index": 0, "delta": delta, "finish_reason": reason}],
            }

        events: list[Any] = [chunk({"role": "assistant", "content": ""})]
        if tools:
            tool = _openai_tool()
            first = {"index": 0, "id": tool["id"], "type": "function"}
            first["function"] = {"name": tool["function"]["name"], "arguments": ""}
            events.append(chunk({"tool_calls": [first]}))
            for piece in (TOOL_ARGUMENTS[:8], TOOL_ARGUMENTS[8:]):
                events.append(
                    chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
                )
            events.append(chunk({}, "tool_calls"))
        else:
            events.extend(chunk({"content": piece}) for piece in self.pieces())
            events.append(chunk({}, "stop"))
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = chunk({})
            usage["choices"] = []
            usage["usage"] = self._chat_usage()
            events.append(usage)
        events.append("[DONE]")
        return events

    def _response(self, model: str, text: str) -> dict[str, Any]:
        return {
            "id": "resp_1",
            "object": "response",
            "created_at": 0,
            "model": model + "-2024",
            "status": "completed",
            "output": [
                {
                    "type": "message",
                    "id": "msg_1",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": text, "annotations": []}],
                }
            ],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": {
                "input_tokens": USAGE_IN,
                "output_tokens": len(self.pieces()),
                "total_tokens": USAGE_IN + len(self.pieces()),
                "input_tokens_details": {"cached_tokens": self.cached_tokens},
                "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
            },
        }

    def _responses_events(self, model: str) -> list[Any]:
        created = self._response(model, "")
        created["status"] = "in_progress"
        created["output"] = []
        events: list[Any] = [
            {"type": "response.created", "sequence_number": 0, "response": created}
        ]
        for i, piece in enumerate(self.pieces()):
            events.append(
                {
                    "type": "response.output_text.delta",
                    "sequence_number": i + 1,
                    "item_id": "msg_1",
                    "output_index": 0,
                    "content_index": 0,
                    "delta": piece,
                    "logprobs": [],
                }
            )
        events.append(
            {
                "type": "response.completed",
                "sequence_number": 99,
                "response": self._response(model, self.reply),
            }
        )
        return events

    def _embeddings(self, model: str, body: dict[str, Any]) -> dict[str, Any]:
        inputs = body.get("input")
        count = len(inputs) if isinstance(inputs, list) else 1
        vector = [0.25, 0.5, 0.75]
        value: Any = vector
        if body.get("encoding_format") == "base64":
            value = base64.b64encode(struct.pack("<3f", *vector)).decode()
        return {
            "object": "list",
            "data": [{"object": "embedding", "index": i, "embedding": value} for i in range(count)],
            "model": model + "-2024",
            "usage": {"prompt_tokens": 4, "total_tokens": 4},
        }

    # -- Anthropic -------------------------------------------------------------------------

    def _message(self, model: str, tools: bool) -> dict[str, Any]:
        content: list[Any] = [{"type": "text", "text": self.reply}]
        reason = "end_turn"
        if tools:
            content.append(_anthropic_tool())
            reason = "tool_use"
        return {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": model + "-2024",
            "content": content,
            "stop_reason": reason,
            "stop_sequence": None,
            "usage": self._anthropic_usage(len(self.pieces())),
        }

    def _anthropic_usage(self, output_tokens: int) -> dict[str, Any]:
        # Anthropic's input_tokens leave out the cache reads and writes, given apart.
        usage: dict[str, Any] = {"input_tokens": USAGE_IN, "output_tokens": output_tokens}
        if self.cached_tokens or self.cache_creation_tokens:
            usage["cache_read_input_tokens"] = self.cached_tokens
            usage["cache_creation_input_tokens"] = self.cache_creation_tokens
        return usage

    def _message_events(self, model: str, tools: bool) -> list[Any]:
        start = self._message(model, False)
        start["content"] = []
        start["stop_reason"] = None
        start["usage"] = self._anthropic_usage(1)
        events: list[Any] = [{"type": "message_start", "message": start}]
        events.append(
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            }
        )
        for piece in self.pieces():
            delta = {"type": "text_delta", "text": piece}
            events.append({"type": "content_block_delta", "index": 0, "delta": delta})
        events.append({"type": "content_block_stop", "index": 0})
        if tools:
            block = _anthropic_tool()
            block["input"] = {}
            events.append({"type": "content_block_start", "index": 1, "content_block": block})
            for piece in (TOOL_ARGUMENTS[:8], TOOL_ARGUMENTS[8:]):
                delta = {"type": "input_json_delta", "partial_json": piece}
                events.append({"type": "content_block_delta", "index": 1, "delta": delta})
            events.append({"type": "content_block_stop", "index": 1})
        events.append(
            {
                "type": "message_delta",
                "delta": {
                    "stop_reason": "tool_use" if tools else "end_turn",
                    "stop_sequence": None,
                },
                "usage": {"output_tokens": len(self.pieces())},
            }
        )
        events.append({"type": "message_stop"})
        return events


def _sse(event: Any, named: bool) -> str:
    if event == "[DONE]":
        return "data: [DONE]\n\n"
    if named:
        return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"
    return f"data: {json.dumps(event)}\n\n"


_ERRORS = {"bad-request": 400, "rate-limited": 429, "server-error": 500}


def _is_content(event: Any) -> bool:
    if not isinstance(event, dict):
        return False
    if event.get("type") in ("response.output_text.delta", "content_block_delta"):
        return True
    choices = event.get("choices") or ()
    return any(c["delta"].get("content") or c["delta"].get("tool_calls") for c in choices)


def _openai_tool() -> dict[str, Any]:
    return {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": TOOL_ARGUMENTS},
    }


def _anthropic_tool() -> dict[str, Any]:
    return {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}


def _send_json(h: Any, doc: Any, status: int = 200) -> None:
    data = json.dumps(doc).encode()
    h.send_response(status)
    h.send_header("content-type", "application/json")
    h.send_header("content-length", str(len(data)))
    h.end_headers()
    h.wfile.write(data)


def _chunk(h: Any, data: bytes) -> None:
    h.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    h.wfile.flush()


# -- reading spans back from the OTLP server -----------------------------------------------


def _any(value: Any) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_any(x) for x in value.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _any(kv.value) for kv in value.kvlist_value.values}
    return None if which is None else getattr(value, which)


def attributes(span: Any) -> dict[str, Any]:
    """A received span's attributes; JSON-encoded structured values decoded."""
    out: dict[str, Any] = {}
    for kv in span.attributes:
        value = _any(kv.value)
        if isinstance(value, str) and value[:1] in ("[", "{"):
            try:
                value = json.loads(value)
            except ValueError:
                pass
        out[kv.key] = value
    return out


def events(span: Any) -> list[str]:
    return [e.name for e in span.events]


def main() -> None:
    """Serve in a process of its own (benchmarks): print the port, stop when stdin closes."""
    import sys

    with FakeLlmServer() as server:
        server.keep_requests = False
        print(server.port, flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    main()
