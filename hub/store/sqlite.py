"""`SqliteStore`: the embedded default, on aiosqlite with WAL.

Design (measured in docs/benchmarks.md):

- Each operation is one Python function run in the connection's worker thread, wrapping
  ``BEGIN IMMEDIATE .. COMMIT`` (writes) or ``BEGIN .. COMMIT`` (reads). One thread hop per
  operation instead of one per statement; a transaction can never interleave with another
  task's statements; a failure rolls the whole change back, events included.
- Writes go through one connection, reads through another: in WAL mode a reader sees a
  committed snapshot and never waits for the writer. (``:memory:`` uses one connection.)
- Messages are keyed ``(session_id, id)``. ``pk`` (the rowid) is insertion order and
  ``parent_pk`` points at the parent's rowid. A parent is always older than its children
  (deleting a message hands its children to its own, older, parent), so the session's
  newest row is always a leaf: the latest leaf is one index probe, and a path walk follows
  rowids and must strictly descend, so it ends even on a corrupted file.
- FTS5 (``porter unicode61``) keyed by the message rowid; a hashed session token column
  lets one session's search intersect posting lists instead of filtering every hit.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import logging
import os
import sqlite3
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar, cast

import aiosqlite
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
from ..fts import phrase_query, words_query
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

__all__ = ["SqliteStore"]

log = logging.getLogger("sessionhub.store")

T = TypeVar("T")
Conn = sqlite3.Connection
Notes = list[tuple[str, int]]  # (stream, seq) to ring on the bus after commit

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode

# Versioned migrations: index i brings the schema from user_version i to i + 1.
MIGRATIONS: list[str] = [
    """
    CREATE TABLE sessions (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        parent_session_id TEXT,
        model TEXT,
        source TEXT,
        input_tokens INTEGER NOT NULL DEFAULT 0,
        output_tokens INTEGER NOT NULL DEFAULT 0,
        estimated_cost REAL NOT NULL DEFAULT 0,
        end_reason TEXT,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    );
    CREATE INDEX sessions_updated ON sessions(updated_at);

    CREATE TABLE messages (
        pk INTEGER PRIMARY KEY,
        session_id TEXT NOT NULL,
        id TEXT NOT NULL,
        parent_pk INTEGER,
        role TEXT NOT NULL,
        content TEXT NOT NULL,
        created_at REAL NOT NULL
    );
    CREATE UNIQUE INDEX messages_id ON messages(session_id, id);
    CREATE INDEX messages_session ON messages(session_id);
    CREATE INDEX messages_children ON messages(parent_pk);

    CREATE VIRTUAL TABLE messages_fts USING fts5(sid, body, tokenize='porter unicode61');
    INSERT INTO messages_fts(messages_fts, rank) VALUES ('rank', 'bm25(0.0, 1.0)');

    CREATE TABLE compactions (
        pk INTEGER PRIMARY KEY,
        session_id TEXT NOT NULL,
        id TEXT NOT NULL,
        summary TEXT NOT NULL,
        from_message_id TEXT NOT NULL,
        to_message_id TEXT NOT NULL,
        created_at REAL NOT NULL
    );
    CREATE UNIQUE INDEX compactions_id ON compactions(session_id, id);

    CREATE TABLE streams (
        stream TEXT PRIMARY KEY,
        epoch TEXT NOT NULL,
        first_seq INTEGER NOT NULL,
        last_seq INTEGER NOT NULL
    ) WITHOUT ROWID;

    CREATE TABLE events (
        stream TEXT NOT NULL,
        seq INTEGER NOT NULL,
        session_id TEXT NOT NULL,
        type TEXT NOT NULL,
        data TEXT NOT NULL,
        created_at REAL NOT NULL,
        PRIMARY KEY (stream, seq)
    ) WITHOUT ROWID;
    """,
    """
    CREATE TABLE context_blocks (
        key TEXT PRIMARY KEY,
        content TEXT NOT NULL,
        updated_at REAL NOT NULL
    ) WITHOUT ROWID;

    CREATE TABLE search_entries (
        pk INTEGER PRIMARY KEY,
        label TEXT NOT NULL,
        key TEXT NOT NULL,
        content TEXT NOT NULL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    );
    CREATE UNIQUE INDEX search_entries_key ON search_entries(label, key);

    CREATE VIRTUAL TABLE search_fts USING fts5(lbl, body, tokenize='porter unicode61');
    INSERT INTO search_fts(search_fts, rank) VALUES ('rank', 'bm25(0.0, 1.0)');
    """,
    """
    CREATE TABLE session_stats (
        session_id TEXT PRIMARY KEY,
        messages INTEGER NOT NULL
    ) WITHOUT ROWID;
    INSERT INTO session_stats (session_id, messages)
        SELECT session_id, COUNT(*) FROM messages GROUP BY session_id;
    """,
    # Facts about how the database is served, e.g. the bus its nodes ring each other on
    # (hub/backends.py: a node on another bus would miss their live events).
    """
    CREATE TABLE settings (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL,
        updated_at REAL NOT NULL
    ) WITHOUT ROWID;
    """,
]


#: Ranking (bm25) costs about a microsecond per matching row. A query is ranked over its
#: newest SEARCH_WINDOW matches: exactly the original's order up to that many matches, and
#: under 2 ms when a phrase matches 14,000 of 100,000 messages (docs/benchmarks.md).
SEARCH_WINDOW = 250
#: Up to this many messages a session's search keeps the session token in MATCH.
SMALL_SESSION = 20_000


def _sid_token(session_id: str) -> str:
    # One alphanumeric token per session for the FTS column filter; the join on
    # session_id keeps results exact even if two ids ever hashed alike.
    return "s" + hashlib.blake2b(session_id.encode(), digest_size=10).hexdigest()


# ---------------------------------------------------------------------------------------
# Statements run inside a transaction, in the worker thread. They take the raw connection.
# ---------------------------------------------------------------------------------------


def _emit(conn: Conn, notes: Notes, stream: str, session_id: str, type_: str, data: Any, now: float) -> int:
    row = conn.execute(
        "UPDATE streams SET last_seq = last_seq + 1 WHERE stream = ? RETURNING last_seq", (stream,)
    ).fetchone()
    if row is None:
        conn.execute("INSERT INTO streams VALUES (?, ?, 1, 1)", (stream, new_epoch()))
        seq = 1
    else:
        seq = row[0]
    conn.execute(
        "INSERT INTO events VALUES (?, ?, ?, ?, ?, ?)",
        (stream, seq, session_id, type_, _encode(data).decode(), now),
    )
    notes.append((stream, seq))
    return int(seq)


def _emit_session(conn: Conn, notes: Notes, session_id: str, type_: str, data: Any, now: float) -> int:
    return _emit(conn, notes, session_stream(session_id), session_id, type_, data, now)


def _touch(conn: Conn, session_id: str, now: float) -> None:
    if conn.execute("UPDATE sessions SET updated_at = ? WHERE id = ?", (now, session_id)).rowcount == 0:
        raise SessionNotFound(session_id)


def _session_row(conn: Conn, session_id: str) -> SessionInfo:
    row = conn.execute(f"SELECT {SESSION_COLS} FROM sessions WHERE id = ?", (session_id,)).fetchone()
    if row is None:
        raise SessionNotFound(session_id)
    return session_info(row, ts)


def _latest(conn: Conn, session_id: str) -> tuple[int, str] | None:
    row = conn.execute(
        "SELECT pk, id FROM messages WHERE session_id = ? ORDER BY pk DESC LIMIT 1", (session_id,)
    ).fetchone()
    return None if row is None else (row[0], row[1])


def _pk_of(conn: Conn, session_id: str, message_id: str) -> int | None:
    row = conn.execute(
        "SELECT pk FROM messages WHERE session_id = ? AND id = ?", (session_id, message_id)
    ).fetchone()
    return None if row is None else int(row[0])


def _index_text(conn: Conn, pk: int, session_id: str, message: Message) -> None:
    text = message.text()
    if text:
        conn.execute(
            "INSERT INTO messages_fts(rowid, sid, body) VALUES (?, ?, ?)",
            (pk, _sid_token(session_id), text),
        )


def _emit_many(
    conn: Conn, notes: Notes, stream: str, session_id: str, events: Sequence[tuple[str, str]], now: float
) -> int:
    """Append pre-encoded ``(type, data_json)`` events with consecutive seqs; returns the last."""
    n = len(events)
    if n == 0:
        return 0
    row = conn.execute(
        "UPDATE streams SET last_seq = last_seq + ? WHERE stream = ? RETURNING last_seq", (n, stream)
    ).fetchone()
    if row is None:
        conn.execute("INSERT INTO streams VALUES (?, ?, 1, ?)", (stream, new_epoch(), n))
        last = n
    else:
        last = int(row[0])
    first = last - n + 1
    conn.executemany(
        "INSERT INTO events VALUES (?, ?, ?, ?, ?, ?)",
        [(stream, first + i, session_id, t, data, now) for i, (t, data) in enumerate(events)],
    )
    notes.append((stream, last))
    return last


def _count_messages(conn: Conn, session_id: str, delta: int) -> None:
    if delta:
        conn.execute(
            "INSERT INTO session_stats (session_id, messages) VALUES (?, ?) "
            "ON CONFLICT (session_id) DO UPDATE SET messages = messages + excluded.messages",
            (session_id, delta),
        )


def _insert_one(
    conn: Conn,
    notes: Notes,
    session_id: str,
    message: Message,
    parent_pk: int | None,
    parent_id: str | None,
    now: float,
) -> AppendResult:
    """The common case, in as few statements as possible (the write path of every turn)."""
    content = message_json(message)
    row = conn.execute(
        "INSERT INTO messages (session_id, id, parent_pk, role, content, created_at) "
        "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (session_id, id) DO NOTHING RETURNING pk",
        (session_id, message.id, parent_pk, message.role, content, now),
    ).fetchone()
    if row is None:  # already stored: first content wins, nothing is written
        return AppendResult(inserted=[], last_id=message.id, last_seq=0)
    text = message.text()
    if text:
        conn.execute(
            "INSERT INTO messages_fts (rowid, sid, body) VALUES (?, ?, ?)",
            (row[0], _sid_token(session_id), text),
        )
    _count_messages(conn, session_id, 1)
    seq = _emit_many(
        conn,
        notes,
        session_stream(session_id),
        session_id,
        [("message.appended", appended_json(content, parent_id))],
        now,
    )
    return AppendResult(inserted=[message.id], last_id=message.id, last_seq=seq)


def _insert_messages(
    conn: Conn,
    notes: Notes,
    session_id: str,
    messages: Sequence[Message],
    parent: ParentArg,
    now: float,
) -> AppendResult:
    parent_pk: int | None
    parent_id: str | None
    if parent is LATEST:
        tip = _latest(conn, session_id)
        parent_pk, parent_id = (None, None) if tip is None else tip
    elif parent is None:
        parent_pk, parent_id = None, None
    else:
        parent_pk = _pk_of(conn, session_id, parent)
        parent_id = parent if parent_pk is not None else None
    if not messages:
        return AppendResult(inserted=[], last_id=parent_id, last_seq=0)
    if len(messages) == 1:
        return _insert_one(conn, notes, session_id, messages[0], parent_pk, parent_id, now)
    # Which ids are stored already (first content wins; they still continue the chain).
    known: dict[str, int] = dict(
        conn.execute(
            "SELECT id, pk FROM messages WHERE session_id = ? AND id IN (SELECT value FROM json_each(?))",
            (session_id, _encode([m.id for m in messages]).decode()),
        ).fetchall()
    )
    # Inside BEGIN IMMEDIATE nobody else writes: the next rowids are ours to hand out, so
    # the whole chain goes in with executemany instead of one statement per message.
    next_pk = int(conn.execute("SELECT COALESCE(MAX(pk), 0) FROM messages").fetchone()[0])
    sid = _sid_token(session_id)
    rows: list[tuple[Any, ...]] = []
    texts: list[tuple[int, str, str]] = []
    events: list[tuple[str, str]] = []
    inserted: list[str] = []
    for message in messages:
        pk = known.get(message.id)
        if pk is None:
            next_pk += 1
            pk = known[message.id] = next_pk
            content = message_json(message)
            rows.append((pk, session_id, message.id, parent_pk, message.role, content, now))
            text = message.text()
            if text:
                texts.append((pk, sid, text))
            events.append(("message.appended", appended_json(content, parent_id)))
            inserted.append(message.id)
        parent_pk, parent_id = pk, message.id
    conn.executemany(
        "INSERT INTO messages (pk, session_id, id, parent_pk, role, content, created_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        rows,
    )
    # One FTS statement for the batch: FTS5 flushes a new index segment at every statement
    # boundary inside a transaction, so per-row inserts cost ~20 µs each more.
    conn.executemany("INSERT INTO messages_fts (rowid, sid, body) VALUES (?, ?, ?)", texts)
    _count_messages(conn, session_id, len(rows))
    last_seq = _emit_many(conn, notes, session_stream(session_id), session_id, events, now)
    return AppendResult(inserted=inserted, last_id=parent_id, last_seq=last_seq)


def _update_message(
    conn: Conn, notes: Notes, session_id: str, message: Message, now: float, *, emit: bool = True
) -> bool:
    content = message_json(message)
    row = conn.execute(
        "UPDATE messages SET content = ?, role = ? WHERE session_id = ? AND id = ? RETURNING pk",
        (content, message.role, session_id, message.id),
    ).fetchone()
    if row is None:
        return False
    pk = int(row[0])
    conn.execute("DELETE FROM messages_fts WHERE rowid = ?", (pk,))
    _index_text(conn, pk, session_id, message)
    if emit:
        _emit_many(
            conn,
            notes,
            session_stream(session_id),
            session_id,
            [("message.updated", updated_json(content))],
            now,
        )
    return True


def _path_rows(conn: Conn, leaf_pk: int) -> list[tuple[int, str, str]]:
    # Walk rowids upward; ``m.pk < path.pk`` guarantees termination on any data.
    # Each step yields at most one row (a message has one parent), so the rows come out
    # leaf first, root last, with no ORDER BY: no sort, and the content rides along
    # instead of a second lookup per row.
    rows = conn.execute(
        """
        WITH RECURSIVE path(pk, parent_pk, id, content) AS (
            SELECT pk, parent_pk, id, content FROM messages WHERE pk = ?
            UNION ALL
            SELECT m.pk, m.parent_pk, m.id, m.content
            FROM path JOIN messages m ON m.pk = path.parent_pk
            WHERE m.pk < path.pk
        )
        SELECT pk, id, content FROM path
        """,
        (leaf_pk,),
    ).fetchall()
    rows.reverse()
    return rows


def _resolve_leaf(conn: Conn, session_id: str, leaf_id: str | None) -> int | None:
    if leaf_id is None or leaf_id == "":
        tip = _latest(conn, session_id)
        return None if tip is None else tip[0]
    return _pk_of(conn, session_id, leaf_id)


def _path(conn: Conn, session_id: str, leaf_id: str | None) -> list[Message]:
    leaf = _resolve_leaf(conn, session_id, leaf_id)
    if leaf is None:
        return []
    out = []
    for _pk, _id, content in _path_rows(conn, leaf):
        message = decode_message(content)
        if message is not None:
            out.append(message)
    return out


def _is_ancestor(conn: Conn, session_id: str, ancestor_id: str, leaf_id: str) -> bool:
    """Whether ``ancestor_id`` is ``leaf_id`` or lies on the path above it."""
    top = _pk_of(conn, session_id, ancestor_id)
    leaf = _pk_of(conn, session_id, leaf_id)
    if top is None or leaf is None or top > leaf:
        return False
    row = conn.execute(
        """
        WITH RECURSIVE up(pk, parent_pk) AS (
            SELECT pk, parent_pk FROM messages WHERE pk = ?
            UNION ALL
            SELECT m.pk, m.parent_pk FROM up JOIN messages m ON m.pk = up.parent_pk
            WHERE m.pk < up.pk AND m.pk >= ?
        )
        SELECT 1 FROM up WHERE pk = ? LIMIT 1
        """,
        (leaf, top, top),
    ).fetchone()
    return row is not None


def _compactions(conn: Conn, session_id: str) -> list[Compaction]:
    rows = conn.execute(
        "SELECT id, summary, from_message_id, to_message_id, created_at FROM compactions "
        "WHERE session_id = ? ORDER BY pk",
        (session_id,),
    ).fetchall()
    return [compaction(r, ts) for r in rows]


def _insert_compaction(
    conn: Conn, notes: Notes, session_id: str, c: Compaction, now: float, *, emit: bool = True
) -> None:
    conn.execute(
        "INSERT INTO compactions "
        "(session_id, id, summary, from_message_id, to_message_id, created_at) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        (session_id, c.id, c.summary, c.from_message_id, c.to_message_id, c.created_at.timestamp()),
    )
    if emit:
        _emit_session(
            conn, notes, session_id, "compaction.added", {"compaction": msgspec.to_builtins(c)}, now
        )


def _create_session(
    conn: Conn,
    notes: Notes,
    now: float,
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
    try:
        conn.execute(
            "INSERT INTO sessions "
            "(id, name, parent_session_id, model, source, created_at, updated_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (sid, name, parent_session_id, model, source, now, now),
        )
    except sqlite3.IntegrityError:
        raise InvalidInput(f"session {sid!r} already exists") from None
    info = _session_row(conn, sid)
    data = {"session": msgspec.to_builtins(info), **(event_extra or {})}
    _emit_session(conn, notes, sid, event, data, now)
    _emit(conn, notes, REGISTRY, sid, event, data, now)
    return info


def _registry_change(
    conn: Conn, notes: Notes, info: SessionInfo, type_: str, now: float, **extra: Any
) -> None:
    data = {"session": msgspec.to_builtins(info), **extra}
    _emit_session(conn, notes, info.id, type_, data, now)
    _emit(conn, notes, REGISTRY, info.id, type_, data, now)


def _clear(conn: Conn, session_id: str) -> None:
    conn.execute(
        "DELETE FROM messages_fts WHERE rowid IN (SELECT pk FROM messages WHERE session_id = ?)",
        (session_id,),
    )
    conn.execute("DELETE FROM messages WHERE session_id = ?", (session_id,))
    conn.execute("DELETE FROM compactions WHERE session_id = ?", (session_id,))
    conn.execute("DELETE FROM session_stats WHERE session_id = ?", (session_id,))


class _Connection:
    """One aiosqlite connection; runs whole transactions as single calls in its thread."""

    def __init__(self, conn: aiosqlite.Connection) -> None:
        self.conn = conn

    @property
    def raw(self) -> Conn:
        return self.conn._conn

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        raw = self.conn._conn
        # aiosqlite's queue runs callables on the connection's own thread, in order.
        return cast(T, await self.conn._execute(fn, raw, *args))  # type: ignore[no-untyped-call]


def _in_tx(begin: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
    def wrap(fn: Callable[..., T]) -> Callable[..., T]:
        def run(conn: Conn, *args: Any) -> T:
            conn.execute(begin)
            try:
                result = fn(conn, *args)
            except BaseException:
                conn.rollback()
                raise
            conn.execute("COMMIT")
            return result

        return run

    return wrap


_write_tx = _in_tx("BEGIN IMMEDIATE")
_read_tx = _in_tx("BEGIN")


BUSY_TIMEOUT_MS = 10_000
#: The background checkpointer is woken after this many commits. A pass with nothing to
#: copy costs a few microseconds, so waking it often keeps each pass (and the final
#: catch-up, below) short.
CHECKPOINT_EVERY = 50
#: When the WAL holds more than this, the next writer waits for one catch-up pass with
#: the write lock held, so the WAL is reused from its start: the bound on its size. It is
#: also the ``journal_size_limit``: the file is cut back to it when the WAL restarts.
WAL_LIMIT_BYTES = 64 * 2**20
#: Appends of more messages than this run in the writer's thread, not inline.
INLINE_BATCH = 16


def _configure(conn: Conn, *, synchronous: str, reader: bool) -> None:
    # The writer runs small transactions inline on the event loop, so it must never wait
    # there: no busy wait (a contended write retries in the thread, with the timeout) and
    # no automatic checkpoint at commit (the store's checkpointer thread does them).
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS if reader else 0}")
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    conn.execute("PRAGMA foreign_keys = OFF")
    conn.execute("PRAGMA cache_size = -65536")
    if reader:
        conn.execute("PRAGMA query_only = 1")
    else:
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        conn.execute(f"PRAGMA journal_size_limit = {WAL_LIMIT_BYTES}")


def _patient(fn: Callable[[Conn], T]) -> Callable[[Conn], T]:
    """Run ``fn`` with the busy timeout on: for the writer's thread, never the event loop."""

    def run(conn: Conn) -> T:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        try:
            return fn(conn)
        finally:
            conn.execute("PRAGMA busy_timeout = 0")

    return run


