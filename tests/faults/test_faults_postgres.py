"""The fault matrix's Postgres rows: the database restarted, stopped, and SIGKILLed under
write load, with a real ``sessionhub serve`` on a scratch cluster (tests/support/faultkit.py).

Each run has writers appending over raw sockets (one request in flight each, a new message
id per attempt), and counts: acknowledged, lost (acknowledged, not stored), answered but
stored (answered ``unavailable`` with ``outcome: not_applied``, yet stored: must be 0;
``unknown`` answers may be either, and are counted), gaps and duplicates in the log as a
subscriber saw it, and the time from the database being back to the first acknowledged
append. Run with ``-s`` to see the figures (docs/operations.md, "What survives what").
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx2
import pytest
from websockets.asyncio.client import connect

from clients import HubClient
from hub import PostgresStore
from hub.store import session_stream
from protocol import Event, Message, SessionHubError, StoreUnavailable
from tests.support.faultkit import ScratchPostgres, TcpProxy, scratch_postgres
from tests.support.nodes import Node, scratch_database
from tests.support.services import postgres_dsn

pytestmark = pytest.mark.timeout(90)

WRITERS = 4
BACKLOG = 2000  # events of the session a subscriber catches up during the fault
BIG = 16 * 1024  # bytes of text of each backlog message


@dataclass
class Tally:
    acked: set[str] = field(default_factory=set)
    not_applied: set[str] = field(default_factory=set)
    unknown: set[str] = field(default_factory=set)
    other: collections.Counter[str] = field(default_factory=collections.Counter)
    # monotonic time of each acknowledgement, to find the first one after the fault
    ack_times: list[float] = field(default_factory=list)

    def first_ack_after(self, when: float) -> float | None:
        return next((t for t in self.ack_times if t >= when), None)


def text_message(mid: str, size: int = 64) -> dict[str, Any]:
    return {"id": mid, "role": "user", "parts": [{"type": "text", "text": "x" * size}]}


async def writer(url: str, session_id: str, w: int, tally: Tally, stop: asyncio.Event) -> None:
    async with connect(url, max_size=None) as ws:
        i = 0
        while not stop.is_set():
            mid = f"w{w}-{i}"
            i += 1
            await ws.send(
                json.dumps({"op": "append", "id": i, "session_id": session_id, "message": text_message(mid)})
            )
            frame = json.loads(await ws.recv())
            assert frame.get("id") == i, frame
            if frame["frame"] == "reply":
                tally.acked.add(mid)
                tally.ack_times.append(time.monotonic())
                continue
            outcome = (frame.get("detail") or {}).get("outcome")
            if frame["code"] == "unavailable" and outcome == "not_applied":
                tally.not_applied.add(mid)
            elif frame["code"] == "unavailable" and outcome == "unknown":
                tally.unknown.add(mid)
            else:
                tally.other[f"{frame['code']}: {frame['message'][:80]}"] += 1
            await asyncio.sleep(0.01)  # the database is down: do not spin


async def catch_up(
    url: str, session_id: str, last_seq: int, seqs: list[int], replied: asyncio.Event | None = None
) -> None:
    """Subscribe from 0 and read the backlog to its end (resubscribing if the hub ends the
    subscription), every seq received in ``seqs``; ``replied`` is set at the first reply."""
    async with connect(url, max_size=None) as ws:
        await ws.send(json.dumps({"op": "subscribe", "id": 1, "session_id": session_id, "after_seq": 0}))
        while not seqs or seqs[-1] < last_seq:
            frame = json.loads(await ws.recv())
            if frame["frame"] == "event":
                seqs.append(frame["seq"])
            elif frame["frame"] == "unsubscribed":  # the hub gave up: resume where we are
                after = seqs[-1] if seqs else 0
                await ws.send(
                    json.dumps(
                        {"op": "subscribe", "id": after + 2, "session_id": session_id, "after_seq": after}
                    )
                )
            else:
                assert frame["frame"] == "reply", frame
                if replied is not None:
                    replied.set()


async def follow(client: HubClient, session_id: str, events: list[Event]) -> None:
    async for event in client.subscribe(session_id):
        events.append(event)


async def prefill(dsn: str, session_id: str) -> int:
    """``BACKLOG`` big messages in ``session_id``, written straight to the database."""
    store = await PostgresStore.connect(dsn)
    try:
        for start in range(0, BACKLOG, 200):
            batch = [
                Message.from_dict(text_message(f"b{n}", BIG)) for n in range(start, min(BACKLOG, start + 200))
            ]
            await store.append_messages(session_id, batch)
        return (await store.stream_position(session_stream(session_id))).last_seq
    finally:
        await store.close()


async def stored_ids(dsn: str, session_id: str) -> set[str]:
    store = await PostgresStore.connect(dsn)
    try:
        dump = await store.dump_session(session_id)
        return {m.message.id for m in dump.messages}
    finally:
        await store.close()


@contextlib.asynccontextmanager
async def loaded_node(pg: ScratchPostgres, *extra: str) -> AsyncIterator[tuple[Node, str, str]]:
    """A node on the cluster with a live session (for the writers) and a backlog session."""
    async with Node(pg.dsn, None, None, "--outbox-bytes", "512K", "--replay-bytes", "256K", *extra) as node:
        async with HubClient(node.ws_url) as admin:
            live = (await admin.sessions.create("live")).id
            backlog = (await admin.sessions.create("backlog")).id
        yield node, live, backlog


def assert_exact(seqs: list[int], last: int) -> tuple[int, int]:
    """Gaps and duplicates of a subscriber's seqs against 1..last (asserted zero)."""
    counts = collections.Counter(seqs)
    duplicates = sum(n - 1 for n in counts.values() if n > 1)
    gaps = sum(1 for s in range(1, last + 1) if s not in counts)
    return gaps, duplicates


