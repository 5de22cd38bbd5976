"""LangGraph checkpoints on SQLite (protocol/graphstate.py; the rules in
:mod:`..graphpolicy`): each change one write transaction with its event on the session's
stream, the serializer's bytes stored as BLOBs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from protocol import Message, coerce_message
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
from . import sql
from .connection import Conn
from .database import SqliteDatabase
from .packing import stored_message
from .tx import SqliteTx

__all__ = ["SqliteGraphRows", "dumped", "restore"]

_encode = msgspec.json.Encoder().encode
_decode_meta = msgspec.json.Decoder(dict[str, Any]).decode

_COLS = "session_id, ns, checkpoint_id, parent_id, type, data, metadata"
_WRITE_COLS = "task_id, idx, channel, type, value, task_path"


def _ensure_session(tx: SqliteTx, session_id: str, name: str) -> None:
    # A thread's first put registers its session (logged as any creation is).
    if tx.conn.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone() is None:
        sql.create_session(
            tx, name=name, parent_session_id=None, model=None, source="langgraph", session_id=session_id
        )
    else:
        tx.touch(session_id)


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


def _writes(conn: Conn, session_id: str, ns: str, checkpoint_id: str) -> list[CheckpointWrite]:
    rows = conn.execute(
        f"SELECT {_WRITE_COLS} FROM graph_writes WHERE session_id = ? AND ns = ? AND checkpoint_id = ? "
        "ORDER BY task_id, idx",
        (session_id, ns, checkpoint_id),
    ).fetchall()
    return [
        CheckpointWrite(task_id=r[0], idx=r[1], channel=r[2], type=r[3], value=bytes(r[4]), task_path=r[5])
        for r in rows
    ]


def _project(
    tx: SqliteTx, session_id: str, messages: Sequence[Message | Mapping[str, Any]], partial: bool
) -> bool:
    """:func:`..graphpolicy.project`'s walk, in the put's transaction."""
    held: Message | None = None
    missing: list[Message] = []
    for raw in reversed(messages):
        m = coerce_message(raw)
        row = tx.conn.execute(
            f"SELECT content, role FROM messages WHERE sk = {sql.KEY} AND id = ?", (session_id, m.id)
        ).fetchone()
        stored = None if row is None else stored_message(row[0], m.id, row[1])
        if stored is None:
            missing.append(m)
            continue
        held = m
        if not same_message(stored, m):
            sql.update_message(tx, session_id, m)
        break
    if held is None and partial:
        raise tail_unknown(session_id)
    if missing:
        missing.reverse()
        sql.insert_messages(tx, session_id, missing, None if held is None else held.id)
    return bool(missing)


def _put(
    tx: SqliteTx,
    record: CheckpointRecord,
    name: str,
    messages: Sequence[Message | Mapping[str, Any]],
    partial: bool,
) -> bool:
    _ensure_session(tx, record.thread_id, name)
    run_id = record.metadata.get("run_id")
    tx.conn.execute(
        f"INSERT OR REPLACE INTO graph_checkpoints ({_COLS}, run_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (
            record.thread_id,
            record.ns,
            record.checkpoint_id,
            record.parent_id,
            record.type,
            record.data,
            _encode(record.metadata).decode(),
            run_id if isinstance(run_id, str) else None,
        ),
    )
    tx.emit_session(record.thread_id, CHECKPOINT_PUT, put_event(record))
    return _project(tx, record.thread_id, messages, partial) if messages else False


def _put_writes(
    tx: SqliteTx,
    session_id: str,
    ns: str,
    checkpoint_id: str,
    writes: Sequence[CheckpointWrite],
    replace: bool,
) -> None:
    tx.touch(session_id)
    verb = "INSERT OR REPLACE" if replace else "INSERT OR IGNORE"
    tx.conn.executemany(
        f"{verb} INTO graph_writes (session_id, ns, checkpoint_id, {_WRITE_COLS}) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            (session_id, ns, checkpoint_id, w.task_id, w.idx, w.channel, w.type, w.value, w.task_path)
            for w in writes
        ],
    )
    tx.emit_session(session_id, CHECKPOINT_WRITES, writes_event(ns, checkpoint_id, writes))


def _get(conn: Conn, session_id: str, ns: str, checkpoint_id: str | None) -> CheckpointRecord | None:
    if checkpoint_id is None:
        row = conn.execute(
            f"SELECT {_COLS} FROM graph_checkpoints WHERE session_id = ? AND ns = ? "
            "ORDER BY checkpoint_id DESC LIMIT 1",
            (session_id, ns),
        ).fetchone()
    else:
        row = conn.execute(
            f"SELECT {_COLS} FROM graph_checkpoints WHERE session_id = ? AND ns = ? AND checkpoint_id = ?",
            (session_id, ns, checkpoint_id),
        ).fetchone()
    return None if row is None else _record(row, _writes(conn, row[0], row[1], row[2]))


def _list(
    conn: Conn,
    session_id: str | None,
    ns: str | None,
    before: str | None,
    limit: int | None,
    wanted: Mapping[str, Any] | None,
) -> list[CheckpointRecord]:
    where, args = [], []
    for clause, value in (("session_id = ?", session_id), ("ns = ?", ns), ("checkpoint_id < ?", before)):
        if value is not None:
            where.append(clause)
            args.append(value)
    cond = f"WHERE {' AND '.join(where)}" if where else ""
    cap = MAX_LIST if limit is None else min(limit, MAX_LIST)
    out: list[CheckpointRecord] = []
    # The metadata filter runs here, before the limit, on the rows in order: the cursor
    # stops as soon as enough matched.
    for row in conn.execute(
        f"SELECT {_COLS} FROM graph_checkpoints {cond} ORDER BY checkpoint_id DESC", args
    ):
        if len(out) >= cap:
            break
        meta = _decode_meta(row[6])
        if metadata_matches(meta, wanted):
            out.append(_record(row, []))
    for r in out:
        r.writes = _writes(conn, r.thread_id, r.ns, r.checkpoint_id)
    return out


def _delete(tx: SqliteTx, session_id: str, keep_latest: bool) -> int:
    conn = tx.conn
    keep = (
        " AND (ns, checkpoint_id) NOT IN (SELECT ns, MAX(checkpoint_id) FROM graph_checkpoints "
        "WHERE session_id = ? GROUP BY ns)"
        if keep_latest
        else ""
    )
    args = (session_id, session_id) if keep_latest else (session_id,)
    conn.execute(f"DELETE FROM graph_writes WHERE session_id = ?{keep}", args)
    n = conn.execute(f"DELETE FROM graph_checkpoints WHERE session_id = ?{keep}", args).rowcount
    if n and conn.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone() is not None:
        tx.emit_session(session_id, CHECKPOINTS_DELETED, {"count": n, "kept_latest": keep_latest})
    return int(n)


def _delete_runs(tx: SqliteTx, run_ids: Sequence[str]) -> int:
    conn = tx.conn
    ids = _encode(list(run_ids)).decode()
    rows = conn.execute(
        "SELECT session_id, ns, checkpoint_id FROM graph_checkpoints "
        "WHERE run_id IN (SELECT value FROM json_each(?))",
        (ids,),
    ).fetchall()
    keys = [tuple(r) for r in rows]
    conn.executemany("DELETE FROM graph_writes WHERE session_id = ? AND ns = ? AND checkpoint_id = ?", keys)
    conn.executemany(
        "DELETE FROM graph_checkpoints WHERE session_id = ? AND ns = ? AND checkpoint_id = ?", keys
    )
    by_session: dict[str, int] = {}
    for sid, _, _ in keys:
        by_session[sid] = by_session.get(sid, 0) + 1
    for sid, n in by_session.items():
        if conn.execute("SELECT 1 FROM sessions WHERE id = ?", (sid,)).fetchone() is not None:
            tx.emit_session(sid, CHECKPOINTS_DELETED, {"count": n, "run_ids": list(run_ids)})
    return len(keys)


def _copy(tx: SqliteTx, source: str, target: str, name: str) -> int:
    conn = tx.conn
    if (
        conn.execute("SELECT 1 FROM graph_checkpoints WHERE session_id = ? LIMIT 1", (source,)).fetchone()
        is None
    ):
        return 0
    _ensure_session(tx, target, name)
    n = conn.execute(
        f"INSERT OR REPLACE INTO graph_checkpoints ({_COLS}, run_id) "
        "SELECT ?, ns, checkpoint_id, parent_id, type, data, metadata, run_id "
        "FROM graph_checkpoints WHERE session_id = ?",
        (target, source),
    ).rowcount
    conn.execute(
        f"INSERT OR REPLACE INTO graph_writes (session_id, ns, checkpoint_id, {_WRITE_COLS}) "
        f"SELECT ?, ns, checkpoint_id, {_WRITE_COLS} FROM graph_writes WHERE session_id = ?",
        (target, source),
    )
    tx.emit_session(target, CHECKPOINT_PUT, {"copied_from": source, "count": n})
    return int(n)


def dumped(conn: Conn, session_id: str) -> list[CheckpointRecord]:
    """Every checkpoint of the session with its writes, by namespace then id (a dump's)."""
    rows = conn.execute(
        f"SELECT {_COLS} FROM graph_checkpoints WHERE session_id = ? ORDER BY ns, checkpoint_id",
        (session_id,),
    ).fetchall()
    return [_record(r, _writes(conn, r[0], r[1], r[2])) for r in rows]


def restore(tx: SqliteTx, session_id: str, records: Sequence[CheckpointRecord]) -> None:
    """An import's checkpoints, in its transaction, over whatever the session held."""
    conn = tx.conn
    conn.execute("DELETE FROM graph_writes WHERE session_id = ?", (session_id,))
    conn.execute("DELETE FROM graph_checkpoints WHERE session_id = ?", (session_id,))
    for r in records:
        run_id = r.metadata.get("run_id")
        conn.execute(
            f"INSERT INTO graph_checkpoints ({_COLS}, run_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (session_id, r.ns, r.checkpoint_id, r.parent_id, r.type, r.data, _encode(r.metadata).decode(),
             run_id if isinstance(run_id, str) else None),
        )  # fmt: skip
        conn.executemany(
            f"INSERT OR REPLACE INTO graph_writes (session_id, ns, checkpoint_id, {_WRITE_COLS}) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(session_id, r.ns, r.checkpoint_id, w.task_id, w.idx, w.channel, w.type, w.value, w.task_path)
             for w in r.writes],
        )  # fmt: skip
    if records:
        tx.emit_session(session_id, CHECKPOINT_PUT, {"imported": len(records)})


class SqliteGraphRows(SqliteDatabase):
    """The checkpoint half of :class:`~.store.SqliteStore` (the contract is
    :class:`~..base.Store`'s)."""

    async def put_checkpoint(
        self,
        record: CheckpointRecord,
        *,
        name: str,
        messages: Sequence[Message | Mapping[str, Any]] = (),
        partial: bool = False,
    ) -> bool:
        return await self._write(
            _put, check_record(record), name, messages, partial, inline=len(messages) <= 64
        )

    async def put_checkpoint_writes(
        self,
        session_id: str,
        ns: str,
        checkpoint_id: str,
        writes: Sequence[CheckpointWrite],
        *,
        replace: bool,
    ) -> None:
        await self._write(_put_writes, session_id, ns, checkpoint_id, check_writes(writes), replace)

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
        return await self._write(_delete, session_id, keep_latest)

    async def delete_checkpoint_runs(self, run_ids: Sequence[str]) -> int:
        return await self._write(_delete_runs, list(run_ids)) if run_ids else 0

    async def copy_checkpoints(self, source: str, target: str, *, name: str) -> int:
        return await self._write(_copy, source, target, name, inline=False)
