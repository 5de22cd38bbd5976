"""Several hub nodes on one Postgres: writers on node A, subscribers on node B, B killed
and restarted in the middle, and every subscriber still ends with every event exactly
once, in order. Run over both backplanes (LISTEN/NOTIFY and Redis).

The Redis is a ``redis-server`` of this module's own, not the machine's: losing the bus
closes every pub/sub client of the server, and on a shared one would count (and cut) those
of every other run using it."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator

import asyncpg
import httpx2
import pytest
import pytest_asyncio
import redis.asyncio as aioredis

from clients import HubClient
from hub import PostgresStore
from hub.store import session_stream
from protocol import Event
from protocol.frames import PresenceFrame
from tests.server.test_streams import Reader, text_of
from tests.support.faultkit import ScratchRedis, scratch_redis
from tests.support.hubtest import eventually
from tests.support.nodes import Node, scratch_database
from tests.support.services import postgres_dsn

SESSIONS = 3
APPENDS = 120
SUBSCRIBERS = 3


# The module's loop: the Redis server is a subprocess of the loop that started it.
pytestmark = [pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(loop_scope="module")
async def database() -> AsyncIterator[str]:
    async with scratch_database(postgres_dsn()) as dsn:
        yield dsn


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def redis_server() -> AsyncIterator[ScratchRedis]:
    async with scratch_redis() as server:
        yield server


@pytest.fixture
def ring(bus: str, redis_server: ScratchRedis) -> str:
    """The nodes' ``--bus``: Postgres NOTIFY, or the module's Redis."""
    return redis_server.url if bus == "redis" else "postgres"


async def collect(client: HubClient, session_id: str, into: list[Event], done: asyncio.Event) -> None:
    async for event in client.subscribe(session_id):
        into.append(event)
        if done.is_set():
            return


@pytest.mark.timeout(120)
@pytest.mark.parametrize("bus", ["postgres", "redis"])
async def test_subscribers_on_b_see_every_write_on_a_once_across_a_restart_of_b(
    database: str, ring: str
) -> None:
    async with Node(database, ring) as a, Node(database, ring) as b:
        writer = HubClient(a.ws_url, name="writer")
        watchers = [HubClient(b.ws_url, name=f"watcher-{i}", max_backoff=0.3) for i in range(SUBSCRIBERS)]
        async with writer:
            ids = [(await writer.sessions.create(f"chat {n}")).id for n in range(SESSIONS)]
            seen: dict[tuple[int, str], list[Event]] = {}
            done = asyncio.Event()
            tasks = []
            for w, watcher in enumerate(watchers):
                await watcher.__aenter__()
                for sid in ids:
                    seen[w, sid] = []
                    tasks.append(asyncio.create_task(collect(watcher, sid, seen[w, sid], done)))
            try:
                for n in range(APPENDS):
                    sid = ids[n % SESSIONS]
                    await writer.sessions.append(sid, {"id": f"m{n}", "role": "user", "parts": []})
                    if n == APPENDS // 3:
                        assert await b.stop(signal.SIGKILL) == -signal.SIGKILL
                    if n == APPENDS // 2:
                        await b.start()
                    await asyncio.sleep(0.005)  # pacing, not a wait: spread the writes over B's restart
                store = await PostgresStore.connect(database)
                try:
                    last = {sid: (await store.stream_position(session_stream(sid))).last_seq for sid in ids}
                finally:
                    await store.close()
                assert all(seq >= APPENDS // SESSIONS for seq in last.values())

                await eventually(
                    lambda: all(got and got[-1].seq >= last[sid] for (_, sid), got in seen.items()),
                    timeout=30,
                    interval=0.02,
                )
                for (_, sid), got in seen.items():
                    assert [e.seq for e in got] == list(range(1, last[sid] + 1)), sid
                    assert len({e.epoch for e in got}) == 1
                appended = [e.data["message"]["id"] for e in seen[0, ids[0]] if e.type == "message.appended"]
                assert appended == [f"m{n}" for n in range(0, APPENDS, SESSIONS)]
            finally:
                done.set()
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                for watcher in watchers:
                    await watcher.__aexit__(None, None, None)


async def kill_listeners(ring: str, database: str) -> int:
    """Close every node's listening connection from the server side; how many there were."""
    if ring != "postgres":
        client = aioredis.Redis.from_url(ring)
        try:
            return int(await client.client_kill_filter(_type="pubsub"))
        finally:
            await client.aclose()
    admin = await asyncpg.connect(database)
    try:
        return int(
            await admin.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = 'sessionhub-listen' AND datname = current_database()"
            )
        )
    finally:
        await admin.close()


@pytest.mark.parametrize("bus", ["postgres", "redis"])
async def test_a_node_reports_a_lost_bus_and_recovers(database: str, bus: str, ring: str) -> None:
    """Kill both nodes' listening connections: a follower on A still gets the write made on
    B meanwhile, and /healthz and /metrics count the reconnection."""
    kind = "RedisBus" if bus == "redis" else "PgListenBus"
    async with (
        Node(database, ring) as a,
        Node(database, ring) as b,
        HubClient(a.ws_url) as reader,
        HubClient(b.ws_url) as writer,
    ):
        sid = (await writer.sessions.create("chat")).id
        got: list[Event] = []
        done = asyncio.Event()
        task = asyncio.create_task(collect(reader, sid, got, done))
        await writer.sessions.append(sid, {"id": "m0", "role": "user", "parts": []})
        await eventually(lambda: any(e.type == "message.appended" for e in got))
        assert await kill_listeners(ring, database) == 2
        await writer.sessions.append(sid, {"id": "m1", "role": "user", "parts": []})
        await eventually(lambda: sum(e.type == "message.appended" for e in got) >= 2)
        async with httpx2.AsyncClient() as http:

            async def reconnected() -> httpx2.Response | None:
                health = await http.get(f"http://127.0.0.1:{a.port}/healthz")
                ok = health.status_code == 200 and health.json()["bus"]["reconnects"] == 1
                return health if ok else None

            health = await eventually(reconnected, timeout=15, interval=0.05)
            metrics = (await http.get(f"http://127.0.0.1:{a.port}/metrics")).text
        assert health.json()["bus"] == {"kind": kind, "connected": True, "reconnects": 1}
        assert "sessionhub_bus_reconnects 1.0" in metrics
        assert "sessionhub_bus_connected 1.0" in metrics
        assert [e.seq for e in got] == list(range(1, len(got) + 1))
        appended = [e.data["message"]["id"] for e in got if e.type == "message.appended"]
        assert appended == ["m0", "m1"]
        done.set()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@pytest.mark.parametrize("bus", ["postgres", "redis"])
