"""The doorbells: the in-process bus, and the cross-node buses against the real Postgres
and Redis of this machine (killing their connections to prove that nothing is missed)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
import redis.asyncio as aioredis

from hub.bus import MemoryBus, PgListenBus, RedisBus, RemoteBus, doorbell
from hub.bus.remote import stop
from tests.support.hubtest import eventually
from tests.support.services import postgres_dsn, redis_url


# -- the payload ----------------------------------------------------------------------------
def test_payload_round_trips() -> None:
    assert doorbell.decode(doorbell.encode("s:chat 1", 42)) == ("s:chat 1", 42)


def test_a_stream_too_long_for_notify_travels_as_its_hash() -> None:
    stream = "s:" + "é" * 5000
    payload = doorbell.encode(stream, 7)
    assert len(payload.encode()) < 8000
    assert doorbell.decode(payload) == (doorbell.stream_hash(stream), 7)


@pytest.mark.parametrize("payload", ["", "12", "x y", " s:a"])
def test_a_foreign_payload_is_refused(payload: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - int() and decode() word it differently
        doorbell.decode(payload)


# -- the memory bus -------------------------------------------------------------------------
async def test_wait_returns_at_once_for_a_seq_already_published() -> None:
    bus = MemoryBus()
    bus.follow("s:a")
    bus.publish("s:a", 3)
    assert await bus.wait("s:a", 2) == 3


def test_only_followed_streams_are_remembered() -> None:
    bus = MemoryBus()
    for i in range(1000):
        bus.publish(f"s:{i}", 1)  # writes to sessions nobody here reads
    assert bus._last == {}
    bus.follow("s:a")
    bus.follow("s:a")
    bus.publish("s:a", 2)
    bus.unfollow("s:a")
    assert bus.last_seq("s:a") == 2  # one follower left
    bus.unfollow("s:a")
    assert bus.last_seq("s:a") == 0 and bus._last == {} and bus.waiting() == []


async def test_a_cancelled_waiter_leaves_nothing_behind() -> None:
    bus = MemoryBus()
    waiters = [asyncio.create_task(bus.wait("s:a", 0)) for _ in range(3)]
    await eventually(lambda: bus.waiting() == ["s:a"])
    bus.publish("s:a", 1)  # remembered while somebody waits
    waiters.append(asyncio.create_task(bus.wait("s:a", 1)))
    await eventually(lambda: all(t.done() for t in waiters[:3]) and bus.waiting() == ["s:a"])
    for task in waiters:
        task.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)
    assert bus.waiting() == [] and bus._waiters == {} and bus._last == {}


async def test_stop_outlasts_a_swallowed_cancellation() -> None:
    """What redis-py's get_message does on Python 3.11 when a cancel meets its timeout."""
    swallowed = 0
    running = asyncio.Event()

    async def stubborn() -> None:
        nonlocal swallowed
        running.set()
        while swallowed < 2:
            try:
                await asyncio.sleep(10)  # the blocking read that the cancellation meets
            except asyncio.CancelledError:
                swallowed += 1

    task = asyncio.create_task(stubborn())
    await running.wait()
    await asyncio.wait_for(stop(task), 5)
    assert task.done() and swallowed == 2


async def test_wait_times_out_with_the_known_seq() -> None:
    bus = MemoryBus()
    assert await bus.wait("s:a", 0, timeout=0.01) == 0


async def test_wake_all_wakes_waiters_without_a_newer_seq() -> None:
    bus = MemoryBus()
    waiters = [asyncio.create_task(bus.wait(s, 0)) for s in ("s:a", "s:b")]
    await eventually(lambda: len(bus.waiting()) == 2)
    assert sorted(bus.waiting()) == ["s:a", "s:b"]
    bus.wake_all()
    assert await asyncio.gather(*waiters) == [0, 0]


async def test_a_stale_generation_returns_at_once() -> None:
    bus = RedisBus("redis://127.0.0.1:1")  # never started: only the local half is used
    bus.generation = 2
    assert await asyncio.wait_for(bus.wait("s:a", 0, since=1), 1.0) == 0


async def test_a_disconnected_remote_bus_polls() -> None:
    bus = RedisBus("redis://127.0.0.1:1", poll_interval=0.05)
    assert not bus.connected
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await bus.wait("s:a", 0) == 0
    assert loop.time() - started < 1.0


# -- Postgres LISTEN/NOTIFY -----------------------------------------------------------------
@pytest.fixture
def channel() -> str:
    return "sessionhub_test_" + uuid.uuid4().hex[:12]


@pytest.fixture
async def pg() -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(postgres_dsn())
    try:
        yield conn
    finally:
        await conn.close()


@pytest.fixture
async def pg_bus(channel: str) -> AsyncIterator[PgListenBus]:
    bus = PgListenBus(postgres_dsn(), channel=channel, ping_interval=0.2, poll_interval=0.05)
    await bus.start()
    try:
        yield bus
    finally:
        await bus.close()


