"""How messages and events name their session or stream: by ``streams.key``, an integer
taken once per stream, instead of the text (4 bytes in a row or an index entry instead of
some 40; docs/operations.md, "Sizes"). The SQL fragments that look the key up or take it."""

from __future__ import annotations

from ..policy import session_stream

__all__ = ["SESSION_KEY", "SESSION_PREFIX", "bump_stream", "stream_key_of"]

#: The key (streams.key) of the session whose id is ``$1``: messages name their session by
#: it. A subquery Postgres runs once per statement (an InitPlan), one probe of streams_pkey.
SESSION_PREFIX = session_stream("")
SESSION_KEY = f"(SELECT key FROM streams WHERE stream = '{SESSION_PREFIX}' || $1)"


def stream_key_of(stream: str) -> str:
    """The key of the stream named by the SQL expression ``stream``."""
    return f"(SELECT key FROM streams WHERE stream = {stream})"


def bump_stream(stream: str, epoch: str, n: str, gate: str = "") -> str:
    """CTEs ``su``, ``si`` and ``s``: add ``n`` to the stream's last_seq, creating the
    stream at the first write; ``s`` is (last_seq, key). An existing stream is bumped by
    UPDATE, so the key's identity sequence advances only when a stream is created (an
    INSERT ... ON CONFLICT would take a value per event). Two first writers of a stream
    both miss it in ``su``; the second one's INSERT then waits and bumps the first one's
    row. ``gate``: a CTE with no row when nothing is to be written."""
    where = f" AND EXISTS (SELECT 1 FROM {gate})" if gate else ""
    src = f" FROM {gate}" if gate else ""
    return f"""su AS (
    UPDATE streams SET last_seq = last_seq + {n} WHERE stream = {stream}{where} RETURNING last_seq, key
), si AS (
    INSERT INTO streams AS s (stream, epoch, first_seq, last_seq) SELECT {stream}, {epoch}, 1, {n}{src}
    WHERE NOT EXISTS (SELECT 1 FROM su)
    ON CONFLICT (stream) DO UPDATE SET last_seq = s.last_seq + excluded.last_seq
    RETURNING last_seq, key
), s AS (
    SELECT last_seq, key FROM su UNION ALL SELECT last_seq, key FROM si
)"""
