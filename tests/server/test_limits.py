"""Memory and fairness limits, in bytes (docs/security.md, "Limits").

Every test runs a real uvicorn with real ``websockets`` peers. A peer that "never reads"
is a raw client with a small socket receive buffer (so that the kernel does not absorb
megabytes on its behalf) and a one-message library queue: what the hub sends it piles up
in the hub, which is what the limits bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import socket
import sqlite3
import statistics
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from hub.server import Connection, Hub, HubConfig
from tests.support.hubtest import Served, eventually, seqs, served, text

KiB = 1 << 10
MiB = 1 << 20


def payload(size: int, seed: int = 0) -> str:
    """``size`` characters of incompressible text."""
    return random.Random(seed).randbytes(size // 2).hex()


@contextlib.asynccontextmanager
async def stalled(h: Served) -> AsyncIterator[ClientConnection]:
    """A peer that reads nothing until the test reads from it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * KiB)  # no autotuning to 32 MiB
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", h.port))
    ws = await connect(
        h.ws_url, sock=sock, proxy=None, compression=None, max_queue=1, max_size=None, close_timeout=1
    )
    try:
        yield ws
    finally:
        with contextlib.suppress(Exception):
            ws.transport.abort()


async def request(ws: ClientConnection, frame: dict[str, Any]) -> dict[str, Any]:
    await ws.send(json.dumps(frame))
    while True:
        answer: dict[str, Any] = json.loads(await ws.recv())
        if answer.get("id") == frame["id"]:
            return answer


def newest(hub: Hub, before: set[Connection]) -> Connection:
    [connection] = set(hub.connections) - before
    return connection


def sample(hub: Hub, name: str) -> float:
    value = hub.metrics.registry.get_sample_value(name)
    assert value is not None, f"{name} is not exported"
    return value


async def ping_times(h: Served, stop: asyncio.Event) -> list[float]:
    """Round trips of another client's pings while ``stop`` is not set."""
    times: list[float] = []
    async with h.client() as other:
        while not stop.is_set():
            started = time.perf_counter()
            assert await other.call("ping") == "pong"
            times.append(time.perf_counter() - started)
            await asyncio.sleep(0.02)
    return times


async def read_until_closed(ws: ClientConnection, timeout: float = 10) -> tuple[int, int | None, str]:
    """Read everything the hub sent, then its close: (frames read, close code, reason).
    A TCP connection that dies without a close frame reads as 1006."""
    frames = 0
    async with asyncio.timeout(timeout):
        try:
            async for _ in ws:
                frames += 1
        except ConnectionClosed:
            pass
    rcvd = ws.protocol.close_rcvd
    return frames, (rcvd.code if rcvd is not None else 1006), (rcvd.reason if rcvd is not None else "")


# -- item 5: bytes, not frames ------------------------------------------------------------


async def test_a_peer_that_never_reads_is_held_to_its_outbox_bytes_then_evicted(tmp_path: Path) -> None:
    config = HubConfig(outbox_bytes=2 * MiB, send_timeout=1.0, replay_bytes=1 * MiB)
    body = payload(256 * KiB)
    async with served(db=tmp_path / "hub.db", config=config) as h:
        manager = h.hub.manager
        sids = [(await manager.create(f"s{i}")).id for i in range(4)]
        before = set(h.hub.connections)
        async with stalled(h) as slow:
            for i, sid in enumerate(sids):
                reply = await request(slow, {"op": "subscribe", "id": i, "session_id": sid, "after_seq": 0})
                assert reply["frame"] == "reply", reply
            conn = newest(h.hub, before)
            stop = asyncio.Event()
            pinger = asyncio.create_task(ping_times(h, stop))
            peak_outbox = peak_unsent = peak_hub = 0
            rounds = 0
            async with asyncio.timeout(30):
                while not conn.closed:
                    for sid in sids:
                        await manager.append(sid, text(f"m{rounds}", body))
                        peak_outbox = max(peak_outbox, conn.queue.bytes)
                        peak_unsent = max(peak_unsent, conn.unsent)
                        peak_hub = max(peak_hub, int(sample(h.hub, "sessionhub_outbox_bytes")))
                    rounds += 1
                    await asyncio.sleep(0.01)
            stop.set()
            times = await pinger
            # Bounded in bytes, not in frames (1,024 frames of 256 KiB would be 256 MiB).
            assert peak_outbox <= config.outbox_bytes
            assert peak_hub <= config.outbox_bytes
            # Outbox, plus one event waiting per subscription, plus a replay batch.
            assert peak_unsent <= config.outbox_bytes + 4 * 260 * KiB + config.replay_bytes
            assert rounds > 10, "evicted before its buffers could even fill"
            # The other client never waited on the slow one: a ping queued behind it would
            # take the slow peer's send_timeout (1 s). Not a speed bound (pings take ~1 ms,
            # ~0.3 s at worst on a loaded 2-core machine), the line between the two cases.
            assert max(times) < config.send_timeout, times
            # Once evicted, nothing is held for it any more.
            await eventually(lambda: conn not in h.hub.connections, 5)
            assert conn.unsent == 0
            assert sample(h.hub, "sessionhub_outbox_bytes") == 0
            assert sample(h.hub, "sessionhub_replay_bytes") == 0
            assert sample(h.hub, "sessionhub_waiting_bytes") == 0
            assert sample(h.hub, "sessionhub_evictions_total") == 1