async def notify(conn: asyncpg.Connection, channel: str, payload: str) -> None:
    await conn.execute("SELECT pg_notify($1, $2)", channel, payload)


async def test_pg_notify_rings_waiters(pg: asyncpg.Connection, pg_bus: PgListenBus, channel: str) -> None:
    pg_bus.follow("s:a")
    waiter = asyncio.create_task(pg_bus.wait("s:a", 0))
    await notify(pg, channel, doorbell.encode("s:a", 5))
    assert await asyncio.wait_for(waiter, 5) == 5
    assert pg_bus.last_seq("s:a") == 5


async def test_pg_notify_in_a_rolled_back_transaction_rings_nobody(
    pg: asyncpg.Connection, pg_bus: PgListenBus, channel: str
) -> None:
    pg_bus.follow("s:a")
    pg_bus.follow("s:b")
    tx = pg.transaction()
    await tx.start()
    await notify(pg, channel, doorbell.encode("s:a", 5))
    await tx.rollback()
    await notify(pg, channel, doorbell.encode("s:b", 1))
    await eventually(lambda: pg_bus.last_seq("s:b") == 1)
    assert pg_bus.last_seq("s:a") == 0


async def test_pg_hashed_stream_rings_its_waiter(
    pg: asyncpg.Connection, pg_bus: PgListenBus, channel: str
) -> None:
    stream = "s:" + "x" * 9000
    waiter = asyncio.create_task(pg_bus.wait(stream, 0))
    await eventually(lambda: stream in pg_bus.waiting())
    await notify(pg, channel, doorbell.encode(stream, 9))
    assert await asyncio.wait_for(waiter, 5) == 9


async def test_pg_foreign_payload_is_ignored(
    pg: asyncpg.Connection, pg_bus: PgListenBus, channel: str, caplog: pytest.LogCaptureFixture
) -> None:
    pg_bus.follow("s:a")
    await notify(pg, channel, "hello")
    await notify(pg, channel, doorbell.encode("s:a", 1))
    await eventually(lambda: pg_bus.last_seq("s:a") == 1)
    assert "foreign payload" in caplog.text


async def test_pg_listener_killed_reconnects_and_wakes_everyone(
    pg: asyncpg.Connection, pg_bus: PgListenBus, channel: str
) -> None:
    pg_bus.follow("s:a")
    waiter = asyncio.create_task(pg_bus.wait("s:a", 0, since=pg_bus.generation))
    await eventually(lambda: "s:a" in pg_bus.waiting())
    pid = pg_bus.backend_pid
    assert await pg.fetchval("SELECT pg_terminate_backend($1)", pid)
    # Woken without a doorbell: the follower re-reads the log for what it may have missed.
    assert await asyncio.wait_for(waiter, 5) == 0
    await eventually(lambda: pg_bus.connected and pg_bus.reconnects == 1)
    assert pg_bus.generation == 1
    assert pg_bus.backend_pid != pid
    await notify(pg, channel, doorbell.encode("s:a", 2))
    await eventually(lambda: pg_bus.last_seq("s:a") == 2)


async def test_pg_bus_refuses_to_start_without_a_server() -> None:
    bus = PgListenBus("postgresql://postgres@127.0.0.1:1/postgres")
    with pytest.raises(OSError, match=r"Connect call failed|refused"):
        await bus.start()


# -- Redis pub/sub --------------------------------------------------------------------------
@pytest.fixture
async def raw_redis() -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url())
    try:
        yield client
    finally:
        await client.aclose()


async def redis_bus(channel: str) -> RedisBus:
    bus = RedisBus(redis_url(), channel=channel, poll_interval=0.05, health_interval=0.2)
    await bus.start()
    return bus


@pytest.fixture
async def redis_pair(channel: str) -> AsyncIterator[tuple[RedisBus, RedisBus]]:
    a, b = await redis_bus(channel), await redis_bus(channel)
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()


async def collect(client: aioredis.Redis, channel: str, into: list[str]) -> Any:
    pubsub = client.pubsub()
    await pubsub.subscribe(channel)

    async def confirmed() -> bool:  # Redis answers SUBSCRIBE once the channel reaches us
        message = await pubsub.get_message(timeout=0.1)
        return message is not None and message["type"] == "subscribe"

    await eventually(confirmed)

    async def run() -> None:
        async for message in pubsub.listen():
            if message["type"] == "message":
                into.append(message["data"].decode())

    task = asyncio.create_task(run())
    return pubsub, task


