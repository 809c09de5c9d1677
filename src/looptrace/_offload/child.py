"""What a worker process does for :mod:`looptrace._offload`: finish serializing a large span,
encode it, and (for :meth:`~looptrace._offload.Offloader.deliver`) send it.

Everything a worker unpickles lives here or in the modules this one imports: the calls it
answers, the slots that stand for raw values, the HTTP settings. None of them imports asyncio.
"""

from __future__ import annotations

import os
import pickle
import sys
import time
from typing import TYPE_CHECKING, Any

from .. import _otlp, _serialize
from .._transport.settings import HttpSettings

if TYPE_CHECKING:
    import httpx

__all__ = ["CALLS", "LIFT_BUDGET", "Slot", "restore"]

# Values visited (per span) looking for large strings to send raw: the planning walk's
# budget, so a span's handoff stays as cheap as its plan. The parent's lift and the worker's
# restore walk the same values in the same order within it.
LIFT_BUDGET = 256

# An answer's body is a status message; more than this is not read, and the connection that
# carried it is not reused (the same bound as the application's client).
_ANSWER_BYTES = 64 * 1024
# A body goes to the HTTP client in pieces of at most this size: a client that copies the
# unsent rest of a piece after a partial send then copies a little, not megabytes.
_SEND_PIECE = 256 * 1024


class Slot:
    """Stands in for a large str or bytes that travels raw after the call's pickle: the
    ``index``-th raw value, of type ``kind``."""

    __slots__ = ("index", "kind")

    def __init__(self, index: int, kind: str) -> None:
        self.index = index
        self.kind = kind

    def __reduce__(self) -> tuple[Any, ...]:
        return (Slot, (self.index, self.kind))

    def __repr__(self) -> str:
        return f"<raw slot {self.index} {self.kind}>"


class _Raw:
    """The worker's view of the raw values of one call."""

    def __init__(self, values: list[bytes]) -> None:
        self._values = values

    def value(self, slot: Slot) -> Any:
        data = self._values[slot.index]
        return data.decode("utf-8", "surrogatepass") if slot.kind == "str" else data


class Destination:
    """Where and how a worker sends a large span: the pipeline's HTTP settings (the same
    object its own client is built from), and the request's encoding, compression and
    resource."""

    __slots__ = ("compression", "encoding", "http", "resource")

    def __init__(
        self, http: HttpSettings, encoding: str, compression: str, resource: _otlp.Resource
    ) -> None:
        self.http = http
        self.encoding = encoding
        self.compression = compression
        self.resource = resource

    def __reduce__(self) -> tuple[Any, ...]:
        return (Destination, (self.http, self.encoding, self.compression, self.resource))

    def __repr__(self) -> str:
        return f"Destination({self.http!r})"


def _ping() -> int:
    return os.getpid()


def restore(v: Any, raw: _Raw, left: list[int]) -> Any:
    """``v`` with every slot replaced by its value: the mirror of the parent's lift, walking
    the same values in the same order within the same budget. ``left`` is [slots still to
    find, values still to visit]."""
    cls = type(v)
    if cls is Slot:
        left[0] -= 1
        return raw.value(v)
    if cls is dict:
        for k, x in v.items():
            left[1] -= 1
            if left[0] <= 0 or left[1] < 0:
                break
            y = restore(x, raw, left)
            if y is not x:
                v[k] = y
        return v
    if cls is list or cls is tuple:
        out = v if cls is list else list(v)
        for i, x in enumerate(out):
            left[1] -= 1
            if left[0] <= 0 or left[1] < 0:
                break
            out[i] = restore(x, raw, left)
        return out if cls is list else tuple(out)
    return v


def _restored(inputs: Any, output: Any, raw: list[bytes]) -> tuple[Any, Any]:
    if not raw:
        return inputs, output
    values = _Raw(raw)
    # Slots met more than once (one value in two places) count each time.
    left = [1 << 30, LIFT_BUDGET]
    inputs = (inputs[0], restore(inputs[1], values, left))
    output = (output[0], restore(output[1], values, left))
    return inputs, output


def _work(
    wire: Any,
    inputs: Any,
    output: Any,
    pol: Any,
    max_span_bytes: int,
    encoding: str,
    raw: list[bytes] | None = None,
) -> Any:
    """Finish serializing one prepared span, and encode it: the encoded span comes back raw.
    (A value the worker cannot rebuild, such as a class from the user's ``__main__``, fails
    in the unpickling, which answers with the error.)"""
    from .worker import Raw

    try:
        inputs, output = _restored(inputs, output, raw or [])
        with _serialize.counted() as counts:
            wire = _serialize.finish(wire, inputs, output, pol, max_span_bytes)
        body = _otlp.encode_span(wire, encoding)
    except Exception as exc:
        return None, {"error": 1, type(exc).__name__: 1}
    return Raw([body], dict(counts))


