"""The hub's own WebSocket protocol (hub/server/wsprotocol.py), what `sessionhub serve --ws hub`
runs, against a real `sessionhub serve` process: the handshake and its
subprotocol, a message past the size limit refused with 1009, a peer that answers no ping
closed with 1011, a peer that stops reading cut off while others are served, a denial
response, close codes and reasons, and frames byte for byte as websockets would write them.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import socket
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.frames import Frame, Opcode

from hub.server.wsframes import text_frame
from hub.server.wsprotocol import HubWebSocketProtocol
from tests.support.hubtest import served, text
from tests.support.mcpkit import serve_process

KiB = 1 << 10
MiB = 1 << 20


@contextlib.asynccontextmanager
async def hub(tmp_path: Path, *options: str) -> AsyncIterator[str]:
    """A `sessionhub serve --ws hub`; yields its ws:// URL."""
    async with serve_process(tmp_path / "hub.db", "--ws", "hub", *options) as port:
        yield f"ws://127.0.0.1:{port}/ws"


def raw(url: str, **options: object) -> contextlib.AbstractAsyncContextManager[ClientConnection]:
    """A plain websockets client (no compression: the hub frames its sends itself)."""
    return connect(url, proxy=None, compression=None, max_size=None, **options)  # type: ignore[arg-type]


async def call(ws: ClientConnection, rid: int, op: str, **fields: object) -> object:
    await ws.send(json.dumps({"op": op, "id": rid, **fields}))
    while True:
        frame = json.loads(await ws.recv())
        if frame.get("id") == rid:
            assert frame["frame"] == "reply", frame
            return frame["result"]


async def closed(ws: ClientConnection, timeout: float = 10) -> tuple[int | None, str]:
    """Read on until the hub closes: its close code and reason (1006: no close frame)."""
    async with asyncio.timeout(timeout):
        with contextlib.suppress(ConnectionClosed):
            async for _ in ws:
                pass
    rcvd = ws.protocol.close_rcvd
    return (1006, "") if rcvd is None else (rcvd.code, rcvd.reason)


async def appended(ws: ClientConnection, count: int) -> list[str]:
    """The ids of the next ``count`` messages appended, as a subscriber reads them."""
    got: list[str] = []
    while len(got) < count:
        frame = json.loads(await ws.recv())
        if frame.get("frame") == "event" and frame["type"] == "message.appended":
            got.append(frame["data"]["message"]["id"])
    return got


async def test_handshake_subprotocol_and_requests(tmp_path: Path) -> None:
    async with hub(tmp_path) as url:
        async with raw(url, subprotocols=["sessionhub"]) as ws:
            assert ws.subprotocol == "sessionhub"
            assert ws.response is not None
            assert ws.response.headers["server"] == "uvicorn"
            assert await call(ws, 1, "ping") == "pong"
            created = await call(ws, 2, "create", name="protocol")
            assert isinstance(created, dict)
        async with raw(url) as ws:  # none offered: none chosen
            assert ws.subprotocol is None
            assert await call(ws, 1, "ping") == "pong"


async def test_a_message_past_the_size_limit_is_refused_with_1009(tmp_path: Path) -> None:
    # serve's ws_max_size is max(4 x --max-frame-bytes, 16 MiB): a 17 MiB frame is past it.
    async with hub(tmp_path) as url, raw(url) as ws:
        assert await call(ws, 1, "ping") == "pong"
        with contextlib.suppress(ConnectionClosed):
            await ws.send("x" * (17 * MiB))
        code, _reason = await closed(ws)
        assert code == 1009


async def test_a_peer_that_answers_no_ping_is_closed_with_1011(tmp_path: Path) -> None:
    async with hub(tmp_path, "--ping-interval", "0.2", "--ping-timeout", "0.3") as url:
        port = int(url.split(":")[2].split("/")[0])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        key = base64.b64encode(os.urandom(16)).decode()
        writer.write(
            (
                f"GET /ws HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        async with asyncio.timeout(10):
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 101 ")
            received = await reader.read()  # everything until the hub closes the TCP connection
        writer.close()
        opcodes, close = [], None
        while received:
            opcode, size = received[0] & 0x0F, received[1] & 0x7F
            assert size < 126, "a control frame is short"
            if opcode == Opcode.CLOSE.value:
                close = (struct.unpack("!H", received[2:4])[0], received[4 : 2 + size].decode())
            opcodes.append(opcode)
            received = received[2 + size :]
        assert Opcode.PING.value in opcodes  # the keepalive ping nobody answered
        assert close == (1011, "keepalive ping timeout")


async def evictions(url: str) -> float:
    """``sessionhub_evictions_total`` off the hub's ``/metrics``."""
    base = url.removeprefix("ws://").removesuffix("/ws")
    host, port = base.split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"GET /metrics HTTP/1.1\r\nHost: {base}\r\nConnection: close\r\n\r\n".encode())
    body = (await reader.read()).decode()
    writer.close()
    for line in body.splitlines():
        if line.startswith("sessionhub_evictions_total "):
            return float(line.split()[1])
    raise AssertionError("no sessionhub_evictions_total in /metrics")


async def test_a_peer_that_stops_reading_is_cut_off_while_others_are_served(tmp_path: Path) -> None:
    # 2 MiB: room for the reader that reads on a loaded machine, far below the 15 MiB sent.
    options = ("--outbox-bytes", "2M", "--send-timeout", "1")
    async with hub(tmp_path, *options) as url, raw(url) as writer, raw(url) as reader:
        sid = await call(writer, 1, "create", name="fan-out")
        assert isinstance(sid, dict)
        sid = sid["id"]
        await call(reader, 1, "subscribe", session_id=sid, after_seq=0)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * KiB)  # the kernel absorbs little
        sock.setblocking(False)
        port = int(url.split(":")[2].split("/")[0])
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        async with raw(url, sock=sock, max_queue=1, close_timeout=1) as slow:
            await call(slow, 1, "subscribe", session_id=sid, after_seq=0)
            count = 120  # 15 MiB: past the slow peer's socket buffers and its outbox
            reading = asyncio.create_task(appended(reader, count))
            body = os.urandom(64 * KiB).hex()  # 128 KiB of text a message
            for i in range(count):
                await call(writer, 10 + i, "append", session_id=sid, message=text(f"m{i}", body))
            # The reader that reads gets every message once, in order.
            assert await asyncio.wait_for(reading, 60) == [f"m{i}" for i in range(count)]
            # The slow peer, still reading nothing, is evicted once its outbox has stayed
            # full for the send timeout (the appends above may take less than that).
            async with asyncio.timeout(30):
                while await evictions(url) < 1:
                    await asyncio.sleep(0.2)
            code, reason = await closed(slow, timeout=60)
            # Evicted (4008 "slow consumer ...") or, past the close grace, aborted (1006).
            assert code in (4008, 1006), (code, reason)
            assert code == 1006 or reason.startswith("slow consumer")
        assert await evictions(url) == 1
        assert await call(writer, 99, "ping") == "pong"


