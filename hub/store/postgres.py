"""`PostgresStore`: the shared backend for several hub nodes, on asyncpg with a pool.

Design (docs/postgres.md):

- Each operation is one transaction on one pooled connection. Statements go through
  asyncpg's per-connection prepared-statement cache, so a hot statement is parsed and
  planned once per connection. Batches travel as arrays (``unnest``), paths are recursive
  CTEs, and most reads are a single statement (a single snapshot, no BEGIN/COMMIT).
- Every write transaction that reads a session's state before changing it (the latest
  leaf, a parent, the path) first takes a transaction-scoped advisory lock on the session's
  stream, in the same round trip as ``BEGIN``: writers of one session are serialized across
  nodes exactly as SQLite's ``BEGIN IMMEDIATE`` serializes them, writers of different
  sessions never wait for each other.
- Event seqs come from a counter row per stream (``streams``), incremented inside the
  writing transaction: the row lock orders concurrent writers, a rollback undoes the
  increment, so a stream's log is always 1..N without a gap or a duplicate.
- After the events, in the same transaction, one ``pg_notify`` per stream written (the
  cross-node doorbell, delivered on commit only); after the commit, ``bus.publish`` as
  SqliteStore does.
- Messages are keyed ``(session_id, id)``; ``pk`` (an identity) is insertion order and
  ``parent_pk`` the parent's pk, with the same invariants as SqliteStore's rowids.
- Full text: ``tsvector`` generated columns with GIN indexes, under the ``sessionhub`` text
  search configuration (Porter stemming, no stop words).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from importlib import resources
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import asyncpg
import msgspec

from protocol import (
    Compaction,
    Conflict,
    Event,
    InvalidInput,
    Message,
    SearchResult,
    SessionInfo,
    SessionNotFound,
    StoreClosed,
    StoreError,
)

from ..bus import Bus, MemoryBus
from ..bus.doorbell import CHANNEL, stream_key
from ..bus.doorbell import encode as doorbell
from ..fts import fts_text, fts_words
from ..overlays import apply_compactions, visible_compactions
from .base import (
    LATEST,
    REGISTRY,
    AppendResult,
    LogEntry,
    ParentArg,
    Store,
    StreamPosition,
    check_limit,
    check_usage,
    session_stream,
    usage_totals,
)
from .rows import (
    SESSION_COLS,
    appended_json,
    compaction,
    decode_message,
    message_json,
    new_epoch,
    session_info,
    ts,
    updated_json,
)

__all__ = ["MIGRATIONS", "SCHEMA_SQL", "PostgresStore", "fts_text"]

log = logging.getLogger("sessionhub.store")

T = TypeVar("T")
Row = asyncpg.Record
if TYPE_CHECKING:
    from asyncpg.pool import PoolConnectionProxy

    Conn = PoolConnectionProxy[asyncpg.Record]

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode

#: The schema as a plain SQL file, shipped for roles that may not create tables.
SCHEMA_SQL: str = resources.files("hub.store").joinpath("postgres_schema.sql").read_text("utf-8")

# Versioned migrations: index i brings the schema from version i to i + 1. Migration 1 is
# the shipped file itself, so the file and what connect() creates cannot drift apart.
#: Migration 2 adds the settings table (already in the file, hence IF NOT EXISTS) to
#: databases created at version 1.
MIGRATIONS: list[str] = [
    SCHEMA_SQL,
    "CREATE TABLE IF NOT EXISTS settings ("
    "key text PRIMARY KEY, value text NOT NULL, updated_at timestamptz NOT NULL DEFAULT now())",
]

#: Ranking costs per matching row; a query is ranked over its newest SEARCH_WINDOW matches
#: (as SqliteStore does).
SEARCH_WINDOW = 250


def _key(name: str) -> int:
    """A 64-bit advisory-lock key for a name."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big", signed=True)


_MIGRATION_LOCK = _key("sessionhub.schema_migrations")


def _body(message: Message) -> str | None:
    # Postgres text cannot hold NUL; the indexed copy drops it (the JSON escapes it).
    text = message.text()
    return text.replace("\x00", " ") if text else None


# ---------------------------------------------------------------------------------------
# Statements
# ---------------------------------------------------------------------------------------

_EMIT = """
WITH s AS (
    INSERT INTO streams AS s (stream, epoch, first_seq, last_seq) VALUES ($1, $2, 1, $3)
    ON CONFLICT (stream) DO UPDATE SET last_seq = s.last_seq + excluded.last_seq
    RETURNING last_seq
), e AS (
    INSERT INTO events (stream, seq, session_id, type, data, created_at)
    SELECT $1, s.last_seq - $3 + u.ord, $4, u.type, u.data, $7
    FROM s, unnest($5::text[], $6::text[]) WITH ORDINALITY AS u(type, data, ord)
)
SELECT last_seq FROM s
"""

_PATH_CTE = """
WITH RECURSIVE path(pk, parent_pk, id, content, depth) AS (
    SELECT pk, parent_pk, id, content, 0 FROM messages WHERE pk = {leaf}
    UNION ALL
    SELECT m.pk, m.parent_pk, m.id, m.content, path.depth + 1
    FROM path JOIN messages m ON m.pk = path.parent_pk
    WHERE m.pk < path.pk
)
"""
_LEAF_LATEST = "(SELECT pk FROM messages WHERE session_id = $1 ORDER BY pk DESC LIMIT 1)"
_LEAF_ID = "(SELECT pk FROM messages WHERE session_id = $1 AND id = $2)"

_PATH_LATEST = _PATH_CTE.format(leaf=_LEAF_LATEST) + "SELECT content FROM path ORDER BY depth DESC"
_PATH_ID = _PATH_CTE.format(leaf=_LEAF_ID) + "SELECT content FROM path ORDER BY depth DESC"

# The path and the session's overlays in one statement (one snapshot, one round trip).
_HISTORY_TAIL = """
SELECT 0 AS kind, depth AS n, content AS a, NULL AS b, NULL AS c, NULL AS d,
       NULL::timestamptz AS t FROM path
UNION ALL
SELECT 1, -pk, id, summary, from_message_id, to_message_id, created_at
FROM compactions WHERE session_id = $1
ORDER BY kind, n DESC
"""
_HISTORY_LATEST = _PATH_CTE.format(leaf=_LEAF_LATEST) + _HISTORY_TAIL
_HISTORY_ID = _PATH_CTE.format(leaf=_LEAF_ID) + _HISTORY_TAIL

