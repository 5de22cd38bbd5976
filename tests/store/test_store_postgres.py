"""PostgresStore specifics: seqs under writers on several nodes, rollbacks, migrations, the
shipped schema file, hostile full-text queries and the NOTIFY doorbell.

The behaviour both stores share is tested through the ``store`` fixture everywhere else.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import msgspec
import pytest

from hub import (
    InvalidInput,
    Message,
    PostgresStore,
    Session,
    SessionManager,
    StoreClosed,
    StoreError,
    session_stream,
)
from hub.bus import doorbell
from hub.store import LogEntry
from hub.store.postgres import MIGRATIONS, SCHEMA_SQL, fts_text
from protocol import SessionInfo
from tests.support.hubtest import text_message as T


def on(schema: str) -> dict[str, str]:
    return {"search_path": schema}


async def open_store(dsn: str, schema: str, **kwargs: Any) -> PostgresStore:
    return await PostgresStore.connect(dsn, server_settings=on(schema), **kwargs)


@pytest.fixture
async def pg(pg_dsn: str, pg_schema: str) -> AsyncIterator[PostgresStore]:
    store = await open_store(pg_dsn, pg_schema)
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture
async def raw(pg_dsn: str, pg_schema: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(pg_dsn, server_settings=on(pg_schema))
    try:
        yield conn
    finally:
        await conn.close()


def msg(message_id: str, text: str = "x") -> Message:
    return Message.from_dict(T(message_id, "user", text))


# -- seqs ---------------------------------------------------------------------------------


async def test_writers_on_several_nodes_get_gap_free_unique_seqs(pg_dsn: str, pg_schema: str) -> None:
    nodes = [await open_store(pg_dsn, pg_schema, max_size=3) for _ in range(4)]
    try:
        per_writer = 25

        async def writer(node: PostgresStore, w: int) -> None:
            session = Session(node, session_id="busy")
            for i in range(per_writer):
                if i % 5 == 4:  # batches take several seqs at once
                    await node.append_messages("busy", [msg(f"w{w}-{i}-{k}") for k in range(3)])
                else:
                    await session.append_message(T(f"w{w}-{i}", "user", f"writer {w} message {i}"))

        await asyncio.gather(*(writer(node, w) for w, node in enumerate(nodes * 2)))
        events = await Session(nodes[0], session_id="busy").read_events(limit=100_000)
        seqs = [e.seq for e in events]
        assert seqs == list(range(1, len(seqs) + 1))
        total = 8 * (per_writer + per_writer // 5 * 2)
        assert len(seqs) == total
        # Every append attached to the latest leaf under the session lock: one chain.
        history = await Session(nodes[1], session_id="busy").get_history()
        assert len(history) == total == await nodes[2].get_path_length("busy")
        assert [e.data["message"]["id"] for e in events] == [m.id for m in history]
        assert (await nodes[3].stream_position(session_stream("busy"))).last_seq == total
    finally:
        for node in nodes:
            await node.close()


async def refuse_inserts(raw: asyncpg.Connection, trigger: str, when: str) -> None:
    """A trigger that fails the rows matching ``when`` with 'boom refused'."""
    await raw.execute(
        "CREATE FUNCTION boom() RETURNS trigger LANGUAGE plpgsql AS "
        "$$BEGIN RAISE EXCEPTION 'boom refused'; END$$; "
        f"CREATE TRIGGER boom {trigger} FOR EACH ROW WHEN ({when}) EXECUTE FUNCTION boom()"
    )


async def test_a_rolled_back_write_leaves_no_gap(pg: PostgresStore, raw: asyncpg.Connection) -> None:
    await refuse_inserts(raw, "AFTER INSERT ON events", "NEW.type = 'boom'")
    s = Session(pg, session_id="tx")
    await s.append_message(T("m0", "user", "before"))
    # message.updated takes seq 2, then the extra event fails: all of it rolls back.
    with pytest.raises(StoreError, match="boom refused"):
        await pg.update_message(
            "tx", msg("m0", "changed"), also=[LogEntry(session_id="tx", type="boom", data={})]
        )
    stored = await pg.get_message("tx", "m0")
    assert stored is not None and stored.text() == "before"
    assert [e.seq for e in await s.read_events()] == [1]
    assert (await pg.stream_position(session_stream("tx"))).last_seq == 1
    await s.append_message(T("m1", "user", "after"))
    assert [e.seq for e in await s.read_events()] == [1, 2]


async def test_a_failed_batch_stores_nothing(pg: PostgresStore, raw: asyncpg.Connection) -> None:
    await refuse_inserts(raw, "BEFORE INSERT ON messages", "NEW.id = 'boom'")
    s = Session(pg, session_id="tx")
    await s.append_message(T("m0", "user", "before"))
    with pytest.raises(StoreError, match="boom refused"):
        await pg.append_messages("tx", [msg("ok1", "ok1"), msg("ok2"), msg("boom")])
    assert [m.id for m in await s.get_history()] == ["m0"]
    assert await s.search("ok1") == []
    await s.append_message(T("m1", "user", "after"))
    assert [e.seq for e in await s.read_events()] == [1, 2]


# -- migrations and the shipped schema ------------------------------------------------------


async def test_concurrent_first_connects_migrate_once(
    pg_dsn: str, pg_schema: str, raw: asyncpg.Connection
) -> None:
    stores = await asyncio.gather(*(open_store(pg_dsn, pg_schema) for _ in range(5)))
    for store in stores:
        await store.close()
    again = await open_store(pg_dsn, pg_schema)  # idempotent
    await again.close()
    rows = await raw.fetch("SELECT version FROM schema_migrations ORDER BY version")
    assert [r[0] for r in rows] == list(range(1, len(MIGRATIONS) + 1))


async def test_a_newer_schema_is_refused(pg_dsn: str, pg_schema: str, raw: asyncpg.Connection) -> None:
    await (await open_store(pg_dsn, pg_schema)).close()
    await raw.execute("INSERT INTO schema_migrations (version) VALUES ($1)", len(MIGRATIONS) + 1)
    with pytest.raises(StoreError, match="newer"):
        await open_store(pg_dsn, pg_schema)


async def catalog(conn: asyncpg.Connection, schema: str) -> dict[str, Any]:
    columns = await conn.fetch(
        "SELECT table_name, column_name, data_type, is_nullable, column_default, generation_expression "
        "FROM information_schema.columns WHERE table_schema = $1 ORDER BY 1, 2",
        schema,
    )
    indexes = await conn.fetch(
        "SELECT indexname, replace(indexdef, $1 || '.', '') FROM pg_indexes WHERE schemaname = $1 ORDER BY 1",
        schema,
    )
    configs = await conn.fetch(
        "SELECT c.cfgname, m.maptokentype, d.dictname, d.dictinitoption "
        "FROM pg_ts_config c JOIN pg_ts_config_map m ON m.mapcfg = c.oid "
        "JOIN pg_ts_dict d ON d.oid = m.mapdict JOIN pg_namespace n ON n.oid = c.cfgnamespace "
        "WHERE n.nspname = $1 ORDER BY 1, 2, 3",
        schema,
    )
    return {
        "columns": [tuple(r) for r in columns],
        "indexes": [tuple(r) for r in indexes],
        "configs": [tuple(r) for r in configs],
    }


async def test_the_shipped_schema_file_is_what_connect_creates(pg_dsn: str, pg_schema: str) -> None:
    assert MIGRATIONS[0] == SCHEMA_SQL  # migration 1 is the file itself
    await (await open_store(pg_dsn, pg_schema)).close()
    conn = await asyncpg.connect(pg_dsn)
    by_file = pg_schema + "_file"
    try:
        await conn.execute(f"CREATE SCHEMA {by_file}; SET search_path = {by_file}")
        async with conn.transaction():
            await conn.execute(SCHEMA_SQL)
        await conn.execute("RESET search_path")
        assert await catalog(conn, by_file) == await catalog(conn, pg_schema)
    finally:
        await conn.execute(f"DROP SCHEMA IF EXISTS {by_file} CASCADE")
        await conn.close()


async def test_a_role_that_may_not_create_runs_on_the_shipped_schema(pg_dsn: str, pg_schema: str) -> None:
    role = f"{pg_schema}_app"
    conn = await asyncpg.connect(pg_dsn, server_settings=on(pg_schema))
    try:
        async with conn.transaction():  # what an administrator would run: the file, then grants
            await conn.execute(SCHEMA_SQL)
        await conn.execute(
            f"CREATE ROLE {role} LOGIN; "
            f"GRANT USAGE ON SCHEMA {pg_schema} TO {role}; "
            f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {pg_schema} TO {role}; "
            f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA {pg_schema} TO {role}; "
            f"REVOKE CREATE ON SCHEMA {pg_schema} FROM PUBLIC"
        )
        parts = urlsplit(pg_dsn)
        dsn = urlunsplit(parts._replace(netloc=f"{role}@{parts.hostname}:{parts.port or 5432}"))
        async with await open_store(dsn, pg_schema) as store:
            manager = SessionManager(store)
            info = await manager.create("limited")
            await manager.append(info.id, T("m1", "user", "hello limited world"))
            await store.append_messages(info.id, [msg("m2"), msg("m3")])
            assert [r.id for r in await manager.search("limited")] == ["m1"]
    finally:
        await conn.execute(f"DROP OWNED BY {role}; DROP ROLE IF EXISTS {role}")
        await conn.close()


# The schema file as sessionhub shipped it at version 3 (before messages and events were
# keyed by their stream's integer key).
SCHEMA_V3 = (Path(__file__).parent.parent / "fixtures" / "postgres_schema_v3.sql").read_text("utf-8")

# The messages and events tables as migration 2 left them: the indexed copy of the text in
# messages.body, every message.appended event a full copy of its message.
VERSION_2 = """
ALTER TABLE messages ADD COLUMN body text;
ALTER TABLE messages DROP COLUMN event_seq;
ALTER TABLE events DROP COLUMN ref;
DELETE FROM schema_migrations WHERE version > 2;
"""


async def test_migration_3_keeps_a_version_2_database_reading_the_same(
    pg_dsn: str, pg_schema: str, raw: asyncpg.Connection
) -> None:
    async with raw.transaction():
        await raw.execute(SCHEMA_V3)
        await raw.execute(VERSION_2)
        now = "2026-01-01T00:00:00Z"
        await raw.execute(
            f"INSERT INTO sessions (id, name, created_at, updated_at) VALUES ('old', 'old', '{now}', '{now}')"
        )
        await raw.execute("INSERT INTO streams VALUES ('s:old', 'e1', 1, 2)")
        parent: int | None = None
        for i, text in enumerate(["alpha beta gamma", "delta epsilon"]):
            content = msgspec.json.encode(T(f"m{i}", "user", text)).decode()
            parent = await raw.fetchval(
                "INSERT INTO messages (session_id, id, parent_pk, role, content, body, tsv, created_at) "
                "VALUES ('old', $1, $2, 'user', $3, $4, to_tsvector('sessionhub', $5), $6) RETURNING pk",
                f"m{i}",
                parent,
                content,
                text,
                fts_text(text),
                datetime.fromisoformat(now),
            )
            parent_id = "null" if i == 0 else '"m0"'
            await raw.execute(
                "INSERT INTO events VALUES ('s:old', $1, 'old', 'message.appended', $2, $3)",
                i + 1,
                f'{{"message":{content},"parent_id":{parent_id}}}',
                datetime.fromisoformat(now),
            )
    async with await open_store(pg_dsn, pg_schema) as store:
        assert [m.text() for m in await store.get_history("old")] == ["alpha beta gamma", "delta epsilon"]
        hits = await store.search_messages("epsilon", session_id="old")
        assert [(h.id, h.content) for h in hits] == [("m1", "delta epsilon")]
        events = await store.read_events("s:old")
        assert [e.data["message"]["id"] for e in events] == ["m0", "m1"]
        assert events[1].data["parent_id"] == "m0"
        await store.update_message("old", msg("m1", "zeta only"))
        assert await store.search_messages("epsilon", session_id="old") == []
        assert [h.id for h in await store.search_messages("zeta", session_id="old")] == ["m1"]
        assert (await store.read_events("s:old"))[1].data["message"]["parts"][0]["text"] == "delta epsilon"
        await store.append_messages("old", [msg("m2", "new words")])
        assert (await store.read_events("s:old", 3))[0].data["parent_id"] == "m1"
    rows = await raw.fetch("SELECT version FROM schema_migrations ORDER BY version")
    assert [r[0] for r in rows] == list(range(1, len(MIGRATIONS) + 1))
    assert (
        await raw.fetchval(
            "SELECT count(*) FROM information_schema.columns "
            "WHERE table_schema = $1 AND column_name = 'body'",
            pg_schema,
        )
        == 0
    )


async def test_migration_4_keeps_a_version_3_database_reading_the_same(
    pg_dsn: str, pg_schema: str, raw: asyncpg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    """Rows written as version 3 wrote them (text session ids and streams, every column
    filled) read back the same once migration 4 has keyed them by their stream."""
    now = datetime.fromisoformat("2026-01-01T00:00:00Z")
    texts = ["alpha beta gamma", "delta epsilon", "zeta branch"]
    contents = [msgspec.json.encode(T(f"m{i}", "user", t)).decode() for i, t in enumerate(texts)]
    info = '{"session":{"id":"old"}}'
    async with raw.transaction():
        await raw.execute(SCHEMA_V3)
        await raw.execute("DELETE FROM schema_migrations WHERE version > 3")
        await raw.execute(
            "INSERT INTO sessions (id, name, created_at, updated_at) VALUES ('old', 'old', $1, $1)", now
        )
        await raw.execute("INSERT INTO streams VALUES ('s:old', 'e1', 1, 5), ('registry', 'e2', 1, 1)")
        await raw.execute(
            "INSERT INTO events VALUES ('registry', 1, 'old', 'session.created', $1, $2, NULL)", info, now
        )
        await raw.execute(
            "INSERT INTO events VALUES ('s:old', 1, 'old', 'session.created', $1, $2, NULL)", info, now
        )
        pks: list[int] = []
        for i, (content, text) in enumerate(zip(contents, texts, strict=True)):
            parent = None if i == 0 else pks[0]  # m1 and m2: two branches under m0
            pks.append(
                await raw.fetchval(
                    "INSERT INTO messages "
                    "(session_id, id, parent_pk, role, content, tsv, created_at, event_seq) "
                    "VALUES ('old', $1, $2, 'user', $3, to_tsvector('sessionhub', $4), $5, $6) RETURNING pk",
                    f"m{i}",
                    parent,
                    content,
                    fts_text(text),
                    now,
                    None if i == 0 else i + 2,
                )
            )
        # m0's event holds its own body (as after an update); m1's and m2's refer to their rows.
        await raw.execute(
            "INSERT INTO events VALUES ('s:old', 2, 'old', 'message.appended', $1, $2, NULL), "
            "('s:old', 3, 'old', 'message.appended', '\"m0\"', $2, $3), "
            "('s:old', 4, 'old', 'message.appended', '\"m0\"', $2, $4), "
            "('s:old', 5, 'old', 'context.replaced', '{}', $2, NULL)",
            f'{{"message":{contents[0]},"parent_id":null}}',
            now,
            pks[1],
            pks[2],
        )
    with caplog.at_level("WARNING", logger="sessionhub.store"):
        store = await open_store(pg_dsn, pg_schema)
    said = [r.getMessage() for r in caplog.records if "schema version" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith(
        f"upgrading the database from schema version 3 to {len(MIGRATIONS)}"
    )
    async with store:
        assert [m.text() for m in await store.get_history("old", "m1")] == texts[:2]
        assert [m.text() for m in await store.get_history("old")] == [texts[0], texts[2]]
        assert [m.id for m in await store.get_branches("old", "m0")] == ["m1", "m2"]
        assert [(h.id, h.session_id) for h in await store.search_messages("epsilon", session_id="old")] == [
            ("m1", "old")
        ]
        assert [h.id for h in await store.search_messages("zeta branch", session_id=None)] == ["m2"]
        events = await store.read_events("s:old")
        assert [(e.seq, e.type, e.session_id) for e in events] == [
            (1, "session.created", "old"),
            (2, "message.appended", "old"),
            (3, "message.appended", "old"),
            (4, "message.appended", "old"),
            (5, "context.replaced", "old"),
        ]
        assert [e.data["message"]["id"] for e in events[1:4]] == ["m0", "m1", "m2"]
        assert [e.data["parent_id"] for e in events[1:4]] == [None, "m0", "m0"]
        assert [(e.type, e.session_id) for e in await store.read_events("registry")] == [
            ("session.created", "old")
        ]
        dump = await store.dump_session("old")
        assert [(d.message.id, d.parent_id, d.created_at) for d in dump.messages] == [
            ("m0", None, now),
            ("m1", "m0", now),
            ("m2", "m0", now),
        ]
        # Writes go on where version 3 left off: the next pk and the next seq.
        await store.append_messages("old", [msg("m3", "new words")])
        assert (await store.read_events("s:old", 5))[0].data["parent_id"] == "m2"
        assert await raw.fetchval("SELECT pk FROM messages WHERE id = 'm3'") > pks[-1]
        await store.update_message("old", msg("m1", "rewritten"))
        assert (await store.read_events("s:old"))[2].data["message"]["parts"][0]["text"] == texts[1]
    rows = await raw.fetch("SELECT version FROM schema_migrations ORDER BY version")
    assert [r[0] for r in rows] == list(range(1, len(MIGRATIONS) + 1))
    columns = await raw.fetch(
        "SELECT table_name, column_name FROM information_schema.columns "
        "WHERE table_schema = $1 AND table_name IN ('messages', 'events') "
        "AND column_name IN ('session_id', 'stream')",
        pg_schema,
    )
    assert sorted(tuple(r) for r in columns) == [("events", "session_id")]


async def test_appended_events_keep_the_body_they_were_appended_with(
    pg: PostgresStore, raw: asyncpg.Connection
) -> None:
    await pg.append_messages("s", [msg("a", "first words"), msg("b", "second words"), msg("c", "third")])
    await pg.append_messages("s", [msg("d", "fourth")])
    await Session(pg, session_id="s").append_message(T("e", "user", "fifth words"))
    before = [e.data for e in await pg.read_events("s:s")]
    assert [d["message"]["id"] for d in before] == ["a", "b", "c", "d", "e"]
    assert [d["parent_id"] for d in before] == [None, "a", "b", "c", "d"]
    # The log refers to the rows: no copy of the message in the event.
    refs = await raw.fetch(
        "SELECT data FROM events WHERE stream_key = (SELECT key FROM streams WHERE stream = 's:s') "
        "AND ref IS NOT NULL ORDER BY seq"
    )
    assert [r[0] for r in refs] == ["null", '"a"', '"b"', '"c"', '"d"']
    await pg.update_message("s", msg("a", "rewritten"))
    await pg.delete_messages("s", ["b"])
    after = [e.data for e in await pg.read_events("s:s")]
    assert after[:5] == before
    assert [h.id for h in await pg.search_messages("words", session_id="s")] == ["e"]
    await pg.clear_messages("s")
    assert [e.data for e in await pg.read_events("s:s")][:5] == before
    assert await raw.fetchval("SELECT count(*) FROM events WHERE ref IS NOT NULL") == 0
    # An append that finds its id stored writes nothing, not even a seq.
    await pg.append_messages("s", [msg("x", "one")])
    position = await pg.stream_position("s:s")
    await pg.append_messages("s", [msg("x", "two")])
    await pg.append_messages("s", [msg("x", "three"), msg("x", "four")])
    assert await pg.stream_position("s:s") == position


# -- full text ------------------------------------------------------------------------------

HOSTILE = [
    "",
    " ",
    '"',
    "'",
    "''",
    '"unbalanced',
    "a & b",
    "a | b",
    "!a",
    "(a",
    "a)",
    "()",
    "*",
    "a*",
    "a:*",
    ":",
    "a:b",
    "<->",
    "a <-> b",
    "a <2> b",
    "\\",
    "\\'",
    "%",
    "_",
    "$1",
    "NEAR(a b)",
    "a AND b OR NOT c",
    "col:value",
    "\x00",
    "a\x00b",
    "🙂🙂",
    "東京",
    "x" * 5000,
    " ".join(["word"] * 500),
    "'; DROP TABLE messages; --",
]


@pytest.mark.parametrize("query", HOSTILE, ids=range(len(HOSTILE)))
async def test_hostile_queries_never_raise(pg: PostgresStore, query: str) -> None:
    manager = SessionManager(pg)
    info = await manager.create("s")
    await manager.append(info.id, T("m1", "user", "a b c 東京 🙂 word " + query))
    # (Postgres text holds no NUL: an entry with one is InvalidInput, see docs/postgres.md.)
    await pg.set_search_entry("lbl", "k", "a b c " + query.replace("\x00", ""))
    for match in ("phrase", "words"):
        for session_id in (info.id, None):
            hits = await pg.search_messages(query, session_id=session_id, match=match)
            assert all(h.id == "m1" for h in hits)
    assert all(k == "k" for k, _ in await pg.search_entries("lbl", query))
    assert await pg.count_search_entries("lbl") == 1


def test_fts_text_splits_as_unicode61() -> None:
    assert fts_text("Blue/green, user@example.com O'Brien x_y 3.14") == (
        "blue green user example com o brien x y 3 14"
    )
    assert fts_text("Café NAÏVE") == "cafe naive"
    assert fts_text("東京 🙂").split() == ["x6771x4eac", "x1f642"]
    assert fts_text("") == fts_text(None) == fts_text("!?") == ""


async def test_stemming_and_stop_words_match_sqlite(pg: PostgresStore) -> None:
    s = Session(pg, session_id="fts")
    await s.append_message(T("m1", "user", "The deployments are running"))
    await s.append_message(T("m2", "user", "deploy it"))
    assert [r.id for r in await s.search("deployment")] == ["m1"]  # porter, not snowball english
    assert [r.id for r in await s.search("the deployment")] == ["m1"]  # no stop words
    assert [r.id for r in await s.search("deploying")] == ["m2"]
    assert [r.id for r in await s.search("run")] == ["m1"]


# -- the doorbell ---------------------------------------------------------------------------


class Listener:
    def __init__(self) -> None:
        self.payloads: list[str] = []
        self.conn: asyncpg.Connection | None = None

    def __call__(self, conn: object, pid: int, channel: str, payload: object) -> None:
        assert channel == doorbell.CHANNEL
        self.payloads.append(str(payload))

    async def settle(self, conn: asyncpg.Connection) -> None:
        await conn.execute("SELECT 1")  # notifications sent before this are in
        await asyncio.sleep(0.05)  # proves a negative: no other notification follows


async def test_notify_rings_once_per_stream_on_commit_only(
    pg: PostgresStore, raw: asyncpg.Connection
) -> None:
    listener = Listener()
    await raw.add_listener(doorbell.CHANNEL, listener)
    manager = SessionManager(pg)
    info = await manager.create("n")  # the session's stream and the registry
    await listener.settle(raw)
    assert sorted(map(doorbell.decode, listener.payloads)) == sorted(
        [(session_stream(info.id), 1), ("registry", 1)]
    )
    listener.payloads.clear()
    await pg.append_messages(info.id, [msg("a"), msg("b"), msg("c")])  # three events, one ring
    await listener.settle(raw)
    assert listener.payloads == [doorbell.encode(session_stream(info.id), 4)]
    listener.payloads.clear()

    await refuse_inserts(raw, "BEFORE INSERT ON messages", "NEW.id = 'boom'")
    with pytest.raises(StoreError):
        await pg.append_messages(info.id, [msg("boom")])
    await listener.settle(raw)
    assert listener.payloads == []


async def test_notify_false_sends_nothing_but_still_rings_the_bus(
    pg_dsn: str, pg_schema: str, raw: asyncpg.Connection
) -> None:
    listener = Listener()
    await raw.add_listener(doorbell.CHANNEL, listener)
    async with await open_store(pg_dsn, pg_schema, notify=False) as store:
        store.bus.follow(session_stream("quiet"))
        await Session(store, session_id="quiet").append_message(T("m1", "user", "x"))
        assert store.bus.last_seq(session_stream("quiet")) == 1
    await listener.settle(raw)
    assert listener.payloads == []


async def test_a_long_stream_name_travels_hashed(pg: PostgresStore, raw: asyncpg.Connection) -> None:
    listener = Listener()
    await raw.add_listener(doorbell.CHANNEL, listener)
    sid = "s" * 9000
    await pg.log_event(LogEntry(session_id=sid, type="custom", data={}))
    await listener.settle(raw)
    assert listener.payloads == [doorbell.encode(session_stream(sid), 1)]
    assert doorbell.decode(listener.payloads[0]) == (doorbell.stream_hash(session_stream(sid)), 1)


# -- lifecycle and errors ---------------------------------------------------------------------


async def test_nul_in_plain_text_is_invalid_input(pg: PostgresStore) -> None:
    with pytest.raises(InvalidInput):
        await pg.set_context_value("k", "a\x00b")
    await Session(pg, session_id="nul").append_message(T("m1", "user", "a\x00b"))  # JSON escapes it
    stored = await pg.get_message("nul", "m1")
    assert stored is not None and stored.text() == "a\x00b"


async def test_closed_store_raises_store_closed(pg_dsn: str, pg_schema: str) -> None:
    store = await open_store(pg_dsn, pg_schema)
    await store.close()
    await store.close()  # idempotent
    with pytest.raises(StoreClosed):
        await Session(store).get_history()
    with pytest.raises(StoreClosed):
        await Session(store).append_message(T("m1", "user", "x"))


async def test_an_unreachable_server_is_a_store_error() -> None:
    with pytest.raises(StoreError, match="cannot connect"):
        await PostgresStore.connect("postgresql://postgres@127.0.0.1:1/nowhere")


async def test_a_deep_history_reads_in_one_statement(pg: PostgresStore) -> None:
    depth = 10_000
    for start in range(0, depth, 1000):
        await pg.append_messages("deep", [msg(f"m{i}", f"message {i}") for i in range(start, start + 1000)])
    await pg.add_compaction("deep", "summary", "m10", "m20")
    started = time.perf_counter()
    history = await pg.get_history("deep")
    elapsed = time.perf_counter() - started
    assert len(history) == depth - 10
    assert history[-1].id == f"m{depth - 1}"
    assert elapsed < 2.0  # ~40 ms here; the bound only catches a per-row round trip


# -- poisoned rows (issue 12) -----------------------------------------------------------------


async def test_a_poisoned_usage_row_reads_back_sanitized(pg: PostgresStore, raw: asyncpg.Connection) -> None:
    """float8 holds Infinity and NaN: a row written so (by hand, or by an older node) reads
    back finite instead of failing every list() and get()."""
    manager = SessionManager(pg)
    a = await manager.create("A")
    b = await manager.create("B")
    await raw.execute("UPDATE sessions SET estimated_cost = 'Infinity' WHERE id = $1", a.id)
    await raw.execute("UPDATE sessions SET estimated_cost = 'NaN' WHERE id = $1", b.id)
    costs = {i.id: i.estimated_cost for i in await manager.list()}
    assert costs == {a.id: sys.float_info.max, b.id: 0.0}
    got = await manager.get(a.id)
    assert got is not None and msgspec.json.decode(msgspec.json.encode(got), type=SessionInfo) == got
    with pytest.raises(InvalidInput, match="nothing was added"):
        await manager.add_usage(a.id, 0, 0, 1e308)
    assert (await manager.add_usage(b.id, 1, 1, 0.5)).estimated_cost == 0.5


async def test_footprint_per_message_is_bounded(pg: PostgresStore, raw: asyncpg.Connection) -> None:
    """1,000 messages of ~120 characters, one event each: the messages and events tables
    with their indexes and TOAST, against the messages' JSON. 8.5x here (the tables' first
    pages weigh more at 1,000 messages: 6.2x at 3,000, bench/bench_footprint.py); migration
    3 took ~360 B a message off (the indexed copy of the text, events copying their
    message), ~1.9x of this JSON, so the old layout is over the bound."""
    json_bytes = 0
    for i in range(1000):
        text = " ".join(f"w{(i * 7 + k) % 613:03d}x" for k in range(20))[:120]
        m = {"id": f"msg-{i:06d}", "role": "user", "parts": [{"type": "text", "text": text}]}
        json_bytes += len(msgspec.json.encode(m))
        await pg.append_messages("fp-session-0000-0000-000000000000", [Message.from_dict(m)])
    await raw.execute("VACUUM messages, events")
    size = await raw.fetchval("SELECT pg_total_relation_size('messages') + pg_total_relation_size('events')")
    ratio = size / json_bytes
    assert ratio < 9.5, ratio
