"""Subscriptions over a real socket: Centrifugo's recovery table, the catch-up race, the
registry stream, unsubscribe, many streams per connection, slow-consumer eviction and
forced connection drops with resume."""

from __future__ import annotations

import asyncio
import json
import random
import time
from datetime import datetime
from pathlib import Path

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from hub import REGISTRY, SessionManager, SqliteStore, session_stream
from hub.bus import MemoryBus
from hub.server import HubConfig
from tests.support.hubtest import Client, Frame, eventually, is_event, prune, seqs, served, set_epoch, text

EVENT_KEYS = {"frame", "stream", "session_id", "seq", "epoch", "type", "data", "created_at"}


async def session_with(manager: SessionManager, appends: int, name: str = "s") -> tuple[str, int]:
    """A session with ``appends`` messages; returns its id and its last seq."""
    sid = (await manager.create(name)).id
    for i in range(appends):
        await manager.append(sid, text(f"m{i}", f"message {i}"))
    position = await manager.store.stream_position(session_stream(sid))
    assert position.last_seq == appends + 1  # created, then one per append
    return sid, position.last_seq


def assert_reset(
    frame: Frame, session_id: str | None, after_seq: int, epoch: str, first: int, last: int
) -> None:
    assert frame["frame"] == "reset", frame
    assert frame["session_id"] == session_id
    assert frame["after_seq"] == after_seq
    assert (frame["epoch"], frame["first_seq"], frame["last_seq"]) == (epoch, first, last)
    assert frame["message"]


# -- the recovery table ----------------------------------------------------------------------


async def test_from_zero_gets_every_event_then_live(store: SqliteStore) -> None:
    manager = SessionManager(store)
    sid, last = await session_with(manager, 5)
    logged = await manager.get_session(sid).read_events()
    async with served(store=store) as h, h.client() as c:
        reply = await c.subscribe(sid, after_seq=0)
        assert reply["frame"] == "reply"
        assert reply["result"] == {"epoch": logged[0].epoch, "last_seq": last}
        backlog = await c.events(sid, last)
        assert seqs(backlog) == list(range(1, last + 1))
        for frame, event in zip(backlog, logged, strict=True):
            assert set(frame) == EVENT_KEYS
            assert frame["stream"] == "session" and frame["session_id"] == sid
            assert (frame["seq"], frame["epoch"], frame["type"], frame["data"]) == (
                event.seq,
                event.epoch,
                event.type,
                event.data,
            )
            assert datetime.fromisoformat(frame["created_at"]) == event.created_at
        assert [f["type"] for f in backlog] == ["session.created"] + ["message.appended"] * 5
        # Then live.
        await manager.append(sid, text("live", "now"))
        [live] = await c.events(sid, 1)
        assert live["seq"] == last + 1 and live["data"]["message"]["id"] == "live"
        await c.quiet(is_event, 0.1)


async def test_from_the_exact_last_seq_gets_only_live(store: SqliteStore) -> None:
    manager = SessionManager(store)
    sid, last = await session_with(manager, 5)
    epoch = (await store.stream_position(session_stream(sid))).epoch
    async with served(store=store) as h, h.client() as c:
        reply = await c.subscribe(sid, after_seq=last, epoch=epoch)
        assert reply["result"] == {"epoch": epoch, "last_seq": last}
        await c.quiet(is_event, 0.2)
        await manager.append(sid, text("live", "now"))
        await manager.append(sid, text("live2", "again"))
        assert seqs(await c.events(sid, 2)) == [last + 1, last + 2]
        await c.quiet(is_event, 0.1)


async def test_from_a_middle_seq_gets_the_rest(store: SqliteStore) -> None:
    manager = SessionManager(store)
    sid, last = await session_with(manager, 5)
    async with served(store=store) as h, h.client() as c:
        assert (await c.subscribe(sid, after_seq=3))["frame"] == "reply"
        assert seqs(await c.events(sid, last - 3)) == list(range(4, last + 1))
        await c.quiet(is_event, 0.1)