_LENGTH_LATEST = _PATH_CTE.format(leaf=_LEAF_LATEST) + "SELECT count(*) FROM path"
_LENGTH_ID = _PATH_CTE.format(leaf=_LEAF_ID) + "SELECT count(*) FROM path"

_COMPACTIONS = (
    "SELECT id, summary, from_message_id, to_message_id, created_at FROM compactions "
    "WHERE session_id = $1 ORDER BY pk"
)

# tsquery of a phrase, and of words (each word a phrase, ANDed; words without any lexeme
# are dropped, as FTS5 drops an empty quoted phrase from an AND). The text form of a
# tsquery is valid tsquery input, so nothing the user typed is ever parsed as syntax.
_PHRASE_Q = "phraseto_tsquery('sessionhub', $1::text)"
_WORDS_Q = (
    "(SELECT string_agg('(' || w.q::text || ')', ' & ')::tsquery FROM "
    "(SELECT phraseto_tsquery('sessionhub', x) AS q FROM unnest($1::text[]) AS x) AS w "
    "WHERE w.q::text <> '')"
)

# A search is two statements. The first turns the user's words into a tsquery's text; the
# second has that tsquery as a constant, so the planner sees which lexemes it holds and,
# from the column's statistics, how common they are: a rare word goes through the GIN index,
# a common word or phrase walks the session's newest rows (GIN keeps no row order, so it
# would check every match in the heap: a phrase in 14 % of 100,000 rows, 25 ms against
# 1 ms). As a parameter (one prepared plan for every query) it would look the same for all.
# The constant travels as hex, so nothing the user typed is ever read as SQL.
_TSQUERY = {
    "phrase": f"SELECT ({_PHRASE_Q})::text",
    "words": f"SELECT ({_WORDS_Q})::text",
}
_SEARCH_SESSION = """
WITH hits AS (
    SELECT m.pk, m.id, m.role, m.body, m.session_id, m.created_at, m.tsv
    FROM messages m WHERE m.session_id = $1 AND m.tsv @@ {q}
    ORDER BY m.pk DESC LIMIT {window}
)
SELECT h.id, h.role, h.body, h.session_id, h.created_at FROM hits h
ORDER BY ts_rank(h.tsv, {q}, 1) DESC, h.pk LIMIT $2
"""
_SEARCH_ALL = """
WITH hits AS (
    SELECT m.pk, m.id, m.role, m.body, m.session_id, m.created_at, m.tsv
    FROM messages m JOIN sessions s ON s.id = m.session_id WHERE m.tsv @@ {q}
    ORDER BY m.pk DESC LIMIT {window}
)
SELECT h.id, h.role, h.body, h.session_id, h.created_at FROM hits h
ORDER BY ts_rank(h.tsv, {q}, 1) DESC, h.pk LIMIT $1
"""


def _tsquery_constant(text: str) -> str:
    return f"convert_from(decode('{text.encode().hex()}', 'hex'), 'UTF8')::tsquery"


_SEARCH_ENTRIES = f"""
WITH q AS (SELECT {_WORDS_Q} AS q)
SELECT e.key, e.content FROM search_entries e, q
WHERE e.label = $2 AND e.tsv @@ q.q
ORDER BY ts_rank(e.tsv, q.q, 1) DESC, e.pk LIMIT $3
"""

_INSERT_MESSAGES = """
INSERT INTO messages (pk, session_id, id, parent_pk, role, content, body, tsv, created_at)
SELECT u.pk, $1, u.id, u.parent_pk, u.role, u.content, u.body,
       CASE WHEN u.body IS NOT NULL THEN to_tsvector('sessionhub', u.fts) END, $2
FROM unnest($3::bigint[], $4::text[], $5::bigint[], $6::text[], $7::text[], $8::text[], $9::text[])
    AS u(pk, id, parent_pk, role, content, body, fts)
"""

_INSERT_ONE = """
WITH ins AS (
    INSERT INTO messages (session_id, id, parent_pk, role, content, body, tsv, created_at)
    VALUES ($1, $2, $3, $4, $5, $6,
            CASE WHEN $6::text IS NOT NULL THEN to_tsvector('sessionhub', $8::text) END, $7)
    ON CONFLICT (session_id, id) DO NOTHING RETURNING pk
), st AS (
    INSERT INTO session_stats AS st (session_id, messages) SELECT $1, 1 FROM ins
    ON CONFLICT (session_id) DO UPDATE SET messages = st.messages + 1
)
SELECT pk FROM ins
"""

# One message, one round trip: touch the session (``$10``: managed), find the parent
# (``{parent}``), insert, count it, take its seq and log ``message.appended`` (its body
# built as ``appended_json`` builds it) and ring the doorbell (``$11``: the channel, or NULL
# for none). Every part sees the statement's one snapshot, so the parent is the latest
# message *before* this one; the session lock taken with BEGIN keeps that true. Each part
# reads the one before it, which makes Postgres run them in that order: the session row is
# locked before the stream's counter row, as every other writer locks them (else two
# writers could deadlock).
_APPEND_ONE = """
WITH p AS ({parent}),
t AS (
    UPDATE sessions SET updated_at = $6 WHERE id = $1 AND $10::bool RETURNING 1
), ins AS (
    INSERT INTO messages (session_id, id, parent_pk, role, content, body, tsv, created_at)
    SELECT $1, $2, (SELECT pk FROM p), $3, $4, $5,
           CASE WHEN $5::text IS NOT NULL THEN to_tsvector('sessionhub', $7::text) END, $6
    FROM (SELECT count(*) FROM t) AS touched
    ON CONFLICT (session_id, id) DO NOTHING RETURNING pk
), st AS (
    INSERT INTO session_stats AS st (session_id, messages) SELECT $1, 1 FROM ins
    ON CONFLICT (session_id) DO UPDATE SET messages = st.messages + 1
), s AS (
    INSERT INTO streams AS s (stream, epoch, first_seq, last_seq) SELECT $8, $9, 1, 1 FROM ins
    ON CONFLICT (stream) DO UPDATE SET last_seq = s.last_seq + 1
    RETURNING last_seq
), e AS (
    INSERT INTO events (stream, seq, session_id, type, data, created_at)
    SELECT $8, s.last_seq, $1, 'message.appended',
           '{{"message":' || $4::text || ',"parent_id":'
           || COALESCE(to_json((SELECT id FROM p))::text, 'null') || '}}', $6
    FROM s
)
SELECT (SELECT pk FROM ins), (SELECT id FROM p), (SELECT last_seq FROM s), (SELECT count(*) FROM t),
       (SELECT pg_notify($11, s.last_seq::text || ' ' || $12) FROM s WHERE $11::text IS NOT NULL)
"""
_APPEND_AFTER_LATEST = _APPEND_ONE.format(
    parent="SELECT pk, id FROM messages WHERE session_id = $1 ORDER BY pk DESC LIMIT 1"
)
_APPEND_AFTER = _APPEND_ONE.format(parent="SELECT pk, id FROM messages WHERE session_id = $1 AND id = $13")
_APPEND_ROOT = _APPEND_ONE.format(parent="SELECT NULL::bigint AS pk, NULL::text AS id WHERE false")