def report(name: str, tally: Tally, stored: set[str], recover: float | None, **more: Any) -> tuple[int, int]:
    lost = len(tally.acked - stored)
    recovered = "n/a" if recover is None else f"{recover:.3f} s"
    answered_but_stored = len(tally.not_applied & stored)
    print(
        f"\n{name}: acknowledged {len(tally.acked)}, lost {lost}, "
        f"answered not_applied {len(tally.not_applied)} "
        f"(stored anyway {answered_but_stored}), "
        f"answered unknown {len(tally.unknown)} (stored {len(tally.unknown & stored)}), "
        f"other errors {dict(tally.other)}, time to recover {recovered}"
        + "".join(f", {k.replace('_', ' ')} {v}" for k, v in more.items())
    )
    return lost, answered_but_stored


async def under_load(
    node: Node, live: str, fault: Callable[[], Awaitable[float]], *, seconds: float = 1.0
) -> tuple[Tally, float]:
    """Writers on ``live`` for ``seconds``, then ``fault()`` (it returns the monotonic time
    the database was back), then writers until they have been acknowledged again."""
    tally, stop = Tally(), asyncio.Event()
    tasks = [asyncio.create_task(writer(node.ws_url, live, w, tally, stop)) for w in range(WRITERS)]
    try:
        await asyncio.sleep(seconds)
        back = await fault()
        async with asyncio.timeout(20):
            while tally.first_ack_after(back) is None:
                await asyncio.sleep(0.05)
        await asyncio.sleep(seconds)  # and on for a while: the hub has recovered for good
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    return tally, back


async def hold_the_log(dsn: str) -> asyncpg.Connection:
    """A connection holding the events table locked: a catch-up's read of the log then
    waits on the lock, and a fault cuts it in flight. (Unlocked, the hub reads a whole
    backlog ahead into the sockets' buffers within a second, and no fault meets a read.)"""
    holder = await asyncpg.connect(dsn)
    await holder.execute("BEGIN; LOCK TABLE events IN ACCESS EXCLUSIVE MODE")
    return holder


