"""The write transaction: plain calls, as the whole transaction runs as one call in the
writer's thread (or inline on the event loop, see ``SqliteStore._write``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from protocol import SessionInfo, SessionNotFound

from ..base import WriteTx
from ..policy import registry_events, session_stream
from ..rows import SESSION_COLS, new_epoch, session_info, ts
from .connection import Conn

__all__ = ["SqliteTx", "next_seq", "session_row"]

_encode = msgspec.json.Encoder().encode


class SqliteTx(WriteTx[Conn]):
    """One ``BEGIN IMMEDIATE .. COMMIT`` on the writer's connection."""

    __slots__ = ()

    def emit(self, stream: str, session_id: str, type_: str, data: Any) -> int:
        conn = self.conn
        row = conn.execute(
            "UPDATE streams SET last_seq = last_seq + 1 WHERE stream = ? RETURNING last_seq", (stream,)
        ).fetchone()
        if row is None:
            conn.execute("INSERT INTO streams VALUES (?, ?, 1, 1)", (stream, new_epoch()))
            seq = 1
        else:
            seq = int(row[0])
        conn.execute(
            "INSERT INTO events (stream, seq, session_id, type, data, created_at) VALUES (?, ?, ?, ?, ?, ?)",
            (stream, seq, session_id, type_, _encode(data).decode(), self.now),
        )
        self.notes.append((stream, seq))
        return seq

    def emit_many(
        self,
        stream: str,
        session_id: str,
        events: Sequence[tuple[str, str]],
        refs: Sequence[int | None] | None = None,
    ) -> int:
        """Append pre-encoded ``(type, data_json)`` events with consecutive seqs; the last.
        ``refs``: per event, the pk of the message whose body it reads back with (see
        :func:`~.sql.read_events`), else None. The first seq is always the stream's
        ``last_seq + 1`` as read inside this transaction (:func:`next_seq`)."""
        n = len(events)
        if n == 0:
            return 0
        conn = self.conn
        row = conn.execute(
            "UPDATE streams SET last_seq = last_seq + ? WHERE stream = ? RETURNING last_seq", (n, stream)
        ).fetchone()
        if row is None:
            conn.execute("INSERT INTO streams VALUES (?, ?, 1, ?)", (stream, new_epoch(), n))
            last = n
        else:
            last = int(row[0])
        first = last - n + 1
        now = self.now
        conn.executemany(
            "INSERT INTO events (stream, seq, session_id, type, data, created_at, ref) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            [
                (stream, first + i, session_id, t, data, now, None if refs is None else refs[i])
                for i, (t, data) in enumerate(events)
            ],
        )
        self.notes.append((stream, last))
        return last

    def emit_session(self, session_id: str, type_: str, data: Any) -> int:
        return self.emit(session_stream(session_id), session_id, type_, data)

    def touch(self, session_id: str) -> None:
        if (
            self.conn.execute(
                "UPDATE sessions SET updated_at = ? WHERE id = ?", (self.now, session_id)
            ).rowcount
            == 0
        ):
            raise SessionNotFound(session_id)

    def session_row(self, session_id: str) -> SessionInfo:
        return session_row(self.conn, session_id)

    def registry_change(self, info: SessionInfo, type_: str, **extra: Any) -> None:
        for stream, data in registry_events(info, type_, **extra):
            self.emit(stream, info.id, type_, data)


def next_seq(conn: Conn, stream: str) -> int:
    """The seq the stream's next event gets: inside ``BEGIN IMMEDIATE`` nobody else writes."""
    row = conn.execute("SELECT last_seq FROM streams WHERE stream = ?", (stream,)).fetchone()
    return 1 if row is None else int(row[0]) + 1


def session_row(conn: Conn, session_id: str) -> SessionInfo:
    row = conn.execute(f"SELECT {SESSION_COLS} FROM sessions WHERE id = ?", (session_id,)).fetchone()
    if row is None:
        raise SessionNotFound(session_id)
    return session_info(row, ts)