_COUNT = (
    "INSERT INTO session_stats AS st (session_id, messages) VALUES ($1, $2) "
    "ON CONFLICT (session_id) DO UPDATE SET messages = st.messages + excluded.messages"
)

_DELETE_ONE = """
WITH t AS (
    SELECT m.pk, m.parent_pk, p.id AS parent_id FROM messages m
    LEFT JOIN messages p ON p.pk = m.parent_pk
    WHERE m.session_id = $1 AND m.id = $2
), ch AS (
    UPDATE messages c SET parent_pk = t.parent_pk FROM t WHERE c.parent_pk = t.pk
    RETURNING c.pk, c.id
), d AS (
    DELETE FROM messages WHERE pk = (SELECT pk FROM t)
)
SELECT t.parent_id, ARRAY(SELECT id FROM ch ORDER BY pk) FROM t
"""

_CLEAR = """
WITH a AS (DELETE FROM messages WHERE session_id = $1),
     b AS (DELETE FROM compactions WHERE session_id = $1)
DELETE FROM session_stats WHERE session_id = $1
"""

_IS_ANCESTOR = """
WITH RECURSIVE up(pk, parent_pk) AS (
    SELECT pk, parent_pk FROM messages WHERE pk = $1
    UNION ALL
    SELECT m.pk, m.parent_pk FROM up JOIN messages m ON m.pk = up.parent_pk
    WHERE m.pk < up.pk AND m.pk >= $2
)
SELECT 1 FROM up WHERE pk = $2 LIMIT 1
"""

_READ_EVENTS = """
SELECT s.epoch, s.first_seq, s.last_seq, e.session_id, e.seq, e.type, e.data, e.created_at
FROM (SELECT 1) AS one
LEFT JOIN streams s ON s.stream = $1
LEFT JOIN LATERAL (
    SELECT session_id, seq, type, data, created_at FROM events
    WHERE stream = $1 AND seq > $2 ORDER BY seq LIMIT $3
) e ON true
ORDER BY e.seq
"""


class _Tx:
    """One write transaction: its connection, its clock, the (stream, seq) it wrote."""

    __slots__ = ("conn", "notes", "notified", "now", "when")

    def __init__(self, conn: Conn) -> None:
        self.conn = conn
        self.now = time.time()
        self.when = ts(self.now)
        self.notes: list[tuple[str, int]] = []
        #: Streams whose doorbell a statement already sent (:data:`_APPEND_ONE`).
        self.notified: set[str] = set()

    async def emit_many(self, stream: str, session_id: str, events: Sequence[tuple[str, str]]) -> int:
        """Append pre-encoded ``(type, data_json)`` events with consecutive seqs; the last."""
        n = len(events)
        if n == 0:
            return 0
        last = await self.conn.fetchval(
            _EMIT,
            stream,
            new_epoch(),
            n,
            session_id,
            [t for t, _ in events],
            [d for _, d in events],
            self.when,
        )
        self.notes.append((stream, int(last)))
        return int(last)

    async def emit(self, stream: str, session_id: str, type_: str, data: Any) -> int:
        return await self.emit_many(stream, session_id, [(type_, _encode(data).decode())])

    async def emit_session(self, session_id: str, type_: str, data: Any) -> int:
        return await self.emit(session_stream(session_id), session_id, type_, data)

    async def touch(self, session_id: str) -> None:
        status = await self.conn.execute(
            "UPDATE sessions SET updated_at = $2 WHERE id = $1", session_id, self.when
        )
        if status == "UPDATE 0":
            raise SessionNotFound(session_id)

    async def session_row(self, session_id: str) -> SessionInfo:
        return await _session_row(self.conn, session_id)

    async def registry_change(self, info: SessionInfo, type_: str, **extra: Any) -> None:
        data = {"session": msgspec.to_builtins(info), **extra}
        await self.emit_session(info.id, type_, data)
        await self.emit(REGISTRY, info.id, type_, data)


async def _session_row(conn: Conn, session_id: str) -> SessionInfo:
    row = await conn.fetchrow(f"SELECT {SESSION_COLS} FROM sessions WHERE id = $1", session_id)
    if row is None:
        raise SessionNotFound(session_id)
    return session_info(row)


async def _pk_of(conn: Conn, session_id: str, message_id: str) -> int | None:
    pk = await conn.fetchval(
        "SELECT pk FROM messages WHERE session_id = $1 AND id = $2", session_id, message_id
    )
    return None if pk is None else int(pk)


async def _path(conn: Conn, session_id: str, leaf_id: str | None) -> list[Message]:
    if leaf_id is None or leaf_id == "":
        rows = await conn.fetch(_PATH_LATEST, session_id)
    else:
        rows = await conn.fetch(_PATH_ID, session_id, leaf_id)
    return [m for (c,) in rows if (m := decode_message(c)) is not None]


async def _compactions(conn: Conn, session_id: str) -> list[Compaction]:
    return [compaction(r) for r in await conn.fetch(_COMPACTIONS, session_id)]