async def until_a_read_waits(
    holder: asyncpg.Connection, starting: str = "SELECT s.epoch, s.first_seq"
) -> None:
    """Until a read of the hub waits on the lock (by default a ``read_events``)."""
    async with asyncio.timeout(10):
        while not await holder.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND ltrim(query, E' \\n') LIKE $1 || '%'",
            starting,
        ):
            await asyncio.sleep(0.02)


def tracebacks(node: Node) -> list[str]:
    return [line for line in node.log if "Traceback" in line or "Task exception was never retrieved" in line]


async def test_postgres_restarted_under_load_loses_nothing_and_a_catching_up_subscriber_gets_all() -> None:
    async with scratch_postgres() as pg, loaded_node(pg) as (node, live, backlog):
        last = await prefill(pg.dsn, backlog)
        seqs: list[int] = []
        events: list[Event] = []
        async with HubClient(node.ws_url) as client:
            following = asyncio.create_task(follow(client, live, events))
            catching_up: asyncio.Task[None] | None = None

            async def restart() -> float:
                # The subscriber comes while the log is held: the hub answers its subscribe
                # (other tables) and its first read of the backlog waits, cut by the restart.
                nonlocal catching_up
                holder = await hold_the_log(pg.dsn)
                replied = asyncio.Event()
                catching_up = asyncio.create_task(catch_up(node.ws_url, backlog, last, seqs, replied))
                async with asyncio.timeout(10):
                    await replied.wait()
                await until_a_read_waits(holder)
                await pg.restart()  # the holder's connection goes with it
                holder.terminate()
                return time.monotonic()

            tally, back = await under_load(node, live, restart, seconds=0.5)
            assert catching_up is not None
            async with asyncio.timeout(30):
                await catching_up
            stored = await stored_ids(pg.dsn, live)
            async with asyncio.timeout(10):
                while {e.data["message"]["id"] for e in events if e.type == "message.appended"} < stored:
                    await asyncio.sleep(0.05)
            following.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await following
        recover = (tally.first_ack_after(back) or back) - back
        gaps, duplicates = assert_exact(seqs, last)
        live_seqs = [e.seq for e in events]
        live_gaps, live_duplicates = assert_exact(live_seqs, max(live_seqs))
        lost, answered_but_stored = report(
            "postgres restarted",
            tally,
            stored,
            recover,
            backlog_events=f"{len(seqs)}/{last}",
            gaps=gaps + live_gaps,
            duplicates=duplicates + live_duplicates,
        )
        assert lost == 0 and answered_but_stored == 0
        assert gaps == duplicates == live_gaps == live_duplicates == 0
        assert not tally.other, tally.other  # never "internal": unavailable, with an outcome
        assert tally.not_applied or tally.unknown  # the fault was felt
        assert not tracebacks(node), "".join(node.log[-40:])


async def test_postgres_stopped_answers_unavailable_and_json_health_then_recovers() -> None:
    async with scratch_postgres() as pg, loaded_node(pg) as (node, live, _):
        health: list[tuple[float, int, dict[str, Any]]] = []
        probing = asyncio.Event()

        async def probe() -> None:
            async with httpx2.AsyncClient(timeout=10) as http:
                while not probing.is_set():
                    for path in ("/healthz", "/readyz"):
                        r = await http.get(f"http://127.0.0.1:{node.port}{path}")
                        assert r.headers["content-type"] == "application/json", r.text
                        health.append((time.monotonic(), r.status_code, r.json() | {"path": path}))
                    await asyncio.sleep(0.05)

        prober = asyncio.create_task(probe())
        stopped_at = 0.0

        async def stop_for_a_while() -> float:
            nonlocal stopped_at
            await pg.stop()
            stopped_at = time.monotonic()
            await asyncio.sleep(3.0)
            await pg.start()
            return time.monotonic()

        tally, back = await under_load(node, live, stop_for_a_while)
        async with asyncio.timeout(10):
            while not (len(health) > 1 and health[-1][1] == 200 and health[-2][1] == 200):
                if prober.done():
                    prober.result()  # a probe that was not JSON fails the test here
                await asyncio.sleep(0.05)
        probing.set()
        await prober
        stored = await stored_ids(pg.dsn, live)
        recover = (tally.first_ack_after(back) or back) - back
        healthy_again = (
            next(
                t for t, status, body in health if t >= back and status == 200 and body["path"] == "/healthz"
            )
            - back
        )
        down = [(status, body) for t, status, body in health if stopped_at + 0.5 <= t < back - 0.2]
        lost, answered_but_stored = report(
            "postgres stopped 3 s",
            tally,
            stored,
            recover,
            health_probes_while_down=f"{len(down)} (all JSON 503: {all(s == 503 for s, _ in down)})",
            healthz_ok_after=f"{healthy_again:.3f} s",
            log_lines=len([line for line in node.log if "postgres" in line and "unavailable" in line]),
        )
        print(
            "the node's log, access lines apart:\n"
            + "".join(line for line in node.log if "HTTP/1.1" not in line)
        )
        assert lost == 0 and answered_but_stored == 0
        assert not tally.other, tally.other  # every refusal during the stop is "unavailable"
        assert len(tally.not_applied) > 10
        assert down and all(status == 503 and body["status"] == "unavailable" for status, body in down), down
        assert all("reason" in body and "asyncpg" not in body["reason"] for _, body in down)
        assert not tracebacks(node), "".join(node.log[-40:])


