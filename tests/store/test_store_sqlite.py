"""SqliteStore: migrations, WAL, transactions with their events, concurrency, failures."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import os
import re
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

from hub import (
    InvalidInput,
    Message,
    Session,
    SessionManager,
    SessionNotFound,
    SqliteStore,
    StoreClosed,
    StoreError,
    session_stream,
)
from hub.store import sqlite as sqlite_store
from hub.store.sqlite import CHECKPOINT_EVERY, MIGRATIONS
from hub.store.sqlite import connection as sqlite_connection
from protocol import SessionInfo, StoreUnavailable
from tests.support.hubtest import text_message as T


def raw(db_path: Path) -> sqlite3.Connection:
    return sqlite3.connect(db_path)


async def test_schema_is_created_and_versioned(store: SqliteStore, db_path: Path) -> None:
    with raw(db_path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"sessions", "messages", "messages_fts", "compactions", "streams", "events"} <= tables


async def test_reopen_does_not_migrate_twice(db_path: Path) -> None:
    async with await SqliteStore.open(db_path) as store:
        await Session(store).append_message(T("m1", "user", "kept"))
    async with await SqliteStore.open(db_path) as store:
        assert len(await Session(store).get_history()) == 1


async def test_newer_schema_is_refused(db_path: Path) -> None:
    async with await SqliteStore.open(db_path):
        pass
    with raw(db_path) as conn:
        conn.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
    with pytest.raises(StoreError, match="newer"):
        await SqliteStore.open(db_path)


async def test_memory_store_works() -> None:
    async with await SqliteStore.open(":memory:") as store:
        s = Session(store)
        await s.append_message(T("m1", "user", "hello"))
        assert [m.id for m in await s.get_history()] == ["m1"]
        assert [r.id for r in await s.search("hello")] == ["m1"]


async def test_memory_store_reads_and_writes_at_once() -> None:
    # In memory, reads and writes share one connection: a write must not begin inline while
    # a read runs in the connection's thread ("cannot start a transaction within a
    # transaction", first met by an MCP listener's feed reading the log during writes).
    async with await SqliteStore.open(":memory:") as store:
        s = Session(store)

        async def reads() -> None:
            for _ in range(100):
                await s.read_events()

        async def writes() -> None:
            for i in range(100):
                await s.append_message(T(f"m{i}", "user", "hello"))
                await asyncio.sleep(0)

        await asyncio.gather(reads(), reads(), writes())
        assert await s.get_path_length() == 100


async def test_closed_store_raises_store_closed(db_path: Path) -> None:
    store = await SqliteStore.open(db_path)
    await store.close()
    await store.close()  # idempotent
    with pytest.raises(StoreClosed):
        await Session(store).get_history()
    with pytest.raises(StoreClosed):
        await Session(store).append_message(T("m1", "user", "x"))


async def test_failed_write_leaves_neither_change_nor_event(store: SqliteStore, db_path: Path) -> None:
    s = Session(store, session_id="tx")
    await s.append_message(T("m0", "user", "before"))
    with raw(db_path) as conn:
        conn.execute(
            "CREATE TRIGGER boom BEFORE INSERT ON messages WHEN NEW.id = 'boom' "
            "BEGIN SELECT RAISE(ABORT, 'boom refused'); END"
        )
    batch = [Message(id=i, role="user", parts=[{"type": "text", "text": i}]) for i in ("ok1", "ok2", "boom")]
    with pytest.raises(StoreError, match="boom refused"):
        await store.append_messages("tx", batch)
    assert [m.id for m in await s.get_history()] == ["m0"]
    assert [e.seq for e in await s.read_events()] == [1]
    assert (await store.stream_position(session_stream("tx"))).last_seq == 1
    assert await s.search("ok1") == []
    # The next write gets the next seq: no gap from the rolled-back one.
    await s.append_message(T("m1", "user", "after"))
    assert [e.seq for e in await s.read_events()] == [1, 2]


async def test_managed_write_to_unknown_session_writes_nothing(store: SqliteStore) -> None:
    with pytest.raises(SessionNotFound):
        await store.append_messages("ghost", [Message(id="m", role="user", parts=[])], managed=True)
    assert await Session(store, session_id="ghost").get_history() == []
    assert (await store.stream_position(session_stream("ghost"))).last_seq == 0


async def test_concurrent_appends_lose_and_duplicate_nothing(store: SqliteStore) -> None:
    s = Session(store, session_id="busy")
    n = 400

    async def writer(w: int) -> None:
        for i in range(n // 8):
            await s.append_message(T(f"w{w}-{i}", "user", f"writer {w} message {i}"))

    await asyncio.gather(*(writer(w) for w in range(8)))
    history = await s.get_history()
    # Every append attached to the latest leaf inside its own transaction: one chain.
    assert len(history) == n
    assert len({m.id for m in history}) == n
    assert await s.get_path_length() == n
    events = await s.read_events(limit=10_000)
    assert [e.seq for e in events] == list(range(1, n + 1))
    assert [e.data["message"]["id"] for e in events] == [m.id for m in history]
    for prev, event in itertools.pairwise(events):
        assert event.data["parent_id"] == prev.data["message"]["id"]


async def test_duplicate_ids_racing_store_one_message(store: SqliteStore) -> None:
    s = Session(store)
    results = await asyncio.gather(*(s.append_message(T("same", "user", f"v{i}")) for i in range(20)))
    assert results.count(True) == 1
    assert len(await s.get_history()) == 1
    assert len(await s.read_events()) == 1


async def test_reads_during_writes_see_whole_changes(store: SqliteStore) -> None:
    s = Session(store, session_id="rw")
    stop = asyncio.Event()
    seen: list[int] = []

    async def reader() -> None:
        while not stop.is_set():
            history = await s.get_history()
            events = await s.read_events(limit=100_000)
            # Each append_all below writes 10 messages in one transaction.
            assert len(history) % 10 == 0
            assert len(events) >= len(history) // 10
            seen.append(len(history))

    task = asyncio.create_task(reader())
    for batch in range(30):
        await store.append_messages(
            "rw", [Message(id=f"b{batch}-{i}", role="user", parts=[]) for i in range(10)]
        )
        await asyncio.sleep(0)
    stop.set()
    await task
    assert len(await s.get_history()) == 300
    assert seen


async def test_two_stores_on_one_file_never_see_database_locked(db_path: Path) -> None:
    a = await SqliteStore.open(db_path)
    b = await SqliteStore.open(db_path)
    try:
        sa, sb = Session(a, session_id="x"), Session(b, session_id="x")

        async def write(session: Session, prefix: str) -> None:
            for i in range(100):
                await session.append_message(T(f"{prefix}{i}", "user", "x"))

        await asyncio.gather(write(sa, "a"), write(sb, "b"))
        assert await sa.get_path_length() == 200
        assert [e.seq for e in await sb.read_events(limit=1000)] == list(range(1, 201))
    finally:
        await a.close()
        await b.close()


async def test_manager_and_session_share_one_store(store: SqliteStore) -> None:
    manager = SessionManager(store)
    info = await manager.create("shared")
    await manager.append(info.id, T("m1", "user", "x"))
    assert [m.id for m in await manager.get_session(info.id).get_history()] == ["m1"]


async def test_a_locked_database_never_blocks_the_event_loop(store: SqliteStore, db_path: Path) -> None:
    # Another process holds the write lock for a while: the append must wait for it in the
    # writer's thread (busy timeout), while the event loop keeps serving everyone else.
    s = Session(store, session_id="locked")
    await s.append_message(T("m0", "user", "before"))
    holder = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    tick_task = asyncio.create_task(ticker())
    append = asyncio.create_task(s.append_message(T("m1", "user", "while locked")))
    await asyncio.sleep(0.3)  # proves a negative: the append stays blocked on the lock
    assert not append.done()
    assert ticks >= 10  # the loop kept running while the write waited
    holder.execute("COMMIT")
    holder.close()
    assert await asyncio.wait_for(append, 5)
    tick_task.cancel()
    assert [m.id for m in await s.get_history()] == ["m0", "m1"]


async def test_a_database_locked_past_the_busy_timeout_is_unavailable_not_internal(
    store: SqliteStore, db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another process keeps the write lock past the busy timeout: the append is refused as
    # "unavailable" (retry later; SQLite rolled it back), not as the hub's own failure.
    monkeypatch.setattr(sqlite_connection, "BUSY_TIMEOUT_MS", 100)
    s = Session(store, session_id="held")
    await s.append_message(T("m0", "user", "before"))
    holder = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(StoreUnavailable, match="locked by another process") as refused:
            await s.append_message(T("m1", "user", "while locked"))
        assert refused.value.code == "unavailable"
        assert refused.value.outcome == "not_applied"
    finally:
        holder.execute("COMMIT")
        holder.close()
    assert [m.id for m in await s.get_history()] == ["m0"]
    assert await s.append_message(T("m1", "user", "after"))


BIG = "lorem ipsum dolor sit amet " * 2400  # ~64 KiB, stored whole (keep_rows_whole)


@pytest.mark.usefixtures("keep_rows_whole")
async def test_background_checkpoints_copy_the_wal_without_the_write_lock(db_path: Path) -> None:
    # Under the WAL limit every checkpoint is a passive pass in the checkpointer's thread:
    # pages reach the database file while no pass ever takes the writers' lock.
    async with await SqliteStore.open(db_path) as store:
        s = Session(store, session_id="wal")
        for i in range(CHECKPOINT_EVERY * 4):
            await s.append_message(T(f"m{i}", "user", BIG))
        checkpointer = store._checkpointer
        assert checkpointer is not None
        await checkpointer.settle()
        assert checkpointer.passes >= 3
        assert checkpointer.catch_ups == 0
        assert os.path.getsize(db_path) > CHECKPOINT_EVERY * 3 * len(BIG)  # noqa: ASYNC240


@pytest.mark.usefixtures("keep_rows_whole")
async def test_a_passive_pass_finishes_while_another_writer_holds_the_lock(db_path: Path) -> None:
    # Proof the background pass needs no write lock: it completes while another connection
    # sits in a write transaction (a RESTART or TRUNCATE checkpoint would wait for it).
    async with await SqliteStore.open(db_path) as store:
        s = Session(store, session_id="wal")
        for i in range(CHECKPOINT_EVERY - 1):
            await s.append_message(T(f"m{i}", "user", "x"))
        checkpointer = store._checkpointer
        assert checkpointer is not None
        assert checkpointer.passes == 0
        holder = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False)
        try:
            holder.execute("BEGIN IMMEDIATE")
            holder.execute("INSERT INTO context_blocks VALUES ('k', 'v', 0)")
            checkpointer.wake(lambda: 0)  # what the 50th commit does
            await asyncio.wait_for(checkpointer.settle(), 5)
            assert checkpointer.passes == 1
            assert checkpointer.wal_bytes == 0  # every committed frame was copied
        finally:
            holder.execute("ROLLBACK")
            holder.close()


async def test_the_wal_stays_bounded_under_nonstop_large_appends(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Appends that never pause (and never yield to the event loop: inline writes need
    # not) leave no gap for a passive pass to finish, so only the catch-up past the limit
    # bounds the WAL. Without it the -wal file would grow to the ~30 MiB written here.
    limit = 2 * 2**20
    monkeypatch.setattr(sqlite_store.checkpoint, "WAL_LIMIT_BYTES", limit)
    async with await SqliteStore.open(db_path) as store:
        s = Session(store, session_id="wal")
        wal = Path(f"{db_path}-wal")
        peak = 0
        for i in range(300):
            await s.append_message(T(f"m{i}", "user", BIG))
            peak = max(peak, os.stat(wal).st_size)
        checkpointer = store._checkpointer
        assert checkpointer is not None
        assert checkpointer.catch_ups >= 3
        with raw(db_path) as conn:
            assert conn.execute("PRAGMA journal_size_limit").fetchone()[0] == -1  # per connection
    # Past the limit by a few commits of ~330 KiB each (message, event, FTS pages) at most:
    # the writer that sees the file over the limit runs the catch-up before returning.
    assert peak < 3 * limit, peak
    assert len(stored_ids(db_path)) == 300


def stored_ids(db_path: Path) -> list[str]:
    with raw(db_path) as conn:
        return [
            r[0]
            for r in conn.execute(
                "SELECT id FROM messages WHERE sk = (SELECT sk FROM streams WHERE stream = 's:wal')"
            )
        ]


async def test_synchronous_stays_normal_with_the_checkpointer(store: SqliteStore, db_path: Path) -> None:
    # Durability is the setting's: NORMAL in WAL mode (a commit survives a crash of the
    # process). The checkpointer's connection uses the same setting.
    assert await store._writer.call(lambda c: c.execute("PRAGMA synchronous").fetchone()[0]) == 1
    # The WAL's file is cut back to the checkpoint bound when it restarts, so that a burst
    # gives its space back (docs/operations.md, "What survives what": the disk full).
    assert await store._writer.call(lambda c: c.execute("PRAGMA journal_size_limit").fetchone()[0]) == (
        sqlite_store.WAL_CHECKPOINT_BYTES
    )


CRASH_WRITER = """
import asyncio, sys
import hub.store.sqlite.checkpoint as checkpoint
from hub import Session, SqliteStore

