"""Statements run inside a transaction, in the connection's thread: reads take the raw
connection, writes the transaction (:class:`~.tx.SqliteTx`: connection, clock, events)."""

from __future__ import annotations

import hashlib
import logging
import sqlite3
import uuid
from collections.abc import Sequence
from typing import Any, Literal

import msgspec

from protocol import Compaction, Event, InvalidInput, Message, SessionInfo

from ..attachments import has_files, message_refs
from ..base import LATEST, REGISTRY, AppendResult, LogEntry, ParentArg, StreamPosition, session_stream
from ..policy import registry_events
from ..rows import (
    appended_ref,
    compaction,
    message_json,
    text_of,
    ts,
    updated_json,
)
from . import filerows
from .connection import Conn
from .packing import (
    appended_data,
    packed,
    role_code,
    stored_message,
    type_name,
    unpacked,
)
from .tx import SqliteTx, open_stream

log = logging.getLogger("sessionhub.store")

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


#: A session's key (its own log's, schema.py migration 6) from its id, the parameter.
KEY = f"(SELECT sk FROM streams WHERE stream = '{session_stream('')}' || ?)"


def sid_token(session_id: str) -> str:
    # One alphanumeric token per session for the FTS column filter; the join on
    # session_id keeps results exact even if two ids ever hashed alike.
    return "s" + hashlib.blake2b(session_id.encode(), digest_size=10).hexdigest()


# ---------------------------------------------------------------------------------------
# Statements run inside a transaction, in the worker thread. They take the raw connection.
# ---------------------------------------------------------------------------------------


def latest(conn: Conn, session_id: str) -> tuple[int, str] | None:
    row = conn.execute(
        f"SELECT pk, id FROM messages WHERE sk = {KEY} ORDER BY pk DESC LIMIT 1", (session_id,)
    ).fetchone()
    return None if row is None else (row[0], row[1])


def pk_of(conn: Conn, session_id: str, message_id: str) -> int | None:
    row = conn.execute(
        f"SELECT pk FROM messages WHERE sk = {KEY} AND id = ?", (session_id, message_id)
    ).fetchone()
    return None if row is None else int(row[0])


def index_text(conn: Conn, pk: int, session_id: str, message: Message) -> None:
    text = message.text()
    if text:
        conn.execute(
            "INSERT INTO messages_fts(rowid, sid, body) VALUES (?, ?, ?)",
            (pk, sid_token(session_id), text),
        )


def unindex(conn: Conn, rows: Sequence[tuple[int, str, str]]) -> None:
    """Take ``(pk, session_id, content)`` rows (the content unpacked) out of the index. The
    index is contentless: it is handed back the words it was given, which Message.text() of the stored message
    gives again (a text that no longer matches would leave stale words, never an error)."""
    gone = [(pk, sid_token(sid), text) for pk, sid, content in rows if (text := text_of(content))]
    if gone:
        conn.executemany(
            "INSERT INTO messages_fts(messages_fts, rowid, sid, body) VALUES ('delete', ?, ?, ?)", gone
        )


#: A message row with what its appended event may take from it: ``(pk, content, event_seq,
#: parent id, created_at)``.
Held = tuple[int, str, int | None, str | None, float]


def detach_events(conn: Conn, session_id: str, rows: Sequence[Held]) -> None:
    """Before rows (the content unpacked) change or go: their ``message.appended`` events
    stop referring to them and get the body, parent id and time they were appended with."""
    held = [
        (content, appended_ref(parent), at, session_id, seq, pk)
        for pk, content, seq, parent, at in rows
        if seq is not None
    ]
    if held:
        conn.executemany(
            "UPDATE events SET data = '{\"message\":' || ? || ',\"parent_id\":' || COALESCE(data, ?) || '}', "
            f"created_at = COALESCE(created_at, ?), ref = NULL WHERE sk = {KEY} AND seq = ? AND ref = ?",
            held,
        )


def count_messages(conn: Conn, session_id: str, delta: int) -> None:
    if delta:
        conn.execute(
            "INSERT INTO session_stats (session_id, messages) VALUES (?, ?) "
            "ON CONFLICT (session_id) DO UPDATE SET messages = messages + excluded.messages",
            (session_id, delta),
        )


