"""The event log: every change, in the same transaction, gap-free per session, followable."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from hub import REGISTRY, Event, PositionLost, Session, SessionManager, SqliteStore, session_stream
from hub.events import follow
from tests.support.hubtest import eventually
from tests.support.hubtest import text_message as T


def summary(events: list[Event]) -> list[tuple[int, str]]:
    return [(e.seq, e.type) for e in events]


async def test_every_message_change_is_an_event_with_its_data(store: SqliteStore) -> None:
    s = Session(store, session_id="ev")
    await s.append_message(T("m1", "user", "one"))
    await s.append_message(T("m2", "assistant", "two"))
    await s.append_message(T("m3", "user", "branch"), "m1")
    await s.update_message(T("m2", "assistant", "two, edited"))
    c = await s.add_compaction("sum", "m1", "m2")
    await s.delete_messages(["m1"])
    await s.clear_messages()
    events = await s.read_events()
    assert summary(events) == [
        (1, "message.appended"),
        (2, "message.appended"),
        (3, "message.appended"),
        (4, "message.updated"),
        (5, "compaction.added"),
        (6, "message.deleted"),
        (7, "messages.cleared"),
    ]
    assert all(e.session_id == "ev" and e.stream == "session" for e in events)
    assert len({e.epoch for e in events}) == 1 and events[0].epoch
    assert events[0].data == {"message": T("m1", "user", "one"), "parent_id": None}
    assert events[1].data["parent_id"] == "m1"
    assert events[2].data == {"message": T("m3", "user", "branch"), "parent_id": "m1"}
    assert events[3].data == {"message": T("m2", "assistant", "two, edited")}
    compaction: dict[str, Any] = events[4].data["compaction"]
    assert compaction["id"] == c.id and compaction["summary"] == "sum"
    assert compaction["from_message_id"] == "m1" and compaction["to_message_id"] == "m2"
    # A subscriber can update its tree from the event alone: who moved where.
    assert events[5].data == {"ids": ["m1"], "reparented": [["m2", None], ["m3", None]]}
    assert events[6].data == {}


async def test_no_op_writes_log_nothing(store: SqliteStore) -> None:
    s = Session(store)
    await s.append_message(T("m1", "user", "x"))
    await s.append_message(T("m1", "user", "duplicate"))
    await s.update_message(T("ghost", "user", "x"))
    await s.delete_messages(["ghost"])
    assert summary(await s.read_events()) == [(1, "message.appended")]


async def test_seq_is_per_session(store: SqliteStore) -> None:
    a, b = Session(store, session_id="a"), Session(store, session_id="b")
    await a.append_message(T("1", "user", "x"))
    await b.append_message(T("1", "user", "x"))
    await a.append_message(T("2", "user", "x"))
    assert [e.seq for e in await a.read_events()] == [1, 2]
    assert [e.seq for e in await b.read_events()] == [1]


async def test_seq_is_gap_free_under_concurrency(store: SqliteStore) -> None:
    manager = SessionManager(store)
    info = await manager.create("busy")

    async def work(w: int) -> None:
        for i in range(25):
            await manager.append(info.id, T(f"{w}-{i}", "user", "x"))
            if i % 5 == 0:
                await manager.add_usage(info.id, 1, 1, 0.0)

    await asyncio.gather(*(work(w) for w in range(6)))
    events = await store.read_events(session_stream(info.id), 0, 10_000)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert len([e for e in events if e.type == "message.appended"]) == 150
    assert len([e for e in events if e.type == "session.usage"]) == 30


async def test_read_events_pages_and_limits(store: SqliteStore) -> None:
    s = Session(store)
    for i in range(10):
        await s.append_message(T(f"m{i}", "user", "x"))
    assert [e.seq for e in await s.read_events(3, 4)] == [4, 5, 6, 7]
    assert await s.read_events(10) == []


async def test_positions_the_log_cannot_serve(store: SqliteStore) -> None:
    s = Session(store, session_id="p")
    await s.append_message(T("m1", "user", "x"))
    stream = session_stream("p")
    epoch = (await store.stream_position(stream)).epoch
    with pytest.raises(PositionLost) as info:
        await store.read_events(stream, 5)
    assert info.value.last_seq == 1 and info.value.code == "reset"
    with pytest.raises(PositionLost):
        await store.read_events(stream, 0, epoch="another-epoch")
    assert len(await store.read_events(stream, 0, epoch=epoch)) == 1
    with pytest.raises(PositionLost):
        await store.read_events(stream, -1)
    # An empty stream serves position 0 and nothing else.
    assert await store.read_events(session_stream("never"), 0) == []


async def test_registry_stream(store: SqliteStore) -> None:
    manager = SessionManager(store)
    a = await manager.create("A", model="m", source="web")
    await manager.rename(a.id, "A2")
    await manager.add_usage(a.id, 10, 5, 0.25)
    await manager.append(a.id, T("x1", "user", "hi"))
    fork = await manager.fork(a.id, "x1", "fork")
    cont = await manager.compact_and_split(a.id, "summary")
    await manager.delete(fork.id)
    events = await manager.read_registry_events()
    assert [(e.type, e.session_id) for e in events] == [
        ("session.created", a.id),
        ("session.renamed", a.id),
        ("session.usage", a.id),
        ("session.forked", fork.id),
        ("session.ended", a.id),
        ("session.created", cont.id),
        ("session.deleted", fork.id),
    ]
    assert [e.seq for e in events] == list(range(1, 8))
    assert all(e.stream == "registry" for e in events)
    assert events[0].data["session"]["name"] == "A" and events[0].data["session"]["model"] == "m"
    assert events[1].data["session"]["name"] == "A2"
    assert events[2].data["delta"] == {"input_tokens": 10, "output_tokens": 5, "cost": 0.25}
    assert events[2].data["session"]["input_tokens"] == 10
    assert events[3].data["from_session_id"] == a.id and events[3].data["at_message_id"] == "x1"
    assert events[4].data["session"]["end_reason"] == "compaction"
    # Registry changes are also in the session's own log.
    own = await store.read_events(session_stream(a.id))
    assert [e.type for e in own] == [
        "session.created",
        "session.renamed",
        "session.usage",
        "message.appended",
        "session.ended",
    ]
    assert [e.type for e in await store.read_events(session_stream(cont.id))] == [
        "session.created",
        "message.appended",
    ]


async def test_deleted_session_keeps_only_a_final_event(store: SqliteStore) -> None:
    manager = SessionManager(store)
    info = await manager.create("doomed")
    await manager.append(info.id, T("m1", "user", "secret"))
    stream = session_stream(info.id)
    await manager.delete(info.id)
    pos = await store.stream_position(stream)
    assert (pos.first_seq, pos.last_seq) == (3, 3)
    final = await store.read_events(stream, 2)
    assert [(e.seq, e.type) for e in final] == [(3, "session.deleted")]
    assert final[0].data["session"]["id"] == info.id
    # The bodies went with the session: an older position must reload (and find nothing).
    with pytest.raises(PositionLost):
        await store.read_events(stream, 0)


async def test_follow_yields_backlog_then_live(store: SqliteStore) -> None:
    s = Session(store, session_id="live")
    for i in range(3):
        await s.append_message(T(f"m{i}", "user", "x"))
    got: list[int] = []

    async def consume() -> None:
        async for event in s.events(after_seq=1):
            got.append(event.seq)
            if event.seq == 6:
                return

    task = asyncio.create_task(consume())
    await eventually(lambda: len(got) == 2)  # the backlog is read: what comes next is live
    for i in range(3, 6):
        await s.append_message(T(f"m{i}", "user", "x"))
    await asyncio.wait_for(task, 5)
    assert got == [2, 3, 4, 5, 6]


async def test_follow_misses_nothing_committed_while_reading_the_backlog(
    store: SqliteStore,
) -> None:
    s = Session(store, session_id="race")
    total = 300
    got: list[int] = []

    async def consume() -> None:
        async for event in follow(store, session_stream("race"), 0, batch=7):
            got.append(event.seq)
            if event.seq == total:
                return

    async def produce() -> None:
        for i in range(total):
            await s.append_message(T(f"m{i}", "user", "x"))
            if i % 13 == 0:
                await asyncio.sleep(0)  # a yield, not a wait: the consumer reads between writes

    await asyncio.wait_for(asyncio.gather(consume(), produce()), 20)
    assert got == list(range(1, total + 1))


async def test_follow_registry(store: SqliteStore) -> None:
    manager = SessionManager(store)
    names: list[str] = []

    async def consume() -> None:
        async for event in manager.registry_events():
            names.append(event.data["session"]["name"])
            if len(names) == 2:
                return

    task = asyncio.create_task(consume())
    await manager.create("one")
    await manager.create("two")
    await asyncio.wait_for(task, 5)
    assert names == ["one", "two"]
    assert (await store.stream_position(REGISTRY)).last_seq == 2


async def test_follow_raises_position_lost(store: SqliteStore) -> None:
    s = Session(store, session_id="lost")
    await s.append_message(T("m1", "user", "x"))
    with pytest.raises(PositionLost):
        async for _ in s.events(after_seq=50):
            pass