async def _append_one(
    tx: _Tx, session_id: str, message: Message, parent: ParentArg, *, managed: bool, notify: bool
) -> AppendResult:
    """:func:`_insert_messages` of one message in one statement (:data:`_APPEND_ONE`)."""
    stream = session_stream(session_id)
    body = _body(message)
    args: list[Any] = [
        session_id,
        message.id,
        message.role,
        message_json(message),
        body,
        tx.when,
        fts_text(body),
        stream,
        new_epoch(),
        managed,
        CHANNEL if notify else None,
        stream_key(stream),
    ]
    if parent is LATEST:
        statement = _APPEND_AFTER_LATEST
    elif parent is None:
        statement = _APPEND_ROOT
    else:
        statement, args = _APPEND_AFTER, [*args, parent]
    row = await tx.conn.fetchrow(statement, *args)
    assert row is not None
    pk, _parent_id, seq, touched, _ = row
    if managed and not touched:
        raise SessionNotFound(session_id)  # the transaction rolls back what was written
    if pk is None:  # already stored: first content wins, nothing is written
        return AppendResult(inserted=[], last_id=message.id, last_seq=0)
    tx.notes.append((stream, int(seq)))
    if notify:
        tx.notified.add(stream)
    return AppendResult(inserted=[message.id], last_id=message.id, last_seq=int(seq))


async def _insert_messages(
    tx: _Tx, session_id: str, messages: Sequence[Message], parent: ParentArg
) -> AppendResult:
    conn = tx.conn
    parent_pk: int | None
    parent_id: str | None
    if parent is LATEST:
        row = await conn.fetchrow(
            "SELECT pk, id FROM messages WHERE session_id = $1 ORDER BY pk DESC LIMIT 1", session_id
        )
        parent_pk, parent_id = (None, None) if row is None else (int(row[0]), row[1])
    elif parent is None:
        parent_pk, parent_id = None, None
    else:
        parent_pk = await _pk_of(conn, session_id, parent)
        parent_id = parent if parent_pk is not None else None
    if not messages:
        return AppendResult(inserted=[], last_id=parent_id, last_seq=0)
    stream = session_stream(session_id)
    if len(messages) == 1:
        message = messages[0]
        content = message_json(message)
        body = _body(message)
        pk = await conn.fetchval(
            _INSERT_ONE,
            session_id,
            message.id,
            parent_pk,
            message.role,
            content,
            body,
            tx.when,
            fts_text(body),
        )
        if pk is None:  # already stored: first content wins, nothing is written
            return AppendResult(inserted=[], last_id=message.id, last_seq=0)
        seq = await tx.emit_many(
            stream, session_id, [("message.appended", appended_json(content, parent_id))]
        )
        return AppendResult(inserted=[message.id], last_id=message.id, last_seq=seq)
    # Which ids are stored already (first content wins; they still continue the chain),
    # and pks for the rest: taken from the identity's sequence, so they are newer than
    # every row of the session (its writers are serialized by the session lock).
    known: dict[str, int] = {
        r[0]: int(r[1])
        for r in await conn.fetch(
            "SELECT id, pk FROM messages WHERE session_id = $1 AND id = ANY($2::text[])",
            session_id,
            [m.id for m in messages],
        )
    }
    fresh = len({m.id for m in messages} - known.keys())
    pks: list[int] = sorted(
        int(r[0])
        for r in await conn.fetch(
            "SELECT nextval(pg_get_serial_sequence('messages', 'pk')) FROM generate_series(1, $1)",
            fresh,
        )
    )
    pk_iter = iter(pks)
    cols: tuple[list[Any], ...] = ([], [], [], [], [], [], [])
    events: list[tuple[str, str]] = []
    inserted: list[str] = []
    for message in messages:
        pk = known.get(message.id)
        if pk is None:
            pk = known[message.id] = next(pk_iter)
            content = message_json(message)
            body = _body(message)
            for col, value in zip(
                cols, (pk, message.id, parent_pk, message.role, content, body, fts_text(body)), strict=True
            ):
                col.append(value)
            events.append(("message.appended", appended_json(content, parent_id)))
            inserted.append(message.id)
        parent_pk, parent_id = pk, message.id
    if inserted:
        await conn.execute(_INSERT_MESSAGES, session_id, tx.when, *cols)
        await conn.execute(_COUNT, session_id, len(inserted))
    last_seq = await tx.emit_many(stream, session_id, events)
    return AppendResult(inserted=inserted, last_id=parent_id, last_seq=last_seq)


async def _update_message(tx: _Tx, session_id: str, message: Message, *, emit: bool = True) -> bool:
    body = _body(message)
    content = message_json(message)
    status = await tx.conn.execute(
        "UPDATE messages SET content = $3, role = $4, body = $5, "
        "tsv = CASE WHEN $5::text IS NOT NULL THEN to_tsvector('sessionhub', $6::text) END "
        "WHERE session_id = $1 AND id = $2",
        session_id,
        message.id,
        content,
        message.role,
        body,
        fts_text(body),
    )
    if status == "UPDATE 0":
        return False
    if emit:
        await tx.emit_many(
            session_stream(session_id), session_id, [("message.updated", updated_json(content))]
        )
    return True


async def _insert_compaction(tx: _Tx, session_id: str, c: Compaction, *, emit: bool = True) -> None:
    await tx.conn.execute(
        "INSERT INTO compactions (session_id, id, summary, from_message_id, to_message_id, created_at) "
        "VALUES ($1, $2, $3, $4, $5, $6)",
        session_id,
        c.id,
        c.summary,
        c.from_message_id,
        c.to_message_id,
        c.created_at,
    )
    if emit:
        await tx.emit_session(session_id, "compaction.added", {"compaction": msgspec.to_builtins(c)})


async def _create_session(
    tx: _Tx,
    *,
    name: str,
    parent_session_id: str | None,
    model: str | None,
    source: str | None,
    session_id: str | None,
    event: str = "session.created",
    event_extra: dict[str, Any] | None = None,
) -> SessionInfo:
    sid = session_id if session_id is not None else str(uuid.uuid4())
    row = await tx.conn.fetchrow(
        "INSERT INTO sessions (id, name, parent_session_id, model, source, created_at, updated_at) "
        f"VALUES ($1, $2, $3, $4, $5, $6, $6) ON CONFLICT (id) DO NOTHING RETURNING {SESSION_COLS}",
        sid,
        name,
        parent_session_id,
        model,
        source,
        tx.when,
    )
    if row is None:
        raise InvalidInput(f"session {sid!r} already exists")
    info = session_info(row)
    data = {"session": msgspec.to_builtins(info), **(event_extra or {})}
    await tx.emit_session(sid, event, data)
    await tx.emit(REGISTRY, sid, event, data)
    return info


