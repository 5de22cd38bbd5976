"""The write transaction: its connection, its clock, the events it wrote."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import asyncpg
import msgspec

from protocol import SessionInfo, SessionNotFound

from ..base import WriteTx
from ..policy import registry_events, session_stream
from ..rows import SESSION_COLS, new_epoch, session_info, ts
from .keys import SESSION_PREFIX, bump_stream

if TYPE_CHECKING:
    from asyncpg.pool import PoolConnectionProxy

    Conn = PoolConnectionProxy[asyncpg.Record]

__all__ = ["Conn", "PostgresTx", "session_row"]

_encode = msgspec.json.Encoder().encode

# An event of the session's own stream stores no session id, a message.appended no type
# (NULL stands for them: READ_EVENTS).
EMIT = f"""
WITH {bump_stream("$1::text", "$2::text", "$3::bigint")}, e AS (
    INSERT INTO events (stream_key, seq, session_id, type, data, created_at, ref)
    SELECT s.key, s.last_seq - $3 + u.ord,
           CASE WHEN $1 = '{SESSION_PREFIX}' || $4 THEN NULL ELSE $4::text END,
           NULLIF(u.type, 'message.appended'), u.data, $7, u.ref
    FROM s, unnest($5::text[], $6::text[], $8::bigint[]) WITH ORDINALITY AS u(type, data, ref, ord)
)
SELECT last_seq FROM s
"""


class PostgresTx(WriteTx["Conn"]):
    """One transaction on a pooled connection. ``when`` is ``now`` as the timestamptz
    every row and event of the transaction gets."""

    __slots__ = ("notified", "when")

    def __init__(self, conn: Conn) -> None:
        super().__init__(conn)
        self.when = ts(self.now)
        #: Streams whose doorbell a statement already sent (:data:`~.sql.APPEND_ONE`).
        self.notified: set[str] = set()

    async def emit_many(
        self,
        stream: str,
        session_id: str,
        events: Sequence[tuple[str, str]],
        refs: Sequence[int | None] | None = None,
    ) -> int:
        """Append pre-encoded ``(type, data_json)`` events with consecutive seqs; the last.
        ``refs``: per event, the pk of the message whose body it reads back with (see
        :func:`~.sql.read_events`), else None."""
        n = len(events)
        if n == 0:
            return 0
        last = await self.conn.fetchval(
            EMIT,
            stream,
            new_epoch(),
            n,
            session_id,
            [t for t, _ in events],
            [d for _, d in events],
            self.when,
            [None] * n if refs is None else list(refs),
        )
        self.notes.append((stream, int(last)))
        return int(last)

    async def emit(self, stream: str, session_id: str, type_: str, data: Any) -> int:
        return await self.emit_many(stream, session_id, [(type_, _encode(data).decode())])

    async def emit_session(self, session_id: str, type_: str, data: Any) -> int:
        return await self.emit(session_stream(session_id), session_id, type_, data)

    async def touch(self, session_id: str) -> None:
        status = await self.conn.execute(
            "UPDATE sessions SET updated_at = $2 WHERE id = $1", session_id, self.when
        )
        if status == "UPDATE 0":
            raise SessionNotFound(session_id)

    async def session_row(self, session_id: str) -> SessionInfo:
        return await session_row(self.conn, session_id)

    async def registry_change(self, info: SessionInfo, type_: str, **extra: Any) -> None:
        for stream, data in registry_events(info, type_, **extra):
            await self.emit(stream, info.id, type_, data)


async def session_row(conn: Conn, session_id: str) -> SessionInfo:
    row = await conn.fetchrow(f"SELECT {SESSION_COLS} FROM sessions WHERE id = $1", session_id)
    if row is None:
        raise SessionNotFound(session_id)
    return session_info(row)
