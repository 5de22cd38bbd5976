"""Event retention: ``Store.prune_events`` on both stores (by age, by count, in batches, the
registry's log), the position contract over a real hub (a pruned position is ``reset``,
never a gap), the hub's background pruner and its metrics, and ``sessionhub prune``."""

from __future__ import annotations

import asyncio
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx2
import pytest

from hub import REGISTRY, SessionManager, session_stream
from hub.retention import parse_age
from hub.server import HubConfig
from hub.store.base import Store
from protocol import InvalidInput, PositionLost
from tests.apps.test_cli import one_line, run
from tests.support.hubtest import eventually, is_event, seqs, served, text


async def session_with(manager: SessionManager, appends: int) -> tuple[str, int]:
    sid = (await manager.create("s")).id
    for i in range(appends):
        await manager.append(sid, text(f"m{i}", f"message {i}"))
    return sid, (await manager.store.stream_position(session_stream(sid))).last_seq


async def test_prune_by_count_keeps_the_newest_and_every_message(store: Store) -> None:
    manager = SessionManager(store)
    sid, last = await session_with(manager, 10)
    stream = session_stream(sid)
    result = await manager.prune_events(keep_per_session=3)
    assert result.events >= last - 3 and result.streams >= 1
    position = await store.stream_position(stream)
    assert (position.first_seq, position.last_seq) == (last - 2, last)
    # Positions before the first kept event are lost, with the new first seq in the error.
    with pytest.raises(PositionLost) as lost:
        await store.read_events(stream, 0)
    assert lost.value.first_seq == last - 2
    assert [e.seq for e in await store.read_events(stream, last - 3)] == [last - 2, last - 1, last]
    # Only the log: the messages, the session and its usage are all there.
    assert [m.id for m in await manager.get_history(sid)] == [f"m{i}" for i in range(10)]
    assert await manager.get_message_count(sid) == 10
    # The next write continues the log where it was.
    await manager.append(sid, text("after", "x"))
    assert [e.seq for e in await store.read_events(stream, last)] == [last + 1]
    # Nothing more to prune at that count: a second pass is a no-op.
    again = await manager.prune_events(keep_per_session=4)
    assert again.events == 0


async def test_prune_by_age(store: Store) -> None:
    manager = SessionManager(store)
    sid, last = await session_with(manager, 8)
    stream = session_stream(sid)
    events = await store.read_events(stream, 0)
    cutoff = events[5].created_at
    expected = next(e.seq for e in events if e.created_at >= cutoff)  # the first one kept
    result = await manager.prune_events(older_than=cutoff)
    position = await store.stream_position(stream)
    assert position.first_seq == expected and position.last_seq == last
    assert result.events >= expected - 1
    assert [e.seq for e in await store.read_events(stream, expected - 1)] == list(range(expected, last + 1))
    # An age (timedelta) prunes from now: a day keeps everything written in this test.
    assert (await manager.prune_events(older_than=timedelta(days=1))).events == 0
    assert len(await manager.get_history(sid)) == 8


async def test_an_event_read_as_the_cutoff_is_kept(db_path: Path) -> None:
    # SQLite stores epoch-seconds floats; an event reads back rounded to the microsecond.
    # One stored just under what it reads as must not count as older than that time.
    from hub import SqliteStore

    stored = 1764620000.1234567  # reads back as ...123457, above what is stored
    assert datetime.fromtimestamp(stored, UTC).timestamp() > stored
    async with await SqliteStore.open(db_path) as store:
        manager = SessionManager(store)
        sid, _ = await session_with(manager, 3)
        stream = session_stream(sid)
    with sqlite3.connect(db_path) as conn:
        conn.execute(
            "UPDATE events SET created_at = ? "
            "WHERE sk = (SELECT sk FROM streams WHERE stream = ?) AND seq >= 2",
            (stored, stream),
        )
        conn.execute(
            "UPDATE events SET created_at = ? "
            "WHERE sk = (SELECT sk FROM streams WHERE stream = ?) AND seq = 1",
            (stored - 1, stream),
        )
    async with await SqliteStore.open(db_path) as store:
        events = await store.read_events(stream, 0)
        await store.prune_events(older_than=events[1].created_at)
        assert (await store.stream_position(stream)).first_seq == 2


