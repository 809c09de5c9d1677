"""What redaction costs on a structure-heavy payload shaped like an LLM application's, with and
without keys that name credentials.

The payload (~165 KB): 1,024 leaf records at depth 6 with seven short fields each (a chat
message's role and content, token counts, a tool call's name), a 6,000-character note, and a
``request`` dict holding ``user``, ``session`` and headers with ``Authorization`` and an
``api_key``. The clean variant renames the credential keys. Each row serializes the value as
the exporter does (``_serialize.dumps_or_steps`` run to its end), ``--calls`` times, and prints
the time per call. ``--shape image`` passes the large-payload row's multimodal chat request
instead (``scenario_large_payloads.image_payload``: a 2.5 MB PNG as a base64 data URL, the
request's settings and headers, usage; a few keys, one huge string). Under
``valgrind --tool=callgrind`` pass ``--calls 0`` once and ``--calls N`` once and subtract, for
instruction counts that do not move with the machine's load::

    python benchmarks/scenario_redaction.py
    valgrind --tool=callgrind --callgrind-out-file=/dev/null python benchmarks/scenario_redaction.py --only secret --calls 20
    python benchmarks/scenario_redaction.py --shape image
"""

from __future__ import annotations

import argparse
import time
from typing import Any


def payload(credentials: bool) -> dict[str, Any]:
    def leaf(i: int) -> dict[str, Any]:
        return {
            "role": "assistant" if i % 2 else "user",
            "content": f"message {i} about the weather",
            "prompt_tokens": 12 + i % 7,
            "completion_tokens": 30 + i % 11,
            "tool": "get_weather",
            "id": f"call_{i:05d}",
            "ok": bool(i % 3),
        }

    def tree(depth: int, start: int) -> Any:
        if depth == 0:
            return [leaf(start + i) for i in range(4)]
        return {f"n{k}": tree(depth - 1, start * 4 + k * 4) for k in range(4)}

    key, auth = ("api_key", "Authorization") if credentials else ("api_name", "Accept")
    return {
        "tree": tree(4, 0),  # 4**4 * 4 = 1,024 leaves at depth 6
        "note": "lorem ipsum " * 500,
        "request": {
            "user": "ann",
            "session": "conv-42",
            "headers": {auth: "Bearer sk-live-123", key: "sk-live-456", "X-Trace": "1"},
            "usage": {"prompt_tokens": 1200, "completion_tokens": 300, "total_tokens": 1500},
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--only", choices=("secret", "clean"), default=None)
    parser.add_argument("--shape", choices=("structure", "image"), default="structure")
    args = parser.parse_args()
    if args.shape == "image":
        # The large-payload row's own request, so both measure the same bytes.
        from scenario_large_payloads import image_payload

        def make(credentials: bool) -> dict[str, Any]:
            return image_payload(2_500_000, credentials)
    else:
        make = payload
    import looptrace
    from looptrace import _serialize
    from looptrace._serialize import walk

    cfg = looptrace.Config()
    pol = _serialize.policy(cfg)
    rows = [("secret", True), ("clean", False)]
    for name, credentials in rows:
        if args.only and name != args.only:
            continue
        value = make(credentials)
        out = _run(walk, value, pol)  # learns the shape, as a long-running process has
        if credentials:
            assert b"sk-live" not in out, "a credential went out"
        started = time.perf_counter()
        for _ in range(args.calls):
            _run(walk, value, pol)
        took = time.perf_counter() - started
        if args.calls:
            print(f"{name:7} {len(out) / 1024:6.0f} KB  {took / args.calls * 1e6:9.0f} us per call")


def _run(walk: Any, value: Any, pol: Any) -> bytes:
    result = walk.dumps_or_steps(value, pol)
    if isinstance(result, bytes):
        return result
    try:
        while True:
            next(result)
    except StopIteration as stop:
        return bytes(stop.value)


if __name__ == "__main__":
    main()
