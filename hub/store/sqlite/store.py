"""`SqliteStore`: the store class; its statements are in :mod:`.sql`, its connections and
transactions in :mod:`.database` (over :mod:`.connection`), the WAL checkpointer in
:mod:`.checkpoint`."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import BinaryIO, Literal

import msgspec

from protocol import (
    Compaction,
    Event,
    Message,
    SearchResult,
    SessionInfo,
)

from ..attachments import CHUNK, StoredFile, attach_files, check_sha256
from ..base import (
    LATEST,
    AppendResult,
    LogEntry,
    ParentArg,
    PruneResult,
    SessionDump,
    Store,
    StreamPosition,
    check_limit,
    check_usage,
    session_stream,
    usage_totals,
)
from ..fts import phrase_query, words_query
from ..overlays import apply_compactions, visible_compactions
from ..policy import (
    END_REASON,
    already_ended,
    check_compaction_args,
    check_end_reason,
    check_name,
    check_query,
    check_summary,
    continuation_message,
    new_compaction,
    not_one_path,
    split_name,
    summarized_deleted,
    usage_event,
)
from ..prune import check_prune
from ..rows import SESSION_COLS, session_info, ts
from . import filerows, maintenance, search, sql
from .connection import Conn
from .graphrows import SqliteGraphRows
from .packing import stored_message
from .tx import SqliteTx

__all__ = ["INLINE_BATCH", "SqliteStore"]

_encode = msgspec.json.Encoder().encode

#: Appends of more messages than this run in the writer's thread, not inline.
INLINE_BATCH = 16
#: At most this many events are read inline by :meth:`SqliteStore.read_events_nowait`: the
#: newest few after a commit, bounded so that a tail far behind reads in the reader's thread.
INLINE_EVENTS = 32


class SqliteStore(SqliteGraphRows, Store):
    """Everything in one SQLite file (or ``":memory:"``); its connections and transactions
    are :class:`~.database.SqliteDatabase`'s."""

    # -- messages ------------------------------------------------------------------------
    async def append_messages(
        self,
        session_id: str,
        messages: Sequence[Message],
        parent: ParentArg = LATEST,
        *,
        managed: bool = False,
    ) -> AppendResult:
        messages = await attach_files(self, messages)

        def fn(tx: SqliteTx) -> AppendResult:
            if managed:
                tx.touch(session_id)
            return sql.insert_messages(tx, session_id, messages, parent)

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
        prepared = await attach_files(self, [message])
        if not prepared:  # an overlay's id (clientwrites.py): nothing is written
            return False
        (message,) = prepared

        def fn(tx: SqliteTx) -> bool:
            if managed:
                tx.touch(session_id)
            updated = sql.update_message(tx, session_id, message, emit=emit)
            for entry in also:
                tx.emit_session(entry.session_id, entry.type, entry.data)
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
        prepared = await attach_files(self, [message])
        if not prepared:  # an overlay's id (clientwrites.py): nothing is written
            return False
        (message,) = prepared

        def fn(tx: SqliteTx) -> bool:
            if managed:
                tx.touch(session_id)
            if sql.update_message(tx, session_id, message):
                return False
            sql.insert_messages(tx, session_id, [message], parent)
            return True

        return await self._write(fn)

    async def delete_messages(
        self, session_id: str, ids: Sequence[str], *, managed: bool = False
    ) -> list[str]:
        return await self._write(
            sql.delete_messages, session_id, ids, managed, inline=len(ids) <= INLINE_BATCH
        )

    async def clear_messages(self, session_id: str, *, managed: bool = False) -> None:
        def fn(tx: SqliteTx) -> None:
            if managed:
                tx.touch(session_id)
            sql.clear(tx.conn, session_id)
            tx.emit_session(session_id, "messages.cleared", {})

        await self._write(fn, inline=False)

    async def get_message(self, session_id: str, message_id: str) -> Message | None:
        def fn(conn: Conn) -> Message | None:
            row = conn.execute(
                f"SELECT content, role FROM messages WHERE sk = {sql.KEY} AND id = ?",
                (session_id, message_id),
            ).fetchone()
            return None if row is None else stored_message(row[0], message_id, row[1])

        return await self._read(fn)

    async def get_history(self, session_id: str, leaf_id: str | None = None) -> list[Message]:
        def fn(conn: Conn) -> list[Message]:
            path = sql.path(conn, session_id, leaf_id)
            if not path:
                return path
            return apply_compactions(path, sql.compactions(conn, session_id))

        return await self._read(fn)

    async def get_path(self, session_id: str, leaf_id: str | None = None) -> list[Message]:
        return await self._read(sql.path, session_id, leaf_id)

    async def get_latest_leaf(self, session_id: str) -> Message | None:
        def fn(conn: Conn) -> Message | None:
            row = conn.execute(
                f"SELECT content, id, role FROM messages WHERE sk = {sql.KEY} ORDER BY pk DESC LIMIT 1",
                (session_id,),
            ).fetchone()
            return None if row is None else stored_message(*row)

        return await self._read(fn)

    async def get_path_length(self, session_id: str, leaf_id: str | None = None) -> int:
        return await self._read(sql.path_length, session_id, leaf_id)

    async def get_branches(self, session_id: str, message_id: str) -> list[Message]:
        def fn(conn: Conn) -> list[Message]:
            pk = sql.pk_of(conn, session_id, message_id)
            if pk is None:
                return []
            rows = conn.execute(
                "SELECT content, id, role FROM messages WHERE parent_pk = ? ORDER BY pk", (pk,)
            ).fetchall()
            return [m for r in rows if (m := stored_message(*r)) is not None]

        return await self._read(fn)

    async def search_messages(
        self,
        query: str,
        *,
        session_id: str | None,
        limit: int = 20,
        match: Literal["phrase", "words"] = "phrase",
    ) -> list[SearchResult]:
        check_query(query)
        expr = phrase_query(query) if match == "phrase" else words_query(query)
        if expr is None or check_limit(limit) <= 0:
            return []

        if session_id is not None:
            found = self._read_inline(
                search.search_session_inline, expr, session_id, limit, search.INLINE_SEARCH_ROWS
            )
            if found is not None:
                return found
        return await self._read(search.search_messages, expr, session_id, limit)

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
        check_compaction_args(summary, from_id, to_id)

        def fn(tx: SqliteTx) -> Compaction:
            if managed:
                tx.touch(session_id)
            if verify_path and not sql.is_ancestor(tx.conn, session_id, from_id, to_id):
                raise not_one_path(from_id, to_id)
            if covered:
                wanted = set(covered)
                found = tx.conn.execute(
                    f"SELECT COUNT(*) FROM messages WHERE sk = {sql.KEY} "
                    "AND id IN (SELECT value FROM json_each(?))",
                    (session_id, _encode(sorted(wanted)).decode()),
                ).fetchone()[0]
                if found != len(wanted):
                    raise summarized_deleted(from_id, to_id, len(wanted) - found)
            c = new_compaction(summary, from_id, to_id, ts(tx.now))
            sql.insert_compaction(tx, session_id, c)
            return c

        return await self._write(fn, inline=not verify_path)

    async def get_compactions(self, session_id: str) -> list[Compaction]:
        return await self._read(sql.compactions, session_id)

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
        check_name(name)

        def fn(tx: SqliteTx) -> SessionInfo:
            return sql.create_session(
                tx,
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
        check_name(name)

        def fn(tx: SqliteTx) -> SessionInfo:
            tx.conn.execute(
                "UPDATE sessions SET name = ?, updated_at = ? WHERE id = ?", (name, tx.now, session_id)
            )
            info = tx.session_row(session_id)
            tx.registry_change(info, "session.renamed")
            return info

        return await self._write(fn)

    async def end_session(self, session_id: str, reason: str = END_REASON) -> SessionInfo:
        check_end_reason(reason)

        def fn(tx: SqliteTx) -> SessionInfo:
            # Checked and written inside BEGIN IMMEDIATE: two enders cannot both succeed.
            before = tx.session_row(session_id)
            if before.end_reason is not None:
                raise already_ended(before)
            tx.conn.execute(
                "UPDATE sessions SET end_reason = ?, updated_at = ? WHERE id = ?",
                (reason, tx.now, session_id),
            )
            info = tx.session_row(session_id)
            tx.registry_change(info, "session.ended")
            return info

        return await self._write(fn)

    async def delete_session(self, session_id: str, *, context_keys: Sequence[str] = ()) -> None:
        await self._write(sql.delete_session, session_id, context_keys, inline=False)

    async def add_usage(
        self, session_id: str, input_tokens: int, output_tokens: int, cost: float
    ) -> SessionInfo:
        delta = check_usage(input_tokens, output_tokens, cost)

        def fn(tx: SqliteTx) -> SessionInfo:
            # Read, check, write inside BEGIN IMMEDIATE: no other writer runs in between.
            before = tx.session_row(session_id)
            totals = usage_totals((before.input_tokens, before.output_tokens, before.estimated_cost), delta)
            tx.conn.execute(
                "UPDATE sessions SET input_tokens = ?, output_tokens = ?, estimated_cost = ?, "
                "updated_at = ? WHERE id = ?",
                (*totals, tx.now, session_id),
            )
            info = tx.session_row(session_id)
            tx.registry_change(info, "session.usage", delta=usage_event(delta))
            return info

        return await self._write(fn)

    async def fork_session(self, session_id: str, at_message_id: str, name: str) -> SessionInfo:
        check_name(name)

        def fn(tx: SqliteTx) -> SessionInfo:
            tx.session_row(session_id)
            path = sql.path(tx.conn, session_id, at_message_id) if at_message_id else []
            overlays = visible_compactions([m.id for m in path], sql.compactions(tx.conn, session_id))
            info = sql.create_session(
                tx,
                name=name,
                parent_session_id=session_id,
                model=None,
                source=None,
                session_id=None,
                event="session.forked",
                event_extra={"from_session_id": session_id, "at_message_id": at_message_id},
            )
            sql.insert_messages(tx, info.id, path, None)
            for c in overlays:
                sql.insert_compaction(tx, info.id, c)
            return info

        return await self._write(fn, inline=False)

    async def split_session(self, session_id: str, summary: str, name: str | None = None) -> SessionInfo:
        check_summary(summary)

        def fn(tx: SqliteTx) -> SessionInfo:
            # Checked inside BEGIN IMMEDIATE, as end_session does: a split must not replace
            # the reason of a session that has ended already (nor split it twice).
            old = tx.session_row(session_id)
            if old.end_reason is not None:
                raise already_ended(old)
            tx.conn.execute(
                "UPDATE sessions SET end_reason = 'compaction', updated_at = ? WHERE id = ?",
                (tx.now, session_id),
            )
            tx.registry_change(tx.session_row(session_id), "session.ended")
            info = sql.create_session(
                tx,
                name=split_name(old, name),
                parent_session_id=session_id,
                model=old.model,
                source=old.source,
                session_id=None,
            )
            sql.insert_messages(tx, info.id, [continuation_message(summary)], None)
            return info

        return await self._write(fn, inline=False)

    # -- context blocks and search entries ------------------------------------------------
    async def get_context_value(self, key: str) -> str | None:
        def fn(conn: Conn) -> str | None:
            row = conn.execute("SELECT content FROM context_blocks WHERE key = ?", (key,)).fetchone()
            return None if row is None else str(row[0])

        return await self._read(fn)

    async def set_context_value(self, key: str, content: str, *, event: LogEntry | None = None) -> None:
        def fn(tx: SqliteTx) -> None:
            tx.conn.execute(
                "INSERT INTO context_blocks (key, content, updated_at) VALUES (?, ?, ?) "
                "ON CONFLICT (key) DO UPDATE SET content = excluded.content, "
                "updated_at = excluded.updated_at",
                (key, content, tx.now),
            )
            if event is not None:
                tx.emit_session(event.session_id, event.type, event.data)

        await self._write(fn)

    async def count_search_entries(self, label: str) -> int:
        def fn(conn: Conn) -> int:
            row = conn.execute("SELECT COUNT(*) FROM search_entries WHERE label = ?", (label,)).fetchone()
            return int(row[0])

        return await self._read(fn)

    async def set_search_entry(
        self, label: str, key: str, content: str, *, event: LogEntry | None = None
    ) -> None:
        await self._write(sql.set_search_entry, label, key, content, event)

    async def search_entries(self, label: str, query: str, limit: int = 10) -> list[tuple[str, str]]:
        expr = words_query(query) if isinstance(query, str) else None
        if expr is None or check_limit(limit) <= 0:
            return []

        return await self._read(sql.search_entries, label, expr, limit)

    async def log_event(self, entry: LogEntry) -> int:
        def fn(tx: SqliteTx) -> int:
            return tx.emit_session(entry.session_id, entry.type, entry.data)

        return await self._write(fn)

    # -- event logs ----------------------------------------------------------------------
    async def read_events(
        self, stream: str, after_seq: int = 0, limit: int = 1000, *, epoch: str | None = None
    ) -> list[Event]:
        check_limit(after_seq, "after_seq")
        check_limit(limit)

        return await self._read(sql.read_events, stream, after_seq, limit, epoch)

    def read_events_nowait(self, stream: str, after_seq: int, limit: int) -> list[Event] | None:
        # The tail's read right after a commit: a few small rows, cheaper here than the two
        # cross-thread wake-ups of the reader's thread (docs/benchmarks.md, issue 18).
        check_limit(after_seq, "after_seq")
        check_limit(limit)
        return self._read_inline(sql.read_events, stream, after_seq, min(limit, INLINE_EVENTS), None)

    async def stream_position(self, stream: str) -> StreamPosition:
        return await self._read(sql.position, stream)

    def stream_position_nowait(self, stream: str) -> StreamPosition | None:
        # One row by primary key: on the event loop, not two cross-thread wake-ups away.
        return self._read_inline(sql.position, stream)

    # -- retention, export and import (.maintenance) -------------------------------------
    async def prune_events(
        self,
        *,
        older_than: datetime | None = None,
        keep_per_session: int | None = None,
        batch: int = 1000,
    ) -> PruneResult:
        args = check_prune(older_than, keep_per_session, batch)
        result = PruneResult()
        for stream in await self._read(maintenance.prune_candidates, args):
            moved = False
            while True:
                # Each batch is its own transaction in the writer's thread: other writers
                # wait for one batch at most, and the event loop not at all.
                n = await self._write(maintenance.prune_batch, stream, args, inline=False)
                result.events += n
                moved = moved or n > 0
                if n < args.batch:
                    break
            result.streams += moved
        return result

    async def count_events(self) -> int:
        return await self._read(maintenance.count_events)

    async def dump_session(self, session_id: str) -> SessionDump:
        return await self._read(maintenance.dump_session, session_id)

    async def import_sessions(
        self, dumps: Sequence[SessionDump], *, replace: bool = False
    ) -> list[SessionInfo]:
        return await self._write(maintenance.import_sessions, dumps, replace, inline=False)

    # -- files -----------------------------------------------------------------------------
    async def put_file(
        self,
        sha256: str,
        media_type: str,
        data: bytes | BinaryIO,
        *,
        subject: str | None = None,
        quota: int | None = None,
    ) -> StoredFile:
        check_sha256(sha256)
        small = isinstance(data, bytes) and len(data) <= CHUNK
        # One writer at a time: the quota's check and the upload it admits are one step.
        return await self._write(filerows.put_file, sha256, media_type, data, subject, quota, inline=small)

    async def file_info(self, sha256: str) -> StoredFile | None:
        return await self._read(filerows.file_info, sha256)

    async def read_file_chunk(self, sha256: str, n: int) -> bytes | None:
        return await self._read(filerows.read_chunk, sha256, n)

    async def file_sessions(self, sha256: str) -> list[str]:
        return await self._read(filerows.file_sessions, sha256)

    async def file_uploaded_by(self, sha256: str, subject: str) -> bool:
        return await self._read(filerows.uploaded_by, sha256, subject)

    async def uploaded_bytes(self, subject: str) -> int:
        return await self._read(filerows.uploaded_bytes, subject)

    async def session_files(self, session_id: str) -> list[str]:
        return await self._read(filerows.session_files, session_stream(session_id))

    async def collect_files(self, older_than: datetime) -> list[str]:
        return await self._write(filerows.collect, older_than.timestamp(), inline=False)

    # -- settings ------------------------------------------------------------------------
    async def claim_setting(self, key: str, value: str, *, replace: bool = False) -> str:
        """Record ``value`` under ``key`` unless another value is recorded (or ``replace``);
        returns the value recorded afterwards. One statement: two nodes starting at once
        agree on which one recorded first."""

        def fn(tx: SqliteTx) -> str:
            row = tx.conn.execute(
                "INSERT INTO settings (key, value, updated_at) VALUES (?, ?, ?) "
                "ON CONFLICT (key) DO UPDATE SET "
                "value = CASE WHEN ? THEN excluded.value ELSE value END, "
                "updated_at = CASE WHEN ? THEN excluded.updated_at ELSE updated_at END "
                "RETURNING value",
                (key, value, tx.now, replace, replace),
            ).fetchone()
            return str(row[0])

        return await self._write(fn)
