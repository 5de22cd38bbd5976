"""`SqliteStore`: the store class; its statements are in :mod:`.sql`, its plumbing in
:mod:`.connection`, the WAL checkpointer in :mod:`.checkpoint`."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

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
    StoreClosed,
    StoreError,
)

from ...bus import Bus, MemoryBus
from ...fts import phrase_query, words_query
from ...overlays import apply_compactions, visible_compactions
from ..base import (
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
from ..rows import SESSION_COLS, decode_message, session_info, ts
from . import sql
from .checkpoint import CHECKPOINT_EVERY, WAL_LIMIT_BYTES, Checkpointer
from .connection import Conn, Connection, configure, is_busy, patient, read_tx, write_tx
from .schema import migrate
from .sql import SEARCH_WINDOW, SMALL_SESSION, Notes

__all__ = ["INLINE_BATCH", "SqliteStore"]

log = logging.getLogger("sessionhub.store")

T = TypeVar("T")

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode

#: Appends of more messages than this run in the writer's thread, not inline.
INLINE_BATCH = 16


class SqliteStore(Store):
    """Everything in one SQLite file (or ``":memory:"``)."""

    def __init__(
        self,
        path: str,
        writer: Connection,
        reader: Connection,
        bus: Bus,
        synchronous: str = "NORMAL",
        wal_limit: int = WAL_LIMIT_BYTES,
    ) -> None:
        self.path = path
        self.bus = bus
        self._writer = writer
        self._reader = reader
        self._closed = False
        self._write_lock = asyncio.Lock()
        self._commits = 0
        self._checkpointer: Checkpointer | None = None
        self._catching_up = False
        self._wal_limit = wal_limit
        if path != ":memory:":
            self._checkpointer = Checkpointer(path, synchronous)

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
        wal_limit = _wal_limit()
        writer = await aiosqlite.connect(path, isolation_level=None, check_same_thread=False)
        try:
            w = Connection(writer)
            if not memory:
                await w.call(lambda c: c.execute("PRAGMA journal_mode = WAL").fetchone())
            await w.call(lambda c: configure(c, synchronous=synchronous, reader=False, wal_limit=wal_limit))
            await w.call(migrate)
            if memory:
                r = w
            else:
                reader = await aiosqlite.connect(path, isolation_level=None, check_same_thread=False)
                r = Connection(reader)
                await r.call(lambda c: configure(c, synchronous=synchronous, reader=True))
        except BaseException:
            await writer.close()
            raise
        return cls(path, w, r, bus or MemoryBus(), synchronous, wal_limit)

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
                        result = write_tx(body)(self._writer.raw)
                    except sqlite3.OperationalError as exc:
                        if not is_busy(exc):
                            raise
                        result = await self._writer.call(patient(write_tx(body)))
                else:
                    result = await self._writer.call(patient(write_tx(body)))
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
            if not self._catching_up and checkpointer.wal_file_size() > self._wal_limit:
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
            return await self._reader.call(read_tx(fn), *args)
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
                sql.touch(conn, session_id, now)
            return sql.insert_messages(conn, notes, session_id, messages, parent, now)

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
                sql.touch(conn, session_id, now)
            updated = sql.update_message(conn, notes, session_id, message, now, emit=emit)
            for entry in also:
                sql.emit_session(conn, notes, entry.session_id, entry.type, entry.data, now)
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
                sql.touch(conn, session_id, now)
            if sql.update_message(conn, notes, session_id, message, now):
                return False
            sql.insert_messages(conn, notes, session_id, [message], parent, now)
            return True

        return await self._write(fn)

    async def delete_messages(
        self, session_id: str, ids: Sequence[str], *, managed: bool = False
    ) -> list[str]:
        def fn(conn: Conn, notes: Notes, now: float) -> list[str]:
            if managed:
                sql.touch(conn, session_id, now)
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
                sql.count_messages(conn, session_id, -len(deleted))
                sql.emit_session(
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
                sql.touch(conn, session_id, now)
            sql.clear(conn, session_id)
            sql.emit_session(conn, notes, session_id, "messages.cleared", {}, now)

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
                "SELECT content FROM messages WHERE session_id = ? ORDER BY pk DESC LIMIT 1",
                (session_id,),
            ).fetchone()
            return None if row is None else decode_message(row[0])

        return await self._read(fn)

    async def get_path_length(self, session_id: str, leaf_id: str | None = None) -> int:
        def fn(conn: Conn) -> int:
            leaf = sql.resolve_leaf(conn, session_id, leaf_id)
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
            pk = sql.pk_of(conn, session_id, message_id)
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
                    both = f"sid : {sql.sid_token(session_id)} AND {body}"
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
                sql.touch(conn, session_id, now)
            if verify_path and not sql.is_ancestor(conn, session_id, from_id, to_id):
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
            sql.insert_compaction(conn, notes, session_id, c, now)
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
        if not isinstance(name, str):
            raise InvalidInput("session name must be a string")

        def fn(conn: Conn, notes: Notes, now: float) -> SessionInfo:
            return sql.create_session(
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
            info = sql.session_row(conn, session_id)
            sql.registry_change(conn, notes, info, "session.renamed", now)
            return info

        return await self._write(fn)

    async def delete_session(self, session_id: str, *, context_keys: Sequence[str] = ()) -> None:
        def fn(conn: Conn, notes: Notes, now: float) -> None:
            info = sql.session_row(conn, session_id)
            sql.clear(conn, session_id)
            conn.executemany("DELETE FROM context_blocks WHERE key = ?", [(k,) for k in context_keys])
            conn.execute("DELETE FROM sessions WHERE id = ?", (session_id,))
            stream = session_stream(session_id)
            # The log goes with the session (it holds message bodies); only the final
            # event stays, and the stream now starts there.
            seq = sql.emit_session(
                conn,
                notes,
                session_id,
                "session.deleted",
                {"session": msgspec.to_builtins(info)},
                now,
            )
            conn.execute("DELETE FROM events WHERE stream = ? AND seq < ?", (stream, seq))
            conn.execute("UPDATE streams SET first_seq = ? WHERE stream = ?", (seq, stream))
            sql.emit(
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
            before = sql.session_row(conn, session_id)
            totals = usage_totals((before.input_tokens, before.output_tokens, before.estimated_cost), delta)
            conn.execute(
                "UPDATE sessions SET input_tokens = ?, output_tokens = ?, estimated_cost = ?, "
                "updated_at = ? WHERE id = ?",
                (*totals, now, session_id),
            )
            info = sql.session_row(conn, session_id)
            data = {"input_tokens": delta[0], "output_tokens": delta[1], "cost": delta[2]}
            sql.registry_change(conn, notes, info, "session.usage", now, delta=data)
            return info

        return await self._write(fn)

    async def fork_session(self, session_id: str, at_message_id: str, name: str) -> SessionInfo:
        if not isinstance(name, str):
            raise InvalidInput("session name must be a string")

        def fn(conn: Conn, notes: Notes, now: float) -> SessionInfo:
            sql.session_row(conn, session_id)
            path = sql.path(conn, session_id, at_message_id) if at_message_id else []
            overlays = visible_compactions([m.id for m in path], sql.compactions(conn, session_id))
            info = sql.create_session(
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
            sql.insert_messages(conn, notes, info.id, path, None, now)
            for c in overlays:
                sql.insert_compaction(conn, notes, info.id, c, now)
            return info

        return await self._write(fn, inline=False)

    async def split_session(self, session_id: str, summary: str, name: str | None = None) -> SessionInfo:
        if not isinstance(summary, str):
            raise InvalidInput("summary must be a string")

        def fn(conn: Conn, notes: Notes, now: float) -> SessionInfo:
            old = sql.session_row(conn, session_id)
            conn.execute(
                "UPDATE sessions SET end_reason = 'compaction', updated_at = ? WHERE id = ?",
                (now, session_id),
            )
            sql.registry_change(conn, notes, sql.session_row(conn, session_id), "session.ended", now)
            info = sql.create_session(
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
            sql.insert_messages(conn, notes, info.id, [message], None, now)
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
                sql.emit_session(conn, notes, event.session_id, event.type, event.data, now)

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
                (pk, sql.sid_token(label), content),
            )
            if event is not None:
                sql.emit_session(conn, notes, event.session_id, event.type, event.data, now)

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
                    (f"lbl : {sql.sid_token(label)} AND body : ({expr})", label, limit),
                ).fetchall()
            except sqlite3.OperationalError as exc:
                log.debug("fts query %r matched nothing: %s", expr, exc)
                return []
            return [(str(k), str(c)) for k, c in rows]

        return await self._read(fn)

    async def log_event(self, entry: LogEntry) -> int:
        def fn(conn: Conn, notes: Notes, now: float) -> int:
            return sql.emit_session(conn, notes, entry.session_id, entry.type, entry.data, now)

        return await self._write(fn)

    # -- event logs ----------------------------------------------------------------------
    async def read_events(
        self, stream: str, after_seq: int = 0, limit: int = 1000, *, epoch: str | None = None
    ) -> list[Event]:
        check_limit(after_seq, "after_seq")
        check_limit(limit)

        def fn(conn: Conn) -> list[Event]:
            pos = sql.position(conn, stream)
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
        return await self._read(sql.position, stream)

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


def _wal_limit() -> int:
    # The knob is the package's attribute, read at each open: setting
    # ``hub.store.sqlite.WAL_LIMIT_BYTES`` applies to the stores opened afterwards.
    from .. import sqlite

    return sqlite.WAL_LIMIT_BYTES
