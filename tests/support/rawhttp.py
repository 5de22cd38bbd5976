"""HTTP/1.1 by hand over a real socket, for what an HTTP client library will not do: send
headers that promise a body it then withholds, read an answer while the body is unsent,
or open a reply stream and never read it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from dataclasses import dataclass
from typing import Any

__all__ = ["RawAnswer", "open_unread", "read_to_end", "request_head", "send_until_answered"]

#: How long a test waits for an answer that must come before the body is sent: a guard
#: against a hub that waits for the body forever, not a measurement.
ANSWER_WAIT = 10.0


@dataclass
class RawAnswer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def _head(method: str, path: str, port: int, headers: dict[str, str]) -> bytes:
    lines = [
        f"{method} {path} HTTP/1.1",
        f"host: 127.0.0.1:{port}",
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def _read_answer(reader: asyncio.StreamReader) -> RawAnswer:
    status_line = await reader.readline()
    status = int(status_line.split()[1])
    headers: dict[str, str] = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return RawAnswer(status, headers, body)


async def request_head(
    port: int, method: str, path: str, headers: dict[str, str], body_start: bytes = b""
) -> RawAnswer:
    """Send the head (which may declare any Content-Length, or chunked) and ``body_start``,
    and no more: the answer read is one the server gave without the rest of the body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(_head(method, path, port, headers) + body_start)
        await writer.drain()
        async with asyncio.timeout(ANSWER_WAIT):
            return await _read_answer(reader)
    finally:
        writer.close()


async def open_unread(
    port: int, method: str, path: str, headers: dict[str, str], body: bytes = b""
) -> socket.socket:
    """A request whose answer is never read: a blocking socket with a small receive
    buffer (set before connecting, so the window stays small), left for the caller to close."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, ("127.0.0.1", port))
    await loop.sock_sendall(
        sock, _head(method, path, port, {**headers, "content-length": str(len(body))}) + body
    )
    return sock


async def read_to_end(sock: socket.socket) -> int:
    """Read what the server sent until it ends the connection (a reset counts as the end);
    the bytes read. TimeoutError if the server keeps the connection open."""
    loop = asyncio.get_running_loop()
    total = 0
    async with asyncio.timeout(ANSWER_WAIT):
        try:
            while chunk := await loop.sock_recv(sock, 1 << 20):
                total += len(chunk)
        except ConnectionResetError:
            pass
    return total


async def send_until_answered(
    port: int, path: str, headers: dict[str, str], total: int, chunk: int = 64 << 10
) -> tuple[RawAnswer, int]:
    """POST a body of ``total`` bytes for real, a chunk at a time, and stop sending once the
    answer has come: the answer, and how many body bytes had been sent by then."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = _head("POST", path, port, {**headers, "content-length": str(total)})
    answer = asyncio.create_task(_read_answer(reader))
    sent = 0
    try:
        writer.write(head)
        piece = b" " * chunk
        with contextlib.suppress(ConnectionError):
            while sent < total and not answer.done():
                writer.write(piece[: total - sent])
                sent += min(chunk, total - sent)
                await writer.drain()
        async with asyncio.timeout(ANSWER_WAIT):
            return await answer, sent
    finally:
        answer.cancel()
        writer.close()
