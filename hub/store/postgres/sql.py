"""The statements, and the functions that run them inside a transaction."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from protocol import Compaction, Conflict, Event, InvalidInput, Message, SessionInfo, SessionNotFound

from ...bus.doorbell import CHANNEL, stream_key
from ..attachments import has_files, message_refs
from ..base import LATEST, AppendResult, ParentArg, StreamPosition
from ..fts import fts_text
from ..overlays import apply_compactions
from ..policy import (
    REGISTRY,
    already_ended,
    continuation_message,
    new_compaction,
    not_one_path,
    registry_events,
    session_stream,
    split_name,
    summarized_deleted,
    usage_event,
    usage_totals,
)
from ..rows import (
    SESSION_COLS,
    appended_ref,
    compaction,
    decode_message,
    message_json,
    new_epoch,
    rehydrated,
    session_info,
    updated_json,
)
from . import filerows
from .keys import SESSION_KEY, SESSION_PREFIX, bump_stream, stream_key_of
from .tx import PostgresTx

if TYPE_CHECKING:
    from .tx import Conn

_decode = msgspec.json.Decoder().decode


def indexed_words(message: Message) -> str | None:
    """What ``to_tsvector`` gets for a message (:func:`fts_text` of its text; NUL, which
    Postgres text cannot hold, separates words as any other non-letter); None when there is
    none, and ``to_tsvector(NULL)`` is a NULL vector: the row is not indexed."""
    return fts_text(message.text()) or None


# Before rows ``x(pk, content, event_seq)`` change or go: their message.appended events stop
# referring to them and get the body they were appended with (what rehydrated() builds).
DETACH = """
UPDATE events e SET data = '{{"message":' || x.content || ',"parent_id":' || e.data || '}}', ref = NULL
FROM {rows} x WHERE e.stream_key = (SELECT key FROM streams WHERE stream = {stream})
AND e.seq = x.event_seq AND e.ref = x.pk
"""


PATH_CTE = """
WITH RECURSIVE path(pk, parent_pk, id, content, depth) AS (
    SELECT pk, parent_pk, id, content, 0 FROM messages WHERE pk = {leaf}
    UNION ALL
    SELECT m.pk, m.parent_pk, m.id, m.content, path.depth + 1
    FROM path JOIN messages m ON m.pk = path.parent_pk
    WHERE m.pk < path.pk
)
"""
LEAF_LATEST = f"(SELECT pk FROM messages WHERE session_key = {SESSION_KEY} ORDER BY pk DESC LIMIT 1)"
LEAF_ID = f"(SELECT pk FROM messages WHERE session_key = {SESSION_KEY} AND id = $2)"

PATH_LATEST = PATH_CTE.format(leaf=LEAF_LATEST) + "SELECT content FROM path ORDER BY depth DESC"
PATH_ID = PATH_CTE.format(leaf=LEAF_ID) + "SELECT content FROM path ORDER BY depth DESC"

# The path and the session's overlays in one statement (one snapshot, one round trip).
HISTORY_TAIL = """
SELECT 0 AS kind, depth AS n, content AS a, NULL AS b, NULL AS c, NULL AS d,
       NULL::timestamptz AS t FROM path
UNION ALL
SELECT 1, -pk, id, summary, from_message_id, to_message_id, created_at
FROM compactions WHERE session_id = $1
ORDER BY kind, n DESC
"""
HISTORY_LATEST = PATH_CTE.format(leaf=LEAF_LATEST) + HISTORY_TAIL
HISTORY_ID = PATH_CTE.format(leaf=LEAF_ID) + HISTORY_TAIL

LENGTH_LATEST = PATH_CTE.format(leaf=LEAF_LATEST) + "SELECT count(*) FROM path"
LENGTH_ID = PATH_CTE.format(leaf=LEAF_ID) + "SELECT count(*) FROM path"

COMPACTIONS = (
    "SELECT id, summary, from_message_id, to_message_id, created_at FROM compactions "
    "WHERE session_id = $1 ORDER BY pk"
)

# The messages of a batch whose pks and event seqs were taken before (insert_messages).
INSERT_MESSAGES = f"""
INSERT INTO messages (pk, session_key, id, parent_pk, role, content, tsv, event_seq, created_at)
SELECT u.pk, {SESSION_KEY}, u.id, u.parent_pk, u.role, u.content, to_tsvector('sessionhub', u.fts), u.seq, $2
FROM unnest($3::bigint[], $4::text[], $5::bigint[], $6::text[], $7::text[], $8::text[], $9::bigint[])
    AS u(pk, id, parent_pk, role, content, fts, seq)
