"""Retention and export/import statements of the Postgres store (``prune_events``,
``dump_session``, ``import_sessions``). Messages go in through :func:`.sql.insert_messages`,
so the search vectors and the ``message.appended`` events are those of any append."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from protocol import Conflict, SessionInfo

from ..base import PROMPT_LABEL, DumpedMessage, SessionDump, context_key
from ..policy import context_owners, owned_context, session_stream
from ..prune import PruneArgs, batch_end
from ..rows import SESSION_COLS, aware, decode_message, session_info, ts
from . import graphrows, sql
from .keys import SESSION_KEY
from .schema import lock_key
from .tx import PostgresTx, session_row

if TYPE_CHECKING:
    from .tx import Conn

__all__ = [
    "count_events",
    "dump_session",
    "import_sessions",
    "prune_batch",
    "prune_candidates",
]


async def prune_candidates(conn: Conn, args: PruneArgs) -> list[str]:
    """Streams with something to prune: longer than ``keep``, or whose first event is older
    than the cutoff (one index probe per stream, no scan of the events)."""
    found: set[str] = set()
    if args.keep is not None:
        rows = await conn.fetch("SELECT stream FROM streams WHERE last_seq - first_seq + 1 > $1", args.keep)
        found.update(r[0] for r in rows)
    if args.cutoff is not None:
        rows = await conn.fetch(
            "SELECT s.stream FROM streams s JOIN events e ON e.stream_key = s.key AND e.seq = s.first_seq "
            "WHERE e.created_at < $1",
            ts(args.cutoff),
        )
        found.update(r[0] for r in rows)
    return sorted(found)


async def prune_batch(tx: PostgresTx, stream: str, args: PruneArgs) -> int:
    """One batch. ``FOR UPDATE`` on the stream's row: a writer of the stream waits for this
    short transaction, and a second node pruning the same stream re-reads ``first_seq``
    after this one's commit, so it deletes nothing twice."""
    conn = tx.conn
    row = await conn.fetchrow(
        "SELECT first_seq, last_seq, key FROM streams WHERE stream = $1 FOR UPDATE", stream
    )
    if row is None:
        return 0
    first, last, key = int(row[0]), int(row[1]), int(row[2])
    first_new: int | None = None
    if args.cutoff is not None:
        found = await conn.fetchval(
            "SELECT MIN(seq) FROM events "
            "WHERE stream_key = $1 AND seq >= $2 AND seq < $3 AND created_at >= $4",
            key,
            first,
            first + args.batch,
            ts(args.cutoff),
        )
        first_new = None if found is None else int(found)
    end = batch_end(first, last, args, first_new)
    if end <= first:
        return 0
    await conn.execute(
        "WITH d AS (DELETE FROM events WHERE stream_key = $3 AND seq < $2) "
        "UPDATE streams SET first_seq = $2 WHERE stream = $1",
        stream,
        end,
        key,
    )
    return end - first


async def count_events(conn: Conn) -> int:
    # Seqs are contiguous from first_seq to last_seq: no need to count rows.
    return int(await conn.fetchval("SELECT COALESCE(SUM(last_seq - first_seq + 1), 0) FROM streams"))


async def _context_rows(conn: Conn, session_id: str) -> list[tuple[str, str]]:
    suffix = "_" + session_id
    rows = await conn.fetch(
        "SELECT key, content FROM context_blocks "
        'WHERE length(key) > length($1) AND right(key, length($1)) = $1 ORDER BY key COLLATE "C"',
        suffix,
    )
    found = [(str(r[0]), str(r[1])) for r in rows]
    candidates = sorted(context_owners((k for k, _ in found), session_id))
    existing: set[str] = set()
    if candidates:
        existing = {
            str(r[0]) for r in await conn.fetch("SELECT id FROM sessions WHERE id = ANY($1)", candidates)
        }
    return owned_context(found, session_id, existing)


async def dump_session(conn: Conn, session_id: str) -> SessionDump:
    # One snapshot for every statement: a write in between cannot tear the dump.
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        info = await session_row(conn, session_id)
        rows = await conn.fetch(
            "SELECT m.content, p.id, m.created_at FROM messages m LEFT JOIN messages p ON p.pk = m.parent_pk "
            f"WHERE m.session_key = {SESSION_KEY} ORDER BY m.pk",
            session_id,
        )
        messages = [
            DumpedMessage(message=m, parent_id=r[1], created_at=aware(r[2]))
            for r in rows
            if (m := decode_message(r[0])) is not None
        ]
        context = dict(await _context_rows(conn, session_id))
        compactions = await sql.compactions(conn, session_id)
        checkpoints = await graphrows.dumped(conn, session_id)
    prompt = context.pop(PROMPT_LABEL, None)
    return SessionDump(
        info=info,
        messages=messages,
        compactions=compactions,
        context=context,
        system_prompt=prompt,
        checkpoints=checkpoints,
    )