async def test_prune_everything_in_small_batches_then_the_log_goes_on(store: Store) -> None:
    manager = SessionManager(store)
    sid, last = await session_with(manager, 9)
    stream = session_stream(sid)
    result = await store.prune_events(older_than=datetime.now(UTC) + timedelta(seconds=60), batch=2)
    assert result.events >= last
    position = await store.stream_position(stream)
    # An empty log: first_seq is one past last_seq, so a reader at last_seq is not lost.
    assert (position.first_seq, position.last_seq) == (last + 1, last)
    assert await store.read_events(stream, last) == []
    with pytest.raises(PositionLost):
        await store.read_events(stream, last - 1)
    await manager.append(sid, text("next", "x"))
    assert [e.seq for e in await store.read_events(stream, last)] == [last + 1]
    assert await store.count_events() == 1 + 0  # the session's new event; the registry's are gone


async def test_the_registry_log_prunes_the_same_way(store: Store) -> None:
    manager = SessionManager(store)
    for i in range(6):
        await manager.create(f"r{i}")
    before = await store.stream_position(REGISTRY)
    assert before.last_seq == 6
    await manager.prune_events(keep_per_session=2)
    after = await store.stream_position(REGISTRY)
    assert (after.first_seq, after.last_seq, after.epoch) == (5, 6, before.epoch)
    with pytest.raises(PositionLost):
        await manager.read_registry_events(0)
    assert [e.seq for e in await manager.read_registry_events(4)] == [5, 6]
    assert len(await manager.list()) == 6


async def test_count_events_follows_appends_and_prunes(store: Store) -> None:
    manager = SessionManager(store)
    assert await store.count_events() == 0
    _sid, last = await session_with(manager, 4)
    assert await store.count_events() == last + 1  # the session's log and the registry's one
    await manager.prune_events(keep_per_session=1)
    assert await store.count_events() == 2


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({}, "older_than or keep_per_session"),
        ({"keep_per_session": -1}, "at least 0"),
        ({"keep_per_session": "3"}, "must be an integer"),
        ({"older_than": "30d"}, "must be a datetime"),
        ({"keep_per_session": 1, "batch": 0}, "batch must be at least 1"),
    ],
)
async def test_bad_prune_arguments_are_refused(store: Store, kwargs: dict[str, object], says: str) -> None:
    with pytest.raises(InvalidInput, match=says):
        await store.prune_events(**kwargs)  # type: ignore[arg-type]


def test_ages() -> None:
    assert parse_age("30d") == timedelta(days=30)
    assert parse_age("90s") == timedelta(seconds=90)
    assert parse_age("2w") == timedelta(weeks=2)
    assert parse_age("1.5h") == timedelta(minutes=90)
    for bad in ("", "30", "d", "-1d", "0s", "30 days"):
        with pytest.raises(InvalidInput):
            parse_age(bad)


# -- over a real hub ---------------------------------------------------------------------------


async def test_a_subscriber_resuming_from_a_pruned_position_is_reset(store: Store) -> None:
    manager = SessionManager(store)
    sid, last = await session_with(manager, 3)
    async with served(store=store) as h:
        async with h.client() as c:
            reply = await c.subscribe(sid, after_seq=0)
            assert reply["frame"] == "reply"
            epoch = reply["result"]["epoch"]
            assert seqs(await c.events(sid, last)) == list(range(1, last + 1))
        # Gone for a while: more is written, then pruned to the newest 2.
        for i in range(5):
            await manager.append(sid, text(f"later{i}", "x"))
        await manager.prune_events(keep_per_session=2)
        now = await store.stream_position(session_stream(sid))
        assert now.first_seq == now.last_seq - 1
        async with h.client() as c:
            frame = await c.subscribe(sid, after_seq=last, epoch=epoch)
            assert frame["frame"] == "reset", f"a pruned position was served: {frame}"
            assert (frame["first_seq"], frame["last_seq"], frame["epoch"]) == (
                now.first_seq,
                now.last_seq,
                epoch,
            )
            await c.quiet(is_event, 0.1)
            # The reset's last_seq is a position the log serves: live from there.
            assert (await c.subscribe(sid, after_seq=frame["last_seq"], epoch=epoch))["frame"] == "reply"
            await manager.append(sid, text("live", "x"))
            assert seqs(await c.events(sid, 1)) == [now.last_seq + 1]