class _Connection(asyncpg.Connection):
    """Pooled connections skip asyncpg's reset query on release (one round trip per
    operation): the store keeps no session state (advisory locks are transaction-scoped,
    no LISTEN, no cursors), and an open transaction is still rolled back."""

    def get_reset_query(self) -> str:
        return ""


def _translate(exc: BaseException) -> BaseException:
    if isinstance(exc, asyncpg.exceptions.DataError):
        return InvalidInput(f"postgres refused the value: {exc}")
    return StoreError(f"postgres: {exc}")


async def _migrate(conn: Conn) -> int:
    """Bring the schema to the newest version; two nodes starting at once take turns."""
    if await conn.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL"):
        current = await conn.fetchval("SELECT coalesce(max(version), 0) FROM schema_migrations")
        if current == len(MIGRATIONS):
            return int(current)  # nothing to create: works for a role that may not create
    async with conn.transaction():
        await conn.execute(f"SELECT pg_advisory_xact_lock({_MIGRATION_LOCK})")
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations "
            "(version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        version = int(await conn.fetchval("SELECT coalesce(max(version), 0) FROM schema_migrations"))
        if version > len(MIGRATIONS):
            raise StoreError(
                f"database schema version {version} is newer than "
                f"this sessionhub supports ({len(MIGRATIONS)})"
            )
        for i in range(version, len(MIGRATIONS)):
            await conn.execute(MIGRATIONS[i])
            await conn.execute(
                "INSERT INTO schema_migrations (version) VALUES ($1) ON CONFLICT (version) DO NOTHING", i + 1
            )
    return len(MIGRATIONS)