"""

# One message, one round trip: touch the session (``$9``: managed), find the parent
# (``{parent}``), see that the id is new, take its seq, insert it (its event's seq beside it),
# count it, log ``message.appended`` referring to it (``ref``; data is the parent id, as
# ``appended_ref`` writes it) and ring the doorbell (``$10``: the channel, or NULL for none).
# Every part sees the statement's one snapshot, so the parent is the latest message *before*
# this one; the session lock taken with BEGIN keeps that true, and keeps the id new between
# the check and the insert (were it not, the seq would be taken with no event: append_one
# rolls that back). Each part reads the one before it, which makes Postgres run them in that
# order: the session row is locked before the stream's counter row, as every other writer
# locks them (else two writers could deadlock).
APPEND_ONE = f"""
WITH p AS ({{parent}}),
t AS (
    UPDATE sessions SET updated_at = $6 WHERE id = $1 AND $9::bool RETURNING 1
), new AS (
    SELECT 1 FROM (SELECT count(*) FROM t) AS touched
    WHERE NOT EXISTS (SELECT 1 FROM messages WHERE session_key = {SESSION_KEY} AND id = $2)
), {bump_stream("$7::text", "$8::text", "1", gate="new")}, ins AS (
    INSERT INTO messages (session_key, id, parent_pk, role, content, tsv, event_seq, created_at)
    SELECT s.key, $2, (SELECT pk FROM p), $3, $4, to_tsvector('sessionhub', $5::text), s.last_seq, $6
    FROM s
    ON CONFLICT (session_key, id) DO NOTHING RETURNING pk
), st AS (
    INSERT INTO session_stats AS st (session_id, messages) SELECT $1, 1 FROM ins
    ON CONFLICT (session_id) DO UPDATE SET messages = st.messages + 1
), e AS (
    INSERT INTO events (stream_key, seq, session_id, type, data, created_at, ref)
    SELECT s.key, s.last_seq, NULL, NULL,
           COALESCE(to_json((SELECT id FROM p))::text, 'null'), $6, ins.pk
    FROM s, ins
)
SELECT (SELECT pk FROM ins), (SELECT id FROM p), (SELECT last_seq FROM s), (SELECT count(*) FROM t),
       (SELECT pg_notify($10, s.last_seq::text || ' ' || $11) FROM s WHERE $10::text IS NOT NULL)
"""
APPEND_AFTER_LATEST = APPEND_ONE.format(
    parent=f"SELECT pk, id FROM messages WHERE session_key = {SESSION_KEY} ORDER BY pk DESC LIMIT 1"
)
APPEND_AFTER = APPEND_ONE.format(
    parent=f"SELECT pk, id FROM messages WHERE session_key = {SESSION_KEY} AND id = $12"
)
APPEND_ROOT = APPEND_ONE.format(parent="SELECT NULL::bigint AS pk, NULL::text AS id WHERE false")

COUNT = (
    "INSERT INTO session_stats AS st (session_id, messages) VALUES ($1, $2) "
    "ON CONFLICT (session_id) DO UPDATE SET messages = st.messages + excluded.messages"
)

DELETE_ONE = f"""
WITH t AS (
    SELECT m.pk, m.parent_pk, p.id AS parent_id, m.content, m.event_seq FROM messages m
    LEFT JOIN messages p ON p.pk = m.parent_pk
    WHERE m.session_key = {SESSION_KEY} AND m.id = $2
), dx AS ({DETACH.format(rows="t", stream="$3")}), ch AS (
    UPDATE messages c SET parent_pk = t.parent_pk FROM t WHERE c.parent_pk = t.pk
    RETURNING c.pk, c.id
), d AS (
    DELETE FROM messages WHERE pk = (SELECT pk FROM t)
)
SELECT t.parent_id, ARRAY(SELECT id FROM ch ORDER BY pk) FROM t
"""

#: A session's messages, overlays and count go (delete_session: the log goes too).
CLEAR_ALL = f"""
WITH a AS (DELETE FROM messages WHERE session_key = {SESSION_KEY}),
     b AS (DELETE FROM compactions WHERE session_id = $1)
DELETE FROM session_stats WHERE session_id = $1
"""
#: As CLEAR_ALL, the log staying readable: the message.appended events get their bodies.
CLEAR = f"""
WITH x AS (
    SELECT pk, content, event_seq FROM messages WHERE session_key = {SESSION_KEY} AND event_seq IS NOT NULL
), dx AS ({DETACH.format(rows="x", stream="$2")}),
     a AS (DELETE FROM messages WHERE session_key = {SESSION_KEY}),
     b AS (DELETE FROM compactions WHERE session_id = $1)