async def import_sessions(tx: PostgresTx, dumps: Sequence[SessionDump], replace: bool) -> list[SessionInfo]:
    """Every session of a dump in the caller's one transaction: a refusal of any rolls back
    those written before it.

    The sessions already stored are write-locked first, all at once and in key order (two
    imports never deadlock; a writer of one waits for the import, holding nothing it
    needs). A new one takes no advisory lock, so a dump of thousands of sessions stays
    within the server's lock table: its ``INSERT ... ON CONFLICT DO NOTHING`` waits for
    anyone creating the same id meanwhile, and is a conflict if they commit."""
    conn = tx.conn
    ids = [d.info.id for d in dumps]
    found = {str(r[0]) for r in await conn.fetch("SELECT id FROM sessions WHERE id = ANY($1::text[])", ids)}
    if found and not replace:
        raise _exists(next(sid for sid in ids if sid in found))
    keys = sorted({lock_key(session_stream(sid)) for sid in found})
    if keys:
        await conn.execute("SELECT pg_advisory_xact_lock(k) FROM unnest($1::bigint[]) AS k", keys)
    return [await _import_session(tx, d, replace) for d in dumps]


def _exists(session_id: str) -> Conflict:
    return Conflict(f"session {session_id!r} already exists (import with replace to overwrite it)")


async def _import_session(tx: PostgresTx, dump: SessionDump, replace: bool) -> SessionInfo:
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
        info.created_at,
        info.updated_at,
    )
    exists = await conn.fetchval("SELECT 1 FROM sessions WHERE id = $1 FOR UPDATE", sid) is not None
    if exists and not replace:
        raise _exists(sid)
    if exists:
        await conn.execute(sql.CLEAR, sid, session_stream(sid))
        keys = [context_key(label, sid) for label, _ in await _context_rows(conn, sid)]
        await conn.execute("DELETE FROM context_blocks WHERE key = ANY($1::text[])", keys)
        row = await conn.fetchrow(
            "UPDATE sessions SET name = $2, parent_session_id = $3, model = $4, source = $5, "
            "input_tokens = $6, output_tokens = $7, estimated_cost = $8, end_reason = $9, "
            f"created_at = $10, updated_at = $11 WHERE id = $1 RETURNING {SESSION_COLS}",
            sid,
            *values,
        )
        await tx.emit_session(sid, "messages.cleared", {})
        event = "session.renamed"
    else:
        row = await conn.fetchrow(
            f"INSERT INTO sessions ({SESSION_COLS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) "
            f"ON CONFLICT (id) DO NOTHING RETURNING {SESSION_COLS}",
            sid,
            *values,
        )
        if row is None:  # created by someone else since the check, and committed
            raise _exists(sid)
        event = "session.created"
    if row is None:  # not after FOR UPDATE; typed for mypy
        raise Conflict(f"session {sid!r} changed during the import")
    stored = session_info(row)
    await tx.registry_change(stored, event)
    for m in dump.messages:
        await sql.insert_messages(tx, sid, [m.message], m.parent_id)
        await conn.execute(
            f"UPDATE messages SET created_at = $3 WHERE session_key = {SESSION_KEY} AND id = $2",
            sid,
            m.message.id,
            m.created_at,
        )
    for c in dump.compactions:
        await sql.insert_compaction(tx, sid, c)
    context = dict(dump.context)
    if dump.system_prompt is not None:
        context[PROMPT_LABEL] = dump.system_prompt
    for label, content in context.items():
        await conn.execute(
            "INSERT INTO context_blocks (key, content, updated_at) VALUES ($1, $2, $3) "
            "ON CONFLICT (key) DO UPDATE SET content = excluded.content, updated_at = excluded.updated_at",
            context_key(label, sid),
            content,
            tx.when,
        )
    if exists or dump.checkpoints:
        await graphrows.restore(tx, sid, dump.checkpoints)
    return stored
