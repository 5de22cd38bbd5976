"""A live event is framed once and its bytes written to every subscriber's socket
(``Tail._push`` -> ``Connection.try_put(data, frame)`` -> ``HubWebSocketProtocol.write_frame``),
the way ``websockets.broadcast`` writes one frame to many: no outbox, coroutine or ASGI
message per subscriber while its socket has room. These pin what that must not change:
every subscriber gets every event once and in order, also when its socket fills and later
frames wait in its outbox behind the ones queued first; a peer that negotiated
permessage-deflate still gets frames through its compressor.

Real uvicorn, real hub protocol (the default), real ``websockets`` peers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect

from hub.server import tails
from hub.server.wsframes import text_frame as text_frame_of_record
from hub.server.wsprotocol import HubWebSocketProtocol
from tests.support.hubtest import Served, eventually, served, text

KiB = 1 << 10
#: These test the hub's protocol, whatever SESSIONHUB_TEST_WS serves the rest of the suite on.
HUB_PROTOCOL = {"ws": HubWebSocketProtocol}


class Counts:
    """How often each path ran, patched into the hub's modules for one test."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.framed = 0  # events framed by the tail
        self.direct = 0  # frames written straight to a socket
        self.writes = 0  # the writes that carried them (several frames in one, under load)
        self.declined = 0  # writes the protocol could not make at once
        self.log: list[str] = []  # "write N" (N frames) in order, and what the test adds
        framing, writing = text_frame_of_record, HubWebSocketProtocol.write_frame

        def text_frame(payload: bytes) -> bytes:
            self.framed += 1
            return framing(payload)

        def write_frame(protocol: HubWebSocketProtocol, frame: bytes) -> bool:
            written = writing(protocol, frame)
            if written:
                n = frames_in(frame)
                self.direct += n
                self.writes += 1
                self.log.append(f"write {n}")
            else:
                self.declined += 1
            return written

        monkeypatch.setattr(tails, "text_frame", text_frame)
        monkeypatch.setattr(HubWebSocketProtocol, "write_frame", write_frame)


def frames_in(data: bytes) -> int:
    """How many unmasked frames (a server's) ``data`` holds, walking their headers."""
    count, at = 0, 0
    while at < len(data):
        length, at = data[at + 1] & 0x7F, at + 2
        if length == 126:
            length, at = int.from_bytes(data[at : at + 2]), at + 2
        elif length == 127:
            length, at = int.from_bytes(data[at : at + 8]), at + 8
        at += length
        count += 1
    assert at == len(data), "a write ended inside a frame"
    return count


