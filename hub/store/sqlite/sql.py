"""Statements run inside a transaction, in the connection's thread: they take the raw
connection, and the write ones the notes (``(stream, seq)`` to ring after commit) and the
transaction's clock."""

from __future__ import annotations

import hashlib
import sqlite3
import uuid
from collections.abc import Sequence
from typing import Any

import msgspec

from protocol import Compaction, InvalidInput, Message, SessionInfo, SessionNotFound

from ..base import LATEST, REGISTRY, AppendResult, ParentArg, StreamPosition, session_stream
from ..rows import (
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
from .connection import Conn

Notes = list[tuple[str, int]]  # (stream, seq) to ring on the bus after commit

_encode = msgspec.json.Encoder().encode

#: Ranking (bm25) costs about a microsecond per matching row. A query is ranked over its
#: newest SEARCH_WINDOW matches: exactly the original's order up to that many matches, and
#: under 2 ms when a phrase matches 14,000 of 100,000 messages (docs/benchmarks.md).
SEARCH_WINDOW = 250
#: Up to this many messages a session's search keeps the session token in MATCH.
SMALL_SESSION = 20_000


def sid_token(session_id: str) -> str:
    # One alphanumeric token per session for the FTS column filter; the join on
    # session_id keeps results exact even if two ids ever hashed alike.
    return "s" + hashlib.blake2b(session_id.encode(), digest_size=10).hexdigest()


# ---------------------------------------------------------------------------------------
# Statements run inside a transaction, in the worker thread. They take the raw connection.
# ---------------------------------------------------------------------------------------


def emit(conn: Conn, notes: Notes, stream: str, session_id: str, type_: str, data: Any, now: float) -> int:
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


def emit_session(conn: Conn, notes: Notes, session_id: str, type_: str, data: Any, now: float) -> int:
    return emit(conn, notes, session_stream(session_id), session_id, type_, data, now)


def touch(conn: Conn, session_id: str, now: float) -> None:
    if conn.execute("UPDATE sessions SET updated_at = ? WHERE id = ?", (now, session_id)).rowcount == 0:
        raise SessionNotFound(session_id)


def session_row(conn: Conn, session_id: str) -> SessionInfo:
    row = conn.execute(f"SELECT {SESSION_COLS} FROM sessions WHERE id = ?", (session_id,)).fetchone()
    if row is None:
        raise SessionNotFound(session_id)
    return session_info(row, ts)


def latest(conn: Conn, session_id: str) -> tuple[int, str] | None:
    row = conn.execute(
        "SELECT pk, id FROM messages WHERE session_id = ? ORDER BY pk DESC LIMIT 1", (session_id,)
    ).fetchone()
    return None if row is None else (row[0], row[1])


def pk_of(conn: Conn, session_id: str, message_id: str) -> int | None:
    row = conn.execute(
        "SELECT pk FROM messages WHERE session_id = ? AND id = ?", (session_id, message_id)
    ).fetchone()
    return None if row is None else int(row[0])


def index_text(conn: Conn, pk: int, session_id: str, message: Message) -> None:
    text = message.text()
    if text:
        conn.execute(
            "INSERT INTO messages_fts(rowid, sid, body) VALUES (?, ?, ?)",
            (pk, sid_token(session_id), text),
        )


def emit_many(
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


def count_messages(conn: Conn, session_id: str, delta: int) -> None:
    if delta:
        conn.execute(
            "INSERT INTO session_stats (session_id, messages) VALUES (?, ?) "
            "ON CONFLICT (session_id) DO UPDATE SET messages = messages + excluded.messages",
            (session_id, delta),
        )


def insert_one(
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
            (row[0], sid_token(session_id), text),
        )
    count_messages(conn, session_id, 1)
    seq = emit_many(
        conn,
        notes,
        session_stream(session_id),
        session_id,
        [("message.appended", appended_json(content, parent_id))],
        now,
    )
    return AppendResult(inserted=[message.id], last_id=message.id, last_seq=seq)


def insert_messages(
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
        tip = latest(conn, session_id)
        parent_pk, parent_id = (None, None) if tip is None else tip
    elif parent is None:
        parent_pk, parent_id = None, None
    else:
        parent_pk = pk_of(conn, session_id, parent)
        parent_id = parent if parent_pk is not None else None
    if not messages:
        return AppendResult(inserted=[], last_id=parent_id, last_seq=0)
    if len(messages) == 1:
        return insert_one(conn, notes, session_id, messages[0], parent_pk, parent_id, now)
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
    sid = sid_token(session_id)
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
    count_messages(conn, session_id, len(rows))
    last_seq = emit_many(conn, notes, session_stream(session_id), session_id, events, now)
    return AppendResult(inserted=inserted, last_id=parent_id, last_seq=last_seq)


def update_message(
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
    index_text(conn, pk, session_id, message)
    if emit:
        emit_many(
            conn,
            notes,
            session_stream(session_id),
            session_id,
            [("message.updated", updated_json(content))],
            now,
        )
    return True


def path_rows(conn: Conn, leaf_pk: int) -> list[tuple[int, str, str]]:
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


def resolve_leaf(conn: Conn, session_id: str, leaf_id: str | None) -> int | None:
    if leaf_id is None or leaf_id == "":
        tip = latest(conn, session_id)
        return None if tip is None else tip[0]
    return pk_of(conn, session_id, leaf_id)


def path(conn: Conn, session_id: str, leaf_id: str | None) -> list[Message]:
    leaf = resolve_leaf(conn, session_id, leaf_id)
    if leaf is None:
        return []
    out = []
    for _pk, _id, content in path_rows(conn, leaf):
        message = decode_message(content)
        if message is not None:
            out.append(message)
    return out


def is_ancestor(conn: Conn, session_id: str, ancestor_id: str, leaf_id: str) -> bool:
    """Whether ``ancestor_id`` is ``leaf_id`` or lies on the path above it."""
    top = pk_of(conn, session_id, ancestor_id)
    leaf = pk_of(conn, session_id, leaf_id)
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


def compactions(conn: Conn, session_id: str) -> list[Compaction]:
    rows = conn.execute(
        "SELECT id, summary, from_message_id, to_message_id, created_at FROM compactions "
        "WHERE session_id = ? ORDER BY pk",
        (session_id,),
    ).fetchall()
    return [compaction(r, ts) for r in rows]


def insert_compaction(
    conn: Conn, notes: Notes, session_id: str, c: Compaction, now: float, *, emit: bool = True
) -> None:
    conn.execute(
        "INSERT INTO compactions "
        "(session_id, id, summary, from_message_id, to_message_id, created_at) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        (session_id, c.id, c.summary, c.from_message_id, c.to_message_id, c.created_at.timestamp()),
    )
    if emit:
        emit_session(conn, notes, session_id, "compaction.added", {"compaction": msgspec.to_builtins(c)}, now)


def create_session(
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
    info = session_row(conn, sid)
    data = {"session": msgspec.to_builtins(info), **(event_extra or {})}
    emit_session(conn, notes, sid, event, data, now)
    emit(conn, notes, REGISTRY, sid, event, data, now)
    return info


def registry_change(
    conn: Conn, notes: Notes, info: SessionInfo, type_: str, now: float, **extra: Any
) -> None:
    data = {"session": msgspec.to_builtins(info), **extra}
    emit_session(conn, notes, info.id, type_, data, now)
    emit(conn, notes, REGISTRY, info.id, type_, data, now)


def clear(conn: Conn, session_id: str) -> None:
    conn.execute(
        "DELETE FROM messages_fts WHERE rowid IN (SELECT pk FROM messages WHERE session_id = ?)",
        (session_id,),
    )
    conn.execute("DELETE FROM messages WHERE session_id = ?", (session_id,))
    conn.execute("DELETE FROM compactions WHERE session_id = ?", (session_id,))
    conn.execute("DELETE FROM session_stats WHERE session_id = ?", (session_id,))


def position(conn: Conn, stream: str) -> StreamPosition:
    row = conn.execute(
        "SELECT epoch, first_seq, last_seq FROM streams WHERE stream = ?", (stream,)
    ).fetchone()
    if row is None:
        return StreamPosition(stream=stream, epoch="", first_seq=1, last_seq=0)
    return StreamPosition(stream=stream, epoch=row[0], first_seq=row[1], last_seq=row[2])
