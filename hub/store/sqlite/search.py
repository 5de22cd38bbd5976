"""Message search on SQLite: a session's (one statement, ranked by FTS5 or, for a small
window in a big index, by :mod:`.rank`) and the whole hub's. Reads take the raw connection,
in the reader's thread or inline on the event loop (``search_session_inline``)."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Sequence
from typing import Any

from protocol import SearchResult

from ..policy import SEARCH_WINDOW
from ..rows import ts
from . import rank, sql
from .connection import Conn
from .packing import role_name, stored_text

__all__ = ["INLINE_SEARCH_ROWS", "search_messages", "search_session_inline"]

log = logging.getLogger("sessionhub.store")

# A session's search, in one statement: the newest SEARCH_WINDOW matches of the session
# (by rowid, so no cost per match), ranked. ``{filter}`` says how the session's rows are
# found among every session's: see search_messages; ``{check}`` keeps only the session's
# rows where its token may be another's too (two ids that hashed alike), before the limit.
# The caller knows the session's id: rows do not give it (a join with streams for it cost a
# fifth of the statement).
SEARCH_SESSION = """
SELECT m.id, m.role, m.content, m.sk, m.created_at FROM (
    SELECT f.rowid AS pk, f.rank AS r FROM messages_fts f {join}
    WHERE messages_fts MATCH ? {filter} ORDER BY f.rowid DESC LIMIT ?
) w JOIN messages m ON m.pk = w.pk {check} ORDER BY w.r, w.pk LIMIT ?
"""
#: The session's token in MATCH: FTS5 intersects the two posting lists.
SEARCH_BY_TOKEN = SEARCH_SESSION.format(join="", filter="", check=f"AND m.sk = {sql.KEY}")
#: The text alone in MATCH, the session checked on each match's row.
SEARCH_BY_ROW = SEARCH_SESSION.format(
    join="JOIN messages s ON s.pk = f.rowid", filter=f"AND s.sk = {sql.KEY}", check=""
)
#: SEARCH_BY_TOKEN's window unranked, with what rank.rank_order needs to order it as FTS5
#: would (each row's text and token counts) without bm25's pass over the whole index.
UNRANKED_BY_TOKEN = f"""
SELECT m.id, m.role, m.content, m.sk, m.created_at, w.pk, d.sz FROM (
    SELECT f.rowid AS pk FROM messages_fts f
    WHERE messages_fts MATCH ? ORDER BY f.rowid DESC LIMIT ?
) w JOIN messages m ON m.pk = w.pk AND m.sk = {sql.KEY} JOIN messages_fts_docsize d ON d.id = w.pk
"""
#: A window of at most this many matches may be ranked by rank.rank_order; a larger one by FTS5.
RANK_ROWS = 64
#: Ranking here costs about what bm25's pass spends on RANK_FIXED_HITS matches of the phrase
#: in the whole index, plus RANK_ROW_HITS per window row (~85 us + ~9.5 us a row here, ~60 ns
#: a match there: docs/benchmarks.md). A window is ranked here when the phrase, as common in
#: the index as in the session, would have more matches than that.
RANK_FIXED_HITS = 1_500
RANK_ROW_HITS = 160
#: A session holding at least this share of all messages is searched SEARCH_BY_ROW: its
#: token's posting list is then most of the index, and walking it (and bm25 counting it)
#: costs more than looking each match's row up; at most 1/share - 1 lookups are wasted
#: per kept match.
BY_ROW_SHARE = 0.25


#: A session's search runs inline on the event loop (SqliteStore.search_messages) while the
#: index holds at most this many rows: its cost is then bounded (~1 ms for a phrase in 14 %
#: of them, docs/benchmarks.md), below which the trip to the reader's thread is a large
#: part of a rare word's search.
INLINE_SEARCH_ROWS = 20_000


def search_session_inline(
    conn: Conn, expr: str, session_id: str, limit: int, max_rows: int
) -> list[SearchResult] | None:
    """:func:`search_messages` of one session, or None (nothing run) when the index holds
    more than ``max_rows`` rows: a search there may take longer than a thread hop saves."""
    size = _session_size(conn, session_id)
    if size is not None and size[1] > max_rows:
        return None
    return _search_session(conn, expr, session_id, limit, size)


def _session_size(conn: Conn, session_id: str) -> tuple[int, int] | None:
    # MAX(pk) stands for the number of messages (deletes leave gaps): one probe.
    row = conn.execute(
        "SELECT messages, (SELECT MAX(pk) FROM messages) FROM session_stats WHERE session_id = ?",
        (session_id,),
    ).fetchone()
    return None if row is None else (int(row[0]), int(row[1] or 0))


def _search_session(
    conn: Conn, expr: str, session_id: str, limit: int, size: tuple[int, int] | None
) -> list[SearchResult]:
    if size is None or not size[0]:
        return []
    body = f"body : ({expr})"
    try:
        if size[0] >= BY_ROW_SHARE * size[1]:
            rows = conn.execute(SEARCH_BY_ROW, (body, session_id, SEARCH_WINDOW, limit)).fetchall()
        else:
            # bm25 scores the token's column 0 (weights 0.0, 1.0): the same order.
            both = f"sid : {sql.sid_token(session_id)} AND {body}"
            found = _ranked_here(conn, both, expr, session_id, limit, size[1] / size[0])
            rows = (
                found
                if found is not None
                else conn.execute(SEARCH_BY_TOKEN, (both, SEARCH_WINDOW, session_id, limit)).fetchall()
            )
    except sqlite3.OperationalError as exc:
        return _no_match(expr, exc)
    return _results(rows, session_id)


def _ranked_here(
    conn: Conn, match: str, expr: str, session_id: str, limit: int, spread: float
) -> list[Any] | None:
    """SEARCH_BY_TOKEN's rows ranked by rank.rank_order, or None (FTS5 should rank them):
    ``spread`` is how many index rows there are per message of the session."""
    if spread <= RANK_ROW_HITS:  # the index's matches cost FTS5 less, whatever the window
        return None
    window = min(SEARCH_WINDOW, RANK_ROWS + 1)
    rows = conn.execute(UNRANKED_BY_TOKEN, (match, window, session_id)).fetchall()
    if len(rows) <= 1:  # its own order
        return rows
    if len(rows) > RANK_ROWS or len(rows) * spread <= RANK_FIXED_HITS + RANK_ROW_HITS * len(rows):
        return None
    order = rank.rank_order(
        conn, "messages_fts", expr, [(r[5], stored_text(r[2], r[0], r[1]), r[6]) for r in rows]
    )
    return None if order is None else [rows[i] for i in order[:limit]]


def _no_match(expr: str, exc: sqlite3.OperationalError) -> list[SearchResult]:
    # Quoting keeps FTS syntax out; what remains (a phrase of only separators, say) is "no
    # results", never an exception for the caller. A busy database is no such thing.
    if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
        raise exc
    log.debug("fts query %r matched nothing: %s", expr, exc)
    return []


def _results(rows: Sequence[Any], session_id: str | None = None) -> list[SearchResult]:
    # The index keeps no copy of the text: a hit's text is its stored message's. Rows give
    # their session's id, or ``session_id`` stands for it (a session's own search).
    return [
        SearchResult(
            id=r[0],
            role=role_name(r[1]),
            content=stored_text(r[2], r[0], r[1]),
            session_id=r[3] if session_id is None else session_id,
            created_at=ts(r[4]),
        )
        for r in rows
    ]


def search_messages(conn: Conn, expr: str, session_id: str | None, limit: int) -> list[SearchResult]:
    if session_id is not None:
        return _search_session(conn, expr, session_id, limit, _session_size(conn, session_id))
    body = f"body : ({expr})"
    try:
        edge = conn.execute(
            "SELECT rowid FROM messages_fts WHERE messages_fts MATCH ? ORDER BY rowid DESC LIMIT 1 OFFSET ?",
            (body, SEARCH_WINDOW - 1),
        ).fetchone()
        rows = conn.execute(
            "SELECT m.id, m.role, m.content, substr(k.stream, 3), m.created_at FROM messages_fts f "
            "JOIN messages m ON m.pk = f.rowid JOIN streams k ON k.sk = m.sk "
            "JOIN sessions s ON s.id = substr(k.stream, 3) "
            "WHERE messages_fts MATCH ? AND f.rowid >= ? ORDER BY f.rank LIMIT ?",
            (body, 0 if edge is None else edge[0], limit),
        ).fetchall()
    except sqlite3.OperationalError as exc:
        return _no_match(expr, exc)
    return _results(rows)