async def test_postgres_killed_under_load_loses_nothing() -> None:
    # A SIGKILL loses what is only in the server's memory: the commits it acknowledged must
    # be in the WAL (fsync stays off: the kernel keeps what was written).
    async with scratch_postgres({"synchronous_commit": "on"}) as pg, loaded_node(pg) as (node, live, _):

        async def kill() -> float:
            await pg.kill()
            await pg.start()  # crash recovery
            return time.monotonic()

        tally, back = await under_load(node, live, kill)
        stored = await stored_ids(pg.dsn, live)
        lost, answered_but_stored = report(
            "postgres SIGKILLed", tally, stored, (tally.first_ack_after(back) or back) - back
        )
        assert lost == 0 and answered_but_stored == 0
        assert not tally.other, tally.other
        assert not tracebacks(node), "".join(node.log[-40:])


# -- the store itself, on the machine's Postgres ------------------------------------------


def through(proxy: TcpProxy, dsn: str) -> str:
    parts = urlsplit(dsn)
    user = f"{parts.username}@" if parts.username else ""
    return urlunsplit(parts._replace(netloc=f"{user}{proxy.address[0]}:{proxy.address[1]}"))


async def test_store_connections_cut_under_load_answer_unavailable_with_the_truth() -> None:
    """Every connection of the store reset (RST) five times under write load: each failed
    write says ``unavailable`` with an outcome (never ``internal``, never the driver's
    text), none answered ``not_applied`` is stored, and an acknowledged one is never lost."""
    async with scratch_database(postgres_dsn(), "sessionhub_cut") as dsn:
        upstream = urlsplit(dsn)
        async with TcpProxy((upstream.hostname or "127.0.0.1", upstream.port or 5432)) as proxy:
            store = await PostgresStore.connect(through(proxy, dsn), max_size=4)
            try:
                sessions = [(await store.create_session(f"s{w}")).id for w in range(WRITERS)]
                tally, stop = Tally(), asyncio.Event()

                async def write(w: int) -> None:
                    i = 0
                    while not stop.is_set():
                        mid = f"w{w}-{i}"
                        i += 1
                        try:
                            await store.append_messages(sessions[w], [Message.from_dict(text_message(mid))])
                            tally.acked.add(mid)
                        except StoreUnavailable as exc:
                            (tally.unknown if exc.outcome == "unknown" else tally.not_applied).add(mid)
                            raw = "asyncpg" in str(exc) or "pool" in str(exc)  # the driver's own text
                            if raw:
                                tally.other[f"raw: {exc}"[:100]] += 1
                        except SessionHubError as exc:
                            tally.other[f"{exc.code}: {exc}"[:100]] += 1

                tasks = [asyncio.create_task(write(w)) for w in range(WRITERS)]
                for _ in range(5):
                    await asyncio.sleep(0.2)
                    proxy.cut()
                await asyncio.sleep(0.2)
                stop.set()
                await asyncio.gather(*tasks)
                stored = set()
                for sid in sessions:
                    stored |= {m.message.id for m in (await store.dump_session(sid)).messages}
            finally:
                await store.close()
        lost, answered_but_stored = report("store connections cut 5 times", tally, stored, None)
        assert lost == 0 and answered_but_stored == 0
        assert not tally.other, tally.other
        assert tally.not_applied or tally.unknown  # the cuts were felt