async def test_from_a_future_seq_is_reset(store: SqliteStore) -> None:
    manager = SessionManager(store)
    sid, last = await session_with(manager, 3)
    epoch = (await store.stream_position(session_stream(sid))).epoch
    async with served(store=store) as h, h.client() as c:
        frame = await c.subscribe(sid, after_seq=last + 5, epoch=epoch)
        assert_reset(frame, sid, last + 5, epoch, 1, last)
        # No events, no reply: the subscription has ended...
        await manager.append(sid, text("live", "x"))
        await c.quiet(lambda f: f["frame"] in ("event", "reply"), 0.2)
        # ...and the client can start again from the snapshot's position.
        assert (await c.subscribe(sid, after_seq=last + 1, epoch=epoch))["frame"] == "reply"
        await manager.append(sid, text("live2", "x"))
        assert seqs(await c.events(sid, 1)) == [last + 2]


async def test_from_a_pruned_position_is_reset(db_path: Path, store: SqliteStore) -> None:
    manager = SessionManager(store)
    sid, last = await session_with(manager, 9)
    stream = session_stream(sid)
    epoch = (await store.stream_position(stream)).epoch
    await prune(db_path, stream, 5)
    assert (await store.stream_position(stream)).first_seq == 6
    async with served(store=store) as h, h.client() as c:
        for after in (0, 2, 4):
            frame = await c.subscribe(sid, after_seq=after, epoch=epoch)
            assert_reset(frame, sid, after, epoch, 6, last)
        await c.quiet(is_event, 0.1)
        # The oldest position the log still serves: right before its first event.
        assert (await c.subscribe(sid, after_seq=5, epoch=epoch))["frame"] == "reply"
        assert seqs(await c.events(sid, last - 5)) == list(range(6, last + 1))
        await c.quiet(is_event, 0.1)


async def test_after_an_epoch_change_is_reset(db_path: Path, store: SqliteStore) -> None:
    manager = SessionManager(store)
    sid, last = await session_with(manager, 4)
    stream = session_stream(sid)
    old = (await store.stream_position(stream)).epoch
    await set_epoch(db_path, stream, "new-epoch")
    async with served(store=store) as h, h.client() as c:
        for after in (0, 2, last):
            frame = await c.subscribe(sid, after_seq=after, epoch=old)
            assert_reset(frame, sid, after, "new-epoch", 1, last)
        await c.quiet(is_event, 0.1)
        # In the stream's current epoch the same position is fine.
        reply = await c.subscribe(sid, after_seq=2, epoch="new-epoch")
        assert reply["result"] == {"epoch": "new-epoch", "last_seq": last}
        events = await c.events(sid, last - 2)
        assert seqs(events) == list(range(3, last + 1))
        assert {e["epoch"] for e in events} == {"new-epoch"}


async def test_an_epoch_change_while_following_is_reset(db_path: Path, store: SqliteStore) -> None:
    manager = SessionManager(store)
    sid, last = await session_with(manager, 2)
    stream = session_stream(sid)
    old = (await store.stream_position(stream)).epoch
    async with served(store=store) as h, h.client() as c:
        assert (await c.subscribe(sid, after_seq=0))["frame"] == "reply"
        assert seqs(await c.events(sid, last)) == list(range(1, last + 1))
        await set_epoch(db_path, stream, "rebuilt")
        await manager.append(sid, text("after", "x"))
        frame = await c.take(lambda f: f["frame"] in ("event", "reset"))
        assert frame["frame"] == "reset", f"an event of another epoch went out as a continuation: {frame}"
        assert frame["session_id"] == sid and frame["epoch"] == "rebuilt" and frame["last_seq"] == last + 1
        assert old != "rebuilt"
        await c.quiet(is_event, 0.1)