async def test_a_stream_written_on_a_grows_on_b(database: str, ring: str) -> None:
    """Streamed deltas have no log: they cross nodes through the bus's relay. A watcher on B
    sees the message grow delta by delta; one joining on B mid-stream gets the state first."""
    watcher, late = Reader(), Reader()
    async with (
        Node(database, ring) as a,
        Node(database, ring) as b,
        HubClient(a.ws_url, name="worker", role="worker") as worker,
        HubClient(b.ws_url, on_stream=watcher) as ui,
        HubClient(b.ws_url, on_stream=late) as joiner,
    ):
        sid = (await worker.sessions.create("chat")).id
        following: list[Event] = []
        tasks = [asyncio.create_task(collect(ui, sid, following, asyncio.Event()))]
        await eventually(lambda: following)  # the backlog's first event: B follows the session
        st = await worker.session(sid).start_stream("a1")
        big = "é" * 9000  # one delta larger than a NOTIFY payload
        for i in range(60):
            await st.text(f"{i},")
        await st.text(big)
        await eventually(lambda: "a1" in watcher.live.messages and watcher.live.index.get("a1", 0) >= 61)
        assert text_of(watcher.live.messages["a1"]) == "".join(f"{i}," for i in range(60)) + big
        tasks.append(asyncio.create_task(collect(joiner, sid, [], asyncio.Event())))
        await eventually(lambda: any(f.action == "state" for f in late.frames))
        for i in range(60, 100):
            await st.text(f"{i},")
        await st.__aexit__(None, None, None)
        expected = "".join(f"{i}," for i in range(60)) + big + "".join(f"{i}," for i in range(60, 100))
        await eventually(
            lambda: watcher.live.status.get("a1") == "finished" and late.live.status.get("a1") == "finished"
        )
        for reader in (watcher, late):
            assert text_of(reader.live.messages["a1"]) == expected
        indexes = [d["index"] for f in watcher.frames if f.action == "delta" for d in f.deltas or []]
        assert indexes == list(range(1, 102))
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@pytest.mark.parametrize("bus", ["postgres", "redis"])
async def test_presence_spans_nodes_and_a_dead_node_leaves(database: str, ring: str) -> None:
    seen: list[PresenceFrame] = []
    async with (
        Node(database, ring, None, "--presence-ttl", "1.5") as a,
        Node(database, ring, None, "--presence-ttl", "1.5") as b,
        HubClient(b.ws_url, name="dash", role="observer", on_presence=seen.append) as dash,
    ):
        sid = (await dash.sessions.create("chat")).id
        watching = asyncio.create_task(collect(dash, sid, [], asyncio.Event()))

        async def names() -> set[str | None]:
            return {e.name for e in await dash.presence(sid)}

        async def listed(name: str, present: bool = True) -> bool:
            return (name in await names()) == present

        async def streaming_on_b_is(expected: list[list[str]]) -> bool:
            return [e.streaming for e in await dash.presence(sid) if e.name == "writer"] == expected

        async with HubClient(a.ws_url, name="worker", role="worker", sessions=[sid]):
            await eventually(lambda: listed("worker"), interval=0.02)
            await eventually(lambda: any(p.action == "join" and p.entry.name == "worker" for p in seen))
        # The worker closed its client on A: B's watcher is told, and B's list drops it.
        await eventually(lambda: any(p.action == "leave" and p.entry.name == "worker" for p in seen))
        assert await names() == {"dash"}

        # A writer streaming on A: B's list and B's watcher say what it streams, then not.
        async with HubClient(a.ws_url, name="writer", role="worker") as writer:
            async with writer.session(sid).stream_message("m-42") as stream:
                await stream.text("hello")
                await eventually(lambda: streaming_on_b_is([["m-42"]]), interval=0.02)
                await eventually(
                    lambda: ("writer", ["m-42"]) in [(p.entry.name, p.entry.streaming) for p in seen]
                )
            await eventually(lambda: streaming_on_b_is([]), interval=0.02)
        assert [p.entry.streaming for p in seen if p.entry.name == "writer"][-1] == []

        # A node that dies cannot say goodbye: its connections leave after --presence-ttl.
        ghost = HubClient(a.ws_url, name="ghost", sessions=[sid], reconnect=False)
        await ghost.__aenter__()
        await eventually(lambda: listed("ghost"), interval=0.02)
        await a.stop(signal.SIGKILL)
        await eventually(lambda: listed("ghost", present=False), interval=0.05)
        assert any(p.action == "leave" and p.entry.name == "ghost" for p in seen)
        with contextlib.suppress(Exception):
            await ghost.__aexit__(None, None, None)
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