@contextlib.asynccontextmanager
async def peer(h: Served, *, rcvbuf: int | None = None, **options: Any) -> AsyncIterator[ClientConnection]:
    """A raw ``websockets`` client; ``rcvbuf``: a small receive buffer, so that a peer that
    does not read fills its socket within a few frames."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", h.port))
    options.setdefault("compression", None)
    async with connect(h.ws_url, sock=sock, proxy=None, max_size=None, **options) as ws:
        yield ws


async def subscribe(ws: ClientConnection, sid: str) -> None:
    await ws.send(json.dumps({"op": "subscribe", "id": 1, "session_id": sid, "after_seq": 0}))
    while json.loads(await ws.recv()).get("id") != 1:
        pass


async def live(h: Served, subscribers: int) -> None:
    """Until ``subscribers`` connections are live: the tail pushes to them (a subscription
    still catching up sends from its own task, not this path)."""
    await eventually(lambda: sum(1 for c in h.hub.connections if c.parked) == subscribers)


@contextlib.asynccontextmanager
async def subscribers(h: Served, name: str, count: int) -> AsyncIterator[tuple[str, list[ClientConnection]]]:
    """A new session and ``count`` raw peers subscribed to it, all live."""
    sid = (await h.hub.manager.create(name)).id
    async with contextlib.AsyncExitStack() as stack:
        peers = [await stack.enter_async_context(peer(h)) for _ in range(count)]
        for ws in peers:
            await subscribe(ws, sid)
        await live(h, count)
        yield sid, peers


async def appended(ws: ClientConnection, count: int) -> list[tuple[int, str]]:
    """The (seq, message id) of the next ``count`` messages appended, as read."""
    got: list[tuple[int, str]] = []
    async with asyncio.timeout(60):
        while len(got) < count:
            frame = json.loads(await ws.recv())
            if frame.get("frame") == "event" and frame["type"] == "message.appended":
                got.append((frame["seq"], frame["data"]["message"]["id"]))
    return got


async def test_every_subscriber_gets_one_event_framed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    counts = Counts(monkeypatch)
    async with served(options=HUB_PROTOCOL) as h:
        async with subscribers(h, "fan-out", 3) as (sid, [a, b, c]):
            counts.framed = counts.direct = 0
            for i in range(5):
                await h.hub.manager.append(sid, text(f"m{i}", f"hello {i}"))
            reads = await asyncio.gather(*(appended(ws, 5) for ws in (a, b, c)))
        ids = [f"m{i}" for i in range(5)]
        assert [[m for _, m in got] for got in reads] == [ids, ids, ids]
        # Five events, each framed once for three subscribers, each written straight (in
        # fewer writes when the tail read several at once).
        assert counts.framed == 5
        assert counts.direct == 15
        assert 3 <= counts.writes <= 15


async def test_a_subscriber_owed_several_events_gets_them_in_one_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # One commit of ten messages: the tail reads them at once, and each subscriber's socket
    # gets one write of ten frames, the bytes joined once for all of them.
    counts = Counts(monkeypatch)
    async with served(options=HUB_PROTOCOL) as h:
        async with subscribers(h, "coalesce", 4) as (sid, [a, b, c, d]):
            counts.framed = counts.direct = counts.writes = 0
            await h.hub.manager.append_all(sid, [text(f"m{i}", f"hello {i}") for i in range(10)])
            reads = await asyncio.gather(*(appended(ws, 10) for ws in (a, b, c, d)))
        ids = [f"m{i}" for i in range(10)]
        assert [[m for _, m in got] for got in reads] == [ids] * 4
        assert [s for s, _ in reads[0]] == list(range(reads[0][0][0], reads[0][0][0] + 10))
        assert counts.framed == 10
        assert (counts.writes, counts.direct) == (4, 40)


async def test_events_past_the_join_budget_go_one_write_each(monkeypatch: pytest.MonkeyPatch) -> None:
    # Ten events of 16 KiB at once: more than JOIN_BYTES together, so each goes in a write
    # of its own, checked against the transport's high-water mark (a batch of big events
    # never lands in a socket's buffer whole).
    counts = Counts(monkeypatch)
    async with served(options=HUB_PROTOCOL) as h:
        async with subscribers(h, "big", 2) as (sid, [a, b]):
            counts.framed = counts.direct = counts.writes = 0
            body = "x" * (16 * KiB)
            await h.hub.manager.append_all(sid, [text(f"m{i}", body) for i in range(10)])
            reads = await asyncio.gather(*(appended(ws, 10) for ws in (a, b)))
        ids = [f"m{i}" for i in range(10)]
        assert [[m for _, m in got] for got in reads] == [ids] * 2
        assert 10 * 16 * KiB > tails.JOIN_BYTES
        assert (counts.writes, counts.direct) == (20, 20)


async def test_a_push_lets_the_loop_run_between_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    # A slice of one subscriber: what the loop was asked to run during the first write
    # runs before the second subscriber's write, not after the whole fan-out (at 19,000
    # subscribers a push would otherwise hold the loop ~95 ms: no append, reply or ping).
    monkeypatch.setattr(tails, "PUSH_CHUNK", 1)
    monkeypatch.setattr(tails, "PUSH_SLICE", 0.0)
    counts = Counts(monkeypatch)
    recorded = HubWebSocketProtocol.write_frame

    def write_frame(protocol: HubWebSocketProtocol, frame: bytes) -> bool:
        if not counts.log:
            asyncio.get_running_loop().call_soon(counts.log.append, "loop ran")
        return recorded(protocol, frame)

    monkeypatch.setattr(HubWebSocketProtocol, "write_frame", write_frame)
    async with served(options=HUB_PROTOCOL) as h:
        async with subscribers(h, "chunks", 3) as (sid, [a, b, c]):
            counts.log.clear()
            await h.hub.manager.append(sid, text("m0", "hello"))
            reads = await asyncio.gather(*(appended(ws, 1) for ws in (a, b, c)))
        assert [[m for _, m in got] for got in reads] == [["m0"]] * 3
        assert counts.log[:3] == ["write 1", "loop ran", "write 1"]
        assert counts.log.count("write 1") == 3


async def test_frames_wait_behind_the_queued_ones_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    # A subscriber that stops reading: its transport passes its high-water mark, the
    # protocol declines the direct write, frames queue in its outbox (8 MiB here, far
    # below the 16 MiB that would evict it); it reads again and gets all, in order, once.
    counts = Counts(monkeypatch)
    count = 64
    body = random.Random(1).randbytes(64 * KiB).hex()  # 128 KiB of text a message
    async with served(options=HUB_PROTOCOL) as h:
        sid = (await h.hub.manager.create("backlog")).id
        async with peer(h) as fast, peer(h, rcvbuf=64 * KiB, max_queue=1) as slow:
            await subscribe(fast, sid)
            await subscribe(slow, sid)
            await live(h, 2)
            reading = asyncio.create_task(appended(fast, count))
            for i in range(count):
                await h.hub.manager.append(sid, text(f"m{i}", body))
            fast_got = await reading
            slow_got = await appended(slow, count)
        expected = [f"m{i}" for i in range(count)]
        assert [m for _, m in fast_got] == expected
        assert [m for _, m in slow_got] == expected
        seqs = [s for s, _ in slow_got]
        assert seqs == sorted(seqs) and len(set(seqs)) == count
        assert counts.direct > 0  # the reader's frames, and the slow one's first
        assert counts.declined > 0  # the slow one's socket filled: later frames queued


async def test_a_deflate_peer_gets_its_frames_through_its_compressor(monkeypatch: pytest.MonkeyPatch) -> None:
    counts = Counts(monkeypatch)
    async with served(options=HUB_PROTOCOL) as h:
        sid = (await h.hub.manager.create("deflate")).id
        async with peer(h, compression="deflate") as ws:
            assert ws.protocol.extensions, "permessage-deflate was not negotiated"
            await subscribe(ws, sid)
            await live(h, 1)
            counts.direct = counts.declined = 0
            for i in range(3):
                await h.hub.manager.append(sid, text(f"m{i}", "compressible " * 200))
            got = await appended(ws, 3)
        assert [m for _, m in got] == ["m0", "m1", "m2"]
        # Declined every time: once an event, and once more for any events read together.
        assert counts.direct == 0 and counts.declined >= 3


async def test_no_frame_is_written_to_a_connection_that_is_gone() -> None:
    async with served(options=HUB_PROTOCOL) as h:
        sid = (await h.hub.manager.create("gone")).id
        async with peer(h) as ws:
            await subscribe(ws, sid)
            await live(h, 1)
            assert h.server is not None
            [protocol] = [p for p in h.server.server_state.connections if isinstance(p, HubWebSocketProtocol)]
            assert protocol.write_frame(text_frame_of_record(b"{}"))  # while connected: written
            ws.transport.abort()
            await eventually(lambda: protocol.disconnected)
            assert not protocol.write_frame(text_frame_of_record(b"{}"))
