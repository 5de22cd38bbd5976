"""The fault matrix, a rolling restart: two real ``sessionhub serve`` nodes on one Postgres
database, 40 named ``HubClient``s writing and subscribed through them, and each node in turn
stopped with SIGTERM (it drains: requests refused ``unavailable``, sockets closed with 1001,
new handshakes accepted and closed with 1001 until it stops) and started again.

Twice: behind a round-robin balancer (``tests/support/faultkit.py: TcpProxy``), and with each client
given both nodes' URLs. Every client must be alive at the end, no acknowledged append lost,
and every subscriber must end with every event of its session once, in order. Issue 24
item 15: before the client guarded its handshake, a close in the middle of it (a draining
node's 1001 as the ``hello`` went out) ended the reconnect loop for good.

Run with ``-s`` for the figures (docs/operations.md, "What survives what").
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from clients import ConnectionLost, HubClient
from hub import PostgresStore
from hub.store import session_stream
from protocol import Event, SessionHubError
from tests.support.faultkit import TcpProxy
from tests.support.hubtest import eventually
from tests.support.nodes import Node, scratch_database
from tests.support.services import postgres_dsn

CLIENTS = 40
SESSIONS = 4
#: Between one client's appends: 40 clients give a few hundred appends a second.
PACE = 0.1
#: Load before the first stop and after each restart (seconds).
SETTLE = 1.0


@dataclass
class Writer:
    """One client's appends, sorted by what the hub answered."""

    index: int
    session_id: str
    acked: list[str] = field(default_factory=list)
    ack_times: list[float] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # an error frame: not applied
    unknown: list[str] = field(default_factory=list)  # the socket dropped: either way
    seen: list[Event] = field(default_factory=list)


@pytest.fixture
async def database() -> AsyncIterator[str]:
    async with scratch_database(postgres_dsn(), "sessionhub_rolling") as dsn:
        yield dsn


async def write(client: HubClient, writer: Writer, stop: asyncio.Event) -> None:
    n = 0
    while not stop.is_set():
        mid = f"c{writer.index}-{n}"
        n += 1
        try:
            await client.sessions.append(writer.session_id, {"id": mid, "role": "user", "parts": []})
        except ConnectionLost:
            writer.unknown.append(mid)
        except SessionHubError as exc:
            if getattr(exc, "code", None) != "unavailable":  # a draining hub's refusal only
                raise
            writer.refused.append(mid)
        else:
            writer.acked.append(mid)
            writer.ack_times.append(time.monotonic())
        await asyncio.sleep(PACE)


async def follow(client: HubClient, writer: Writer) -> None:
    async for event in client.subscribe(writer.session_id):
        writer.seen.append(event)


async def alive(client: HubClient) -> bool:
    try:
        await asyncio.wait_for(client.ping(), 10)
    except (SessionHubError, TimeoutError):
        return False
    return True


def recovery(writers: list[Writer], stopped_at: float) -> float:
    """The longest any client went from the SIGTERM to its next acknowledged append."""
    return max(next((t for t in w.ack_times if t > stopped_at), float("inf")) - stopped_at for w in writers)


async def stored_ids(database: str, session_ids: list[str]) -> dict[str, list[int]]:
    """Each stored message id, with the seqs of its ``message.appended`` events."""
    store = await PostgresStore.connect(database)
    try:
        ids: dict[str, list[int]] = {}
        for sid in session_ids:
            after = 0
            while batch := await store.read_events(session_stream(sid), after, 1000):
                for event in batch:
                    if event.type == "message.appended":
                        ids.setdefault(event.data["message"]["id"], []).append(event.seq)
                after = batch[-1].seq
        return ids
    finally:
        await store.close()


