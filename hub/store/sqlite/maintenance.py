"""Retention and export/import statements of the SQLite store (``prune_events``,
``dump_session``, ``import_sessions``). Messages go in through :func:`.sql.insert_messages`,
so the search index and the ``message.appended`` events are those of any append."""

from __future__ import annotations

from collections.abc import Sequence

from protocol import Conflict, SessionInfo

from ..base import PROMPT_LABEL, DumpedMessage, SessionDump, context_key
from ..policy import context_owners, owned_context
from ..prune import PruneArgs, batch_end
from ..rows import SESSION_COLS, session_info, ts
from . import graphrows, sql
from .connection import Conn
from .packing import stored_message
from .tx import SqliteTx, session_row

__all__ = [
    "count_events",
    "dump_session",
    "import_sessions",
    "prune_batch",
    "prune_candidates",
]


def prune_candidates(conn: Conn, args: PruneArgs) -> list[str]:
    """Streams with something to prune: longer than ``keep``, or whose first event is older
    than the cutoff (one index probe per stream, no scan of the events)."""
    found: set[str] = set()
    if args.keep is not None:
        rows = conn.execute(
            "SELECT stream FROM streams WHERE last_seq - first_seq + 1 > ?", (args.keep,)
        ).fetchall()
        found.update(r[0] for r in rows)
    if args.cutoff is not None:
        rows = conn.execute(
            "SELECT s.stream FROM streams s JOIN events e ON e.sk = s.sk AND e.seq = s.first_seq "
            f"WHERE {_EVENT_TIME} < ?",
            (_stored_cutoff(args.cutoff),),
        ).fetchall()
        found.update(r[0] for r in rows)
    return sorted(found)


#: An event's time: a referring event may take its message's (SqliteTx.emit_many).
_EVENT_TIME = "COALESCE(e.created_at, (SELECT m.created_at FROM messages m WHERE m.pk = e.ref))"


def _stored_cutoff(cutoff: float) -> float:
    """The cutoff against the stored epoch-seconds floats. An event reads back as
    ``datetime.fromtimestamp(created_at)``, rounded to the microsecond, so the one read as
    exactly the cutoff may be stored up to half a microsecond below it: it is kept."""
    return cutoff - 5e-7


def prune_batch(tx: SqliteTx, stream: str, args: PruneArgs) -> int:
    """One batch: re-read the stream under the write lock (another process may have pruned
    it meanwhile), delete its oldest events and move ``first_seq`` past them."""
    conn = tx.conn
    row = conn.execute("SELECT first_seq, last_seq, sk FROM streams WHERE stream = ?", (stream,)).fetchone()
    if row is None:
        return 0
    first, last, sk = int(row[0]), int(row[1]), int(row[2])
    first_new: int | None = None
    if args.cutoff is not None:
        found = conn.execute(
            f"SELECT MIN(seq) FROM events e WHERE sk = ? AND seq >= ? AND seq < ? AND {_EVENT_TIME} >= ?",
            (sk, first, first + args.batch, _stored_cutoff(args.cutoff)),
        ).fetchone()
        first_new = None if found[0] is None else int(found[0])
    end = batch_end(first, last, args, first_new)
    if end <= first:
        return 0
    conn.execute("DELETE FROM events WHERE sk = ? AND seq < ?", (sk, end))
    conn.execute("UPDATE streams SET first_seq = ? WHERE stream = ?", (end, stream))
    return end - first


def count_events(conn: Conn) -> int:
    # Seqs are contiguous from first_seq to last_seq: no need to count rows.
    row = conn.execute("SELECT COALESCE(SUM(last_seq - first_seq + 1), 0) FROM streams").fetchone()
    return int(row[0])


def _context_rows(conn: Conn, session_id: str) -> list[tuple[str, str]]:
    suffix = "_" + session_id
    rows = conn.execute(
        "SELECT key, content FROM context_blocks WHERE length(key) > ? AND substr(key, -?) = ? ORDER BY key",
        (len(suffix), len(suffix), suffix),
    ).fetchall()
    found = [(str(k), str(c)) for k, c in rows]
    candidates = sorted(context_owners((k for k, _ in found), session_id))
    existing = (
        {
            str(r[0])
            for r in conn.execute(
                f"SELECT id FROM sessions WHERE id IN ({', '.join('?' * len(candidates))})", candidates
            ).fetchall()
        }
        if candidates
        else set()
    )
    return owned_context(found, session_id, existing)