async def test_the_tail_cache_is_bounded_in_bytes_and_readers_behind_it_use_the_log(tmp_path: Path) -> None:
    config = HubConfig(tail_bytes=1 * MiB, tail_events=1024)
    body = payload(200 * KiB, seed=1)
    async with served(db=tmp_path / "hub.db", config=config) as h, h.client(max_size=None) as live:
        manager = h.hub.manager
        sid = (await manager.create("big")).id
        assert (await live.subscribe(sid))["frame"] == "reply"
        peak = 0
        for i in range(30):
            await manager.append(sid, text(f"m{i}", body))
            await live.events(sid, 1)  # the tail has read it
            peak = max(peak, int(sample(h.hub, "sessionhub_tail_bytes")))
        [tail] = h.hub.tails._tails.values()
        assert tail.bytes <= config.tail_bytes
        assert peak <= config.tail_bytes
        assert 0 < len(tail.entries) < 30
        assert sample(h.hub, "sessionhub_tail_evictions_total") > 0
        # A subscriber from the start reads what the cache dropped from the log, in order.
        async with h.client(max_size=None) as late:
            assert (await late.subscribe(sid, after_seq=0))["frame"] == "reply"
            final = tail.last_seq
            assert seqs(await late.until_seq(sid, final)) == list(range(1, final + 1))
    assert sample(h.hub, "sessionhub_tail_bytes") == 0  # every tail gone with its subscribers


async def test_all_tails_together_stay_within_tail_bytes_total(tmp_path: Path) -> None:
    config = HubConfig(tail_bytes=1 * MiB, tail_bytes_total=1536 * KiB)
    body = payload(100 * KiB, seed=2)
    async with served(db=tmp_path / "hub.db", config=config) as h, h.client(max_size=None) as live:
        manager = h.hub.manager
        sids = [(await manager.create(f"s{i}")).id for i in range(3)]
        for sid in sids:
            assert (await live.subscribe(sid))["frame"] == "reply"
        peak = 0
        for i in range(15):
            for sid in sids:
                await manager.append(sid, text(f"m{i}", body))
                await live.events(sid, 1)
                peak = max(peak, int(sample(h.hub, "sessionhub_tail_bytes")))
        assert peak <= config.tail_bytes_total
        tails = list(h.hub.tails._tails.values())
        assert sum(t.bytes for t in tails) == h.hub.held.tail
        assert all(t.entries for t in tails)  # shrinking halves the largest, it empties none


