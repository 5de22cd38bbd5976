"""`PostgresStore`: the store class; its statements are in :mod:`.sql`, its transaction in
:mod:`.tx`, its schema in :mod:`.schema`, its connections and retries in :mod:`.pool`."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, BinaryIO, Literal

from protocol import (
    Compaction,
    Event,
    Message,
    SearchResult,
    SessionInfo,
    SessionNotFound,
)

from ..attachments import StoredFile, attach_files, check_sha256
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
)
from ..fts import fts_text, fts_words
from ..overlays import visible_compactions
from ..policy import (
    END_REASON,
    already_ended,
    check_compaction_args,
    check_end_reason,
    check_name,
    check_query,
    check_summary,
)
from ..prune import check_prune
from ..rows import SESSION_COLS, decode_message, session_info
from . import filerows, maintenance, search, sql
from .graphrows import PostgresGraphRows
from .keys import SESSION_KEY
from .tx import PostgresTx

if TYPE_CHECKING:
    from .tx import Conn

__all__ = ["PostgresStore"]

#: The advisory lock one subject's uploads take when its quota is judged (session streams
#: are ``s:...``, so the names never meet).
_UPLOADS = "uploads:"


class PostgresStore(PostgresGraphRows, Store):
    """Everything in one Postgres database (the schema on the role's ``search_path``); its
    connections and transactions are :class:`~.pool.PostgresPool`'s."""

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

        async def fn(tx: PostgresTx) -> AppendResult:
            if len(messages) == 1:
                return await sql.append_one(
                    tx, session_id, messages[0], parent, managed=managed, notify=self.notify
                )
            if managed:
                await tx.touch(session_id)
            return await sql.insert_messages(tx, session_id, messages, parent)

        return await self._write(fn, lock=session_stream(session_id))

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

        async def fn(tx: PostgresTx) -> bool:
            if managed:
                await tx.touch(session_id)
            updated = await sql.update_message(tx, session_id, message, emit=emit)
            for entry in also:
                await tx.emit_session(entry.session_id, entry.type, entry.data)
            return updated

        return await self._write(fn, lock=session_stream(session_id))

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

        async def fn(tx: PostgresTx) -> bool:
            if managed:
                await tx.touch(session_id)
            if await sql.update_message(tx, session_id, message):
                return False
            await sql.insert_messages(tx, session_id, [message], parent)
            return True

        return await self._write(fn, lock=session_stream(session_id))

    async def delete_messages(
        self, session_id: str, ids: Sequence[str], *, managed: bool = False
    ) -> list[str]:
        return await self._write(
            sql.delete_messages, session_id, ids, managed, lock=session_stream(session_id)
        )

    async def clear_messages(self, session_id: str, *, managed: bool = False) -> None:
        async def fn(tx: PostgresTx) -> None:
            if managed:
                await tx.touch(session_id)
            await tx.conn.execute(sql.CLEAR, session_id, session_stream(session_id))
            await tx.emit_session(session_id, "messages.cleared", {})

        await self._write(fn, lock=session_stream(session_id))

    async def get_message(self, session_id: str, message_id: str) -> Message | None:
        async def fn(conn: Conn) -> Message | None:
            content = await conn.fetchval(
                f"SELECT content FROM messages WHERE session_key = {SESSION_KEY} AND id = $2",
                session_id,
                message_id,
            )
            return None if content is None else decode_message(content)

        return await self._read(fn)

    async def get_history(self, session_id: str, leaf_id: str | None = None) -> list[Message]:
        return await self._read(sql.history, session_id, leaf_id)

    async def get_path(self, session_id: str, leaf_id: str | None = None) -> list[Message]:
        return await self._read(lambda conn: sql.path(conn, session_id, leaf_id))

    async def get_latest_leaf(self, session_id: str) -> Message | None:
        async def fn(conn: Conn) -> Message | None:
            content = await conn.fetchval(
                f"SELECT content FROM messages WHERE session_key = {SESSION_KEY} ORDER BY pk DESC LIMIT 1",
                session_id,
            )
            return None if content is None else decode_message(content)

        return await self._read(fn)

    async def get_path_length(self, session_id: str, leaf_id: str | None = None) -> int:
        async def fn(conn: Conn) -> int:
            if leaf_id is None or leaf_id == "":
                n = await conn.fetchval(sql.LENGTH_LATEST, session_id)
            else:
                n = await conn.fetchval(sql.LENGTH_ID, session_id, leaf_id)
            return int(n)

        return await self._read(fn)

    async def get_branches(self, session_id: str, message_id: str) -> list[Message]:
        async def fn(conn: Conn) -> list[Message]:
            rows = await conn.fetch(
                "SELECT content FROM messages WHERE parent_pk = "
                f"(SELECT pk FROM messages WHERE session_key = {SESSION_KEY} AND id = $2) ORDER BY pk",
                session_id,
                message_id,
            )
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
        check_query(query)
        arg: str | list[str] = fts_text(query) if match == "phrase" else fts_words(query)
        if not arg or check_limit(limit) <= 0:
            return []

        return await self._read(search.search_messages, arg, match, session_id, limit)

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

        return await self._write(
            sql.add_compaction,
            session_id,
            summary,
            from_id,
            to_id,
            managed,
            verify_path,
            covered,
            lock=session_stream(session_id),
        )

    async def get_compactions(self, session_id: str) -> list[Compaction]:
        return await self._read(lambda conn: sql.compactions(conn, session_id))

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

        async def fn(tx: PostgresTx) -> SessionInfo:
            return await sql.create_session(
                tx,
                name=name,
                parent_session_id=parent_session_id,
                model=model,
                source=source,
                session_id=session_id,
            )

        return await self._write(fn)

    async def get_session(self, session_id: str) -> SessionInfo | None:
        async def fn(conn: Conn) -> SessionInfo | None:
            row = await conn.fetchrow(f"SELECT {SESSION_COLS} FROM sessions WHERE id = $1", session_id)
            return None if row is None else session_info(row)

        return await self._read(fn)

    async def list_sessions(self) -> list[SessionInfo]:
        async def fn(conn: Conn) -> list[SessionInfo]:
            rows = await conn.fetch(f"SELECT {SESSION_COLS} FROM sessions ORDER BY updated_at DESC, pk DESC")
            return [session_info(r) for r in rows]

        return await self._read(fn)

    async def rename_session(self, session_id: str, name: str) -> SessionInfo:
        check_name(name)

        async def fn(tx: PostgresTx) -> SessionInfo:
            row = await tx.conn.fetchrow(
                f"UPDATE sessions SET name = $2, updated_at = $3 WHERE id = $1 RETURNING {SESSION_COLS}",
                session_id,
                name,
                tx.when,
            )
            if row is None:
                raise SessionNotFound(session_id)
            info = session_info(row)
            await tx.registry_change(info, "session.renamed")
            return info

        return await self._write(fn)

    async def end_session(self, session_id: str, reason: str = END_REASON) -> SessionInfo:
        check_end_reason(reason)

        async def fn(tx: PostgresTx) -> SessionInfo:
            # One conditional UPDATE: of two concurrent enders, only one finds it open.
            row = await tx.conn.fetchrow(
                "UPDATE sessions SET end_reason = $2, updated_at = $3 "
                f"WHERE id = $1 AND end_reason IS NULL RETURNING {SESSION_COLS}",
                session_id,
                reason,
                tx.when,
            )
            if row is None:
                raise already_ended(await tx.session_row(session_id))  # or SessionNotFound
            info = session_info(row)
            await tx.registry_change(info, "session.ended")
            return info

        return await self._write(fn)

    async def delete_session(self, session_id: str, *, context_keys: Sequence[str] = ()) -> None:
        stream = session_stream(session_id)

        await self._write(sql.delete_session, session_id, stream, context_keys, lock=stream)

    async def add_usage(
        self, session_id: str, input_tokens: int, output_tokens: int, cost: float
    ) -> SessionInfo:
        delta = check_usage(input_tokens, output_tokens, cost)

        return await self._write(sql.add_usage, session_id, delta)

    async def fork_session(self, session_id: str, at_message_id: str, name: str) -> SessionInfo:
        check_name(name)

        async def fn(tx: PostgresTx) -> SessionInfo:
            conn = tx.conn
            await tx.session_row(session_id)
            path = await sql.path(conn, session_id, at_message_id) if at_message_id else []
            overlays = visible_compactions([m.id for m in path], await sql.compactions(conn, session_id))
            info = await sql.create_session(
                tx,
                name=name,
                parent_session_id=session_id,
                model=None,
                source=None,
                session_id=None,
                event="session.forked",
                event_extra={"from_session_id": session_id, "at_message_id": at_message_id},
            )
            await sql.insert_messages(tx, info.id, path, None)
            for c in overlays:
                await sql.insert_compaction(tx, info.id, c)
            return info

        return await self._write(fn, lock=session_stream(session_id))

    async def split_session(self, session_id: str, summary: str, name: str | None = None) -> SessionInfo:
        check_summary(summary)

        return await self._write(
            sql.split_session, session_id, summary, name, lock=session_stream(session_id)
        )

    # -- context blocks and search entries ------------------------------------------------
    async def get_context_value(self, key: str) -> str | None:
        async def fn(conn: Conn) -> str | None:
            content = await conn.fetchval("SELECT content FROM context_blocks WHERE key = $1", key)
            return None if content is None else str(content)

        return await self._read(fn)

    async def set_context_value(self, key: str, content: str, *, event: LogEntry | None = None) -> None:
        async def fn(tx: PostgresTx) -> None:
            await tx.conn.execute(
                "INSERT INTO context_blocks (key, content, updated_at) VALUES ($1, $2, $3) "
                "ON CONFLICT (key) DO UPDATE SET content = excluded.content, "
                "updated_at = excluded.updated_at",
                key,
                content,
                tx.when,
            )
            if event is not None:
                await tx.emit_session(event.session_id, event.type, event.data)

        await self._write(fn)

    async def count_search_entries(self, label: str) -> int:
        async def fn(conn: Conn) -> int:
            return int(await conn.fetchval("SELECT count(*) FROM search_entries WHERE label = $1", label))

        return await self._read(fn)

    async def set_search_entry(
        self, label: str, key: str, content: str, *, event: LogEntry | None = None
    ) -> None:
        async def fn(tx: PostgresTx) -> None:
            await tx.conn.execute(
                "INSERT INTO search_entries (label, key, content, tsv, created_at, updated_at) "
                "VALUES ($1, $2, $3, to_tsvector('sessionhub', $5::text), $4, $4) "
                "ON CONFLICT (label, key) DO UPDATE SET "
                "content = excluded.content, tsv = excluded.tsv, updated_at = excluded.updated_at",
                label,
                key,
                content,
                tx.when,
                fts_text(content),
            )
            if event is not None:
                await tx.emit_session(event.session_id, event.type, event.data)

        await self._write(fn)

    async def search_entries(self, label: str, query: str, limit: int = 10) -> list[tuple[str, str]]:
        words = fts_words(query) if isinstance(query, str) else []
        if not words or check_limit(limit) <= 0:
            return []

        return await self._read(search.search_entries, words, label, limit)

    async def log_event(self, entry: LogEntry) -> int:
        async def fn(tx: PostgresTx) -> int:
            return await tx.emit_session(entry.session_id, entry.type, entry.data)

        return await self._write(fn)

    # -- event logs ----------------------------------------------------------------------
    async def read_events(
        self, stream: str, after_seq: int = 0, limit: int = 1000, *, epoch: str | None = None
    ) -> list[Event]:
        check_limit(after_seq, "after_seq")
        check_limit(limit)

        return await self._read(sql.read_events, stream, after_seq, limit, epoch)

    async def stream_position(self, stream: str) -> StreamPosition:
        async def fn(conn: Conn) -> StreamPosition:
            row = await conn.fetchrow(
                "SELECT epoch, first_seq, last_seq FROM streams WHERE stream = $1", stream
            )
            if row is None:
                return StreamPosition(stream=stream, epoch="", first_seq=1, last_seq=0)
            return StreamPosition(stream=stream, epoch=row[0], first_seq=row[1], last_seq=row[2])

        return await self._read(fn)

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
                # Each batch is its own transaction: a writer of the stream waits for one
                # batch at most.
                n = await self._write(maintenance.prune_batch, stream, args)
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
        # No lock in BEGIN: import_sessions takes those of the sessions it replaces.
        return await self._write(maintenance.import_sessions, dumps, replace)

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
        # A quota is judged under the subject's advisory lock: two uploads of one subject at
        # once take turns, so they cannot both pass a check that only one fits.
        lock = None if subject is None or quota is None else _UPLOADS + subject
        return await self._write(filerows.put_file, sha256, media_type, data, subject, quota, lock=lock)

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
        return await self._write(filerows.collect, older_than)

    # -- settings ------------------------------------------------------------------------
    async def claim_setting(self, key: str, value: str, *, replace: bool = False) -> str:
        """Record ``value`` under ``key`` unless another value is recorded (or ``replace``);
        returns the value recorded afterwards. One statement: two nodes starting at once
        agree on which one recorded first."""

        async def fn(conn: Conn) -> str:
            return str(
                await conn.fetchval(
                    "INSERT INTO settings (key, value) VALUES ($1, $2) "
                    "ON CONFLICT (key) DO UPDATE SET "
                    "value = CASE WHEN $3 THEN excluded.value ELSE settings.value END, "
                    "updated_at = CASE WHEN $3 THEN now() ELSE settings.updated_at END "
                    "RETURNING value",
                    key,
                    value,
                    replace,
                )
            )

        return await self._read(fn)