def insert_one(
    tx: SqliteTx, session_id: str, message: Message, parent_pk: int | None, parent_id: str | None
) -> AppendResult:
    """The common case, in as few statements as possible (the write path of every turn)."""
    conn = tx.conn
    content = packed(message_json(message), message.id, message.role)
    stream = session_stream(session_id)
    sk, seq = open_stream(conn, stream)
    row = conn.execute(
        "INSERT INTO messages (sk, id, parent_pk, role, content, created_at, event_seq) "
        "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (sk, id) DO NOTHING RETURNING pk",
        (sk, message.id, parent_pk, role_code(message.role), content, tx.now, seq),
    ).fetchone()
    if row is None:  # already stored: first content wins, nothing is written
        return AppendResult(inserted=[], last_id=message.id, last_seq=0)
    if has_files([message]):
        filerows.add_refs(conn, sk, row[0], message_refs(message))
    text = message.text()
    if text:
        conn.execute(
            "INSERT INTO messages_fts (rowid, sid, body) VALUES (?, ?, ?)",
            (row[0], sid_token(session_id), text),
        )
    count_messages(conn, session_id, 1)
    seq = tx.emit_many(stream, session_id, [("message.appended", None)], [row[0]])
    return AppendResult(inserted=[message.id], last_id=message.id, last_seq=seq)


def insert_messages(
    tx: SqliteTx, session_id: str, messages: Sequence[Message], parent: ParentArg
) -> AppendResult:
    conn = tx.conn
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
        return insert_one(tx, session_id, messages[0], parent_pk, parent_id)
    # Which ids are stored already (first content wins; they still continue the chain).
    known: dict[str, int] = dict(
        conn.execute(
            f"SELECT id, pk FROM messages WHERE sk = {KEY} AND id IN (SELECT value FROM json_each(?))",
            (session_id, _encode([m.id for m in messages]).decode()),
        ).fetchall()
    )
    # Inside BEGIN IMMEDIATE nobody else writes: the next rowids are ours to hand out, so
    # the whole chain goes in with executemany instead of one statement per message.
    next_pk = int(conn.execute("SELECT COALESCE(MAX(pk), 0) FROM messages").fetchone()[0])
    stream = session_stream(session_id)
    sk, seq = open_stream(conn, stream)
    sid = sid_token(session_id)
    rows: list[tuple[Any, ...]] = []
    texts: list[tuple[int, str, str]] = []
    events: list[tuple[str, str | None]] = []
    refs: list[int | None] = []
    inserted: list[str] = []
    files: list[tuple[int, list[str]]] = []
    for message in messages:
        pk = known.get(message.id)
        if pk is None:
            next_pk += 1
            pk = known[message.id] = next_pk
            content = packed(message_json(message), message.id, message.role)
            rows.append((pk, sk, message.id, parent_pk, role_code(message.role), content, tx.now, seq))
            seq += 1
            text = message.text()
            if text:
                texts.append((pk, sid, text))
            events.append(("message.appended", None))  # parent and time: the row's
            refs.append(pk)
            inserted.append(message.id)
            if has_files([message]):
                files.append((pk, message_refs(message)))
        parent_pk, parent_id = pk, message.id
    conn.executemany(
        "INSERT INTO messages (pk, sk, id, parent_pk, role, content, created_at, event_seq) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        rows,
    )
    for pk, shas in files:
        filerows.add_refs(conn, sk, pk, shas)
    # One FTS statement for the batch: FTS5 flushes a new index segment at every statement
    # boundary inside a transaction, so per-row inserts cost ~20 µs each more.
    conn.executemany("INSERT INTO messages_fts (rowid, sid, body) VALUES (?, ?, ?)", texts)
    count_messages(conn, session_id, len(rows))
    last_seq = tx.emit_many(stream, session_id, events, refs)
    return AppendResult(inserted=inserted, last_id=parent_id, last_seq=last_seq)


def update_message(tx: SqliteTx, session_id: str, message: Message, *, emit: bool = True) -> bool:
    conn = tx.conn
    content = message_json(message)
    old = conn.execute(
        "SELECT m.pk, m.content, m.event_seq, m.role, p.id, m.created_at FROM messages m "
        f"LEFT JOIN messages p ON p.pk = m.parent_pk WHERE m.sk = {KEY} AND m.id = ?",
        (session_id, message.id),
    ).fetchone()
    if old is None:
        return False
    pk = int(old[0])
    before = unpacked(old[1], message.id, old[3])
    detach_events(conn, session_id, [(pk, before, old[2], old[4], old[5])])
    conn.execute(
        "UPDATE messages SET content = ?, role = ?, event_seq = NULL WHERE pk = ?",
        (packed(content, message.id, message.role), role_code(message.role), pk),
    )
    unindex(conn, [(pk, session_id, before)])
    index_text(conn, pk, session_id, message)
    if has_files([message]) or '"file"' in before:
        filerows.replace_refs(conn, pk, message_refs(message))
    if emit:
        tx.emit_many(session_stream(session_id), session_id, [("message.updated", updated_json(content))])
    return True