async def test_the_hub_wide_limit_evicts_the_connection_holding_the_most(tmp_path: Path) -> None:
    # Each connection may hold 2 MiB, the hub 2.25 MiB: the first connection to fill its
    # outbox takes the hub over; it is the heaviest and goes, the other stays.
    config = HubConfig(outbox_bytes=2 * MiB, outbox_bytes_total=2304 * KiB, send_timeout=30)
    body = payload(256 * KiB, seed=3)
    async with served(db=tmp_path / "hub.db", config=config) as h:
        manager = h.hub.manager
        one, two = [(await manager.create(f"s{i}")).id for i in range(2)]
        async with contextlib.AsyncExitStack() as stack:
            before = set(h.hub.connections)
            heavy = await stack.enter_async_context(stalled(h))
            await request(heavy, {"op": "ping", "id": "hello"})
            heavy_conn = newest(h.hub, before)
            light = await stack.enter_async_context(stalled(h))
            await request(light, {"op": "ping", "id": "hello"})
            light_conn = newest(h.hub, before | {heavy_conn})
            for i, sid in enumerate((one, two)):
                await request(heavy, {"op": "subscribe", "id": i, "session_id": sid, "after_seq": 0})
            await request(light, {"op": "subscribe", "id": 9, "session_id": one, "after_seq": 0})
            async with asyncio.timeout(20):
                i = 0
                while not heavy_conn.closed:
                    await manager.append(one, text(f"a{i}", body))
                    await manager.append(two, text(f"b{i}", body))
                    i += 1
                    await asyncio.sleep(0.005)
            assert not light_conn.closed
            assert sample(h.hub, "sessionhub_evictions_total") == 1
            _, code, reason = await read_until_closed(heavy)
            assert code == 4008
            assert "the hub holds over" in reason, reason
            assert light_conn in h.hub.connections


# -- item 6: requests in flight -----------------------------------------------------------


async def test_a_ping_flood_is_read_only_as_fast_as_it_is_answered(tmp_path: Path) -> None:
    config = HubConfig(max_in_flight=8, outbox_bytes=1 * MiB, send_timeout=2.0)
    pad = "p" * (64 * KiB)  # a ping's id comes back in its reply: 64 KiB replies
    total = 10_000
    async with served(db=tmp_path / "hub.db", config=config) as h:
        before = set(h.hub.connections)
        async with stalled(h) as flood:
            await request(flood, {"op": "ping", "id": 0})
            conn = newest(h.hub, before)
            sent = 0

            async def send_all() -> None:
                nonlocal sent
                with contextlib.suppress(ConnectionClosed):
                    for i in range(1, total + 1):
                        await flood.send(json.dumps({"op": "ping", "id": f"{i}-{pad}"}))
                        sent = i

            sender = asyncio.create_task(send_all())
            stop = asyncio.Event()
            pinger = asyncio.create_task(ping_times(h, stop))
            peak_in_flight = peak_unsent = 0
            async with asyncio.timeout(30):
                while not conn.closed:
                    peak_in_flight = max(peak_in_flight, len(conn.requests))
                    peak_unsent = max(peak_unsent, conn.unsent)
                    await asyncio.sleep(0.002)
            stop.set()
            times = await pinger
            sent_at_eviction = sent
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender
            # The hub stopped reading: the flood backed up into the client's own socket.
            assert sample(h.hub, "sessionhub_reads_paused_total") >= 1
            assert sent_at_eviction < total // 4, sent_at_eviction
            assert peak_in_flight <= config.max_in_flight
            # The outbox, plus at most max_in_flight replies waiting for room.
            assert peak_unsent <= config.outbox_bytes + config.max_in_flight * 65 * KiB
            # Before the in-flight bound another client's ping took 2.2 s (p50) during a flood;
            # now ~1 ms (~0.1 s on a loaded machine). The bound sits between the two.
            assert statistics.median(times) < 0.5, times
            # Evicted once for its unread replies, though several were waiting.
            assert sample(h.hub, "sessionhub_evictions_total") == 1
            _, code, _reason = await read_until_closed(flood)
            assert code == 4008