async def rolling_restart(database: str, route: str) -> None:
    a, b = Node(database, "postgres"), Node(database, "postgres")
    await asyncio.gather(a.start(), b.start())
    proxy = TcpProxy(("127.0.0.1", a.port), ("127.0.0.1", b.port))
    clients: list[HubClient] = []
    tasks: list[asyncio.Task[None]] = []
    stop = asyncio.Event()
    try:
        await proxy.start()
        for i in range(CLIENTS):
            if route == "balancer":
                urls: str | list[str] = f"ws://127.0.0.1:{proxy.port}/ws"
            else:  # half start on each node, and fail over to the other
                urls = [a.ws_url, b.ws_url] if i % 2 == 0 else [b.ws_url, a.ws_url]
            clients.append(HubClient(urls, name=f"client-{i}", max_backoff=0.5))
        for client in clients:
            await client.connect()
        session_ids = [(await clients[0].sessions.create(f"rolling {s}")).id for s in range(SESSIONS)]
        writers = [Writer(i, session_ids[i % SESSIONS]) for i in range(CLIENTS)]
        for client, writer in zip(clients, writers, strict=True):
            tasks.append(asyncio.create_task(follow(client, writer)))
            tasks.append(asyncio.create_task(write(client, writer, stop)))

        await asyncio.sleep(SETTLE)
        stops: list[float] = []
        for node in (a, b):
            stops.append(time.monotonic())
            # uvicorn re-raises the signal once it has drained and stopped.
            assert await node.stop(signal.SIGTERM) in (0, -signal.SIGTERM)
            await node.start()
            await asyncio.sleep(SETTLE)
        stop.set()
        await asyncio.gather(*tasks[1::2])  # the writers

        living = sum(await asyncio.gather(*(alive(c) for c in clients)))
        stored = await stored_ids(database, session_ids)
        store_last = {}
        store = await PostgresStore.connect(database)
        try:
            for sid in session_ids:
                store_last[sid] = (await store.stream_position(session_stream(sid))).last_seq
        finally:
            await store.close()
        with contextlib.suppress(AssertionError):
            await eventually(
                lambda: all(w.seen and w.seen[-1].seq >= store_last[w.session_id] for w in writers),
                timeout=15,
                interval=0.05,
            )
        acked = [mid for w in writers for mid in w.acked]
        lost = [mid for mid in acked if mid not in stored]
        refused_stored = [mid for w in writers for mid in w.refused if mid in stored]
        unknown_stored = [mid for w in writers for mid in w.unknown if mid in stored]
        gaps = duplicates = 0
        for w in writers:
            seqs = [e.seq for e in w.seen]
            duplicates += len(seqs) - len(set(seqs))
            gaps += len(set(range(1, store_last[w.session_id] + 1)) - set(seqs))
        print(
            f"\nrolling restart ({route}): {CLIENTS} clients, alive at the end {living}; "
            f"acknowledged {len(acked)}, lost {len(lost)}, refused unavailable "
            f"{sum(len(w.refused) for w in writers)} (answered-but-stored {len(refused_stored)}), "
            f"dropped in flight {sum(len(w.unknown) for w in writers)} (stored {len(unknown_stored)}); "
            f"subscribers: gaps {gaps}, duplicates {duplicates}; time to recover "
            + ", ".join(f"{recovery(writers, t):.2f} s" for t in stops)
            + f"; reconnects {sum(c.reconnects for c in clients)}"
        )
        assert living == CLIENTS
        assert lost == []
        assert refused_stored == []
        assert all(len(seqs) == 1 for seqs in stored.values()), "an append stored twice"
        assert gaps == 0
        assert duplicates == 0
        for w in writers:
            assert [e.seq for e in w.seen] == list(range(1, store_last[w.session_id] + 1))
    finally:
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for client in clients:
            await client.aclose()
        await proxy.close()
        await asyncio.gather(a.stop(), b.stop())


@pytest.mark.timeout(90)
@pytest.mark.parametrize("route", ["balancer", "urls"])
async def test_a_rolling_restart_under_load_loses_no_client_and_no_event(database: str, route: str) -> None:
    await rolling_restart(database, route)