def _is_busy(exc: sqlite3.Error) -> bool:
    return isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc)


class _Checkpointer:
    """PASSIVE checkpoints on a connection and thread of their own, off the write path.

    A passive checkpoint copies WAL frames into the database file while writers go on
    appending (it takes no write lock), so a pass costs the writers nothing but disk
    bandwidth. What it cannot do under steady writes is *finish*: frames appended during a
    pass are left for the next, and SQLite reuses the WAL from its start only once every
    frame is copied. So the WAL grows until either a pass ends with no commit having
    happened meanwhile (any pause in writing), or its file passes ``WAL_LIMIT_BYTES``: then one
    writer holds the write lock for a last pass, which copies only the frames appended
    since the previous pass (the bulk is already in the file), and the next write starts
    the WAL over. Submitting a pass needs no event-loop turn: a writer that never yields
    still gets its WAL checkpointed.
    """

    def __init__(self, path: str, synchronous: str) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sessionhub-checkpoint")
        self._pending: concurrent.futures.Future[None] | None = None
        self._conn: Conn | None = None
        self._path = path
        self._wal = path + "-wal"
        self._synchronous = synchronous
        #: WAL size (bytes) at the start of the last pass; 0 once a pass copied everything.
        self.wal_bytes = 0
        self.passes = 0
        self.catch_ups = 0

    def _pass(self, commits: Callable[[], int]) -> None:
        if self._conn is None:
            self._conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
            self._conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            self._conn.execute(f"PRAGMA synchronous = {self._synchronous}")
        before = commits()
        _busy, log, done = self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        page = int(self._conn.execute("PRAGMA page_size").fetchone()[0])
        self.passes += 1
        # log == done and no commit since: every frame is in the database file, and the
        # next write restarts the WAL. Otherwise the WAL is at least `log` frames long.
        caught_up = log == done and commits() == before
        self.wal_bytes = 0 if caught_up else max(0, int(log)) * (page + 24)

    def wal_file_size(self) -> int:
        """The -wal file's size: a stat, ~1 µs. It is the WAL's length whenever that is over
        ``journal_size_limit``, since SQLite cuts the file back to it when the WAL restarts."""
        try:
            return os.stat(self._wal).st_size
        except FileNotFoundError:
            return 0

    def wake(self, commits: Callable[[], int]) -> None:
        """Start a background pass unless one is queued or running; never blocks."""
        if self._pending is not None and not self._pending.done():
            return
        self._pending = self._pool.submit(self._pass, commits)
        self._pending.add_done_callback(_log_failed_pass)

    async def settle(self) -> None:
        """Wait for the running pass, if any (writers go on meanwhile)."""
        pending = self._pending
        if pending is not None and not pending.done():
            await asyncio.wrap_future(pending)

    async def catch_up(self, commits: Callable[[], int]) -> None:
        """One pass while the caller holds the write lock: the WAL ends fully copied.

        After ``settle()`` it copies only what was appended during the last pass."""
        self.catch_ups += 1
        await asyncio.wrap_future(self._pool.submit(self._pass, commits))

    async def close(self) -> None:
        def shut() -> None:
            self._pool.submit(self._close_conn).result()
            self._pool.shutdown(wait=True)

        await asyncio.to_thread(shut)

    def _close_conn(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _log_failed_pass(future: concurrent.futures.Future[None]) -> None:
    exc = future.exception()
    if exc is not None:  # the next pass catches up
        log.warning("WAL checkpoint failed: %s", exc)


def _migrate(conn: Conn) -> int:
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        if version > len(MIGRATIONS):
            raise StoreError(
                f"database schema version {version} is newer than "
                f"this sessionhub supports ({len(MIGRATIONS)})"
            )
        for i in range(version, len(MIGRATIONS)):
            for statement in MIGRATIONS[i].split(";\n"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {i + 1}")
        conn.execute("COMMIT")
    except BaseException:
        conn.rollback()
        raise
    return len(MIGRATIONS)


class SqliteStore(Store):
    """Everything in one SQLite file (or ``":memory:"``)."""

    def __init__(
        self, path: str, writer: _Connection, reader: _Connection, bus: Bus, synchronous: str = "NORMAL"
    ) -> None:
        self.path = path
        self.bus = bus
        self._writer = writer
        self._reader = reader
        self._closed = False
        self._write_lock = asyncio.Lock()
        self._commits = 0
        self._checkpointer: _Checkpointer | None = None
        self._catching_up = False
        if path != ":memory:":
            self._checkpointer = _Checkpointer(path, synchronous)

    @classmethod
    async def open(
        cls,
        path: str | Path = "sessionhub.db",
        *,
        bus: Bus | None = None,
        synchronous: Literal["OFF", "NORMAL", "FULL", "EXTRA"] = "NORMAL",
    ) -> SqliteStore:
        """Open (creating and migrating as needed) the database at ``path``.

        ``synchronous="NORMAL"`` with WAL survives a crash of the process (the commit is in
        the WAL before the call returns) but may lose the last commits on power loss;
        ``"FULL"`` fsyncs every commit.
        """
        path = str(path)
        memory = path == ":memory:"
        writer = await aiosqlite.connect(path, isolation_level=None, check_same_thread=False)
        try:
            w = _Connection(writer)
            if not memory:
                await w.call(lambda c: c.execute("PRAGMA journal_mode = WAL").fetchone())
            await w.call(lambda c: _configure(c, synchronous=synchronous, reader=False))
            await w.call(_migrate)
            if memory:
                r = w
            else:
                reader = await aiosqlite.connect(path, isolation_level=None, check_same_thread=False)
                r = _Connection(reader)
                await r.call(lambda c: _configure(c, synchronous=synchronous, reader=True))
        except BaseException:
            await writer.close()
            raise
        return cls(path, w, r, bus or MemoryBus(), synchronous)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        async with self._write_lock:
            if self._checkpointer is not None:
                await self._checkpointer.close()
            if self._reader is not self._writer:
                await self._reader.conn.close()
            await self._writer.conn.close()

    async def __aenter__(self) -> SqliteStore:
        return self

    # -- plumbing ------------------------------------------------------------------------
    async def _write(self, fn: Callable[..., T], *args: Any, inline: bool = True) -> T:
        """Run ``fn(conn, notes, now, *args)`` as one write transaction, then ring the bus.

        Small transactions (``inline``) run right here on the event loop: they take
        ~80 µs, less than the two cross-thread wake-ups a trip to the writer's thread costs
        on this kind of machine (docs/benchmarks.md). Big ones, and any that finds the
        database locked by another process, run in the writer's thread with the busy
        timeout, so the event loop never waits on a lock or a long write.
        """
        if self._closed:
            raise StoreClosed("store is closed")
        notes: Notes = []

        def body(conn: Conn) -> T:
            notes.clear()
            return fn(conn, notes, time.time(), *args)

        async with self._write_lock:
            try:
                if inline:
                    try:
                        result = _write_tx(body)(self._writer.raw)
                    except sqlite3.OperationalError as exc:
                        if not _is_busy(exc):
                            raise
                        result = await self._writer.call(_patient(_write_tx(body)))
                else:
                    result = await self._writer.call(_patient(_write_tx(body)))
            except sqlite3.Error as exc:
                raise StoreError(f"sqlite: {exc}") from exc
            except UnicodeEncodeError as exc:  # binding a str with a lone surrogate
                raise InvalidInput(f"text that is not valid Unicode: {exc.reason}") from None
        for stream, seq in notes:
            self.bus.publish(stream, seq)
        self._commits += 1
        checkpointer = self._checkpointer
        if checkpointer is not None:
            if self._commits % CHECKPOINT_EVERY == 0:
                checkpointer.wake(self._commit_count)
            if not self._catching_up and checkpointer.wal_file_size() > WAL_LIMIT_BYTES:
                # The bound on the WAL. This writer (committed already) runs the catch-up
                # inline rather than in a task, so the bound holds even for a caller that
                # never yields to the event loop; other writers go on until it takes the lock.
                self._catching_up = True
                try:
                    await checkpointer.settle()
                    async with self._write_lock:
                        if not self._closed:
                            await checkpointer.catch_up(self._commit_count)
                except Exception as exc:  # committed already; the next catch-up retries
                    log.warning("WAL checkpoint failed: %s", exc)
                finally:
                    self._catching_up = False
        return result

    def _commit_count(self) -> int:
        return self._commits

    async def _read(self, fn: Callable[..., T], *args: Any) -> T:
        if self._closed:
            raise StoreClosed("store is closed")
        try:
            return await self._reader.call(_read_tx(fn), *args)
        except sqlite3.Error as exc:
            raise StoreError(f"sqlite: {exc}") from exc
        except UnicodeEncodeError as exc:
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
        def fn(conn: Conn, notes: Notes, now: float) -> AppendResult:
            if managed:
                _touch(conn, session_id, now)
            return _insert_messages(conn, notes, session_id, messages, parent, now)

        return await self._write(fn, inline=len(messages) <= INLINE_BATCH)

    async def update_message(
        self,
        session_id: str,
        message: Message,
        *,
        managed: bool = False,
        emit: bool = True,
        also: Sequence[LogEntry] = (),
    ) -> bool:
        def fn(conn: Conn, notes: Notes, now: float) -> bool:
            if managed:
                _touch(conn, session_id, now)
            updated = _update_message(conn, notes, session_id, message, now, emit=emit)
            for entry in also:
                _emit_session(conn, notes, entry.session_id, entry.type, entry.data, now)
            return updated

        return await self._write(fn)

    async def upsert_message(
        self,
        session_id: str,
        message: Message,
        parent: ParentArg = LATEST,
        *,
        managed: bool = False,
    ) -> bool:
        def fn(conn: Conn, notes: Notes, now: float) -> bool:
            if managed:
                _touch(conn, session_id, now)
            if _update_message(conn, notes, session_id, message, now):
                return False
            _insert_messages(conn, notes, session_id, [message], parent, now)
            return True

        return await self._write(fn)

    async def delete_messages(
        self, session_id: str, ids: Sequence[str], *, managed: bool = False
    ) -> list[str]:
        def fn(conn: Conn, notes: Notes, now: float) -> list[str]:
            if managed:
                _touch(conn, session_id, now)
            deleted: list[str] = []
            reparented: list[list[str | None]] = []
            for mid in dict.fromkeys(ids):
                row = conn.execute(
                    "SELECT m.pk, m.parent_pk, p.id FROM messages m "
                    "LEFT JOIN messages p ON p.pk = m.parent_pk "
                    "WHERE m.session_id = ? AND m.id = ?",
                    (session_id, mid),
                ).fetchone()
                if row is None:
                    continue
                pk, parent_pk, parent_id = row
                children = conn.execute(
                    "UPDATE messages SET parent_pk = ? WHERE parent_pk = ? RETURNING id",
                    (parent_pk, pk),
                ).fetchall()
                reparented.extend([child, parent_id] for (child,) in children)
                conn.execute("DELETE FROM messages_fts WHERE rowid = ?", (pk,))
                conn.execute("DELETE FROM messages WHERE pk = ?", (pk,))
                deleted.append(mid)
            if deleted:
                _count_messages(conn, session_id, -len(deleted))
                _emit_session(
                    conn,
                    notes,
                    session_id,
                    "message.deleted",
                    {"ids": deleted, "reparented": reparented},
                    now,
                )
            return deleted

        return await self._write(fn, inline=len(ids) <= INLINE_BATCH)

    async def clear_messages(self, session_id: str, *, managed: bool = False) -> None:
        def fn(conn: Conn, notes: Notes, now: float) -> None:
            if managed:
                _touch(conn, session_id, now)
            _clear(conn, session_id)
            _emit_session(conn, notes, session_id, "messages.cleared", {}, now)

        await self._write(fn, inline=False)

    async def get_message(self, session_id: str, message_id: str) -> Message | None:
        def fn(conn: Conn) -> Message | None:
            row = conn.execute(
                "SELECT content FROM messages WHERE session_id = ? AND id = ?",
                (session_id, message_id),
            ).fetchone()
            return None if row is None else decode_message(row[0])

        return await self._read(fn)

    async def get_history(self, session_id: str, leaf_id: str | None = None) -> list[Message]:
        def fn(conn: Conn) -> list[Message]:
            path = _path(conn, session_id, leaf_id)
            if not path:
                return path
            return apply_compactions(path, _compactions(conn, session_id))

        return await self._read(fn)

    async def get_path(self, session_id: str, leaf_id: str | None = None) -> list[Message]:
        return await self._read(_path, session_id, leaf_id)

    async def get_latest_leaf(self, session_id: str) -> Message | None:
        def fn(conn: Conn) -> Message | None:
            row = conn.execute(
                "SELECT content FROM messages WHERE session_id = ? ORDER BY pk DESC LIMIT 1",
                (session_id,),
            ).fetchone()
            return None if row is None else decode_message(row[0])

        return await self._read(fn)

    async def get_path_length(self, session_id: str, leaf_id: str | None = None) -> int:
        def fn(conn: Conn) -> int:
            leaf = _resolve_leaf(conn, session_id, leaf_id)
            if leaf is None:
                return 0
            row = conn.execute(
                """
                WITH RECURSIVE path(pk, parent_pk) AS (
                    SELECT pk, parent_pk FROM messages WHERE pk = ?
                    UNION ALL
                    SELECT m.pk, m.parent_pk FROM path JOIN messages m ON m.pk = path.parent_pk
                    WHERE m.pk < path.pk
                )
                SELECT COUNT(*) FROM path
                """,
                (leaf,),
            ).fetchone()
            return int(row[0])

        return await self._read(fn)

    async def get_branches(self, session_id: str, message_id: str) -> list[Message]:
        def fn(conn: Conn) -> list[Message]:
            pk = _pk_of(conn, session_id, message_id)
            if pk is None:
                return []
            rows = conn.execute(
                "SELECT content FROM messages WHERE parent_pk = ? ORDER BY pk", (pk,)
            ).fetchall()
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
        expr = phrase_query(query) if match == "phrase" else words_query(query)
        if expr is None or check_limit(limit) <= 0:
            return []

        def fn(conn: Conn) -> list[SearchResult]:
            body = f"body : ({expr})"
            try:
                if session_id is not None:
                    both = f"sid : {_sid_token(session_id)} AND {body}"
                    # The newest matches, by rowid: no ranking, so no cost per match.
                    window = conn.execute(
                        "SELECT rowid FROM messages_fts WHERE messages_fts MATCH ? "
                        "ORDER BY rowid DESC LIMIT ?",
                        (both, SEARCH_WINDOW),
                    ).fetchall()
                    if not window:
                        return []
                    size = conn.execute(
                        "SELECT messages FROM session_stats WHERE session_id = ?", (session_id,)
                    ).fetchone()
                    # bm25 counts every row holding each phrase; the session token is in
                    # every row of the session, so only small sessions keep it in MATCH.
                    small = size is None or size[0] <= SMALL_SESSION
                    rows = conn.execute(
                        "SELECT m.id, m.role, f.body, m.session_id, m.created_at FROM messages_fts f "
                        "JOIN messages m ON m.pk = f.rowid "
                        "WHERE messages_fts MATCH ? AND f.rowid >= ? AND m.session_id = ? "
                        "ORDER BY f.rank LIMIT ?",
                        (both if small else body, window[-1][0], session_id, limit),
                    ).fetchall()
                else:
                    edge = conn.execute(
                        "SELECT rowid FROM messages_fts WHERE messages_fts MATCH ? "
                        "ORDER BY rowid DESC LIMIT 1 OFFSET ?",
                        (body, SEARCH_WINDOW - 1),
                    ).fetchone()
                    rows = conn.execute(
                        "SELECT m.id, m.role, f.body, m.session_id, m.created_at FROM messages_fts f "
                        "JOIN messages m ON m.pk = f.rowid JOIN sessions s ON s.id = m.session_id "
                        "WHERE messages_fts MATCH ? AND f.rowid >= ? ORDER BY f.rank LIMIT ?",
                        (body, 0 if edge is None else edge[0], limit),
                    ).fetchall()
            except sqlite3.OperationalError as exc:
                # Quoting keeps FTS syntax out; what remains (a phrase of only separators,
                # say) is "no results", never an exception for the caller.
                log.debug("fts query %r matched nothing: %s", expr, exc)
                return []
            return [
                SearchResult(id=r[0], role=r[1], content=r[2], session_id=r[3], created_at=ts(r[4]))
                for r in rows
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

        def fn(conn: Conn, notes: Notes, now: float) -> Compaction:
            if managed:
                _touch(conn, session_id, now)
            if verify_path and not _is_ancestor(conn, session_id, from_id, to_id):
                raise Conflict(
                    f"cannot lay an overlay over {from_id!r}..{to_id!r}: "
                    "they are no longer one path of the session"
                )
            if covered:
                wanted = set(covered)
                found = conn.execute(
                    "SELECT COUNT(*) FROM messages WHERE session_id = ? "
                    "AND id IN (SELECT value FROM json_each(?))",
                    (session_id, _encode(sorted(wanted)).decode()),
                ).fetchone()[0]
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
                created_at=ts(now),
            )
            _insert_compaction(conn, notes, session_id, c, now)
            return c

        return await self._write(fn, inline=not verify_path)

    async def get_compactions(self, session_id: str) -> list[Compaction]:
        return await self._read(_compactions, session_id)

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

        def fn(conn: Conn, notes: Notes, now: float) -> SessionInfo:
            return _create_session(
                conn,
                notes,
                now,
                name=name,
                parent_session_id=parent_session_id,
                model=model,
                source=source,
                session_id=session_id,
            )

        return await self._write(fn)

    async def get_session(self, session_id: str) -> SessionInfo | None:
        def fn(conn: Conn) -> SessionInfo | None:
            row = conn.execute(f"SELECT {SESSION_COLS} FROM sessions WHERE id = ?", (session_id,)).fetchone()
            return None if row is None else session_info(row, ts)

        return await self._read(fn)

    async def list_sessions(self) -> list[SessionInfo]:
        def fn(conn: Conn) -> list[SessionInfo]:
            rows = conn.execute(
                f"SELECT {SESSION_COLS} FROM sessions ORDER BY updated_at DESC, rowid DESC"
            ).fetchall()
            return [session_info(r, ts) for r in rows]

        return await self._read(fn)

    async def rename_session(self, session_id: str, name: str) -> SessionInfo:
        if not isinstance(name, str):
            raise InvalidInput("session name must be a string")

        def fn(conn: Conn, notes: Notes, now: float) -> SessionInfo:
            conn.execute("UPDATE sessions SET name = ?, updated_at = ? WHERE id = ?", (name, now, session_id))
            info = _session_row(conn, session_id)
            _registry_change(conn, notes, info, "session.renamed", now)
            return info

        return await self._write(fn)

    async def delete_session(self, session_id: str, *, context_keys: Sequence[str] = ()) -> None:
        def fn(conn: Conn, notes: Notes, now: float) -> None:
            info = _session_row(conn, session_id)
            _clear(conn, session_id)
            conn.executemany("DELETE FROM context_blocks WHERE key = ?", [(k,) for k in context_keys])
            conn.execute("DELETE FROM sessions WHERE id = ?", (session_id,))
            stream = session_stream(session_id)
            # The log goes with the session (it holds message bodies); only the final
            # event stays, and the stream now starts there.
            seq = _emit_session(
                conn,
                notes,
                session_id,
                "session.deleted",
                {"session": msgspec.to_builtins(info)},
                now,
            )
            conn.execute("DELETE FROM events WHERE stream = ? AND seq < ?", (stream, seq))
            conn.execute("UPDATE streams SET first_seq = ? WHERE stream = ?", (seq, stream))
            _emit(
                conn,
                notes,
                REGISTRY,
                session_id,
                "session.deleted",
                {"session": msgspec.to_builtins(info)},
                now,
            )

        await self._write(fn, inline=False)

    async def add_usage(
        self, session_id: str, input_tokens: int, output_tokens: int, cost: float
    ) -> SessionInfo:
        delta = check_usage(input_tokens, output_tokens, cost)

        def fn(conn: Conn, notes: Notes, now: float) -> SessionInfo:
            # Read, check, write inside BEGIN IMMEDIATE: no other writer runs in between.
            before = _session_row(conn, session_id)
            totals = usage_totals((before.input_tokens, before.output_tokens, before.estimated_cost), delta)
            conn.execute(
                "UPDATE sessions SET input_tokens = ?, output_tokens = ?, estimated_cost = ?, "
                "updated_at = ? WHERE id = ?",
                (*totals, now, session_id),
            )
            info = _session_row(conn, session_id)
            data = {"input_tokens": delta[0], "output_tokens": delta[1], "cost": delta[2]}
            _registry_change(conn, notes, info, "session.usage", now, delta=data)
            return info

        return await self._write(fn)

    async def fork_session(self, session_id: str, at_message_id: str, name: str) -> SessionInfo:
        if not isinstance(name, str):
            raise InvalidInput("session name must be a string")

        def fn(conn: Conn, notes: Notes, now: float) -> SessionInfo:
            _session_row(conn, session_id)
            path = _path(conn, session_id, at_message_id) if at_message_id else []
            overlays = visible_compactions([m.id for m in path], _compactions(conn, session_id))
            info = _create_session(
                conn,
                notes,
                now,
                name=name,
                parent_session_id=session_id,
                model=None,
                source=None,
                session_id=None,
                event="session.forked",
                event_extra={"from_session_id": session_id, "at_message_id": at_message_id},
            )
            _insert_messages(conn, notes, info.id, path, None, now)
            for c in overlays:
                _insert_compaction(conn, notes, info.id, c, now)
            return info

        return await self._write(fn, inline=False)

    async def split_session(self, session_id: str, summary: str, name: str | None = None) -> SessionInfo:
        if not isinstance(summary, str):
            raise InvalidInput("summary must be a string")

        def fn(conn: Conn, notes: Notes, now: float) -> SessionInfo:
            old = _session_row(conn, session_id)
            conn.execute(
                "UPDATE sessions SET end_reason = 'compaction', updated_at = ? WHERE id = ?",
                (now, session_id),
            )
            _registry_change(conn, notes, _session_row(conn, session_id), "session.ended", now)
            info = _create_session(
                conn,
                notes,
                now,
                name=name if name is not None else (old.name or "Compacted"),
                parent_session_id=session_id,
                model=old.model,
                source=old.source,
                session_id=None,
            )
            message = Message(
                id=str(uuid.uuid4()),
                role="assistant",
                parts=[{"type": "text", "text": f"[Context from previous session]\n\n{summary}"}],
            )
            _insert_messages(conn, notes, info.id, [message], None, now)
            return info

        return await self._write(fn, inline=False)

    # -- context blocks and search entries ------------------------------------------------
    async def get_context_value(self, key: str) -> str | None:
        def fn(conn: Conn) -> str | None:
            row = conn.execute("SELECT content FROM context_blocks WHERE key = ?", (key,)).fetchone()
            return None if row is None else str(row[0])

        return await self._read(fn)

    async def set_context_value(self, key: str, content: str, *, event: LogEntry | None = None) -> None:
        def fn(conn: Conn, notes: Notes, now: float) -> None:
            conn.execute(
                "INSERT INTO context_blocks (key, content, updated_at) VALUES (?, ?, ?) "
                "ON CONFLICT (key) DO UPDATE SET content = excluded.content, "
                "updated_at = excluded.updated_at",
                (key, content, now),
            )
            if event is not None:
                _emit_session(conn, notes, event.session_id, event.type, event.data, now)

        await self._write(fn)

    async def count_search_entries(self, label: str) -> int:
        def fn(conn: Conn) -> int:
            row = conn.execute("SELECT COUNT(*) FROM search_entries WHERE label = ?", (label,)).fetchone()
            return int(row[0])

        return await self._read(fn)

    async def set_search_entry(
        self, label: str, key: str, content: str, *, event: LogEntry | None = None
    ) -> None:
        def fn(conn: Conn, notes: Notes, now: float) -> None:
            row = conn.execute(
                "INSERT INTO search_entries (label, key, content, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (label, key) DO UPDATE SET "
                "content = excluded.content, updated_at = excluded.updated_at RETURNING pk",
                (label, key, content, now, now),
            ).fetchone()
            pk = int(row[0])
            conn.execute("DELETE FROM search_fts WHERE rowid = ?", (pk,))
            conn.execute(
                "INSERT INTO search_fts (rowid, lbl, body) VALUES (?, ?, ?)",
                (pk, _sid_token(label), content),
            )
            if event is not None:
                _emit_session(conn, notes, event.session_id, event.type, event.data, now)

        await self._write(fn)

    async def search_entries(self, label: str, query: str, limit: int = 10) -> list[tuple[str, str]]:
        expr = words_query(query) if isinstance(query, str) else None
        if expr is None or check_limit(limit) <= 0:
            return []

        def fn(conn: Conn) -> list[tuple[str, str]]:
            try:
                rows = conn.execute(
                    "SELECT e.key, e.content FROM search_fts f JOIN search_entries e ON e.pk = f.rowid "
                    "WHERE search_fts MATCH ? AND e.label = ? ORDER BY f.rank LIMIT ?",
                    (f"lbl : {_sid_token(label)} AND body : ({expr})", label, limit),
                ).fetchall()
            except sqlite3.OperationalError as exc:
                log.debug("fts query %r matched nothing: %s", expr, exc)
                return []
            return [(str(k), str(c)) for k, c in rows]

        return await self._read(fn)

    async def log_event(self, entry: LogEntry) -> int:
        def fn(conn: Conn, notes: Notes, now: float) -> int:
            return _emit_session(conn, notes, entry.session_id, entry.type, entry.data, now)

        return await self._write(fn)

    # -- event logs ----------------------------------------------------------------------
    async def read_events(
        self, stream: str, after_seq: int = 0, limit: int = 1000, *, epoch: str | None = None
    ) -> list[Event]:
        check_limit(after_seq, "after_seq")
        check_limit(limit)

        def fn(conn: Conn) -> list[Event]:
            pos = _position(conn, stream)
            pos.check(after_seq, epoch)
            rows = conn.execute(
                "SELECT session_id, seq, type, data, created_at FROM events "
                "WHERE stream = ? AND seq > ? ORDER BY seq LIMIT ?",
                (stream, after_seq, limit),
            ).fetchall()
            kind: Literal["session", "registry"] = "registry" if stream == REGISTRY else "session"
            return [
                Event(
                    session_id=r[0],
                    seq=r[1],
                    epoch=pos.epoch,
                    type=r[2],
                    data=_decode(r[3]),
                    created_at=ts(r[4]),
                    stream=kind,
                )
                for r in rows
            ]

        return await self._read(fn)

    async def stream_position(self, stream: str) -> StreamPosition:
        return await self._read(_position, stream)

    # -- settings ------------------------------------------------------------------------
    async def claim_setting(self, key: str, value: str, *, replace: bool = False) -> str:
        """Record ``value`` under ``key`` unless another value is recorded (or ``replace``);
        returns the value recorded afterwards. One statement: two nodes starting at once
        agree on which one recorded first."""

        def fn(conn: Conn, notes: Notes, now: float) -> str:
            row = conn.execute(
                "INSERT INTO settings (key, value, updated_at) VALUES (?, ?, ?) "
                "ON CONFLICT (key) DO UPDATE SET "
                "value = CASE WHEN ? THEN excluded.value ELSE value END, "
                "updated_at = CASE WHEN ? THEN excluded.updated_at ELSE updated_at END "
                "RETURNING value",
                (key, value, now, replace, replace),
            ).fetchone()
            return str(row[0])

        return await self._write(fn)


def _position(conn: Conn, stream: str) -> StreamPosition:
    row = conn.execute(
        "SELECT epoch, first_seq, last_seq FROM streams WHERE stream = ?", (stream,)
    ).fetchone()
    if row is None:
        return StreamPosition(stream=stream, epoch="", first_seq=1, last_seq=0)
    return StreamPosition(stream=stream, epoch=row[0], first_seq=row[1], last_seq=row[2])