async def test_a_registry_subscriber_resuming_from_a_pruned_position_is_reset(store: Store) -> None:
    manager = SessionManager(store)
    for i in range(5):
        await manager.create(f"r{i}")
    epoch = (await store.stream_position(REGISTRY)).epoch
    await manager.prune_events(keep_per_session=1)
    async with served(store=store) as h, h.client() as c:
        frame = await c.subscribe(None, after_seq=2, epoch=epoch)
        assert frame["frame"] == "reset" and (frame["first_seq"], frame["last_seq"]) == (5, 5)


async def test_the_hub_prunes_in_the_background_and_shows_it_in_metrics(store: Store) -> None:
    manager = SessionManager(store)
    sid, last = await session_with(manager, 6)
    config = HubConfig(retain_events_per_session=2, retention_interval=0.05)
    async with served(store=store, config=config) as h:
        stream = session_stream(sid)

        async def pruned() -> bool:
            return (await store.stream_position(stream)).first_seq == last - 1

        await eventually(pruned)
        async with httpx2.AsyncClient() as http:
            body = (await http.get(h.url + "/metrics")).text
        values = {
            line.split()[0]: float(line.split()[1])
            for line in body.splitlines()
            if line.startswith(("sessionhub_log_events", "sessionhub_events_pruned_total"))
        }
        assert values["sessionhub_events_pruned_total"] >= last - 2
        assert values["sessionhub_log_events"] == await store.count_events()
        # New writes are pruned by the next passes too.
        for i in range(4):
            await manager.append(sid, text(f"n{i}", "x"))

        async def pruned_again() -> bool:
            p = await store.stream_position(stream)
            return p.last_seq == last + 4 and p.first_seq == last + 3

        await eventually(pruned_again)
        assert len(await manager.get_history(sid)) == 10


async def test_without_a_policy_the_hub_keeps_everything(store: Store) -> None:
    manager = SessionManager(store)
    sid, _last = await session_with(manager, 3)
    async with served(store=store) as h:
        assert h.hub.retention.task is None
        assert (await store.stream_position(session_stream(sid))).first_seq == 1


# -- the command ------------------------------------------------------------------------------


async def test_sessionhub_prune(tmp_path: Path) -> None:
    from hub import SqliteStore

    db = tmp_path / "hub.db"
    async with await SqliteStore.open(db) as s:
        sid, last = await session_with(SessionManager(s), 5)
    result = await asyncio.to_thread(run, "prune", "--db", str(db), "--keep-per-session", "2")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"pruned {last - 2 + 0} events from 1 logs"]
    with sqlite3.connect(db) as conn:
        assert conn.execute(
            "SELECT first_seq FROM streams WHERE stream = ?", (session_stream(sid),)
        ).fetchone() == (last - 1,)
    result = await asyncio.to_thread(run, "prune", "--db", str(db), "--older-than", "30d")
    assert (result.returncode, result.stdout.strip()) == (0, "pruned 0 events from 0 logs")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["prune"], "prune needs --older-than AGE or --keep-per-session N"),
        (["prune", "--older-than", "soon"], "not an age: 'soon'"),
        (["prune", "--keep-per-session", "-3"], "must be at least 0"),
        (["prune", "--keep-per-session", "1", "--db", "mysql://x/y"], "unsupported scheme 'mysql'"),
        (["serve", "--retain-events", "forever"], "not an age: 'forever'"),
        (["serve", "--retain-events-per-session", "0"], "must be at least 1"),
    ],
)
def test_retention_options_are_checked_in_one_line(tmp_path: Path, args: list[str], says: str) -> None:
    if args[0] == "prune" and "--db" not in args:
        args = [*args, "--db", str(tmp_path / "x.db")]
    result = run(*args, cwd=tmp_path)
    assert result.returncode == 2
    assert says in one_line(result)