def path_rows(conn: Conn, leaf_pk: int) -> list[tuple[int, str, int | str, str | bytes]]:
    """``(pk, id, role, stored content)`` from the root down to ``leaf_pk``."""
    # Walk rowids upward; ``m.pk < path.pk`` guarantees termination on any data.
    # Each step yields at most one row (a message has one parent), so the rows come out
    # leaf first, root last, with no ORDER BY: no sort, and the content rides along
    # instead of a second lookup per row.
    rows = conn.execute(
        """
        WITH RECURSIVE path(pk, parent_pk, id, role, content) AS (
            SELECT pk, parent_pk, id, role, content FROM messages WHERE pk = ?
            UNION ALL
            SELECT m.pk, m.parent_pk, m.id, m.role, m.content
            FROM path JOIN messages m ON m.pk = path.parent_pk
            WHERE m.pk < path.pk
        )
        SELECT pk, id, role, content FROM path
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
    for _pk, id_, role, stored in path_rows(conn, leaf):
        message = stored_message(stored, id_, role)
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


def insert_compaction(tx: SqliteTx, session_id: str, c: Compaction, *, emit: bool = True) -> None:
    tx.conn.execute(
        "INSERT INTO compactions "
        "(session_id, id, summary, from_message_id, to_message_id, created_at) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        (session_id, c.id, c.summary, c.from_message_id, c.to_message_id, c.created_at.timestamp()),
    )
    if emit:
        tx.emit_session(session_id, "compaction.added", {"compaction": msgspec.to_builtins(c)})


def create_session(
    tx: SqliteTx,
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
        tx.conn.execute(
            "INSERT INTO sessions "
            "(id, name, parent_session_id, model, source, created_at, updated_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (sid, name, parent_session_id, model, source, tx.now, tx.now),
        )
    except sqlite3.IntegrityError:
        raise InvalidInput(f"session {sid!r} already exists") from None
    info = tx.session_row(sid)
    tx.registry_change(info, event, **(event_extra or {}))
    return info


def clear(conn: Conn, session_id: str, *, keep_log: bool = True) -> None:
    """Delete the session's messages, overlays and counts. ``keep_log``: its
    ``message.appended`` events stay readable, with the bodies they were appended with
    (False when the log goes too)."""
    rows: list[Held] = [
        (pk, unpacked(content, id_, role), seq, parent, at)
        for pk, id_, role, content, seq, parent, at in conn.execute(
            "SELECT m.pk, m.id, m.role, m.content, m.event_seq, p.id, m.created_at FROM messages m "
            f"LEFT JOIN messages p ON p.pk = m.parent_pk WHERE m.sk = {KEY}",
            (session_id,),
        )
    ]
    if keep_log:
        detach_events(conn, session_id, rows)
    unindex(conn, [(r[0], session_id, r[1]) for r in rows])
    conn.execute(f"DELETE FROM messages WHERE sk = {KEY}", (session_id,))
    conn.execute("DELETE FROM compactions WHERE session_id = ?", (session_id,))
    conn.execute("DELETE FROM session_stats WHERE session_id = ?", (session_id,))


def position(conn: Conn, stream: str) -> StreamPosition:
    row = conn.execute(
        "SELECT epoch, first_seq, last_seq FROM streams WHERE stream = ?", (stream,)
    ).fetchone()
    if row is None:
        return StreamPosition(stream=stream, epoch="", first_seq=1, last_seq=0)
    return StreamPosition(stream=stream, epoch=row[0], first_seq=row[1], last_seq=row[2])


def delete_messages(tx: SqliteTx, session_id: str, ids: Sequence[str], managed: bool) -> list[str]:
    if managed:
        tx.touch(session_id)
    deleted: list[str] = []
    reparented: list[list[str | None]] = []
    for mid in dict.fromkeys(ids):
        row = tx.conn.execute(
            "SELECT m.pk, m.parent_pk, p.id, m.content, m.event_seq, m.role, m.created_at FROM messages m "
            "LEFT JOIN messages p ON p.pk = m.parent_pk "
            f"WHERE m.sk = {KEY} AND m.id = ?",
            (session_id, mid),
        ).fetchone()
        if row is None:
            continue
        pk, parent_pk, parent_id, stored, event_seq, role, at = row
        content = unpacked(stored, mid, role)
        detach_events(tx.conn, session_id, [(pk, content, event_seq, parent_id, at)])
        # The children get another parent: events still taking theirs from the row keep this one.
        tx.conn.execute(
            f"UPDATE events SET data = ? WHERE sk = {KEY} AND data IS NULL AND seq IN "
            "(SELECT event_seq FROM messages WHERE parent_pk = ? AND event_seq IS NOT NULL)",
            (appended_ref(mid), session_id, pk),
        )
        children = tx.conn.execute(
            "UPDATE messages SET parent_pk = ? WHERE parent_pk = ? RETURNING id",
            (parent_pk, pk),
        ).fetchall()
        reparented.extend([child, parent_id] for (child,) in children)
        unindex(tx.conn, [(pk, session_id, content)])
        tx.conn.execute("DELETE FROM messages WHERE pk = ?", (pk,))
        deleted.append(mid)
    if deleted:
        count_messages(tx.conn, session_id, -len(deleted))
        tx.emit_session(session_id, "message.deleted", {"ids": deleted, "reparented": reparented})
    return deleted


def path_length(conn: Conn, session_id: str, leaf_id: str | None) -> int:
    leaf = resolve_leaf(conn, session_id, leaf_id)
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


def delete_session(tx: SqliteTx, session_id: str, context_keys: Sequence[str]) -> None:
    info = tx.session_row(session_id)
    clear(tx.conn, session_id, keep_log=False)
    tx.conn.executemany("DELETE FROM context_blocks WHERE key = ?", [(k,) for k in context_keys])
    tx.conn.execute("DELETE FROM sessions WHERE id = ?", (session_id,))
    # A LangGraph thread's checkpoints go with its session.
    tx.conn.execute("DELETE FROM graph_writes WHERE session_id = ?", (session_id,))
    tx.conn.execute("DELETE FROM graph_checkpoints WHERE session_id = ?", (session_id,))
    stream = session_stream(session_id)
    # The log goes with the session (it holds message bodies); only the final
    # event stays, and the stream now starts there.
    (own, data), (registry, _) = registry_events(info, "session.deleted")
    seq = tx.emit(own, session_id, "session.deleted", data)
    tx.conn.execute(f"DELETE FROM events WHERE sk = {KEY} AND seq < ?", (session_id, seq))
    tx.conn.execute("UPDATE streams SET first_seq = ? WHERE stream = ?", (seq, stream))
    tx.emit(registry, session_id, "session.deleted", data)


def set_search_entry(tx: SqliteTx, label: str, key: str, content: str, event: LogEntry | None) -> None:
    row = tx.conn.execute(
        "INSERT INTO search_entries (label, key, content, created_at, updated_at) "
        "VALUES (?, ?, ?, ?, ?) ON CONFLICT (label, key) DO UPDATE SET "
        "content = excluded.content, updated_at = excluded.updated_at RETURNING pk",
        (label, key, content, tx.now, tx.now),
    ).fetchone()
    pk = int(row[0])
    tx.conn.execute("DELETE FROM search_fts WHERE rowid = ?", (pk,))
    tx.conn.execute(
        "INSERT INTO search_fts (rowid, lbl, body) VALUES (?, ?, ?)",
        (pk, sid_token(label), content),
    )
    if event is not None:
        tx.emit_session(event.session_id, event.type, event.data)


def search_entries(conn: Conn, label: str, expr: str, limit: int) -> list[tuple[str, str]]:
    try:
        rows = conn.execute(
            "SELECT e.key, e.content FROM search_fts f JOIN search_entries e ON e.pk = f.rowid "
            "WHERE search_fts MATCH ? AND e.label = ? ORDER BY f.rank LIMIT ?",
            (f"lbl : {sid_token(label)} AND body : ({expr})", label, limit),
        ).fetchall()
    except sqlite3.OperationalError as exc:
        log.debug("fts query %r matched nothing: %s", expr, exc)
        return []
    return [(str(k), str(c)) for k, c in rows]


def read_events(conn: Conn, stream: str, after_seq: int, limit: int, epoch: str | None) -> list[Event]:
    pos = position(conn, stream)
    pos.check(after_seq, epoch)
    # A referring event (ref set) reads its message's row: the message as appended, since
    # an update or a delete gives the event its body back first (detach_events).
    rows = conn.execute(
        "SELECT e.session_id, e.seq, e.type, e.data, COALESCE(e.created_at, m.created_at), e.ref, "
        "m.content, m.id, m.role, p.id FROM events e LEFT JOIN messages m ON m.pk = e.ref "
        "LEFT JOIN messages p ON e.data IS NULL AND p.pk = m.parent_pk "
        "WHERE e.sk = (SELECT sk FROM streams WHERE stream = ?) AND e.seq > ? ORDER BY e.seq LIMIT ?",
        (stream, after_seq, limit),
    ).fetchall()
    kind: Literal["session", "registry"] = "registry" if stream == REGISTRY else "session"
    # An event of a session's own log stores no session id (SqliteTx.emit_many).
    own = stream[len(session_stream("")) :]
    return [
        Event(
            session_id=own if r[0] is None else r[0],
            seq=r[1],
            epoch=pos.epoch,
            type=type_name(r[2]),
            data=_decode(r[3]) if r[5] is None else appended_data(r[6], r[7], r[8], r[3], r[9]),
            created_at=ts(r[4]),
            stream=kind,
        )
        for r in rows
    ]