async def test_large_appends_are_read_no_faster_than_they_run(tmp_path: Path) -> None:
    """The reported case: appends of 900 KiB sent without waiting for replies. Each request
    in flight holds its frame: read as fast as they came, 1,900 of them reached 1 GiB.
    Here another process holds the database's write lock, so no append can finish: the
    hub reads max_in_flight of them, then leaves the rest in the peer's socket."""
    config = HubConfig(max_in_flight=4)
    body = payload(900 * KiB, seed=4)
    total = 80  # 72 MB: more than the kernel's socket buffers take
    db = tmp_path / "hub.db"
    async with served(db=db, config=config) as h:
        sid = (await h.hub.manager.create("big")).id
        before = set(h.hub.connections)
        async with h.client(max_size=None) as writer:
            await writer.call("ping")
            conn = newest(h.hub, before)
            lock = sqlite3.connect(db, isolation_level=None)
            lock.execute("BEGIN IMMEDIATE")
            try:
                frame = {"op": "append", "session_id": sid, "message": text("m", body)}

                async def send_all() -> None:
                    for i in range(total):
                        await writer.send_raw(json.dumps({**frame, "id": i, "message": text(f"m{i}", body)}))

                sender = asyncio.create_task(send_all())
                await eventually(lambda: sample(h.hub, "sessionhub_reads_paused_total") >= 1, 10)
                await asyncio.sleep(0.3)  # time for the hub to read more, if it would
                assert len(conn.requests) == config.max_in_flight
                assert not sender.done(), "the hub read every append while none could run"
            finally:
                lock.rollback()
                lock.close()
            await sender
            for rid in range(total):
                reply = await writer.answer(rid, timeout=30)
                assert reply["frame"] == "reply", reply
            assert await h.hub.manager.get_message_count(sid) == total


# -- item 7: the close code gets through ------------------------------------------------------


async def test_an_evicted_peer_that_reads_later_sees_4008(tmp_path: Path) -> None:
    # It starts reading 3 s after its eviction, within close_grace: behind what the
    # transport already held, the next frame is the close frame, not its backlog.
    config = HubConfig(outbox_bytes=1 * MiB, send_timeout=0.5, close_grace=6.0)
    body = payload(128 * KiB, seed=5)
    async with served(db=tmp_path / "hub.db", config=config) as h:
        sid = (await h.hub.manager.create("s")).id
        before = set(h.hub.connections)
        async with stalled(h) as slow:
            await request(slow, {"op": "subscribe", "id": 1, "session_id": sid, "after_seq": 0})
            conn = newest(h.hub, before)
            async with asyncio.timeout(20):
                i = 0
                while not conn.closed:
                    await h.hub.manager.append(sid, text(f"m{i}", body))
                    i += 1
                    await asyncio.sleep(0.005)
            appended = i
            await asyncio.sleep(3.0)
            frames, code, reason = await read_until_closed(slow)
            assert code == 4008, (code, reason, frames)
            assert "slow consumer" in reason
            # It did not get the backlog its outbox held: that went at the eviction.
            assert frames < appended
            assert sample(h.hub, "sessionhub_evictions_total") == 1


async def test_a_peer_that_never_reads_its_close_frame_is_cut_off(tmp_path: Path) -> None:
    config = HubConfig(outbox_bytes=1 * MiB, send_timeout=0.5, close_grace=0.5)
    body = payload(128 * KiB, seed=6)
    async with served(db=tmp_path / "hub.db", config=config) as h:
        sid = (await h.hub.manager.create("s")).id
        before = set(h.hub.connections)
        async with stalled(h) as slow:
            await request(slow, {"op": "subscribe", "id": 1, "session_id": sid, "after_seq": 0})
            conn = newest(h.hub, before)
            async with asyncio.timeout(20):
                i = 0
                while not conn.closed:
                    await h.hub.manager.append(sid, text(f"m{i}", body))
                    i += 1
                    await asyncio.sleep(0.005)
            evicted = time.perf_counter()
            # Its socket is aborted after the grace: uvicorn lets go of it and its buffer
            # (a graceful close would wait for a peer that never reads, for ever).
            assert h.server is not None
            sockets = h.server.server_state.connections
            await eventually(lambda: not sockets, config.close_grace + 3)
            assert time.perf_counter() - evicted < config.close_grace + 2
            assert conn not in h.hub.connections
            # Whatever reached its kernel buffer before the abort, then the end.
            _, code, _reason = await read_until_closed(slow)
            assert code in (4008, 1006)
            assert sample(h.hub, "sessionhub_evictions_total") == 1