DELETE FROM session_stats WHERE session_id = $1
"""

UPDATE_MESSAGE = f"""
WITH x AS (SELECT pk, content, event_seq FROM messages WHERE session_key = {SESSION_KEY} AND id = $2),
     dx AS ({DETACH.format(rows="x", stream="$6")})
UPDATE messages m SET content = $3, role = $4, tsv = to_tsvector('sessionhub', $5::text), event_seq = NULL
FROM x WHERE m.pk = x.pk RETURNING m.pk
"""

IS_ANCESTOR = """
WITH RECURSIVE up(pk, parent_pk) AS (
    SELECT pk, parent_pk FROM messages WHERE pk = $1
    UNION ALL
    SELECT m.pk, m.parent_pk FROM up JOIN messages m ON m.pk = up.parent_pk
    WHERE m.pk < up.pk AND m.pk >= $2
)
SELECT 1 FROM up WHERE pk = $2 LIMIT 1
"""

# A referring event (ref set) reads its message's row: the message as appended, since an
# update or a delete gives the event its body back first (DETACH).
# An event whose session_id is NULL is of the session whose stream it is in; one whose type
# is NULL, a message.appended (what EMIT leaves out).
READ_EVENTS = f"""
SELECT s.epoch, s.first_seq, s.last_seq, e.session_id, e.seq, e.type, e.data, e.created_at,
       e.ref, e.content