async def test_a_socket_off_the_hubs_path_gets_a_denial_response(tmp_path: Path) -> None:
    async with hub(tmp_path) as url:
        with pytest.raises(InvalidStatus) as refused:
            async with raw(url.removesuffix("/ws") + "/elsewhere"):
                pass
        response = refused.value.response
        assert response.status_code == 404
        assert b"/ws" in response.body


async def test_close_codes_and_reasons_reach_the_peer(tmp_path: Path) -> None:
    async with hub(tmp_path) as url:
        async with raw(url) as ws:
            await ws.send(b"\x00binary")
            assert await closed(ws) == (1003, "binary frames are not supported; send JSON text")
        async with raw(url) as ws:  # the peer closes: the hub answers its close and goes on
            assert await call(ws, 1, "ping") == "pong"
            await ws.close(4000, "done here")
            assert ws.protocol.close_rcvd is not None and ws.protocol.close_rcvd.code == 4000
        async with raw(url) as ws:
            assert await call(ws, 1, "ping") == "pong"


@pytest.mark.parametrize("size", [0, 1, 125, 126, 65535, 65536, 70000])
def test_a_text_frame_is_the_one_websockets_writes(size: int) -> None:
    payload = b"x" * size
    expected = Frame(Opcode.TEXT, payload).serialize(mask=False)
    assert text_frame(payload) == expected


# -- the handshake's protocol let go (the frames go to a fresh ServerProtocol) ---------------


async def echo(scope: dict[str, object], receive: Any, send: Any) -> None:
    """An ASGI app that accepts after a moment (so that a peer can send before the 101) and
    echoes one text message."""
    if scope["type"] == "lifespan":
        await receive()
        await send({"type": "lifespan.startup.complete"})
        await receive()
        await send({"type": "lifespan.shutdown.complete"})
        return
    assert (await receive())["type"] == "websocket.connect"
    await asyncio.sleep(0.5)
    await send({"type": "websocket.accept"})
    message = await receive()
    await send({"type": "websocket.send", "text": "echo " + message["text"]})
    await receive()  # the disconnect


def masked(payload: bytes) -> bytes:
    return Frame(Opcode.TEXT, payload).serialize(mask=True)


async def upgrade(port: int, writer: asyncio.StreamWriter) -> None:
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write(
        f"GET /ws HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    await writer.drain()


async def test_frames_go_to_a_fresh_protocol_once_accepted() -> None:
    async with served(app=echo, options={"ws": HubWebSocketProtocol}) as h, raw(h.ws_url) as ws:
        assert h.server is not None
        [protocol] = h.server.server_state.connections
        assert isinstance(protocol, HubWebSocketProtocol)
        assert protocol.conn.id.int == 0  # the frames protocol, not the handshake's
        assert protocol.request is None and protocol.response is None
        await ws.send("hello")
        assert await ws.recv() == "echo hello"


async def test_a_peer_that_sends_before_the_101_keeps_its_handshake_parser() -> None:
    # Half a frame before the answer, the rest after it: the handshake's parser holds the
    # first half, so the socket stays on it (a fresh parser would read garbage: 1002).
    frame = masked(b"early bird")
    async with served(app=echo, options={"ws": HubWebSocketProtocol}) as h:
        reader, writer = await asyncio.open_connection("127.0.0.1", h.port)
        try:
            await upgrade(h.port, writer)
            await asyncio.sleep(0.2)  # the app waits 0.5 s before it accepts
            writer.write(frame[:5])
            await writer.drain()
            async with asyncio.timeout(10):
                head = await reader.readuntil(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 101 ")
                assert h.server is not None
                [protocol] = h.server.server_state.connections
                assert isinstance(protocol, HubWebSocketProtocol)
                assert protocol.conn.id.int != 0
                writer.write(frame[5:])
                await writer.drain()
                header = await reader.readexactly(2)
                assert header[0] == 0x81, header  # a text frame, not a close
                assert await reader.readexactly(header[1] & 0x7F) == b"echo early bird"
        finally:
            writer.close()
