"""Stored files (hub/store/attachments.py) on Postgres: their rows, chunks, uploaders and the
messages that reference them (schema.py migration 6)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, BinaryIO

from protocol import InvalidInput

from ..attachments import StoredFile, chunks_of, over_quota, refs_in
from ..rows import aware
from .keys import SESSION_PREFIX
from .tx import PostgresTx

if TYPE_CHECKING:
    from .tx import Conn

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


async def put_file(
    tx: PostgresTx,
    sha256: str,
    media_type: str,
    data: bytes | BinaryIO,
    subject: str | None,
    quota: int | None = None,
) -> StoredFile:
    """Store a file once: a second copy only touches it (and records its uploader). Two
    writers of one new file: the second waits on the first's row, then only touches it."""
    conn = tx.conn
    row = await conn.fetchrow(
        "INSERT INTO files (sha256, size, media_type, touched_at) VALUES ($1, 0, $2, $3) "
        "ON CONFLICT (sha256) DO UPDATE SET touched_at = excluded.touched_at "
        "RETURNING size, media_type, (xmax = 0) AS fresh",
        sha256,
        media_type,
        tx.when,
    )
    assert row is not None
    size = int(row[0])
    if row[2]:
        digest = hashlib.sha256()
        size = 0
        if not isinstance(data, bytes):
            data.seek(0)  # a transaction retried on a fresh connection starts over
        for n, piece in enumerate(chunks_of(data)):
            digest.update(piece)
            size += len(piece)
            await conn.execute(
                "INSERT INTO file_chunks (sha256, n, data) VALUES ($1, $2, $3)",
                sha256,
                n,
                piece,
            )
        if digest.hexdigest() != sha256:
            raise InvalidInput("the file's bytes do not hash to the SHA-256 it was stored under")
        await conn.execute("UPDATE files SET size = $2 WHERE sha256 = $1", sha256, size)
    if subject is not None and quota is not None and not await uploaded_by(conn, sha256, subject):
        # Under the subject's lock (store.put_file): another upload of it waits until this
        # one commits. Its own upload is not recorded yet: what it holds is its other files.
        over_quota(await uploaded_bytes(conn, subject), size, quota)
    if subject is not None:
        await conn.execute(
            "INSERT INTO file_uploads (sha256, subject) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            sha256,
            subject,
        )
    return StoredFile(sha256=sha256, size=size, media_type=str(row[1]), touched_at=tx.when)


async def file_info(conn: Conn, sha256: str) -> StoredFile | None:
    row = await conn.fetchrow("SELECT size, media_type, touched_at FROM files WHERE sha256 = $1", sha256)
    if row is None:
        return None
    return StoredFile(sha256=sha256, size=int(row[0]), media_type=str(row[1]), touched_at=aware(row[2]))


async def read_chunk(conn: Conn, sha256: str, n: int) -> bytes | None:
    value = await conn.fetchval("SELECT data FROM file_chunks WHERE sha256 = $1 AND n = $2", sha256, n)
    return None if value is None else bytes(value)


async def file_sessions(conn: Conn, sha256: str) -> list[str]:
    rows = await conn.fetch(
        "SELECT DISTINCT s.stream FROM file_refs r JOIN streams s ON s.key = r.session_key "
        "WHERE r.sha256 = $1",
        sha256,
    )
    return [str(r[0])[len(SESSION_PREFIX) :] for r in rows]


async def session_files(conn: Conn, stream: str) -> list[str]:
    rows = await conn.fetch(
        "SELECT DISTINCT r.sha256 FROM file_refs r JOIN streams s ON s.key = r.session_key "
        "WHERE s.stream = $1 ORDER BY r.sha256",
        stream,
    )
    return [str(r[0]) for r in rows]


async def uploaded_by(conn: Conn, sha256: str, subject: str) -> bool:
    found = await conn.fetchval(
        "SELECT 1 FROM file_uploads WHERE sha256 = $1 AND subject = $2", sha256, subject
    )
    return found is not None


async def uploaded_bytes(conn: Conn, subject: str) -> int:
    total = await conn.fetchval(
        "SELECT COALESCE(SUM(f.size), 0) FROM file_uploads u JOIN files f ON f.sha256 = u.sha256 "
        "WHERE u.subject = $1",
        subject,
    )
    return int(total)


async def add_refs(tx: PostgresTx, pk: int, shas: Sequence[str]) -> None:
    """A message's references, in its transaction. Touching the files (an UPDATE) makes a
    concurrent ``gc`` that waits on their rows re-check them and keep them; a file gone
    meanwhile fails the write, which then stores nothing."""
    if not shas:
        return
    touched = await tx.conn.fetchval(
        "WITH t AS (UPDATE files SET touched_at = $2 WHERE sha256 = ANY($1::text[]) RETURNING 1) "
        "SELECT count(*) FROM t",
        list(shas),
        tx.when,
    )
    if touched != len(set(shas)):
        raise InvalidInput(
            "a file the message references is not stored (collected meanwhile?): upload it again"
        )
    await tx.conn.execute(
        "INSERT INTO file_refs (pk, sha256, session_key) "
        "SELECT $1, u, (SELECT session_key FROM messages WHERE pk = $1) FROM unnest($2::text[]) AS u "
        "ON CONFLICT DO NOTHING",
        pk,
        list(shas),
    )


async def replace_refs(tx: PostgresTx, pk: int, shas: Sequence[str]) -> None:
    await tx.conn.execute("DELETE FROM file_refs WHERE pk = $1", pk)
    await add_refs(tx, pk, shas)


async def collect(tx: PostgresTx, cutoff: datetime) -> list[str]:
    """Delete the files no message references, nor any event (an old body in a
    ``message.updated`` or deleted message's event), last stored before ``cutoff``."""
    conn = tx.conn
    candidates = {
        str(r[0])
        for r in await conn.fetch(
            "SELECT sha256 FROM files f WHERE touched_at < $1 "
            "AND NOT EXISTS (SELECT 1 FROM file_refs r WHERE r.sha256 = f.sha256)",
            cutoff,
        )
    }
    if not candidates:
        return []
    for r in await conn.fetch("SELECT data FROM events WHERE data LIKE '%/files/%'"):
        candidates -= refs_in(str(r[0]))
    # Re-checked row by row as it deletes: a writer that touched a file meanwhile keeps it.
    rows = await conn.fetch(
        "DELETE FROM files f WHERE sha256 = ANY($1::text[]) AND touched_at < $2 "
        "AND NOT EXISTS (SELECT 1 FROM file_refs r WHERE r.sha256 = f.sha256) RETURNING sha256",
        sorted(candidates),
        cutoff,
    )
    return sorted(str(r[0]) for r in rows)
