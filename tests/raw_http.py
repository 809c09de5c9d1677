"""Reading a client's request by hand, for test servers that answer with raw bytes (the
misbehaving backends of the transport's tests)."""

from __future__ import annotations

import socket


def read_request(conn: socket.socket) -> bool:
    """Read one request, its head and a Content-Length body; False when the client closed."""
    data = b""
    while b"\r\n\r\n" not in data:
        part = conn.recv(65536)
        if not part:
            return False
        data += part
    head, _, rest = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    left = length - len(rest)
    while left > 0:
        part = conn.recv(min(left, 1 << 20))
        if not part:
            return False
        left -= len(part)
    return True
