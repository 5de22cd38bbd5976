"""LangGraph checkpoints on Postgres (protocol/graphstate.py; the rules in
:mod:`..graphpolicy`): each change one transaction under the session stream's lock, with
its event, the serializer's bytes stored as bytea and the metadata as jsonb."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from protocol import Message, SessionNotFound, coerce_message
from protocol.graphstate import CheckpointRecord, CheckpointWrite

from ..graphpolicy import (
    CHECKPOINT_PUT,
    CHECKPOINT_WRITES,
    CHECKPOINTS_DELETED,
    MAX_LIST,
    check_record,
    check_writes,
    metadata_matches,
    put_event,
    same_message,
    tail_unknown,
    writes_event,
)
from ..policy import session_stream
from ..rows import decode_message
from . import sql
from .keys import SESSION_KEY
from .pool import PostgresPool
from .tx import PostgresTx

if TYPE_CHECKING:
    from .tx import Conn

__all__ = ["PostgresGraphRows", "dumped", "restore"]

_encode = msgspec.json.Encoder().encode
_decode_meta = msgspec.json.Decoder(dict[str, Any]).decode

#: How many of a put's newest messages the projection reads in its first statement.
_TAIL = 8
_COLS = "session_id, ns, checkpoint_id, parent_id, type, data, metadata::text"
_INSERT = (
    "INSERT INTO graph_checkpoints (session_id, ns, checkpoint_id, parent_id, type, data, metadata, run_id) "
)
_UPSERT = (
    "ON CONFLICT (session_id, ns, checkpoint_id) DO UPDATE SET parent_id = excluded.parent_id, "
    "type = excluded.type, data = excluded.data, metadata = excluded.metadata, run_id = excluded.run_id"
)
_WRITE_COLS = "task_id, idx, channel, type, value, task_path"


async def _ensure_session(tx: PostgresTx, session_id: str, name: str) -> None:
    # A thread's first put registers its session (logged as any creation is); every other
    # put touches it, one statement.
    try:
        await tx.touch(session_id)
    except SessionNotFound:
        await sql.create_session(
            tx, name=name, parent_session_id=None, model=None, source="langgraph", session_id=session_id
        )


def _record(row: Sequence[Any], writes: list[CheckpointWrite]) -> CheckpointRecord:
    return CheckpointRecord(
        thread_id=row[0],
        ns=row[1],
        checkpoint_id=row[2],
        parent_id=row[3],
        type=row[4],
        data=bytes(row[5]),
        metadata=_decode_meta(row[6]),
        writes=writes,
    )


def _write_of(r: Sequence[Any]) -> CheckpointWrite:
    return CheckpointWrite(task_id=r[0], idx=r[1], channel=r[2], type=r[3], value=bytes(r[4]), task_path=r[5])


async def _writes_of(conn: Conn, records: list[CheckpointRecord]) -> None:
    if not records:
        return
    rows = await conn.fetch(
        f"SELECT w.session_id, w.ns, w.checkpoint_id, {', '.join('w.' + c for c in _WRITE_COLS.split(', '))} "
        "FROM graph_writes w JOIN unnest($1::text[], $2::text[], $3::text[]) AS k(s, n, c) "
        "ON w.session_id = k.s AND w.ns = k.n AND w.checkpoint_id = k.c ORDER BY w.task_id, w.idx",
        [r.thread_id for r in records],
        [r.ns for r in records],
        [r.checkpoint_id for r in records],
    )
    by_key = {(r.thread_id, r.ns, r.checkpoint_id): r for r in records}
    for row in rows:
        by_key[(row[0], row[1], row[2])].writes.append(_write_of(tuple(row)[3:]))


async def _project(
    tx: PostgresTx, session_id: str, messages: Sequence[Message | Mapping[str, Any]], partial: bool
) -> bool:
    """:func:`..graphpolicy.project`'s walk, in the put's transaction."""
    held: Message | None = None
    missing: list[Message] = []
    tail = [coerce_message(raw) for raw in messages[-_TAIL:]]
    # The newest few in one round trip: a put adds a message or two.
    rows = await tx.conn.fetch(
        f"SELECT id, content FROM messages WHERE session_key = {SESSION_KEY} AND id = ANY($2::text[])",
        session_id,
        [m.id for m in tail],
    )
    known: dict[str, Any] = {r[0]: r[1] for r in rows}
    for i, raw in enumerate(reversed(messages)):
        m = tail[-1 - i] if i < len(tail) else coerce_message(raw)
        content = (
            known.get(m.id)
            if i < len(tail)
            else await tx.conn.fetchval(
                f"SELECT content FROM messages WHERE session_key = {SESSION_KEY} AND id = $2",
                session_id,
                m.id,
            )
        )
        if content is None:
            missing.append(m)
            continue
        held = m
        stored = decode_message(content)
        if stored is None or not same_message(stored, m):
            await sql.update_message(tx, session_id, m)
        break
    if held is None and partial:
        raise tail_unknown(session_id)
    if missing:
        missing.reverse()
        await sql.insert_messages(tx, session_id, missing, None if held is None else held.id)
    return bool(missing)


async def _put(
    tx: PostgresTx,
    record: CheckpointRecord,
    name: str,
    messages: Sequence[Message | Mapping[str, Any]],
    partial: bool,
) -> bool:
    await _ensure_session(tx, record.thread_id, name)
    run_id = record.metadata.get("run_id")
    await tx.conn.execute(
        f"{_INSERT} VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8) {_UPSERT}",
        record.thread_id,
        record.ns,
        record.checkpoint_id,
        record.parent_id,
        record.type,
        record.data,
        _encode(record.metadata).decode(),
        run_id if isinstance(run_id, str) else None,
    )
    await tx.emit_session(record.thread_id, CHECKPOINT_PUT, put_event(record))
    return await _project(tx, record.thread_id, messages, partial) if messages else False


async def _put_rows(
    conn: Conn,
    session_id: str,
    ns: str,
    checkpoint_id: str,
    writes: Sequence[CheckpointWrite],
    on_conflict: str,
) -> None:
    await conn.execute(
        f"INSERT INTO graph_writes (session_id, ns, checkpoint_id, {_WRITE_COLS}) "
        "SELECT $1, $2, $3, * FROM unnest("
        "$4::text[], $5::int[], $6::text[], $7::text[], $8::bytea[], $9::text[]) "
        f"ON CONFLICT (session_id, ns, checkpoint_id, task_id, idx) {on_conflict}",
        session_id,
        ns,
        checkpoint_id,
        [w.task_id for w in writes],
        [w.idx for w in writes],
        [w.channel for w in writes],
        [w.type for w in writes],
        [w.value for w in writes],
        [w.task_path for w in writes],
    )


async def _put_writes(
    tx: PostgresTx,
    session_id: str,
    ns: str,
    checkpoint_id: str,
    writes: Sequence[CheckpointWrite],
    replace: bool,
) -> None:
    await tx.touch(session_id)
    on_conflict = (
        "DO UPDATE SET channel = excluded.channel, type = excluded.type, value = excluded.value, "
        "task_path = excluded.task_path"
        if replace
        else "DO NOTHING"
    )
    await _put_rows(tx.conn, session_id, ns, checkpoint_id, writes, on_conflict)
    await tx.emit_session(session_id, CHECKPOINT_WRITES, writes_event(ns, checkpoint_id, writes))


async def _get(conn: Conn, session_id: str, ns: str, checkpoint_id: str | None) -> CheckpointRecord | None:
    if checkpoint_id is None:
        row = await conn.fetchrow(
            f"SELECT {_COLS} FROM graph_checkpoints WHERE session_id = $1 AND ns = $2 "
            "ORDER BY checkpoint_id DESC LIMIT 1",
            session_id,
            ns,
        )
    else:
        row = await conn.fetchrow(
            f"SELECT {_COLS} FROM graph_checkpoints WHERE session_id = $1 AND ns = $2 AND checkpoint_id = $3",
            session_id,
            ns,
            checkpoint_id,
        )
    if row is None:
        return None
    found = _record(tuple(row), [])
    await _writes_of(conn, [found])
    return found


async def _list(
    conn: Conn,
    session_id: str | None,
    ns: str | None,
    before: str | None,
    limit: int | None,
    wanted: Mapping[str, Any] | None,
) -> list[CheckpointRecord]:
    cap = MAX_LIST if limit is None else min(limit, MAX_LIST)
    if cap <= 0:
        return []
    # The metadata filter is jsonb containment (indexable), checked again in Python as
    # SQLite checks it, so both stores answer alike (a filter value 1 against 1.0, ...).
    rows = await conn.fetch(
        f"SELECT {_COLS} FROM graph_checkpoints WHERE ($1::text IS NULL OR session_id = $1) "
        "AND ($2::text IS NULL OR ns = $2) AND ($3::text IS NULL OR checkpoint_id < $3) "
        "AND ($4::jsonb IS NULL OR metadata @> $4::jsonb) ORDER BY checkpoint_id DESC LIMIT $5",
        session_id,
        ns,
        before,
        None if not wanted else _encode(dict(wanted)).decode(),
        cap,
    )
    out = [r for r in (_record(tuple(row), []) for row in rows) if metadata_matches(r.metadata, wanted)]
    await _writes_of(conn, out)
    return out


async def _delete(tx: PostgresTx, session_id: str, keep_latest: bool) -> int:
    conn = tx.conn
    keep = (
        " AND (ns, checkpoint_id) NOT IN (SELECT ns, max(checkpoint_id) FROM graph_checkpoints "
        "WHERE session_id = $1 GROUP BY ns)"
        if keep_latest
        else ""
    )
    await conn.execute(f"DELETE FROM graph_writes WHERE session_id = $1{keep}", session_id)
    status = await conn.execute(f"DELETE FROM graph_checkpoints WHERE session_id = $1{keep}", session_id)
    n = int(status.split()[-1])
    if n and await conn.fetchval("SELECT 1 FROM sessions WHERE id = $1", session_id) is not None:
        await tx.emit_session(session_id, CHECKPOINTS_DELETED, {"count": n, "kept_latest": keep_latest})
    return n


async def _delete_runs(tx: PostgresTx, run_ids: Sequence[str]) -> int:
    conn = tx.conn
    rows = await conn.fetch(
        "DELETE FROM graph_checkpoints WHERE run_id = ANY($1::text[]) "
        "RETURNING session_id, ns, checkpoint_id",
        list(run_ids),
    )
    if not rows:
        return 0
    await conn.execute(
        "DELETE FROM graph_writes w USING unnest($1::text[], $2::text[], $3::text[]) AS k(s, n, c) "
        "WHERE w.session_id = k.s AND w.ns = k.n AND w.checkpoint_id = k.c",
        [r[0] for r in rows],
        [r[1] for r in rows],
        [r[2] for r in rows],
    )
    by_session: dict[str, int] = {}
    for r in rows:
        by_session[r[0]] = by_session.get(r[0], 0) + 1
    for sid, n in sorted(by_session.items()):
        if await conn.fetchval("SELECT 1 FROM sessions WHERE id = $1", sid) is not None:
            await tx.emit_session(sid, CHECKPOINTS_DELETED, {"count": n, "run_ids": list(run_ids)})
    return len(rows)


async def _copy(tx: PostgresTx, source: str, target: str, name: str) -> int:
    conn = tx.conn
    if await conn.fetchval("SELECT 1 FROM graph_checkpoints WHERE session_id = $1 LIMIT 1", source) is None:
        return 0
    await _ensure_session(tx, target, name)
    status = await conn.execute(
        f"{_INSERT} SELECT $2, ns, checkpoint_id, parent_id, type, data, metadata, run_id "
        f"FROM graph_checkpoints WHERE session_id = $1 {_UPSERT}",
        source,
        target,
    )
    await conn.execute(
        f"INSERT INTO graph_writes (session_id, ns, checkpoint_id, {_WRITE_COLS}) "
        f"SELECT $2, ns, checkpoint_id, {_WRITE_COLS} FROM graph_writes WHERE session_id = $1 "
        "ON CONFLICT (session_id, ns, checkpoint_id, task_id, idx) DO NOTHING",
        source,
        target,
    )
    n = int(status.split()[-1])
    await tx.emit_session(target, CHECKPOINT_PUT, {"copied_from": source, "count": n})
    return n


async def dumped(conn: Conn, session_id: str) -> list[CheckpointRecord]:
    """Every checkpoint of the session with its writes, by namespace then id (a dump's)."""
    rows = await conn.fetch(
        f"SELECT {_COLS} FROM graph_checkpoints WHERE session_id = $1 ORDER BY ns, checkpoint_id", session_id
    )
    out = [_record(tuple(r), []) for r in rows]
    await _writes_of(conn, out)
    return out


async def restore(tx: PostgresTx, session_id: str, records: Sequence[CheckpointRecord]) -> None:
    """An import's checkpoints, in its transaction, over whatever the session held."""
    conn = tx.conn
    await conn.execute("DELETE FROM graph_writes WHERE session_id = $1", session_id)
    await conn.execute("DELETE FROM graph_checkpoints WHERE session_id = $1", session_id)
    for r in records:
        run_id = r.metadata.get("run_id")
        await conn.execute(
            f"{_INSERT} VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8)",
            session_id, r.ns, r.checkpoint_id, r.parent_id, r.type, r.data, _encode(r.metadata).decode(),
            run_id if isinstance(run_id, str) else None,
        )  # fmt: skip
        if r.writes:
            await _put_rows(conn, session_id, r.ns, r.checkpoint_id, r.writes, "DO NOTHING")
    if records:
        await tx.emit_session(session_id, CHECKPOINT_PUT, {"imported": len(records)})


class PostgresGraphRows(PostgresPool):
    """The checkpoint half of :class:`~.store.PostgresStore` (the contract is
    :class:`~..base.Store`'s)."""

    async def put_checkpoint(
        self,
        record: CheckpointRecord,
        *,
        name: str,
        messages: Sequence[Message | Mapping[str, Any]] = (),
        partial: bool = False,
    ) -> bool:
        check_record(record)
        return await self._write(_put, record, name, messages, partial, lock=session_stream(record.thread_id))

    async def put_checkpoint_writes(
        self,
        session_id: str,
        ns: str,
        checkpoint_id: str,
        writes: Sequence[CheckpointWrite],
        *,
        replace: bool,
    ) -> None:
        await self._write(
            _put_writes,
            session_id,
            ns,
            checkpoint_id,
            check_writes(writes),
            replace,
            lock=session_stream(session_id),
        )

    async def get_checkpoint(
        self, session_id: str, ns: str, checkpoint_id: str | None
    ) -> CheckpointRecord | None:
        return await self._read(_get, session_id, ns, checkpoint_id)

    async def list_checkpoints(
        self,
        session_id: str | None,
        *,
        ns: str | None = None,
        before: str | None = None,
        limit: int | None = None,
        filter: Mapping[str, Any] | None = None,
    ) -> list[CheckpointRecord]:
        return await self._read(_list, session_id, ns, before, limit, filter)

    async def delete_checkpoints(self, session_id: str, *, keep_latest: bool = False) -> int:
        return await self._write(_delete, session_id, keep_latest, lock=session_stream(session_id))

    async def delete_checkpoint_runs(self, run_ids: Sequence[str]) -> int:
        return await self._write(_delete_runs, list(run_ids)) if run_ids else 0

    async def copy_checkpoints(self, source: str, target: str, *, name: str) -> int:
        return await self._write(_copy, source, target, name, lock=session_stream(target))
