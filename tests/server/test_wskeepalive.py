"""The keepalive of the hub's WebSocket protocol (hub/server/wskeepalive.py): one timer for
every connection's pings, which stops with the last connection; a peer that answers stays,
one that does not is dropped with 1011 (not before its ping has waited ``ping_timeout``),
and with no timeout the pings go on, answered or not. Real uvicorn, real peers."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import struct
import time
from collections.abc import AsyncIterator

from websockets.asyncio.client import connect
from websockets.frames import Opcode

from hub.server import wskeepalive
from hub.server.wsprotocol import HubWebSocketProtocol
from tests.support.hubtest import Served, eventually, served


@contextlib.asynccontextmanager
async def silent(h: Served) -> AsyncIterator[asyncio.StreamReader]:
    """A peer that completes the handshake and then sends nothing, pongs included."""
    reader, writer = await asyncio.open_connection("127.0.0.1", h.port)
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write(
        f"GET /ws HTTP/1.1\r\nHost: 127.0.0.1:{h.port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert head.startswith(b"HTTP/1.1 101 ")
    try:
        yield reader
    finally:
        writer.close()


async def next_frame(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    header = await reader.readexactly(2)
    size = header[1] & 0x7F
    assert size < 126, "a control frame or a short reply"
    return header[0] & 0x0F, await reader.readexactly(size)


def protocols(h: Served) -> list[HubWebSocketProtocol]:
    assert h.server is not None
    return [p for p in h.server.server_state.connections if isinstance(p, HubWebSocketProtocol)]


async def test_one_timer_pings_every_connection_and_stops_with_the_last() -> None:
    options = {"ws": HubWebSocketProtocol, "ws_ping_interval": 0.1, "ws_ping_timeout": 1.0}
    async with served(options=options) as h:
        loop = asyncio.get_running_loop()
        async with connect(h.ws_url, proxy=None) as a, connect(h.ws_url, proxy=None) as b:
            [keepalive] = [k for key, k in wskeepalive._KEEPALIVES.items() if key[0] is loop]
            assert set(keepalive.members) == set(protocols(h)) and len(keepalive.members) == 2
            # Each pings and hears its pong (websockets answers on its own), more than once.
            await eventually(lambda: all(p.last_ping_rtt > 0 for p in protocols(h)), 10)
            await asyncio.sleep(0.5)
            assert a.state.name == b.state.name == "OPEN"
        await eventually(lambda: not keepalive.members, 10)
        assert keepalive.timer is None
        assert not any(key[0] is loop for key in wskeepalive._KEEPALIVES)


async def test_a_peer_that_answers_no_ping_is_dropped_after_the_timeout() -> None:
    interval, timeout = 0.2, 0.6
    options = {"ws": HubWebSocketProtocol, "ws_ping_interval": interval, "ws_ping_timeout": timeout}
    async with served(options=options) as h, silent(h) as reader:
        opened = time.monotonic()
        opcode, payload = await asyncio.wait_for(next_frame(reader), 10)
        assert opcode == Opcode.PING.value and len(payload) == 4
        pinged = time.monotonic()
        opcode, payload = await asyncio.wait_for(next_frame(reader), 10)
        assert opcode == Opcode.CLOSE.value
        code, reason = struct.unpack("!H", payload[:2])[0], payload[2:].decode()
        assert (code, reason) == (1011, "keepalive ping timeout")
        # Never early: the ping waited its whole timeout (the tick may add to it).
        assert pinged - opened >= interval * 0.9
        assert time.monotonic() - pinged >= timeout * 0.9


async def test_with_no_timeout_the_pings_go_on_unanswered() -> None:
    options = {"ws": HubWebSocketProtocol, "ws_ping_interval": 0.1, "ws_ping_timeout": None}
    async with served(options=options) as h, silent(h) as reader:
        payloads = set()
        for _ in range(3):
            opcode, payload = await asyncio.wait_for(next_frame(reader), 10)
            assert opcode == Opcode.PING.value
            payloads.add(payload)
        assert len(payloads) == 3  # three pings, each named anew
        assert len(protocols(h)) == 1  # and the peer is still served