FROM (SELECT 1) AS one
LEFT JOIN streams s ON s.stream = $1
LEFT JOIN LATERAL (
    SELECT COALESCE(ev.session_id, substr($1, {len(SESSION_PREFIX) + 1})) AS session_id, ev.seq,
           COALESCE(ev.type, 'message.appended') AS type, ev.data, ev.created_at, ev.ref, m.content
    FROM events ev
    LEFT JOIN messages m ON m.pk = ev.ref
    WHERE ev.stream_key = s.key AND ev.seq > $2 ORDER BY ev.seq LIMIT $3
) e ON true
ORDER BY e.seq
"""


async def pk_of(conn: Conn, session_id: str, message_id: str) -> int | None:
    pk = await conn.fetchval(
        f"SELECT pk FROM messages WHERE session_key = {SESSION_KEY} AND id = $2", session_id, message_id
    )
    return None if pk is None else int(pk)


async def path(conn: Conn, session_id: str, leaf_id: str | None) -> list[Message]:
    if leaf_id is None or leaf_id == "":
        rows = await conn.fetch(PATH_LATEST, session_id)
    else:
        rows = await conn.fetch(PATH_ID, session_id, leaf_id)
    return [m for (c,) in rows if (m := decode_message(c)) is not None]


async def compactions(conn: Conn, session_id: str) -> list[Compaction]:
    return [compaction(r) for r in await conn.fetch(COMPACTIONS, session_id)]


async def append_one(
    tx: PostgresTx, session_id: str, message: Message, parent: ParentArg, *, managed: bool, notify: bool
) -> AppendResult:
    """:func:`insert_messages` of one message in one statement (:data:`APPEND_ONE`)."""
    stream = session_stream(session_id)
    args: list[Any] = [
        session_id,
        message.id,
        message.role,
        message_json(message),
        indexed_words(message),
        tx.when,
        stream,
        new_epoch(),
        managed,
        CHANNEL if notify else None,
        stream_key(stream),
    ]
    if parent is LATEST:
        statement = APPEND_AFTER_LATEST
    elif parent is None:
        statement = APPEND_ROOT
    else:
        statement, args = APPEND_AFTER, [*args, parent]
    row = await tx.conn.fetchrow(statement, *args)
    assert row is not None
    pk, _parent_id, seq, touched, _ = row
    if managed and not touched:
        raise SessionNotFound(session_id)  # the transaction rolls back what was written
    if pk is None and seq is not None:  # the id came in between check and insert (no lock)
        raise Conflict(f"message {message.id!r} was appended concurrently; nothing was written")
    if pk is None:  # already stored: first content wins, nothing is written
        return AppendResult(inserted=[], last_id=message.id, last_seq=0)
    tx.notes.append((stream, int(seq)))
    if notify:
        tx.notified.add(stream)
    if has_files([message]):
        await filerows.add_refs(tx, int(pk), message_refs(message))
    return AppendResult(inserted=[message.id], last_id=message.id, last_seq=int(seq))


async def insert_messages(
    tx: PostgresTx, session_id: str, messages: Sequence[Message], parent: ParentArg
) -> AppendResult:
    if len(messages) == 1:  # one statement (the doorbell then goes with COMMIT)
        return await append_one(tx, session_id, messages[0], parent, managed=False, notify=False)
    conn = tx.conn
    parent_pk: int | None
    parent_id: str | None
    if parent is LATEST:
        row = await conn.fetchrow(
            f"SELECT pk, id FROM messages WHERE session_key = {SESSION_KEY} ORDER BY pk DESC LIMIT 1",
            session_id,
        )
        parent_pk, parent_id = (None, None) if row is None else (int(row[0]), row[1])
    elif parent is None:
        parent_pk, parent_id = None, None
    else:
        parent_pk = await pk_of(conn, session_id, parent)
        parent_id = parent if parent_pk is not None else None
    if not messages:
        return AppendResult(inserted=[], last_id=parent_id, last_seq=0)
    stream = session_stream(session_id)
    # Which ids are stored already (first content wins; they still continue the chain),
    # and pks for the rest: taken from the identity's sequence, so they are newer than
    # every row of the session (its writers are serialized by the session lock).
    known: dict[str, int] = {
        r[0]: int(r[1])
        for r in await conn.fetch(
            f"SELECT id, pk FROM messages WHERE session_key = {SESSION_KEY} AND id = ANY($2::text[])",
            session_id,
            [m.id for m in messages],
        )
    }
    fresh = len({m.id for m in messages} - known.keys())
    if not fresh:
        return AppendResult(inserted=[], last_id=messages[-1].id, last_seq=0)
    pks: list[int] = sorted(
        int(r[0])
        for r in await conn.fetch(
            "SELECT nextval(pg_get_serial_sequence('messages', 'pk')) FROM generate_series(1, $1)",
            fresh,
        )
    )
    pk_iter = iter(pks)
    cols: tuple[list[Any], ...] = ([], [], [], [], [], [])
    events: list[tuple[str, str]] = []
    refs: list[int | None] = []
    inserted: list[str] = []
    files: list[tuple[int, list[str]]] = []
    for message in messages:
        pk = known.get(message.id)
        if pk is None:
            pk = known[message.id] = next(pk_iter)
            values = (pk, message.id, parent_pk, message.role, message_json(message), indexed_words(message))
            for col, value in zip(cols, values, strict=True):
                col.append(value)
            events.append(("message.appended", appended_ref(parent_id)))
            refs.append(pk)
            inserted.append(message.id)
            if has_files([message]):
                files.append((pk, message_refs(message)))
        parent_pk, parent_id = pk, message.id
    # The events first: each message row keeps its event's seq (consecutive, ending at last).
    last_seq = await tx.emit_many(stream, session_id, events, refs)
    seqs = list(range(last_seq - len(inserted) + 1, last_seq + 1))
    await conn.execute(INSERT_MESSAGES, session_id, tx.when, *cols, seqs)
    await conn.execute(COUNT, session_id, len(inserted))
    for pk, shas in files:
        await filerows.add_refs(tx, pk, shas)
    return AppendResult(inserted=inserted, last_id=parent_id, last_seq=last_seq)


async def update_message(tx: PostgresTx, session_id: str, message: Message, *, emit: bool = True) -> bool:
    content = message_json(message)
    stream = session_stream(session_id)
    pk = await tx.conn.fetchval(
        UPDATE_MESSAGE, session_id, message.id, content, message.role, indexed_words(message), stream
    )
    if pk is None:
        return False
    # The old references go even when the new body has none (a cheap indexed delete).
    await filerows.replace_refs(tx, int(pk), message_refs(message) if has_files([message]) else [])
    if emit:
        await tx.emit_many(stream, session_id, [("message.updated", updated_json(content))])
    return True


async def insert_compaction(tx: PostgresTx, session_id: str, c: Compaction, *, emit: bool = True) -> None:
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


async def create_session(
    tx: PostgresTx,
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
    await tx.registry_change(info, event, **(event_extra or {}))
    return info


async def delete_messages(tx: PostgresTx, session_id: str, ids: Sequence[str], managed: bool) -> list[str]:
    if managed:
        await tx.touch(session_id)
    deleted: list[str] = []
    reparented: list[list[str | None]] = []
    for mid in dict.fromkeys(ids):
        row = await tx.conn.fetchrow(DELETE_ONE, session_id, mid, session_stream(session_id))
        if row is None:
            continue
        parent_id, children = row
        reparented.extend([child, parent_id] for child in children)
        deleted.append(mid)
    if deleted:
        await tx.conn.execute(COUNT, session_id, -len(deleted))
        await tx.emit_session(session_id, "message.deleted", {"ids": deleted, "reparented": reparented})
    return deleted


async def history(conn: Conn, session_id: str, leaf_id: str | None) -> list[Message]:
    if leaf_id is None or leaf_id == "":
        rows = await conn.fetch(HISTORY_LATEST, session_id)
    else:
        rows = await conn.fetch(HISTORY_ID, session_id, leaf_id)
    path: list[Message] = []
    overlays: list[Compaction] = []
    for kind, _n, a, b, c, d, t in rows:
        if kind == 0:
            if (m := decode_message(a)) is not None:
                path.append(m)
        else:
            overlays.append(Compaction(id=a, summary=b, from_message_id=c, to_message_id=d, created_at=t))
    if not path:
        return path
    return apply_compactions(path, overlays)


async def add_compaction(
    tx: PostgresTx,
    session_id: str,
    summary: str,
    from_id: str,
    to_id: str,
    managed: bool,
    verify_path: bool,
    covered: Sequence[str],
) -> Compaction:
    conn = tx.conn
    if managed:
        await tx.touch(session_id)
    if verify_path:
        top = await pk_of(conn, session_id, from_id)
        leaf = await pk_of(conn, session_id, to_id)
        if top is None or leaf is None or top > leaf or not await conn.fetchval(IS_ANCESTOR, leaf, top):
            raise not_one_path(from_id, to_id)
    if covered:
        wanted = sorted(set(covered))
        found = int(
            await conn.fetchval(
                f"SELECT count(*) FROM messages WHERE session_key = {SESSION_KEY} AND id = ANY($2::text[])",
                session_id,
                wanted,
            )
        )
        if found != len(wanted):
            raise summarized_deleted(from_id, to_id, len(wanted) - found)
    c = new_compaction(summary, from_id, to_id, tx.when)
    await insert_compaction(tx, session_id, c)
    return c


async def delete_session(tx: PostgresTx, session_id: str, stream: str, context_keys: Sequence[str]) -> None:
    conn = tx.conn
    info = await tx.session_row(session_id)
    await conn.execute(CLEAR_ALL, session_id)
    if context_keys:
        await conn.execute("DELETE FROM context_blocks WHERE key = ANY($1::text[])", list(context_keys))
    await conn.execute("DELETE FROM sessions WHERE id = $1", session_id)
    # A LangGraph thread's checkpoints go with its session.
    await conn.execute("DELETE FROM graph_writes WHERE session_id = $1", session_id)
    await conn.execute("DELETE FROM graph_checkpoints WHERE session_id = $1", session_id)
    (own, data), (registry, _) = registry_events(info, "session.deleted")
    # The log goes with the session (it holds message bodies); only the final
    # event stays, and the stream now starts there.
    seq = await tx.emit(own, session_id, "session.deleted", data)
    await conn.execute(
        f"WITH d AS (DELETE FROM events WHERE stream_key = {stream_key_of('$1')} AND seq < $2) "
        "UPDATE streams SET first_seq = $2 WHERE stream = $1",
        stream,
        seq,
    )
    await tx.emit(registry, session_id, "session.deleted", data)


async def add_usage(tx: PostgresTx, session_id: str, delta: tuple[int, int, float]) -> SessionInfo:
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
    await tx.registry_change(info, "session.usage", delta=usage_event(delta))
    return info


async def split_session(tx: PostgresTx, session_id: str, summary: str, name: str | None) -> SessionInfo:
    # One conditional UPDATE, as end_session: of a split and a concurrent end (or two
    # splits), only one finds the session open; the other writes nothing.
    row = await tx.conn.fetchrow(
        "UPDATE sessions SET end_reason = 'compaction', updated_at = $2 "
        f"WHERE id = $1 AND end_reason IS NULL RETURNING {SESSION_COLS}",
        session_id,
        tx.when,
    )
    if row is None:
        raise already_ended(await tx.session_row(session_id))  # or SessionNotFound
    ended = session_info(row)
    await tx.registry_change(ended, "session.ended")
    info = await create_session(
        tx,
        name=split_name(ended, name),
        parent_session_id=session_id,
        model=ended.model,
        source=ended.source,
        session_id=None,
    )
    await insert_messages(tx, info.id, [continuation_message(summary)], None)
    return info


async def read_events(conn: Conn, stream: str, after_seq: int, limit: int, epoch: str | None) -> list[Event]:
    rows = await conn.fetch(READ_EVENTS, stream, after_seq, max(limit, 0))
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
            data=_decode(r[6] if r[8] is None else rehydrated(r[9] or "null", r[6])),
            created_at=r[7],
            stream=kind,
        )
        for r in rows
        if r[4] is not None
    ]