async def test_registry_position_table(store: SqliteStore) -> None:
    manager = SessionManager(store)
    for i in range(3):
        await manager.create(f"r{i}")
    position = await store.stream_position(REGISTRY)
    assert position.last_seq == 3
    async with served(store=store) as h, h.client() as c:
        frame = await c.subscribe(None, after_seq=10, epoch=position.epoch)
        assert_reset(frame, None, 10, position.epoch, 1, 3)
        frame = await c.subscribe(None, after_seq=1, epoch="some-other-epoch")
        assert_reset(frame, None, 1, position.epoch, 1, 3)
        assert (await c.subscribe(None, after_seq=1, epoch=position.epoch))["frame"] == "reply"
        events = await c.events(None, 2)
        assert seqs(events) == [2, 3]
        assert [e["data"]["session"]["name"] for e in events] == ["r1", "r2"]


# -- the catch-up race -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "config",
    [HubConfig(), HubConfig(backlog_batch=37, tail_events=16)],
    ids=["default", "small-batches"],
)
async def test_events_committed_during_catch_up_arrive_once_in_order(
    store: SqliteStore, config: HubConfig
) -> None:
    manager = SessionManager(store)
    sid = (await manager.create("race")).id
    for chunk in range(10):
        await manager.append_all(sid, [text(f"b{chunk}-{i}", "backlog") for i in range(200)])
    backlog_last = (await store.stream_position(session_stream(sid))).last_seq
    assert backlog_last == 2001
    async with served(store=store, config=config) as h, h.client() as c:

        async def writer() -> None:
            for i in range(300):
                await manager.append(sid, text(f"w{i}", "live"))
                if i % 3 == 0:
                    await asyncio.sleep(0)  # a yield, not a wait: the catch-up runs between writes

        task = asyncio.create_task(writer())
        await asyncio.sleep(0)  # the writer is running when the subscription starts
        reply = await c.subscribe(sid, after_seq=0)
        assert reply["frame"] == "reply"
        writing = not task.done()
        await task
        final = backlog_last + 300
        # The race is real: the writer was still committing after the subscription began.
        assert writing and reply["result"]["last_seq"] < final
        assert (await store.stream_position(session_stream(sid))).last_seq == final
        events = await c.until_seq(sid, final, timeout=10)
        assert seqs(events) == list(range(1, final + 1))
        await c.quiet(is_event, 0.1)


# -- the registry, unsubscribe, many streams ---------------------------------------------------


async def test_registry_subscription_on_an_empty_hub(store: SqliteStore) -> None:
    """Subscribing to the registry before any session exists, then seeing the first ones."""
    manager = SessionManager(store)
    async with served(store=store) as h, h.client() as c:
        assert (await c.subscribe(None, after_seq=0))["frame"] == "reply"
        a = await manager.create("first")
        b = await manager.create("second")
        events = await c.events(None, 2, timeout=2)
        assert [(e["type"], e["session_id"], e["seq"]) for e in events] == [
            ("session.created", a.id, 1),
            ("session.created", b.id, 2),
        ]
        assert events[0]["epoch"] == events[1]["epoch"] != ""


async def test_registry_subscription_sees_every_registry_change(store: SqliteStore) -> None:
    manager = SessionManager(store)
    await manager.create("seed")
    async with served(store=store) as h, h.client() as c:
        assert (await c.subscribe(None, after_seq=1))["frame"] == "reply"
        a = await manager.create("a")
        await manager.append(a.id, text("m1", "x"))  # not a registry change
        await manager.rename(a.id, "a2")
        fork = await manager.fork(a.id, "m1", "fork of a")
        await manager.add_usage(a.id, 10, 5, 0.1)
        successor = await manager.compact_and_split(a.id, "gist")
        await manager.delete(fork.id)
        expected = [
            ("session.created", a.id),
            ("session.renamed", a.id),
            ("session.forked", fork.id),
            ("session.usage", a.id),
            ("session.ended", a.id),
            ("session.created", successor.id),
            ("session.deleted", fork.id),
        ]
        events = await c.events(None, len(expected))
        assert [(e["type"], e["session_id"]) for e in events] == expected
        assert seqs(events) == list(range(2, len(expected) + 2))
        assert all(e["stream"] == "registry" for e in events)
        assert events[1]["data"]["session"]["name"] == "a2"
        assert events[2]["data"]["from_session_id"] == a.id
        assert events[3]["data"]["delta"] == {"input_tokens": 10, "output_tokens": 5, "cost": 0.1}
        assert events[4]["data"]["session"]["end_reason"] == "compaction"
        await c.quiet(is_event, 0.1)