checkpoint.WAL_LIMIT_BYTES = 1 << 20  # many catch-ups before the kill

async def main() -> None:
    store = await SqliteStore.open(sys.argv[1])
    s = Session(store, session_id="crash")
    text = "lorem ipsum dolor sit amet " * 2400
    i = 0
    while True:
        await s.append_message({"id": f"m{i}", "role": "user", "parts": [{"type": "text", "text": text}]})
        print(f"m{i}", store._checkpointer.catch_ups, flush=True)  # acknowledged
        i += 1

asyncio.run(main())
"""


def test_acknowledged_appends_survive_sigkill_across_checkpoints(db_path: Path) -> None:
    acked: list[str] = []
    with subprocess.Popen(
        [sys.executable, "-c", CRASH_WRITER, str(db_path)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    ) as proc:
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                message_id, catch_ups = line.split()
                acked.append(message_id)
                if int(catch_ups) >= 3 and len(acked) >= 120:
                    break
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
    assert len(acked) >= 120
    with raw(db_path) as conn:
        stored = {
            r[0]
            for r in conn.execute(
                "SELECT id FROM messages WHERE sk = (SELECT sk FROM streams WHERE stream = 's:crash')"
            )
        }
        seqs = [
            r[0]
            for r in conn.execute(
                "SELECT seq FROM events WHERE sk = (SELECT sk FROM streams WHERE stream = 's:crash') "
                "ORDER BY seq"
            )
        ]
    assert set(acked) <= stored
    assert seqs == list(range(1, len(seqs) + 1))


# -- poisoned rows (issue 12) -----------------------------------------------------------------


async def test_a_poisoned_usage_row_reads_back_sanitized(db_path: Path) -> None:
    """Rows written before add_usage checked its bounds (an infinite cost, a token total
    that SQLite turned into a REAL on overflow, a text) must not fail every list() and get():
    they read back clamped, and the next add_usage goes on from the clamped values."""
    store = await SqliteStore.open(db_path)
    manager = SessionManager(store)
    try:
        poisoned = [await manager.create(f"p{i}") for i in range(3)]
        healthy = await manager.create("healthy")
        conn = raw(db_path)
        with conn:
            for (tokens_in, tokens_out, cost), info in zip(
                [(2.0**64, -(2.0**64), float("inf")), ("many", None, -float("inf")), (1, 2, "cheap")],
                poisoned,
                strict=True,
            ):
                conn.execute(
                    "UPDATE sessions SET input_tokens = ?, output_tokens = coalesce(?, 0), "
                    "estimated_cost = ? WHERE id = ?",
                    (tokens_in, tokens_out, cost, info.id),
                )
        conn.close()
        listed = {i.id: i for i in await manager.list()}
        assert listed[healthy.id] == healthy
        first = listed[poisoned[0].id]
        assert (first.input_tokens, first.output_tokens) == (2**63 - 1, -(2**63))
        assert first.estimated_cost == sys.float_info.max
        second = listed[poisoned[1].id]
        assert (second.input_tokens, second.output_tokens, second.estimated_cost) == (
            0,
            0,
            -sys.float_info.max,
        )
        assert listed[poisoned[2].id].estimated_cost == 0.0
        assert await manager.get(poisoned[0].id) == first
        # The wire form is valid JSON a client decodes (no null for a float).
        assert msgspec.json.decode(msgspec.json.encode(first), type=SessionInfo) == first
        # Adding to a clamped total that would overflow is refused; adding below it works.
        with pytest.raises(InvalidInput):
            await manager.add_usage(poisoned[0].id, 1, 0, 0.0)
        healed = await manager.add_usage(poisoned[0].id, -1, 1, -1e308)
        assert healed.input_tokens == 2**63 - 2 and math.isfinite(healed.estimated_cost)
    finally:
        await store.close()


async def test_a_stored_message_nested_too_deeply_is_skipped_not_fatal(db_path: Path) -> None:
    store = await SqliteStore.open(db_path)
    session = Session(store).for_session("s")
    try:
        await session.append_message(T("m1", "user", "kept"))
        await session.append_message(T("m2", "user", "poisoned"))
        conn = raw(db_path)
        with conn:
            deep = '{"id":"m2","role":"user","parts":[{"type":"x","v":' + "[" * 5000 + "]" * 5000 + "}]}"
            conn.execute("UPDATE messages SET content = ? WHERE id = 'm2'", (deep,))
            conn.execute(
                "UPDATE messages SET content = ? WHERE id = 'm1'",
                ('{"id":"m1","role":"user","parts":[{"type":"text","text":"kept","n":' + "9" * 5000 + "}]}",),
            )
        conn.close()
        # Neither a RecursionError nor msgspec's "integer out of range" escapes the read.
        assert [m.id for m in await session.get_history()] == []
        assert await session.get_message("m2") is None
    finally:
        await store.close()


# -- footprint: contentless index, referring events (migration 5) ---------------------------


def _m(message_id: str, text: str) -> Message:
    return Message.from_dict(T(message_id, "user", text))


def _old_database(path: Path) -> None:
    """A file as sessionhub wrote it before migration 5: the index holds its own copy of
    the text and every message.appended event the whole message."""
    conn = sqlite3.connect(path, isolation_level=None)
    for migration in MIGRATIONS[:4]:
        for statement in migration.split(";\n"):
            if statement.strip():
                conn.execute(statement)
    conn.execute("PRAGMA user_version = 4")
    now = 1_700_000_000.0
    conn.execute(
        "INSERT INTO sessions (id, name, created_at, updated_at) VALUES ('old', 'old', ?, ?)", (now, now)
    )
    conn.execute("INSERT INTO streams VALUES ('s:old', 'e0', 1, 2)")
    parent = None
    for i, text in enumerate(["alpha beta gamma", "delta epsilon"]):
        content = msgspec.json.encode(
            {"id": f"m{i}", "role": "user", "parts": [{"type": "text", "text": text}]}
        )
        pk = conn.execute(
            "INSERT INTO messages (session_id, id, parent_pk, role, content, created_at) "
            "VALUES ('old', ?, ?, 'user', ?, ?) RETURNING pk",
            (f"m{i}", parent, content.decode(), now),
        ).fetchone()[0]
        conn.execute(
            "INSERT INTO messages_fts (rowid, sid, body) VALUES (?, ?, ?)",
            (pk, sqlite_store.sql.sid_token("old"), text),
        )
        parent_id = None if parent is None else f"m{i - 1}"
        data = f'{{"message":{content.decode()},"parent_id":{msgspec.json.encode(parent_id).decode()}}}'
        conn.execute(
            "INSERT INTO events VALUES ('s:old', ?, 'old', 'message.appended', ?, ?)", (i + 1, data, now)
        )
        parent = pk
    conn.execute("INSERT INTO session_stats VALUES ('old', 2)")
    conn.close()


async def test_migration_5_keeps_an_old_file_reading_the_same(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    _old_database(path)
    store = await SqliteStore.open(path)
    try:
        assert [m.text() for m in await store.get_history("old")] == ["alpha beta gamma", "delta epsilon"]
        hits = await store.search_messages("epsilon", session_id="old")
        assert [(h.id, h.content) for h in hits] == [("m1", "delta epsilon")]
        events = await store.read_events("s:old")
        assert [e.data["message"]["id"] for e in events] == ["m0", "m1"]
        assert events[1].data["parent_id"] == "m0"
        # Migrated index rows come out again: the old words stop matching after an update.
        await store.update_message("old", _m("m1", "zeta only"))
        assert await store.search_messages("epsilon", session_id="old") == []
        assert [h.id for h in await store.search_messages("zeta", session_id="old")] == ["m1"]
        assert (await store.read_events("s:old"))[1].data["message"]["parts"][0]["text"] == "delta epsilon"
    finally:
        await store.close()
    with raw(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
        assert (
            conn.execute("SELECT name FROM sqlite_master WHERE name = 'messages_fts_content'").fetchone()
            is None
        )
        conn.execute("INSERT INTO messages_fts(messages_fts) VALUES ('integrity-check')")


FIXTURES = Path(__file__).parent.parent / "fixtures"


async def test_migration_6_reads_a_version_5_file_back_the_same(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """tests/fixtures/sqlite_v5.db was written by sessionhub at schema version 5 (branches,
    an update, a delete that reparented, an overlay, a fork, a deleted session, usage,
    context); sqlite_v5.json is what it read back then (make_sqlite_v5.py). Migrated,
    everything reads back the same, events and export byte for byte."""
    from tests.fixtures.make_sqlite_v5 import m, read_back

    path = tmp_path / "v5.db"
    path.write_bytes((FIXTURES / "sqlite_v5.db").read_bytes())
    with raw(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 5
    expected = (FIXTURES / "sqlite_v5.json").read_text()
    with caplog.at_level("WARNING", logger="sessionhub.store"):
        store = await SqliteStore.open(path)
    # The operator is told before the tables are rewritten (minutes on a big file).
    said = [r.getMessage() for r in caplog.records if "schema version" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith(
        f"upgrading the database from schema version 5 to {len(MIGRATIONS)} (~10 messages"
    )
    try:
        got = await read_back(store)
        assert json.dumps(got, indent=1, ensure_ascii=False) + "\n" == expected
        # The migrated file goes on: seqs continue, the index and the keys hold.
        sid = next(s["info"]["id"] for s in got["sessions"] if s["info"]["name"] == "alpha renamed")
        last = got["streams"]["s:" + sid][-1]["seq"]
        result = await store.append_messages(sid, [m("n1", "a new answer after the migration")])
        assert result.last_seq == last + 1
        hits = await store.search_messages("answer", session_id=sid)
        assert [h.id for h in hits] == ["n1", "a2"] or sorted(h.id for h in hits) == ["a2", "n1"]
        assert (await store.read_events("s:" + sid))[:-1] == await store.read_events("s:" + sid, 0, last)
    finally:
        await store.close()
    with raw(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
        conn.execute("INSERT INTO messages_fts(messages_fts) VALUES ('integrity-check')")
        # Every row the old file held was packed (none kept whole: they all start with "{").
        assert conn.execute("SELECT COUNT(*) FROM messages WHERE content LIKE '{%'").fetchone()[0] == 0
        assert conn.execute("SELECT COUNT(*) FROM events WHERE typeof(type) = 'text'").fetchone()[0] == 0


async def test_appended_events_keep_the_body_they_were_appended_with(
    store: SqliteStore, db_path: Path
) -> None:
    await store.append_messages("s", [_m("a", "first words"), _m("b", "second words"), _m("c", "third")])
    await store.append_messages("s", [_m("d", "fourth")])
    before = [e.data for e in await store.read_events("s:s")]
    with raw(db_path) as conn:
        # The log refers to the rows: no copy of the message in the event.
        refs = conn.execute(
            "SELECT COUNT(*) FROM events "
            "WHERE sk = (SELECT sk FROM streams WHERE stream = 's:s') AND ref IS NOT NULL"
        ).fetchone()[0]
        assert refs == 4
    await store.update_message("s", _m("a", "rewritten"))
    await store.delete_messages("s", ["b"])
    after = [e.data for e in await store.read_events("s:s")]
    assert after[:4] == before
    assert [h.id for h in await store.search_messages("words", session_id="s")] == []
    await store.clear_messages("s")
    assert [e.data for e in await store.read_events("s:s")][:4] == before
    with raw(db_path) as conn:
        conn.execute("INSERT INTO messages_fts(messages_fts) VALUES ('integrity-check')")
        assert (
            conn.execute("SELECT COUNT(*) FROM messages_fts WHERE messages_fts MATCH 'fourth'").fetchone()[0]
            == 0
        )


async def test_appended_events_take_parent_and_time_from_the_row_until_it_changes(
    store: SqliteStore, db_path: Path, tmp_path: Path
) -> None:
    await store.append_messages("s", [_m("a", "one"), _m("b", "two"), _m("c", "three")])
    before = await store.read_events("s:s")
    with raw(db_path) as conn:
        implied = "SELECT COUNT(*) FROM events WHERE ref IS NOT NULL AND data IS NULL AND created_at IS NULL"
        assert conn.execute(implied).fetchone()[0] == 3
    # c's parent becomes a: its event still says b, and every time stays.
    await store.delete_messages("s", ["b"])
    after = await store.read_events("s:s")
    assert [(e.data, e.created_at) for e in after[:3]] == [(e.data, e.created_at) for e in before]
    assert after[2].data["parent_id"] == "b" and after[2].data["message"]["id"] == "c"
    # An import gives the rows their dumped times; their events keep the time of the import.
    await store.create_session("d", session_id="d")
    await store.append_messages("d", [_m("x", "imported")])
    dump = await store.dump_session("d")
    dumped = dump.messages[0].created_at
    other = await SqliteStore.open(tmp_path / "other.db")
    try:
        await asyncio.sleep(0.01)
        await other.import_session(dump)
        (event,) = [e for e in await other.read_events("s:d") if e.type == "message.appended"]
        assert event.created_at > dumped
        assert (await other.dump_session("d")).messages[0].created_at == dumped
    finally:
        await other.close()


async def test_footprint_per_message_is_bounded(tmp_path: Path) -> None:
    """Deterministic bytes: 1,000 messages of ~120 characters, one event each. Before
    migration 5 this was 5.7x the messages' JSON at 3,000 messages, 3.7x before migration 6;
    now 2.02x (bench/bench_footprint.py)."""
    path = tmp_path / "fp.db"
    store = await SqliteStore.open(path)
    json_bytes = 0
    try:
        for i in range(1000):
            text = " ".join(f"w{(i * 7 + k) % 613:03d}x" for k in range(20))[:120]
            m = {"id": f"msg-{i:06d}", "role": "user", "parts": [{"type": "text", "text": text}]}
            json_bytes += len(msgspec.json.encode(m))
            await store.append_messages("fp-session-0000-0000-000000000000", [Message.from_dict(m)])
    finally:
        await store.close()
    with raw(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    ratio = path.stat().st_size / json_bytes
    # 2.68 here (1,000 messages: the fixed pages of the empty tables weigh more), 2.81 since
    # migration 8 (the file tables' six empty pages: 24 KiB once, nothing per message);
    # 4.25 before migration 6, 6.2 before migration 5.
    assert ratio < 2.95, ratio


@pytest.mark.sqlite_only
async def test_a_session_search_runs_inline_and_answers_as_the_reader_does(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session's search on a small index skips the reader's thread (the hop is most of a
    rare word's time); on a big index, or while a write holds the writer's connection, it
    goes to the thread. Every way gives the same hits."""
    await store.append_messages(
        "a", [_m(f"a{i}", f"shared words {i} {'rare' * (i % 5 == 0)}") for i in range(40)]
    )
    await store.append_messages("b", [_m(f"b{i}", f"shared words {i}") for i in range(40)])
    trips = 0
    real_call = store._reader.call

    async def counted(fn: object, *args: object) -> object:
        nonlocal trips
        trips += 1
        return await real_call(fn, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(store._reader, "call", counted)
    queries = [("shared words", "phrase"), ("rare", "words"), ("words 7", "phrase"), ("nothing", "phrase")]

    async def answers() -> list[list[tuple[str, str]]]:
        out = []
        for q, match in queries:
            hits = await store.search_messages(q, session_id="a", match=match)  # type: ignore[arg-type]
            out.append([(h.id, h.content) for h in hits])
        return out

    inline = await answers()
    assert trips == 0
    assert inline[1] == [(f"a{i}", f"shared words {i} rare") for i in range(0, 40, 5)][: len(inline[1])]
    assert inline[3] == []
    monkeypatch.setattr(sqlite_store.search, "INLINE_SEARCH_ROWS", 50)  # 80 rows: too big
    assert await answers() == inline
    assert trips == len(queries)
    monkeypatch.setattr(sqlite_store.search, "INLINE_SEARCH_ROWS", 20_000)
    async with store._write_lock:  # a write in flight owns the writer's connection
        assert await answers() == inline
    assert trips == 2 * len(queries)
    # The whole-hub search always goes to the thread.
    await store.search_messages("rare", session_id=None)
    assert trips == 2 * len(queries) + 1


@pytest.mark.parametrize("ranked_here", [False, True], ids=["fts5-rank", "ranked-here"])
async def test_a_session_search_keeps_only_its_own_rows_when_tokens_collide(
    db_path: Path, monkeypatch: pytest.MonkeyPatch, ranked_here: bool
) -> None:
    # Every session's token the same (what two ids that hash alike share): the token finds
    # every session's rows, and the rows' session keys must leave only the searched one's.
    monkeypatch.setattr(sqlite_store.sql, "sid_token", lambda session_id: "sshared")
    async with await SqliteStore.open(db_path) as store:
        for k in range(6):
            s = Session(store, session_id=f"s{k}")
            for i in range(3 if k else 1):
                await s.append_message(T(f"m{k}-{i}", "user", f"deploy pipeline number {k} {i}"))
        conn = sqlite3.connect(db_path)
        try:
            # (messages of the session, rows in the index): a session under a quarter of it
            # goes by token; a huge index makes ranking here worth it.
            size = (1, 1_000_000) if ranked_here else (1, 16)
            hits = sqlite_store.search._search_session(conn, '"deploy pipeline"', "s0", 10, size)
        finally:
            conn.close()
    assert [(h.id, h.session_id) for h in hits] == [("m0-0", "s0")]


LONG = (
    "A long answer from the model, the kind that fills a page: it repeats the words of the "
    "question, explains each step and lists what to do next. "
) * 20


async def _long_history(store: SqliteStore) -> dict[str, Any]:
    """Long messages through every path that writes or reads a row: append on two branches,
    update, delete with a child, fork, search, the log and export."""
    from tests.fixtures.make_sqlite_v5 import read_back

    await store.create_session("long", session_id="s")
    await store.append_messages("s", [_m("a1", "short question"), _m("a2", LONG + "one")])
    await store.append_messages("s", [_m("a3", LONG + "two"), _m("a4", LONG + "three")])
    await store.append_messages("s", [_m("b1", LONG + "branch")], parent="a2")
    await store.update_message("s", _m("a3", LONG + "two, edited"))
    await store.delete_messages("s", ["a3"])  # a4 moves up to a2
    await store.fork_session("s", "a4", "fork")
    return await read_back(store)


async def test_long_messages_are_deflated_and_read_back_as_if_they_were_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hub.store.sqlite import packing

    deflated, plain = tmp_path / "deflated.db", tmp_path / "plain.db"
    async with await SqliteStore.open(deflated) as store:
        got = await _long_history(store)
    with monkeypatch.context() as patched:
        patched.setattr(packing, "DEFLATE_AT", 1 << 30)
        async with await SqliteStore.open(plain) as store:
            expected = await _long_history(store)
    # Ids and times differ between the two files; what was read is otherwise the same.
    assert _without_ids(got) == _without_ids(expected)
    assert [h["id"] for h in got["sessions"][0]["search"]["answer"]] != []
    with raw(deflated) as conn:
        own = "(SELECT sk FROM streams WHERE stream = 's:s')"
        kinds = dict(conn.execute(f"SELECT id, typeof(content) FROM messages WHERE sk = {own}"))
        assert kinds == {"a1": "text", "a2": "blob", "a4": "blob", "b1": "blob"}
        conn.execute("INSERT INTO messages_fts(messages_fts) VALUES ('integrity-check')")
    with raw(plain) as conn:
        assert conn.execute("SELECT COUNT(*) FROM messages WHERE typeof(content) = 'blob'").fetchone()[0] == 0
    assert deflated.stat().st_size < plain.stat().st_size


def _without_ids(value: Any) -> Any:
    # Session ids (random per file), epochs and times (the clock) are all that may differ.
    if isinstance(value, dict):
        return {_UUID.sub("<sid>", k): "-" if k in _CLOCKED else _without_ids(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_ids(v) for v in value]
    if isinstance(value, str) and value.startswith("{"):
        return _without_ids(json.loads(value))  # an export line
    return _UUID.sub("<sid>", value) if isinstance(value, str) else value


_CLOCKED = {"created_at", "updated_at", "createdAt", "epoch"}
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