def dump_session(conn: Conn, session_id: str) -> SessionDump:
    info = session_row(conn, session_id)
    rows = conn.execute(
        "SELECT m.content, m.id, m.role, p.id, m.created_at FROM messages m "
        f"LEFT JOIN messages p ON p.pk = m.parent_pk WHERE m.sk = {sql.KEY} ORDER BY m.pk",
        (session_id,),
    ).fetchall()
    messages = [
        DumpedMessage(message=m, parent_id=parent, created_at=ts(at))
        for content, id_, role, parent, at in rows
        if (m := stored_message(content, id_, role)) is not None
    ]
    context = dict(_context_rows(conn, session_id))
    prompt = context.pop(PROMPT_LABEL, None)
    return SessionDump(
        info=info,
        messages=messages,
        compactions=sql.compactions(conn, session_id),
        context=context,
        system_prompt=prompt,
        checkpoints=graphrows.dumped(conn, session_id),
    )


def import_sessions(tx: SqliteTx, dumps: Sequence[SessionDump], replace: bool) -> list[SessionInfo]:
    """Every session of a dump in the caller's one transaction: a refusal of any (an
    existing id without ``replace``) rolls back those written before it."""
    return [_import_session(tx, dump, replace) for dump in dumps]


def _import_session(tx: SqliteTx, dump: SessionDump, replace: bool) -> SessionInfo:
    conn = tx.conn
    info = dump.info
    sid = info.id
    values = (
        info.name,
        info.parent_session_id,
        info.model,
        info.source,
        info.input_tokens,
        info.output_tokens,
        info.estimated_cost,
        info.end_reason,
        info.created_at.timestamp(),
        info.updated_at.timestamp(),
    )
    exists = conn.execute("SELECT 1 FROM sessions WHERE id = ?", (sid,)).fetchone() is not None
    if exists and not replace:
        raise Conflict(f"session {sid!r} already exists (import with replace to overwrite it)")
    if exists:
        sql.clear(conn, sid)
        for label, _ in _context_rows(conn, sid):
            conn.execute("DELETE FROM context_blocks WHERE key = ?", (context_key(label, sid),))
        conn.execute(
            "UPDATE sessions SET name = ?, parent_session_id = ?, model = ?, source = ?, "
            "input_tokens = ?, output_tokens = ?, estimated_cost = ?, end_reason = ?, "
            "created_at = ?, updated_at = ? WHERE id = ?",
            (*values, sid),
        )
        tx.emit_session(sid, "messages.cleared", {})
        event = "session.renamed"
    else:
        conn.execute(
            f"INSERT INTO sessions ({SESSION_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", (sid, *values)
        )
        event = "session.created"
    stored = session_info(
        conn.execute(f"SELECT {SESSION_COLS} FROM sessions WHERE id = ?", (sid,)).fetchone(), ts
    )
    tx.registry_change(stored, event)
    for row in dump.messages:
        sql.insert_messages(tx, sid, [row.message], row.parent_id)
        # The row's time changes: its event, taking the row's, keeps the time it was written.
        conn.execute(
            f"UPDATE events SET created_at = ? WHERE sk = {sql.KEY} AND created_at IS NULL "
            f"AND seq = (SELECT event_seq FROM messages WHERE sk = {sql.KEY} AND id = ?)",
            (tx.now, sid, sid, row.message.id),
        )
        conn.execute(
            f"UPDATE messages SET created_at = ? WHERE sk = {sql.KEY} AND id = ?",
            (row.created_at.timestamp(), sid, row.message.id),
        )
    for c in dump.compactions:
        sql.insert_compaction(tx, sid, c)
    context = dict(dump.context)
    if dump.system_prompt is not None:
        context[PROMPT_LABEL] = dump.system_prompt
    for label, content in context.items():
        conn.execute(
            "INSERT INTO context_blocks (key, content, updated_at) VALUES (?, ?, ?) "
            "ON CONFLICT (key) DO UPDATE SET content = excluded.content, updated_at = excluded.updated_at",
            (context_key(label, sid), content, tx.now),
        )
    if exists or dump.checkpoints:
        graphrows.restore(tx, sid, dump.checkpoints)
    return stored
