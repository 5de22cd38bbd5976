"""Stored files (hub/store/attachments.py) on SQLite: their rows, chunks, uploaders and the
messages that reference them (schema.py migration 8)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import BinaryIO

from protocol import InvalidInput

from ..attachments import StoredFile, chunks_of, over_quota, refs_in
from ..rows import ts
from .connection import Conn
from .tx import SqliteTx

#: A reference to a file collected between the writer's check and its commit.
GONE = "a file the message references is not stored (collected meanwhile?): upload it again"

__all__ = [
    "add_refs",
    "collect",
    "file_info",
    "file_sessions",
    "put_file",
    "read_chunk",
    "replace_refs",
    "session_files",
    "uploaded_by",
    "uploaded_bytes",
]


def put_file(
    tx: SqliteTx,
    sha256: str,
    media_type: str,
    data: bytes | BinaryIO,
    subject: str | None,
    quota: int | None = None,
) -> StoredFile:
    """Store a file once: a second copy only touches it (and records its uploader)."""
    conn = tx.conn
    row = conn.execute(
        "UPDATE files SET touched_at = ? WHERE sha256 = ? RETURNING size, media_type", (tx.now, sha256)
    ).fetchone()
    if row is None:
        digest = hashlib.sha256()
        size = 0
        if not isinstance(data, bytes):
            data.seek(0)  # a busy attempt is retried from the start
        for n, piece in enumerate(chunks_of(data)):
            digest.update(piece)
            size += len(piece)
            conn.execute("INSERT INTO file_chunks (sha256, n, data) VALUES (?, ?, ?)", (sha256, n, piece))
        if digest.hexdigest() != sha256:
            raise InvalidInput("the file's bytes do not hash to the SHA-256 it was stored under")
        conn.execute(
            "INSERT INTO files (sha256, size, media_type, touched_at) VALUES (?, ?, ?, ?)",
            (sha256, size, media_type, tx.now),
        )
        row = (size, media_type)
    if subject is not None and quota is not None and not uploaded_by(conn, sha256, subject):
        # Its own upload is not recorded yet: what it holds is the subject's other files.
        over_quota(uploaded_bytes(conn, subject), int(row[0]), quota)
    if subject is not None:
        conn.execute(
            "INSERT INTO file_uploads (sha256, subject) VALUES (?, ?) ON CONFLICT DO NOTHING",
            (sha256, subject),
        )
    return StoredFile(sha256=sha256, size=int(row[0]), media_type=str(row[1]), touched_at=ts(tx.now))


def file_info(conn: Conn, sha256: str) -> StoredFile | None:
    row = conn.execute(
        "SELECT size, media_type, touched_at FROM files WHERE sha256 = ?", (sha256,)
    ).fetchone()
    if row is None:
        return None
    return StoredFile(sha256=sha256, size=int(row[0]), media_type=str(row[1]), touched_at=ts(row[2]))


def read_chunk(conn: Conn, sha256: str, n: int) -> bytes | None:
    row = conn.execute("SELECT data FROM file_chunks WHERE sha256 = ? AND n = ?", (sha256, n)).fetchone()
    return None if row is None else bytes(row[0])


def file_sessions(conn: Conn, sha256: str) -> list[str]:
    """The sessions whose messages reference the file."""
    return [
        str(r[0])[2:]
        for r in conn.execute(
            "SELECT DISTINCT s.stream FROM file_refs r JOIN streams s ON s.sk = r.sk WHERE r.sha256 = ?",
            (sha256,),
        )
    ]


def session_files(conn: Conn, sk_of: str) -> list[str]:
    """The files a session's messages reference (``sk_of``: its stream's name)."""
    return [
        str(r[0])
        for r in conn.execute(
            "SELECT DISTINCT r.sha256 FROM file_refs r JOIN streams s ON s.sk = r.sk "
            "WHERE s.stream = ? ORDER BY r.sha256",
            (sk_of,),
        )
    ]


def uploaded_by(conn: Conn, sha256: str, subject: str) -> bool:
    return (
        conn.execute(
            "SELECT 1 FROM file_uploads WHERE sha256 = ? AND subject = ?", (sha256, subject)
        ).fetchone()
        is not None
    )


def uploaded_bytes(conn: Conn, subject: str) -> int:
    (total,) = conn.execute(
        "SELECT COALESCE(SUM(f.size), 0) FROM file_uploads u JOIN files f ON f.sha256 = u.sha256 "
        "WHERE u.subject = ?",
        (subject,),
    ).fetchone()
    return int(total)


def add_refs(conn: Conn, sk: int, pk: int, shas: Sequence[str]) -> None:
    """A message's references, in its transaction; a file gone meanwhile (collected between
    the writer's check and this commit) fails the write, which then stores nothing."""
    if not shas:
        return
    conn.executemany(
        "INSERT OR IGNORE INTO file_refs (pk, sha256, sk) VALUES (?, ?, ?)", [(pk, s, sk) for s in shas]
    )
    marks = ",".join("?" * len(shas))
    (stored,) = conn.execute(f"SELECT COUNT(*) FROM files WHERE sha256 IN ({marks})", list(shas)).fetchone()
    if stored != len(set(shas)):
        raise InvalidInput(
            "a file the message references is not stored (collected meanwhile?): upload it again"
        )


def replace_refs(conn: Conn, pk: int, shas: Sequence[str]) -> None:
    """An updated message's references: the old ones go (its rows hold the stream's key)."""
    row = conn.execute("SELECT sk FROM messages WHERE pk = ?", (pk,)).fetchone()
    conn.execute("DELETE FROM file_refs WHERE pk = ?", (pk,))
    if row is not None:
        add_refs(conn, int(row[0]), pk, shas)


def collect(tx: SqliteTx, cutoff: float) -> list[str]:
    """Delete the files no message references, nor any event of a log (a message's old body
    in a ``message.updated`` or deleted message's event), last stored before ``cutoff``."""
    conn = tx.conn
    candidates = {
        str(r[0])
        for r in conn.execute(
            "SELECT sha256 FROM files f WHERE touched_at < ? "
            "AND NOT EXISTS (SELECT 1 FROM file_refs r WHERE r.sha256 = f.sha256)",
            (cutoff,),
        )
    }
    if not candidates:
        return []
    for (data,) in conn.execute("SELECT data FROM events WHERE data LIKE '%/files/%'"):
        candidates -= refs_in(data if isinstance(data, str) else bytes(data).decode("utf-8", "replace"))
    gone = sorted(candidates)
    for table in ("file_chunks", "file_uploads", "files"):
        conn.executemany(f"DELETE FROM {table} WHERE sha256 = ?", [(s,) for s in gone])
    return gone