async def test_a_write_cut_while_committing_is_answered_unknown_and_a_retry_tells() -> None:
    """The connection dies while the server runs the COMMIT: the store cannot know whether
    it committed, and says so (``unknown``), never "rolled back"; appending the same id
    again tells (here: it was not applied, so the retry inserts it)."""
    async with scratch_database(postgres_dsn(), "sessionhub_commit") as dsn:
        store = await PostgresStore.connect(dsn, max_size=2)
        admin = await asyncpg.connect(dsn)
        try:
            sid = (await store.create_session("s")).id
            # A deferred constraint trigger runs inside COMMIT: it holds the commit open
            # long enough to end the connection right then.
            await admin.execute(
                "CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN PERFORM pg_sleep(30); RETURN NULL; END $$;"
                "CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON messages "
                "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit()"
            )
            writing = asyncio.create_task(store.append_messages(sid, [Message.from_dict(text_message("m1"))]))
            async with asyncio.timeout(10):
                while not (
                    pid := await admin.fetchval(
                        "SELECT pid FROM pg_stat_activity WHERE wait_event = 'PgSleep' "
                        "AND datname = current_database()"
                    )
                ):
                    await asyncio.sleep(0.02)
            await admin.execute("SELECT pg_terminate_backend($1)", pid)
            with pytest.raises(StoreUnavailable) as failed:
                await writing
            assert failed.value.outcome == "unknown"
            assert failed.value.code == "unavailable"
            await admin.execute("DROP TRIGGER slow_commit ON messages")
            retried = await store.append_messages(sid, [Message.from_dict(text_message("m1"))])
            assert retried.inserted == ["m1"]  # the truth: the first one was not applied
        finally:
            await admin.close()
            await store.close()


async def test_a_subscription_the_hub_gives_up_on_is_resumed_by_the_client(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With ``--subscription-retry`` shorter than the outage, the hub ends a catching-up
    subscription with an ``unsubscribed`` frame (again and again while the database stays
    down); ``HubClient`` subscribes again from its position each time and, once the
    database is back, has every event exactly once."""
    async with scratch_postgres() as pg, loaded_node(pg, "--subscription-retry", "0.3") as (node, _, backlog):
        last = await prefill(pg.dsn, backlog)
        seqs: list[int] = []
        async with HubClient(node.ws_url) as client:

            async def read() -> None:
                async for event in client.subscribe(backlog):
                    seqs.append(event.seq)
                    if event.seq == last:
                        return
                    if len(seqs) % 20 == 0:
                        await asyncio.sleep(0.01)

            holder = await hold_the_log(pg.dsn)
            reading = asyncio.create_task(read())
            # (Here the read that waits is the subscribe's own, of the stream's position.)
            await until_a_read_waits(holder, "SELECT")
            await pg.stop()
            holder.terminate()
            at_stop = len(seqs)
            await asyncio.sleep(2.0)
            await pg.start()
            async with asyncio.timeout(30):
                await reading
        ended = sum("ended the subscription" in r.getMessage() for r in caplog.records)
        gaps, duplicates = assert_exact(seqs, last)
        print(
            f"\nsubscription given up on: {len(seqs)}/{last} events (at the stop {at_stop}), "
            f"unsubscribed frames {ended}, gaps {gaps}, duplicates {duplicates}"
        )
        assert ended >= 1  # the hub did give up, and the client resubscribed
        assert gaps == duplicates == 0
        assert not tracebacks(node), "".join(node.log[-40:])