async def test_unsubscribe_stops_events(store: SqliteStore) -> None:
    manager = SessionManager(store)
    sid, last = await session_with(manager, 2)
    async with served(store=store) as h, h.client() as c:
        assert (await c.subscribe(sid))["frame"] == "reply"
        assert (await c.subscribe(None, after_seq=1))["frame"] == "reply"
        await c.events(sid, last)
        assert await c.call("unsubscribe", session_id=sid) is None
        await manager.append(sid, text("after", "x"))
        await manager.rename(sid, "renamed")
        # The registry subscription still runs; the session one does not.
        [renamed] = await c.events(None, 1)
        assert renamed["type"] == "session.renamed"
        await c.quiet(lambda f: is_event(f) and f["stream"] == "session", 0.3)
        frame = await c.request("unsubscribe", session_id=sid)
        assert (frame["frame"], frame["code"]) == ("error", "not_found")
        # Subscribing again resumes wherever the client says.
        assert (await c.subscribe(sid, after_seq=last))["frame"] == "reply"
        assert [e["type"] for e in await c.events(sid, 2)] == ["message.appended", "session.renamed"]


async def test_the_bus_remembers_only_the_streams_this_hub_follows(store: SqliteStore) -> None:
    """Writes to sessions nobody subscribes to leave nothing behind in the hub's memory;
    a subscribed session is remembered while its tail runs, and forgotten after."""
    manager = SessionManager(store)
    quiet = [(await session_with(manager, 1, f"q{i}"))[0] for i in range(30)]
    sid, last = await session_with(manager, 1)
    bus = store.bus
    assert isinstance(bus, MemoryBus)
    assert not any(session_stream(q) in bus.waiting() for q in quiet)
    async with served(store=store) as h, h.client() as c:
        await c.subscribe(sid)
        await c.events(sid, last)
        await manager.append(sid, text("live", "x"))
        await c.events(sid, 1)
        assert session_stream(sid) in bus.waiting()
        assert bus.last_seq(session_stream(sid)) == last + 1
        for q in quiet:
            await manager.append(q, text("more", "x"))
        assert all(bus.last_seq(session_stream(q)) == 0 for q in quiet)
        assert await c.call("unsubscribe", session_id=sid) is None
        await eventually(lambda: session_stream(sid) not in bus.waiting())
    assert bus.last_seq(session_stream(sid)) == 0


async def test_many_subscriptions_on_one_connection(store: SqliteStore) -> None:
    manager = SessionManager(store)
    sids = [(await manager.create(f"s{i}")).id for i in range(20)]
    async with served(store=store) as h, h.client() as c:
        for sid in sids:
            assert (await c.subscribe(sid, after_seq=1))["frame"] == "reply"
        assert (await c.subscribe(None, after_seq=20))["frame"] == "reply"
        for round_ in range(3):
            for i, sid in enumerate(sids):
                await manager.append(sid, text(f"r{round_}", f"{i}/{round_}"))
        for i, sid in enumerate(sids):
            events = await c.events(sid, 3)
            assert seqs(events) == [2, 3, 4]
            assert [e["data"]["message"]["parts"][0]["text"] for e in events] == [
                f"{i}/{r}" for r in range(3)
            ]
        await manager.rename(sids[7], "seven")
        [registry] = await c.events(None, 1)
        [session] = await c.events(sids[7], 1)
        assert registry["type"] == session["type"] == "session.renamed"
        # A duplicate subscription is refused; the first one goes on.
        frame = await c.request("subscribe", id="dup", session_id=sids[0], after_seq=0)
        assert (frame["frame"], frame["code"], frame["id"]) == ("error", "invalid", "dup")
        await manager.append(sids[0], text("more", "x"))
        assert seqs(await c.events(sids[0], 1)) == [5]
        await c.quiet(is_event, 0.1)


