"""What a subscribe costs the store (hub/server/subscriptions.py, hub/server/tails.py): at
most one read of the stream's position, none at the live head while the tail vouches for
it, the session's row only for an empty stream, and the backlog read from the log once for
many subscribers from the same position. Counted on a real SQLite store whose reads are
wrapped, over a real socket; then the conditions under which the tail must not vouch (a
failed read, a bus that reconnected), and resuming exactly across a real bus reconnection
(Postgres with the Redis and the LISTEN/NOTIFY bus)."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import redis.asyncio as aioredis

from hub import SessionManager, SqliteStore, session_stream
from hub.apps.backends import open_backend
from hub.bus import MemoryBus
from hub.server.tails import Tail
from protocol import StoreUnavailable
from tests.support.hubtest import Client, eventually, is_event, seqs, served, text
from tests.support.nodes import scratch_database
from tests.support.services import postgres_dsn, redis_url

#: The Redis database this file's buses select: their listeners are told apart from other
#: tests' (which may share the server) by it, so only ours are killed.
REDIS_DB = 11

#: The store's reads a subscribe may make, awaited or answered at once.
READS = ("stream_position", "stream_position_nowait", "get_session", "read_events", "read_events_nowait")


class Counted:
    """A real store's reads, wrapped to count each call by name (the store still answers)."""

    def __init__(self, store: SqliteStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: collections.Counter[str] = collections.Counter()
        self.failing = False
        for name in READS:
            monkeypatch.setattr(store, name, self._wrap(name, getattr(store, name)))

    def _wrap(self, name: str, read: Any) -> Any:
        if name.endswith("_nowait"):

            def now(*args: Any) -> Any:
                self.calls[name] += 1
                if self.failing:
                    raise StoreUnavailable("the database is out of reach (test)")
                return read(*args)

            return now

        async def awaited(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            if self.failing:
                raise StoreUnavailable("the database is out of reach (test)")
            return await read(*args, **kwargs)

        return awaited

    def take(self) -> dict[str, int]:
        """The counts since the last take (only the reads that happened)."""
        counts = {name: n for name, n in self.calls.items() if n}
        self.calls.clear()
        return counts


@pytest.fixture
async def sqlite(db_path: Path) -> AsyncIterator[SqliteStore]:
    store = await SqliteStore.open(db_path)
    try:
        yield store
    finally:
        await store.close()


async def a_session(store: SqliteStore, appends: int) -> tuple[str, str, int]:
    manager = SessionManager(store)
    sid = (await manager.create("counted")).id
    for i in range(appends):
        await manager.append(sid, text(f"m{i}", f"message {i}"))
    position = await store.stream_position(session_stream(sid))
    return sid, position.epoch, position.last_seq


async def live(c: Client, sid: str, after: int, last: int, epoch: str | None = None) -> None:
    """Subscribe and take the backlog up to ``last``."""
    reply = await c.subscribe(sid, after_seq=after, epoch=epoch)
    assert reply["frame"] == "reply", reply
    assert reply["result"]["last_seq"] == last
    assert seqs(await c.events(sid, last - after)) == list(range(after + 1, last + 1))


async def test_a_subscriber_at_the_live_head_reads_nothing(
    sqlite: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    sid, epoch, last = await a_session(sqlite, 3)
    counted = Counted(sqlite, monkeypatch)
    async with served(store=sqlite) as h, h.client() as first, h.client() as second:
        await live(first, sid, 0, last)  # the stream's tail runs from here on
        await eventually(lambda: h.hub.tails._tails[session_stream(sid)].head(last) is not None)
        counted.take()
        await live(second, sid, last, last, epoch)
        assert counted.take() == {}, "a subscribe at the live head read the store"
        # And it is live: the next event reaches both, once.
        await SessionManager(sqlite).append(sid, text("n", "next"))
        for c in (first, second):
            assert seqs(await c.events(sid, 1)) == [last + 1]
            await c.quiet(is_event, 0.1)


async def test_a_subscriber_behind_the_head_reads_the_position_once_and_the_backlog_never(
    sqlite: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    sid, _, last = await a_session(sqlite, 5)
    counted = Counted(sqlite, monkeypatch)
    async with served(store=sqlite) as h, h.client() as first:
        await live(first, sid, 0, last)
        # The first subscriber read the backlog from the log; the tail kept it.
        assert counted.take().get("read_events", 0) >= 1
        for after in (0, 2):
            async with h.client() as c:
                await live(c, sid, after, last)
                # One position, answered on the event loop (no trip to the reader's thread);
                # no session row (the stream is not empty), no log read (the tail holds it).
                assert counted.take() == {"stream_position_nowait": 1}


async def test_the_session_row_is_read_only_for_an_empty_stream(
    sqlite: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    counted = Counted(sqlite, monkeypatch)
    async with served(store=sqlite) as h, h.client() as c:
        counted.take()
        missing = await c.subscribe("no-such-session")
        assert missing["frame"] == "error" and missing["code"] == "not_found", missing
        reads = counted.take()
        assert reads.get("get_session") == 1
        assert reads.get("stream_position", 0) + reads.get("stream_position_nowait", 0) == 1
        # The registry has no session row to ask for, even empty.
        reply = await c.subscribe(None)
        assert reply["frame"] == "reply" and reply["result"]["last_seq"] == 0
        assert "get_session" not in counted.take()
        # Nothing of the missing session is followed after its refusal.
        assert session_stream("no-such-session") not in h.hub.tails._tails


async def test_the_tail_vouches_only_for_a_current_view(
    sqlite: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    sid, epoch, last = await a_session(sqlite, 2)
    stream = session_stream(sid)
    counted = Counted(sqlite, monkeypatch)
    tail = Tail(sqlite, stream, size=64)
    assert tail.head(last) is None  # not started: no view at all
    await tail.start()
    try:
        position = tail.head(last)
        assert position is not None
        assert (position.epoch, position.first_seq, position.last_seq) == (epoch, 1, last)
        assert tail.head(last - 1) is None  # behind the head: the caller reads the position
        assert tail.head(last + 1) is None  # ahead of what the tail read: the caller reads

        # The bus reconnected (doorbells may have been missed): no answer until the tail
        # has read the log again, which the reconnection's wake-up makes it do.
        bus = sqlite.bus
        assert isinstance(bus, MemoryBus)
        bus.generation = 1  # what RemoteBus does when it listens again
        assert tail.head(last) is None
        bus.wake_all()
        await eventually(lambda: tail.head(last) is not None)
        assert tail.generation == 1

        # A read that failed: no answer (the log may be ahead) until one succeeds.
        counted.failing = True
        bus.wake_all()
        await eventually(lambda: not tail.ok)
        assert tail.head(last) is None
        counted.failing = False
        await SessionManager(sqlite).append(sid, text("x", "after the failure"))
        await eventually(lambda: tail.head(last + 1) is not None, timeout=5)
        assert tail.head(last) is None  # the head moved on

        # A stopped tail vouches for nothing.
        assert tail.task is not None
        tail.task.cancel()
        await asyncio.gather(tail.task, return_exceptions=True)
        assert tail.head(last) is None
    finally:
        if tail.task is not None:
            tail.task.cancel()
            await asyncio.gather(tail.task, return_exceptions=True)


def ring_of(bus: str) -> str:
    if bus == "postgres":
        return "postgres"
    base = redis_url().rstrip("/")
    root = base.rsplit("/", 1)[0] if base.count("/") > 2 else base
    return f"{root}/{REDIS_DB}"


async def kill_listeners(bus: str, dsn: str) -> int:
    """Close the listening connections of this test's buses from the server side (only
    theirs: the Redis database they select, the scratch Postgres database); how many."""
    if bus == "redis":
        client = aioredis.Redis.from_url(ring_of(bus))
        try:
            ours = [c for c in await client.client_list(_type="pubsub") if int(c["db"]) == REDIS_DB]
            for c in ours:
                await client.client_kill_filter(_id=c["id"])
            return len(ours)
        finally:
            await client.aclose()
    admin = await asyncpg.connect(dsn)
    try:
        return int(
            await admin.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = 'sessionhub-listen' AND datname = current_database()"
            )
        )
    finally:
        await admin.close()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("bus", ["postgres", "redis"])
async def test_resuming_at_the_head_across_a_bus_reconnect_is_exact(bus: str) -> None:
    """A hub node follows a session written by another node. Both nodes' bus listeners are
    killed; the other node writes while this one cannot hear, and a subscriber resumes at
    what it holds, during the outage and right after it. Every subscriber ends with every
    event once, in order: a tail that may have missed doorbells does not vouch for a head."""
    ring = ring_of(bus)
    async with (
        scratch_database(postgres_dsn(), "sessionhub_reads") as dsn,
        open_backend(dsn, ring) as served_store,
        open_backend(dsn, ring) as writer_store,
        served(store=served_store) as h,
        h.client() as steady,
    ):
        writer = SessionManager(writer_store)
        sid = (await writer.create("across")).id
        for i in range(3):
            await writer.append(sid, text(f"a{i}", "before"))
        last = (await writer_store.stream_position(session_stream(sid))).last_seq
        await live(steady, sid, 0, last)
        resumed: list[tuple[Client, int]] = []  # each client and the seq it resumed after
        resumers: list[Any] = []
        n = 0
        for phase in range(3):
            if phase == 1:
                assert await kill_listeners(bus, dsn) == 2
            for _ in range(4):
                await writer.append(sid, text(f"w{n}", "write"))
                n += 1
            # A client that holds everything up to what ``steady`` got resumes from there.
            got = [f["seq"] for f in steady.received if is_event(f)]
            holds = got[-1]
            cm = h.client()
            c = await cm.__aenter__()
            resumers.append(cm)
            resumed.append((c, holds))
            reply = await c.subscribe(sid, after_seq=holds)
            assert reply["frame"] == "reply", reply
        final = (await writer_store.stream_position(session_stream(sid))).last_seq
        assert final == last + n
        try:
            events = await steady.until_seq(sid, final, timeout=30)
            assert seqs(events) == list(range(final - len(events) + 1, final + 1))
            assert [f["seq"] for f in steady.received if is_event(f)] == list(range(1, final + 1))
            for c, holds in resumed:
                await c.until_seq(sid, final, timeout=30)
                assert [f["seq"] for f in c.received if is_event(f)] == list(range(holds + 1, final + 1))
            await steady.quiet(is_event, 0.2)
        finally:
            for cm in resumers:
                await cm.__aexit__(None, None, None)