def _deliver(
    wire: Any,
    inputs: Any,
    output: Any,
    max_span_bytes: int,
    settings: bytes,
    raw: list[bytes] | None = None,
) -> tuple[str, Any, dict[str, int]]:
    """Finish one large span, and send it as a request of its own. Answers ``("answered",
    (status, retry_after, detail), counts)``, ``("unsent", error, counts)`` when no answer
    came, or ``("error", name, {})`` when the span could not be encoded here (the parent then
    encodes it itself)."""
    import httpx

    try:
        # Unpickled here, inside the try: a failure is an answer, not a dead worker.
        dest, pol = _settings(settings)
        inputs, output = _restored(inputs, output, raw or [])
        with _serialize.counted() as counts:
            if dest.encoding == "protobuf":
                # The payloads' JSON goes out as orjson wrote it: no str, no joined copy.
                payloads = _serialize.finish_payloads(wire, inputs, output, pol, max_span_bytes)
                resource = _otlp.scoped(dest.resource, wire.scope)
                body = _otlp.request_pieces(_otlp.span_pieces(wire, payloads), resource)
            else:
                wire = _serialize.finish(wire, inputs, output, pol, max_span_bytes)
                chunk = _otlp.encode_span(wire, dest.encoding)
                body = [_otlp.encode_request([chunk], dest.resource, dest.encoding)]
        headers = {"Content-Type": _otlp.content_type(dest.encoding)}
        body, content_encoding = _otlp.compress_pieces(body, dest.compression)
        if content_encoding:
            headers["Content-Encoding"] = content_encoding
    except Exception as exc:
        return "error", type(exc).__name__, {}
    try:
        answer = post(dest.http, body, headers)
    except httpx.HTTPError as exc:
        return "unsent", f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__, counts
    return "answered", answer, dict(counts)


_clients: dict[HttpSettings, httpx.Client] = {}


def post(
    http: HttpSettings, body: list[bytes], headers: dict[str, str]
) -> tuple[int, str | None, bytes]:
    """POST the pieces of ``body`` with a client built from ``http``, as the application's
    own is; ``(status, Retry-After, the start of the answer's body)``. Raises
    ``httpx.HTTPError`` when no answer came."""
    import httpx

    client = _clients.get(http)
    if client is None:
        client = _clients[http] = http.sync_client()
    headers["Content-Length"] = str(sum(map(len, body)))
    deadline = time.monotonic() + http.timeout
    try:
        return _post_once(client, http.url, body, headers, deadline)
    except httpx.RemoteProtocolError:
        # A kept-alive connection the server closed while idle, in the instant before it was
        # reused: nothing was answered, so once more on a new connection.
        return _post_once(client, http.url, body, headers, deadline)


def _post_once(
    client: httpx.Client, url: str, body: list[bytes], headers: dict[str, str], deadline: float
) -> tuple[int, str | None, bytes]:
    import httpx

    with client.stream("POST", url, content=_steps(body), headers=headers) as response:
        detail = bytearray()
        for part in response.iter_raw():
            detail += part
            if len(detail) >= _ANSWER_BYTES:
                break  # the rest is not read; closing the response drops the connection
            if time.monotonic() > deadline:
                # An answer that trickles in past the deadline: the request failed.
                raise httpx.ReadTimeout("the answer did not arrive within the export timeout")
        return response.status_code, response.headers.get("retry-after"), bytes(detail[:200])


def _steps(body: list[bytes]) -> Any:
    for piece in body:
        if len(piece) <= _SEND_PIECE:
            yield piece
            continue
        view = memoryview(piece)
        for i in range(0, len(piece), _SEND_PIECE):
            yield view[i : i + _SEND_PIECE]


_last_settings: tuple[bytes, Any] | None = None


def _settings(raw: bytes) -> tuple[Destination, Any]:
    """The destination and serialization policy, unpickled once per change."""
    global _last_settings
    last = _last_settings
    if last is None or last[0] != raw:
        last = _last_settings = (raw, pickle.loads(raw))
    return last[1]  # type: ignore[no-any-return]


def _modules() -> list[str]:
    """The modules this worker has loaded (diagnostics: what its start-up costs)."""
    return sorted(sys.modules)


# What a worker answers to, by name.
CALLS: dict[str, Any] = {
    "ping": _ping,
    "modules": _modules,
    "work": _work,
    "deliver": _deliver,
}