async def test_redis_publish_rings_the_other_node_once(
    redis_pair: tuple[RedisBus, RedisBus], raw_redis: aioredis.Redis, channel: str
) -> None:
    a, b = redis_pair
    seen: list[str] = []
    pubsub, task = await collect(raw_redis, channel, seen)
    try:
        a.follow("s:a")
        b.follow("s:a")
        waiter = asyncio.create_task(b.wait("s:a", 0))
        a.publish("s:a", 1)
        assert a.last_seq("s:a") == 1  # the local waiters do not wait for Redis
        assert await asyncio.wait_for(waiter, 5) == 1
        await eventually(lambda: seen)
        a.publish("s:a", 1)  # a doorbell already rung is not sent again
        await asyncio.sleep(0.2)  # proves a negative: no second message comes
        # Heard on B, not echoed back by B: one message on the channel.
        assert seen == [doorbell.encode("s:a", 1)]
    finally:
        task.cancel()
        await pubsub.aclose()


async def test_redis_doorbells_coalesce_per_stream(
    redis_pair: tuple[RedisBus, RedisBus], raw_redis: aioredis.Redis, channel: str
) -> None:
    a, b = redis_pair
    b.follow("s:a")
    for seq in range(1, 101):
        a.publish("s:a", seq)
    await eventually(lambda: b.last_seq("s:a") == 100)


async def test_redis_listener_killed_reconnects(
    redis_pair: tuple[RedisBus, RedisBus], raw_redis: aioredis.Redis, channel: str
) -> None:
    a, b = redis_pair
    b.follow("s:a")
    waiter = asyncio.create_task(b.wait("s:a", 0, since=b.generation))
    await eventually(lambda: "s:a" in b.waiting())
    killed = await raw_redis.client_kill_filter(_type="pubsub")
    assert int(killed) >= 2  # both nodes' listeners
    assert await asyncio.wait_for(waiter, 5) == 0
    await eventually(lambda: a.reconnects >= 1 and b.reconnects >= 1 and a.connected and b.connected)
    assert b.generation >= 1
    a.publish("s:a", 3)
    await eventually(lambda: b.last_seq("s:a") == 3)


async def test_redis_doorbell_survives_a_killed_sender(
    redis_pair: tuple[RedisBus, RedisBus], raw_redis: aioredis.Redis
) -> None:
    a, b = redis_pair
    b.follow("s:a")
    a.publish("s:a", 1)
    await eventually(lambda: b.last_seq("s:a") == 1)
    # Kill every plain connection but ours: the senders' pooled connections die.
    mine = str(await raw_redis.client_id())
    for client in await raw_redis.client_list(_type="normal"):
        if str(client["id"]) != mine:
            await raw_redis.client_kill_filter(_id=client["id"])
    a.publish("s:a", 2)
    await eventually(lambda: b.last_seq("s:a") == 2)


# -- relaying (what has no log: streamed deltas) ------------------------------------------
async def relay_pair(kind: str, channel: str) -> tuple[RemoteBus, RemoteBus]:
    buses: list[RemoteBus] = []
    for _ in range(2):
        bus: RemoteBus = (
            PgListenBus(postgres_dsn(), channel=channel, ping_interval=0.2)
            if kind == "postgres"
            else RedisBus(redis_url(), channel=channel, health_interval=0.2)
        )
        await bus.start()
        buses.append(bus)
    return buses[0], buses[1]


@pytest.mark.parametrize("kind", ["postgres", "redis"])
async def test_relay_reaches_the_other_node_in_order_and_not_its_sender(kind: str, channel: str) -> None:
    a, b = await relay_pair(kind, channel)
    try:
        got_a: list[str] = []
        got_b: list[tuple[str, str]] = []
        a.on_relay = lambda node, data: got_a.append(data)
        b.on_relay = lambda node, data: got_b.append((node, data))
        big = "é🙂x" * 5000  # 40 KB of mixed-width UTF-8: several NOTIFY pieces
        sent = [f"frame {i}" for i in range(200)] + [big, "after"]
        for data in sent:
            a.relay(data)
        await eventually(lambda: len(got_b) == len(sent))
        assert got_b == [(a.node_id, data) for data in sent]
        await asyncio.sleep(0.1)  # proves a negative: nothing comes back to the sender
        assert got_a == []
        assert a.relay_dropped == 0
    finally:
        await a.close()
        await b.close()


def test_relay_pieces_reassemble_and_a_missing_piece_drops_the_message() -> None:
    sender = PgListenBus("postgresql://unused")
    receiver = PgListenBus("postgresql://unused")
    got: list[str] = []
    receiver.on_relay = lambda node, data: got.append(data)
    data = "ü" * 10_000
    pieces = sender._pieces(data)
    assert len(pieces) > 1
    assert all(len(p.encode()) < 8000 for p in pieces)
    for piece in pieces:
        receiver.relayed(piece)
    assert got == [data]
    broken = sender._pieces(data)
    for piece in broken[:1] + broken[2:]:
        receiver.relayed(piece)
    receiver.relayed(sender._pieces("next")[0])
    assert got == [data, "next"]


def test_relay_backlog_is_bounded() -> None:
    bus = RedisBus("redis://127.0.0.1:1")
    bus.relay_backlog = 3
    for i in range(5):
        bus.relay(str(i))
    assert list(bus._relay_out) == ["2", "3", "4"]
    assert bus.relay_dropped == 2
