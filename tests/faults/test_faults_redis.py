"""The fault matrix: Redis restarted under load (issue 24, "The fault matrix").

Two real ``sessionhub serve`` nodes on one Postgres database ring each other through a
``redis-server`` of the test's own. Writers append on node A, a subscriber follows on node
B, and Redis is SIGKILLed mid-load and started again on the same port. Redis is only the
doorbell: the log in Postgres is the truth, so while Redis is down B must keep delivering
(it polls the log, ``RemoteBus.poll_interval``), and once Redis is back both nodes must be
listening again (``/healthz``) with every acknowledged append delivered once, in order, and
the last ones delivered without any later append to ring for them.

(``tests/server/test_multinode.py`` kills the bus's connections with Redis still up; here the
server itself goes away, with its channels and every connection.)
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

import httpx2
import pytest

from hub.bus import RedisBus
from tests.support.faultkit import TcpProxy, scratch_redis
from tests.support.figures import Figures, duplicates, gaps
from tests.support.hubtest import Client, eventually
from tests.support.load import Follower, Writer
from tests.support.nodes import Node, scratch_database
from tests.support.services import postgres_dsn

WRITERS = 3
BEFORE = 150  # appends acknowledged before the kill
OUTAGE = 4.0  # seconds Redis stays down: long enough for the reconnect backoffs to grow
AFTER = 150  # appends acknowledged once both nodes listen again


@pytest.fixture
async def database() -> AsyncIterator[str]:
    async with scratch_database(postgres_dsn(), prefix="sessionhub_redis_fault") as dsn:
        yield dsn


async def bus_health(http: httpx2.AsyncClient, node: Node) -> dict[str, object]:
    health = (await http.get(f"http://127.0.0.1:{node.port}/healthz")).json()
    return dict(health["bus"])


@pytest.mark.timeout(120)
async def test_redis_restarted_under_load_loses_nothing(database: str) -> None:
    figures = Figures("Redis restarted (two nodes, Postgres, writers on A, a subscriber on B)")
    wrong: list[str] = []  # deliveries that differ from what was acknowledged, in order
    async with (
        scratch_redis() as redis,
        Node(database, redis.url) as a,
        Node(database, redis.url) as b,
        httpx2.AsyncClient() as http,
        Client.connect(b.ws_url) as watching,
        contextlib.AsyncExitStack() as stack,
    ):
        clients = [await stack.enter_async_context(Client.connect(a.ws_url)) for _ in range(WRITERS)]
        writers = []
        for i, client in enumerate(clients):
            sid = (await client.call("create", name=f"redis {i}"))["id"]
            writers.append(Writer(f"w{i}", sid, lambda n: f"append {n} " * 8))
        follower = Follower(watching)
        await follower.follow([w.session_id for w in writers])

        def acked() -> int:
            return sum(len(w.acked) for w in writers)

        async def load(until: Callable[[], bool]) -> None:
            await asyncio.gather(
                *(w.run(c, until, pace=0.005) for w, c in zip(writers, clients, strict=True))
            )

        await load(lambda: acked() >= BEFORE)
        await redis.kill()
        killed_at = time.monotonic()
        await load(lambda: time.monotonic() - killed_at >= OUTAGE)
        during = acked() - BEFORE
        await redis.start()
        restarted_at = time.monotonic()

        async def both_listening() -> bool:
            states = [await bus_health(http, node) for node in (a, b)]
            return all(s["connected"] and s["reconnects"] == 1 for s in states)

        # Writes go on while the nodes reconnect; the figure is when both listen again.
        listening = asyncio.create_task(eventually(both_listening, timeout=30, interval=0.05))
        await load(listening.done)
        await listening
        figures.recovery = time.monotonic() - restarted_at  # to within a poll of /healthz
        listened = acked()
        await load(lambda: acked() >= listened + AFTER)
        # The last appends must reach B with no later append to ring for them.
        last = [w.acked[-1] for w in writers]
        await eventually(lambda: follower.has(last), timeout=30, interval=0.02)

        for w in writers:
            got = follower.seen[w.session_id]
            figures.gaps += gaps([f["seq"] for f in got])
            figures.duplicates += duplicates(f["seq"] for f in got)
            appended = follower.appended(w.session_id)
            figures.lost += len(set(w.acked) - set(appended))
            figures.answered_but_stored += len(set(w.refused) & set(appended))
            if appended != w.acked:
                wrong.append(f"{w.name} delivered {appended} for {w.acked}")
        await follower.stop()

        def worst_lag(since: float, until: float) -> float:
            return max(
                follower.arrived[mid] - at
                for w in writers
                for mid, at in zip(w.acked, w.acked_at, strict=True)
                if since <= at < until
            )

        figures.acknowledged = acked()
        figures.extra = {
            "refused": sum(len(w.refused) for w in writers),
            "acknowledged while Redis was down": during,
            "outage": f"{restarted_at - killed_at:.2f} s",
            "worst delivery lag on B while down": f"{worst_lag(killed_at, restarted_at):.2f} s",
            "while reconnecting": f"{worst_lag(restarted_at, restarted_at + figures.recovery):.2f} s",
            "after": f"{worst_lag(restarted_at + figures.recovery, time.monotonic()):.3f} s",
        }
    figures.print()
    figures.assert_exact()
    assert figures.extra["refused"] == 0
    assert not wrong, wrong


async def test_a_doorbell_kept_while_redis_was_unreachable_leaves_within_a_poll() -> None:
    """Node A loses Redis for a while (a proxy refuses it) while B stays subscribed, as
    when B's listener reconnects first after a restart: B does not poll, so A's kept doorbell
    must leave soon after Redis is reachable again. The sender's retries used to back off to
    the listener's ``max_backoff`` (5 s): after 4.5 s down its next try came ~2 s late."""
    async with scratch_redis() as redis, TcpProxy(("127.0.0.1", redis.port)) as proxy:
        a = RedisBus(f"redis://127.0.0.1:{proxy.port}/0", poll_interval=0.05, health_interval=0.2)
        b = RedisBus(redis.url, poll_interval=0.05, health_interval=0.2)
        await a.start()
        await b.start()
        try:
            b.follow("s:a")
            proxy.refuse()
            proxy.cut()
            a.publish("s:a", 1)  # kept: A cannot reach Redis
            await asyncio.sleep(4.5)  # the fault's length, not a wait for a condition
            assert b.last_seq("s:a") == 0
            proxy.refuse(False)
            back = time.monotonic()
            await eventually(lambda: b.last_seq("s:a") == 1, timeout=20 * a.poll_interval, interval=0.01)
            print(f"\nkept doorbell heard {time.monotonic() - back:.3f} s after Redis was reachable again")
        finally:
            await a.close()
            await b.close()
