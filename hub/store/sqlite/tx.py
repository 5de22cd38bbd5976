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
from .packing import type_code

__all__ = ["SqliteTx", "open_stream", "session_row"]

_encode = msgspec.json.Encoder().encode


class SqliteTx(WriteTx[Conn]):
    """One ``BEGIN IMMEDIATE .. COMMIT`` on the writer's connection."""

    __slots__ = ()

    def emit(self, stream: str, session_id: str, type_: str, data: Any) -> int:
        return self.emit_many(stream, session_id, [(type_, _encode(data).decode())])

    def emit_many(
        self,
        stream: str,
        session_id: str,
        events: Sequence[tuple[str, str | None]],
        refs: Sequence[int | None] | None = None,
    ) -> int:
        """Append pre-encoded ``(type, data_json)`` events with consecutive seqs; the last.
        ``refs``: per event, the pk of the message whose body it reads back with (see
        :func:`~.sql.read_events`), else None. A referring event with data None takes its
        parent id and its time from the row too: no data, no time stored. The first seq is always the stream's
        ``last_seq + 1`` as read inside this transaction (:func:`open_stream`)."""
        n = len(events)
        if n == 0:
            return 0
        conn = self.conn
        row = conn.execute(
            "UPDATE streams SET last_seq = last_seq + ? WHERE stream = ? RETURNING sk, last_seq", (n, stream)
        ).fetchone()
        if row is None:
            sk = _new_stream(conn, stream, n)
            last = n
        else:
            sk, last = int(row[0]), int(row[1])
        first = last - n + 1
        now = self.now
        # An event of a session's own log names no session: the log's key says which.
        own = None if stream == session_stream(session_id) else session_id
        conn.executemany(
            "INSERT INTO events (sk, seq, session_id, type, data, created_at, ref) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    sk,
                    first + i,
                    own,
                    type_code(t),
                    data,
                    None if data is None else now,
                    refs[i] if refs else None,
                )
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


def _new_stream(conn: Conn, stream: str, last_seq: int) -> int:
    row = conn.execute(
        "INSERT INTO streams (stream, sk, epoch, first_seq, last_seq) "
        "VALUES (?, (SELECT COALESCE(MAX(sk), 0) + 1 FROM streams), ?, 1, ?) RETURNING sk",
        (stream, new_epoch(), last_seq),
    ).fetchone()
    return int(row[0])


def open_stream(conn: Conn, stream: str) -> tuple[int, int]:
    """The stream's key and the seq its next event gets, creating it (with no events) if
    need be: inside ``BEGIN IMMEDIATE`` nobody else writes."""
    row = conn.execute("SELECT sk, last_seq FROM streams WHERE stream = ?", (stream,)).fetchone()
    if row is None:
        return _new_stream(conn, stream, 0), 1
    return int(row[0]), int(row[1]) + 1


def session_row(conn: Conn, session_id: str) -> SessionInfo:
    row = conn.execute(f"SELECT {SESSION_COLS} FROM sessions WHERE id = ?", (session_id,)).fetchone()
    if row is None:
        raise SessionNotFound(session_id)
    return session_info(row, ts)