class PostgresStore(Store):
    """Everything in one Postgres database (the schema on the role's ``search_path``)."""

    def __init__(self, pool: asyncpg.Pool[asyncpg.Record], bus: Bus, *, notify: bool = True) -> None:
        self.bus = bus
        self.notify = notify
        self._pool = pool
        self._closed = False

    @classmethod
    async def connect(
        cls,
        dsn: str,
        *,
        bus: Bus | None = None,
        min_size: int = 1,
        max_size: int = 10,
        notify: bool = True,
        server_settings: dict[str, str] | None = None,
    ) -> PostgresStore:
        """Open a pool on ``dsn`` and create or migrate the schema as needed.

        ``notify=True`` sends a ``pg_notify`` doorbell per stream written, in each write's
        transaction, for the hub nodes listening on :data:`hub.bus.doorbell.CHANNEL`.
        ``server_settings`` (e.g. ``{"search_path": "tenant_a"}``) apply to every connection.
        """
        try:
            pool = await asyncpg.create_pool(
                dsn,
                min_size=min_size,
                max_size=max_size,
                server_settings=server_settings,
                connection_class=_Connection,
            )
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise StoreError(f"postgres: cannot connect: {exc}") from exc
        try:
            async with pool.acquire() as conn:
                await _migrate(conn)
        except BaseException as exc:
            await pool.close()
            if isinstance(exc, asyncpg.PostgresError | asyncpg.InterfaceError | OSError):
                raise StoreError(f"postgres: cannot migrate: {exc}") from exc
            raise
        return cls(pool, bus or MemoryBus(), notify=notify)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._pool.close()

    async def __aenter__(self) -> PostgresStore:
        return self

    # -- plumbing ------------------------------------------------------------------------
    async def _write(self, fn: Callable[[_Tx], Awaitable[T]], *, lock: str | None = None) -> T:
        """Run ``fn(tx)`` as one transaction (after locking session stream ``lock``), send
        the doorbells inside it, commit, then ring the bus."""
        if self._closed:
            raise StoreClosed("store is closed")
        try:
            async with self._pool.acquire() as conn:
                tx = _Tx(conn)
                await conn.execute(
                    "BEGIN" if lock is None else f"BEGIN; SELECT pg_advisory_xact_lock({_key(lock)})"
                )
                try:
                    result = await fn(tx)
                    await conn.execute(self._commit(tx))
                except BaseException:
                    if not conn.is_closed():
                        with contextlib.suppress(asyncpg.PostgresError, asyncpg.InterfaceError, OSError):
                            await conn.execute("ROLLBACK")
                    raise
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as exc:
            if self._closed:
                raise StoreClosed("store is closed") from exc
            raise _translate(exc) from exc
        except UnicodeEncodeError as exc:  # a lone surrogate, in a lock key or a parameter
            raise InvalidInput(f"text that is not valid Unicode: {exc.reason}") from None
        for stream, seq in tx.notes:
            self.bus.publish(stream, seq)
        return result

    async def analyze(self) -> None:
        """Refresh the planner's statistics of the store's tables. Autovacuum does it soon
        after a big change; call it yourself right after a bulk import, before searching."""

        async def fn(conn: Conn) -> None:
            await conn.execute("ANALYZE messages, events, search_entries, sessions")

        await self._read(fn)

    def _commit(self, tx: _Tx) -> str:
        """COMMIT, after the doorbells not yet sent: one round trip. The payloads go as
        hex literals, so no stream name can ever be read as SQL."""
        if not self.notify:
            return "COMMIT"
        last = {stream: seq for stream, seq in tx.notes if stream not in tx.notified}
        payloads = [doorbell(stream, seq).encode().hex() for stream, seq in last.items()]
        notices = "".join(
            f"SELECT pg_notify('{CHANNEL}', convert_from(decode('{p}', 'hex'), 'UTF8'));" for p in payloads
        )
        return notices + "COMMIT"

    async def _read(self, fn: Callable[[Conn], Awaitable[T]]) -> T:
        if self._closed:
            raise StoreClosed("store is closed")
        try:
            async with self._pool.acquire() as conn:
                return await fn(conn)
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as exc:
            if self._closed:
                raise StoreClosed("store is closed") from exc
            raise _translate(exc) from exc
        except UnicodeEncodeError as exc:  # a lone surrogate, in a lock key or a parameter
            raise InvalidInput(f"text that is not valid Unicode: {exc.reason}") from None

    # -- messages ------------------------------------------------------------------------
    async def append_messages(
        self,
        session_id: str,
        messages: Sequence[Message],
        parent: ParentArg = LATEST,
        *,
        managed: bool = False,
    ) -> AppendResult:
        async def fn(tx: _Tx) -> AppendResult:
            if len(messages) == 1:
                return await _append_one(
                    tx, session_id, messages[0], parent, managed=managed, notify=self.notify
                )
            if managed:
                await tx.touch(session_id)
            return await _insert_messages(tx, session_id, messages, parent)

        return await self._write(fn, lock=session_stream(session_id))

    async def update_message(
        self,
        session_id: str,
        message: Message,
        *,
        managed: bool = False,
        emit: bool = True,
        also: Sequence[LogEntry] = (),
    ) -> bool:
        async def fn(tx: _Tx) -> bool:
            if managed:
                await tx.touch(session_id)
            updated = await _update_message(tx, session_id, message, emit=emit)
            for entry in also:
                await tx.emit_session(entry.session_id, entry.type, entry.data)
            return updated

        return await self._write(fn, lock=session_stream(session_id))

    async def upsert_message(
        self,
        session_id: str,
        message: Message,
        parent: ParentArg = LATEST,
        *,
        managed: bool = False,
    ) -> bool:
        async def fn(tx: _Tx) -> bool:
            if managed:
                await tx.touch(session_id)
            if await _update_message(tx, session_id, message):
                return False
            await _insert_messages(tx, session_id, [message], parent)
            return True

        return await self._write(fn, lock=session_stream(session_id))

    async def delete_messages(
        self, session_id: str, ids: Sequence[str], *, managed: bool = False
    ) -> list[str]:
        async def fn(tx: _Tx) -> list[str]:
            if managed:
                await tx.touch(session_id)
            deleted: list[str] = []
            reparented: list[list[str | None]] = []
            for mid in dict.fromkeys(ids):
                row = await tx.conn.fetchrow(_DELETE_ONE, session_id, mid)
                if row is None:
                    continue
                parent_id, children = row
                reparented.extend([child, parent_id] for child in children)
                deleted.append(mid)
            if deleted:
                await tx.conn.execute(_COUNT, session_id, -len(deleted))
                await tx.emit_session(
                    session_id, "message.deleted", {"ids": deleted, "reparented": reparented}
                )
            return deleted

        return await self._write(fn, lock=session_stream(session_id))

    async def clear_messages(self, session_id: str, *, managed: bool = False) -> None:
        async def fn(tx: _Tx) -> None:
            if managed:
                await tx.touch(session_id)
            await tx.conn.execute(_CLEAR, session_id)
            await tx.emit_session(session_id, "messages.cleared", {})

        await self._write(fn, lock=session_stream(session_id))

    async def get_message(self, session_id: str, message_id: str) -> Message | None:
        async def fn(conn: Conn) -> Message | None:
            content = await conn.fetchval(
                "SELECT content FROM messages WHERE session_id = $1 AND id = $2", session_id, message_id
            )
            return None if content is None else decode_message(content)

        return await self._read(fn)

    async def get_history(self, session_id: str, leaf_id: str | None = None) -> list[Message]:
        async def fn(conn: Conn) -> list[Message]:
            if leaf_id is None or leaf_id == "":
                rows = await conn.fetch(_HISTORY_LATEST, session_id)
            else:
                rows = await conn.fetch(_HISTORY_ID, session_id, leaf_id)
            path: list[Message] = []
            overlays: list[Compaction] = []
            for kind, _n, a, b, c, d, t in rows:
                if kind == 0:
                    if (m := decode_message(a)) is not None:
                        path.append(m)
                else:
                    overlays.append(
                        Compaction(id=a, summary=b, from_message_id=c, to_message_id=d, created_at=t)
                    )
            if not path:
                return path
            return apply_compactions(path, overlays)

        return await self._read(fn)

    async def get_path(self, session_id: str, leaf_id: str | None = None) -> list[Message]:
        return await self._read(lambda conn: _path(conn, session_id, leaf_id))

    async def get_latest_leaf(self, session_id: str) -> Message | None:
        async def fn(conn: Conn) -> Message | None:
            content = await conn.fetchval(
                "SELECT content FROM messages WHERE session_id = $1 ORDER BY pk DESC LIMIT 1", session_id
            )
            return None if content is None else decode_message(content)

        return await self._read(fn)

    async def get_path_length(self, session_id: str, leaf_id: str | None = None) -> int:
        async def fn(conn: Conn) -> int:
            if leaf_id is None or leaf_id == "":
                n = await conn.fetchval(_LENGTH_LATEST, session_id)
            else:
                n = await conn.fetchval(_LENGTH_ID, session_id, leaf_id)
            return int(n)

        return await self._read(fn)

    async def get_branches(self, session_id: str, message_id: str) -> list[Message]:
        async def fn(conn: Conn) -> list[Message]:
            rows = await conn.fetch(
                "SELECT content FROM messages WHERE parent_pk = "
                "(SELECT pk FROM messages WHERE session_id = $1 AND id = $2) ORDER BY pk",
                session_id,
                message_id,
            )
            return [m for (c,) in rows if (m := decode_message(c)) is not None]

        return await self._read(fn)

    async def search_messages(
        self,
        query: str,
        *,
        session_id: str | None,
        limit: int = 20,
        match: Literal["phrase", "words"] = "phrase",
    ) -> list[SearchResult]:
        if not isinstance(query, str):
            raise InvalidInput("search query must be a string")
        arg: str | list[str] = fts_text(query) if match == "phrase" else fts_words(query)
        if not arg or check_limit(limit) <= 0:
            return []

        async def fn(conn: Conn) -> list[SearchResult]:
            tsquery = await conn.fetchval(_TSQUERY[match], arg)
            if not tsquery:
                return []  # no lexeme in the query: nothing can match
            q = _tsquery_constant(tsquery)
            if session_id is not None:
                rows = await conn.fetch(_SEARCH_SESSION.format(q=q, window=SEARCH_WINDOW), session_id, limit)
            else:
                rows = await conn.fetch(_SEARCH_ALL.format(q=q, window=SEARCH_WINDOW), limit)
            return [
                SearchResult(id=r[0], role=r[1], content=r[2], session_id=r[3], created_at=r[4]) for r in rows
            ]

        return await self._read(fn)

    # -- compaction overlays -------------------------------------------------------------
    async def add_compaction(
        self,
        session_id: str,
        summary: str,
        from_id: str,
        to_id: str,
        *,
        managed: bool = False,
        verify_path: bool = False,
        covered: Sequence[str] = (),
    ) -> Compaction:
        for name, value in (("summary", summary), ("from_id", from_id), ("to_id", to_id)):
            if not isinstance(value, str):
                raise InvalidInput(f"{name} must be a string")

        async def fn(tx: _Tx) -> Compaction:
            conn = tx.conn
            if managed:
                await tx.touch(session_id)
            if verify_path:
                top = await _pk_of(conn, session_id, from_id)
                leaf = await _pk_of(conn, session_id, to_id)
                if (
                    top is None
                    or leaf is None
                    or top > leaf
                    or not await conn.fetchval(_IS_ANCESTOR, leaf, top)
                ):
                    raise Conflict(
                        f"cannot lay an overlay over {from_id!r}..{to_id!r}: "
                        "they are no longer one path of the session"
                    )
            if covered:
                wanted = sorted(set(covered))
                found = int(
                    await conn.fetchval(
                        "SELECT count(*) FROM messages WHERE session_id = $1 AND id = ANY($2::text[])",
                        session_id,
                        wanted,
                    )
                )
                if found != len(wanted):
                    raise Conflict(
                        f"cannot lay an overlay over {from_id!r}..{to_id!r}: "
                        f"{len(wanted) - found} of the summarized messages were deleted meanwhile"
                    )
            c = Compaction(
                id=str(uuid.uuid4()),
                summary=summary,
                from_message_id=from_id,
                to_message_id=to_id,
                created_at=tx.when,
            )
            await _insert_compaction(tx, session_id, c)
            return c

        return await self._write(fn, lock=session_stream(session_id))

    async def get_compactions(self, session_id: str) -> list[Compaction]:
        return await self._read(lambda conn: _compactions(conn, session_id))

    # -- sessions registry ---------------------------------------------------------------
    async def create_session(
        self,
        name: str,
        *,
        parent_session_id: str | None = None,
        model: str | None = None,
        source: str | None = None,
        session_id: str | None = None,
    ) -> SessionInfo:
        if not isinstance(name, str):
            raise InvalidInput("session name must be a string")

        async def fn(tx: _Tx) -> SessionInfo:
            return await _create_session(
                tx,
                name=name,
                parent_session_id=parent_session_id,
                model=model,
                source=source,
                session_id=session_id,
            )

        return await self._write(fn)

    async def get_session(self, session_id: str) -> SessionInfo | None:
        async def fn(conn: Conn) -> SessionInfo | None:
            row = await conn.fetchrow(f"SELECT {SESSION_COLS} FROM sessions WHERE id = $1", session_id)
            return None if row is None else session_info(row)

        return await self._read(fn)

    async def list_sessions(self) -> list[SessionInfo]:
        async def fn(conn: Conn) -> list[SessionInfo]:
            rows = await conn.fetch(f"SELECT {SESSION_COLS} FROM sessions ORDER BY updated_at DESC, pk DESC")
            return [session_info(r) for r in rows]

        return await self._read(fn)

    async def rename_session(self, session_id: str, name: str) -> SessionInfo:
        if not isinstance(name, str):
            raise InvalidInput("session name must be a string")

        async def fn(tx: _Tx) -> SessionInfo:
            row = await tx.conn.fetchrow(
                f"UPDATE sessions SET name = $2, updated_at = $3 WHERE id = $1 RETURNING {SESSION_COLS}",
                session_id,
                name,
                tx.when,
            )
            if row is None:
                raise SessionNotFound(session_id)
            info = session_info(row)
            await tx.registry_change(info, "session.renamed")
            return info

        return await self._write(fn)

    async def delete_session(self, session_id: str, *, context_keys: Sequence[str] = ()) -> None:
        stream = session_stream(session_id)

        async def fn(tx: _Tx) -> None:
            conn = tx.conn
            info = await tx.session_row(session_id)
            await conn.execute(_CLEAR, session_id)
            if context_keys:
                await conn.execute(
                    "DELETE FROM context_blocks WHERE key = ANY($1::text[])", list(context_keys)
                )
            await conn.execute("DELETE FROM sessions WHERE id = $1", session_id)
            data = {"session": msgspec.to_builtins(info)}
            # The log goes with the session (it holds message bodies); only the final
            # event stays, and the stream now starts there.
            seq = await tx.emit_session(session_id, "session.deleted", data)
            await conn.execute(
                "WITH d AS (DELETE FROM events WHERE stream = $1 AND seq < $2) "
                "UPDATE streams SET first_seq = $2 WHERE stream = $1",
                stream,
                seq,
            )
            await tx.emit(REGISTRY, session_id, "session.deleted", data)

        await self._write(fn, lock=stream)

    async def add_usage(
        self, session_id: str, input_tokens: int, output_tokens: int, cost: float
    ) -> SessionInfo:
        delta = check_usage(input_tokens, output_tokens, cost)

        async def fn(tx: _Tx) -> SessionInfo:
            # FOR UPDATE: a concurrent add_usage waits here, then checks the new totals.
            current = await tx.conn.fetchrow(
                f"SELECT {SESSION_COLS} FROM sessions WHERE id = $1 FOR UPDATE", session_id
            )
            if current is None:
                raise SessionNotFound(session_id)
            before = session_info(current)
            totals = usage_totals((before.input_tokens, before.output_tokens, before.estimated_cost), delta)
            row = await tx.conn.fetchrow(
                "UPDATE sessions SET input_tokens = $2, output_tokens = $3, estimated_cost = $4, "
                f"updated_at = $5 WHERE id = $1 RETURNING {SESSION_COLS}",
                session_id,
                *totals,
                tx.when,
            )
            if row is None:  # not after FOR UPDATE found it; typed for mypy
                raise SessionNotFound(session_id)
            info = session_info(row)
            data = {"input_tokens": delta[0], "output_tokens": delta[1], "cost": delta[2]}
            await tx.registry_change(info, "session.usage", delta=data)
            return info

        return await self._write(fn)

    async def fork_session(self, session_id: str, at_message_id: str, name: str) -> SessionInfo:
        if not isinstance(name, str):
            raise InvalidInput("session name must be a string")

        async def fn(tx: _Tx) -> SessionInfo:
            conn = tx.conn
            await tx.session_row(session_id)
            path = await _path(conn, session_id, at_message_id) if at_message_id else []
            overlays = visible_compactions([m.id for m in path], await _compactions(conn, session_id))
            info = await _create_session(
                tx,
                name=name,
                parent_session_id=session_id,
                model=None,
                source=None,
                session_id=None,
                event="session.forked",
                event_extra={"from_session_id": session_id, "at_message_id": at_message_id},
            )
            await _insert_messages(tx, info.id, path, None)
            for c in overlays:
                await _insert_compaction(tx, info.id, c)
            return info

        return await self._write(fn, lock=session_stream(session_id))

    async def split_session(self, session_id: str, summary: str, name: str | None = None) -> SessionInfo:
        if not isinstance(summary, str):
            raise InvalidInput("summary must be a string")

        async def fn(tx: _Tx) -> SessionInfo:
            row = await tx.conn.fetchrow(
                "UPDATE sessions SET end_reason = 'compaction', updated_at = $2 WHERE id = $1 "
                f"RETURNING {SESSION_COLS}",
                session_id,
                tx.when,
            )
            if row is None:
                raise SessionNotFound(session_id)
            ended = session_info(row)
            await tx.registry_change(ended, "session.ended")
            info = await _create_session(
                tx,
                name=name if name is not None else (ended.name or "Compacted"),
                parent_session_id=session_id,
                model=ended.model,
                source=ended.source,
                session_id=None,
            )
            message = Message(
                id=str(uuid.uuid4()),
                role="assistant",
                parts=[{"type": "text", "text": f"[Context from previous session]\n\n{summary}"}],
            )
            await _insert_messages(tx, info.id, [message], None)
            return info

        return await self._write(fn, lock=session_stream(session_id))

    # -- context blocks and search entries ------------------------------------------------
    async def get_context_value(self, key: str) -> str | None:
        async def fn(conn: Conn) -> str | None:
            content = await conn.fetchval("SELECT content FROM context_blocks WHERE key = $1", key)
            return None if content is None else str(content)

        return await self._read(fn)

    async def set_context_value(self, key: str, content: str, *, event: LogEntry | None = None) -> None:
        async def fn(tx: _Tx) -> None:
            await tx.conn.execute(
                "INSERT INTO context_blocks (key, content, updated_at) VALUES ($1, $2, $3) "
                "ON CONFLICT (key) DO UPDATE SET content = excluded.content, "
                "updated_at = excluded.updated_at",
                key,
                content,
                tx.when,
            )
            if event is not None:
                await tx.emit_session(event.session_id, event.type, event.data)

        await self._write(fn)

    async def count_search_entries(self, label: str) -> int:
        async def fn(conn: Conn) -> int:
            return int(await conn.fetchval("SELECT count(*) FROM search_entries WHERE label = $1", label))

        return await self._read(fn)

    async def set_search_entry(
        self, label: str, key: str, content: str, *, event: LogEntry | None = None
    ) -> None:
        async def fn(tx: _Tx) -> None:
            await tx.conn.execute(
                "INSERT INTO search_entries (label, key, content, tsv, created_at, updated_at) "
                "VALUES ($1, $2, $3, to_tsvector('sessionhub', $5::text), $4, $4) "
                "ON CONFLICT (label, key) DO UPDATE SET "
                "content = excluded.content, tsv = excluded.tsv, updated_at = excluded.updated_at",
                label,
                key,
                content,
                tx.when,
                fts_text(content),
            )
            if event is not None:
                await tx.emit_session(event.session_id, event.type, event.data)

        await self._write(fn)

    async def search_entries(self, label: str, query: str, limit: int = 10) -> list[tuple[str, str]]:
        words = fts_words(query) if isinstance(query, str) else []
        if not words or check_limit(limit) <= 0:
            return []

        async def fn(conn: Conn) -> list[tuple[str, str]]:
            rows = await conn.fetch(_SEARCH_ENTRIES, words, label, limit)
            return [(str(k), str(c)) for k, c in rows]

        return await self._read(fn)

    async def log_event(self, entry: LogEntry) -> int:
        async def fn(tx: _Tx) -> int:
            return await tx.emit_session(entry.session_id, entry.type, entry.data)

        return await self._write(fn)

    # -- event logs ----------------------------------------------------------------------
    async def read_events(
        self, stream: str, after_seq: int = 0, limit: int = 1000, *, epoch: str | None = None
    ) -> list[Event]:
        check_limit(after_seq, "after_seq")
        check_limit(limit)

        async def fn(conn: Conn) -> list[Event]:
            rows = await conn.fetch(_READ_EVENTS, stream, after_seq, max(limit, 0))
            head = rows[0]
            if head[0] is None:
                pos = StreamPosition(stream=stream, epoch="", first_seq=1, last_seq=0)
            else:
                pos = StreamPosition(stream=stream, epoch=head[0], first_seq=head[1], last_seq=head[2])
            pos.check(after_seq, epoch)
            kind: Literal["session", "registry"] = "registry" if stream == REGISTRY else "session"
            return [
                Event(
                    session_id=r[3],
                    seq=r[4],
                    epoch=pos.epoch,
                    type=r[5],
                    data=_decode(r[6]),
                    created_at=r[7],
                    stream=kind,
                )
                for r in rows
                if r[4] is not None
            ]

        return await self._read(fn)

    async def stream_position(self, stream: str) -> StreamPosition:
        async def fn(conn: Conn) -> StreamPosition:
            row = await conn.fetchrow(
                "SELECT epoch, first_seq, last_seq FROM streams WHERE stream = $1", stream
            )
            if row is None:
                return StreamPosition(stream=stream, epoch="", first_seq=1, last_seq=0)
            return StreamPosition(stream=stream, epoch=row[0], first_seq=row[1], last_seq=row[2])

        return await self._read(fn)

    # -- settings ------------------------------------------------------------------------
    async def claim_setting(self, key: str, value: str, *, replace: bool = False) -> str:
        """Record ``value`` under ``key`` unless another value is recorded (or ``replace``);
        returns the value recorded afterwards. One statement: two nodes starting at once
        agree on which one recorded first."""

        async def fn(conn: Conn) -> str:
            return str(
                await conn.fetchval(
                    "INSERT INTO settings (key, value) VALUES ($1, $2) "
                    "ON CONFLICT (key) DO UPDATE SET "
                    "value = CASE WHEN $3 THEN excluded.value ELSE settings.value END, "
                    "updated_at = CASE WHEN $3 THEN now() ELSE settings.updated_at END "
                    "RETURNING value",
                    key,
                    value,
                    replace,
                )
            )

        return await self._read(fn)