async def test_too_many_subscriptions(store: SqliteStore) -> None:
    manager = SessionManager(store)
    sids = [(await manager.create(f"s{i}")).id for i in range(4)]
    async with served(store=store, config=HubConfig(max_subscriptions=3)) as h, h.client() as c:
        for sid in sids[:3]:
            assert (await c.subscribe(sid))["frame"] == "reply"
        frame = await c.request("subscribe", id="four", session_id=sids[3])
        assert (frame["frame"], frame["code"], frame["id"]) == ("error", "too_many", "four")
        assert "3" in frame["message"]
        # Unsubscribing frees a slot.
        assert await c.call("unsubscribe", session_id=sids[0]) is None
        assert (await c.subscribe(sids[3]))["frame"] == "reply"
        # So does a subscription the hub ended with a reset.
        assert await c.call("unsubscribe", session_id=sids[1]) is None
        assert (await c.subscribe(sids[0], after_seq=99))["frame"] == "reset"
        assert (await c.subscribe(sids[1]))["frame"] == "reply"
        frame = await c.request("subscribe", id="again", session_id=sids[0])
        assert (frame["code"], frame["id"]) == ("too_many", "again")
        # And a subscription refused with not_found.
        assert await c.call("unsubscribe", session_id=sids[1]) is None
        frame = await c.request("subscribe", id="ghost", session_id="no-such-session")
        assert (frame["frame"], frame["code"], frame["id"]) == ("error", "not_found", "ghost")
        assert (await c.subscribe(sids[1], after_seq=1))["frame"] == "reply"


async def test_a_deleted_sessions_subscriber_gets_session_deleted(store: SqliteStore) -> None:
    manager = SessionManager(store)
    sid, last = await session_with(manager, 3)
    async with served(store=store) as h, h.client() as c, h.client() as other:
        assert (await c.subscribe(sid))["frame"] == "reply"
        await c.events(sid, last)
        await other.call("delete", session_id=sid)
        [deleted] = await c.events(sid, 1)
        assert (deleted["type"], deleted["seq"]) == ("session.deleted", last + 1)
        assert deleted["data"]["session"]["id"] == sid
        await c.quiet(is_event, 0.1)
        # Later subscribers: the log only keeps the deletion.
        epoch = deleted["epoch"]
        assert_reset(await other.subscribe(sid, after_seq=0), sid, 0, epoch, last + 1, last + 1)
        assert (await other.subscribe(sid, after_seq=last))["frame"] == "reply"
        [again] = await other.events(sid, 1)
        assert again["type"] == "session.deleted"


# -- slow consumers ---------------------------------------------------------------------------


async def test_a_slow_consumer_is_evicted_and_resumes(store: SqliteStore) -> None:
    manager = SessionManager(store)
    sid = (await manager.create("flood")).id
    config = HubConfig(queue_frames=8, send_timeout=0.5)
    payload = random.Random(5).randbytes(32 * 1024).hex()  # 64 KB of incompressible text
    async with served(store=store, config=config) as h, h.client(max_size=None) as reader:
        before = set(h.hub.connections)
        # A raw client that stops reading: its small queue fills, then the TCP buffers.
        slow = await connect(
            h.ws_url, proxy=None, compression=None, max_queue=1, max_size=None, close_timeout=1
        )
        got: list[int] = []
        close_seen = False
        try:
            await slow.send(json.dumps({"op": "subscribe", "id": 1, "session_id": sid, "after_seq": 0}))
            assert json.loads(await slow.recv())["frame"] == "reply"
            [slow_conn] = set(h.hub.connections) - before
            assert (await reader.subscribe(sid))["frame"] == "reply"

            durations: list[float] = []
            evicted_at: int | None = None
            peak_queue = 0
            async with asyncio.timeout(20):
                for i in range(1000):
                    started = time.perf_counter()
                    await manager.append(sid, text(f"m{i}", payload))
                    durations.append(time.perf_counter() - started)
                    await asyncio.sleep(0.002)  # pacing, not a wait: a steady writer
                    peak_queue = max(peak_queue, slow_conn.queue.qsize())
                    if evicted_at is None and slow_conn.closed:
                        evicted_at = i
                    if evicted_at is not None and i >= evicted_at + 10:
                        break
            assert evicted_at is not None, "the slow consumer was never evicted"
            assert peak_queue <= config.queue_frames  # bounded memory for the slow peer
            final = (await store.stream_position(session_stream(sid))).last_seq

            # The reading subscriber got every event, in order, once.
            events = await reader.until_seq(sid, final, timeout=10)
            assert seqs(events) == list(range(1, final + 1))
            # Appends never waited on the slow peer.
            assert max(durations) < config.send_timeout, f"slowest append {max(durations):.3f}s"

            # The slow client now reads what was sent before its eviction, then the close.
            try:
                async with asyncio.timeout(5):
                    async for message in slow:
                        frame = json.loads(message)
                        if frame["frame"] == "presence":  # someone joined the session
                            continue
                        assert frame["frame"] == "event", frame
                        got.append(frame["seq"])
                close_seen = True  # a normal close (1000/1001) ends the iteration
            except ConnectionClosed:
                close_seen = True  # any other close code raises
            except TimeoutError:
                pass
            assert got == list(range(1, len(got) + 1))
            assert 0 < len(got) < final
        finally:
            await slow.close()

        # Resuming from the last seq it saw gets the rest, once.
        async with h.client(max_size=None) as again:
            assert (await again.subscribe(sid, after_seq=got[-1]))["frame"] == "reply"
            rest = await again.until_seq(sid, final, timeout=10)
            assert seqs(rest) == list(range(got[-1] + 1, final + 1))
            await again.quiet(is_event, 0.1)

        assert close_seen, (
            f"the evicted connection was never closed: the client read {len(got)} events, "
            "then nothing for 5 s and no close frame"
        )
        assert slow.close_code == 4008, (slow.close_code, slow.close_reason)
        assert slow.close_reason is not None and "slow consumer" in slow.close_reason
        assert h.hub.metrics.registry.get_sample_value("sessionhub_evictions_total") == 1
        assert slow_conn not in h.hub.connections


# -- forced drops ----------------------------------------------------------------------------


async def test_forced_drops_during_a_stream_lose_nothing(store: SqliteStore) -> None:
    manager = SessionManager(store)
    sid = (await manager.create("drops")).id
    total = 300
    final = total + 1
    received: list[int] = []
    closes: list[tuple[int | None, str | None]] = []
    written = 0

    async with served(store=store) as h:

        async def subscriber() -> None:
            last = 0
            while last < final:
                async with Client.connect(h.ws_url) as c:
                    reply = await c.subscribe(sid, after_seq=last)
                    assert reply["frame"] == "reply", reply
                    while last < final:
                        try:
                            frame = await c.take(is_event, timeout=5)
                        except ConnectionError:
                            closes.append((c.close_code, c.close_reason))
                            break
                        received.append(frame["seq"])
                        last = frame["seq"]

        async def writer() -> None:
            nonlocal written
            for i in range(total):
                await manager.append(sid, text(f"m{i}", f"message {i}"))
                written += 1
                await asyncio.sleep(0.002)  # pacing, not a wait: the drops land mid-stream

        async def dropper() -> None:
            for at in (75, 150, 225):
                await eventually(lambda: written >= at, interval=0.001)  # noqa: B023 - awaited here
                live = await eventually(
                    lambda: [c for c in h.hub.connections if not c.closed and c.follows(sid)], interval=0.001
                )
                for conn in live:
                    await conn.close(1011, "test drop")

        async with asyncio.timeout(20):
            sub = asyncio.create_task(subscriber())
            await asyncio.gather(writer(), dropper())
            await sub

    assert len(closes) == 3, closes
    assert all(code == 1011 and reason == "test drop" for code, reason in closes), closes
    assert received == list(range(1, final + 1))
