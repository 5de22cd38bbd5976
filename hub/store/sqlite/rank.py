"""FTS5's bm25 order for a small window of one-phrase matches, without bm25's cost.

bm25 first counts the phrase's matches over the whole index (its IDF), which at 100k rows
costs ~2 ms for a phrase in 14 % of them (docs/benchmarks.md). With one phrase (all that
``Session.search`` sends) and the session token's column weighted 0, a row's score is that
IDF, a positive constant, times ``f(tf, dl)``: the order of ``(rank, rowid)`` is the order
of ``(-f, rowid)``, which needs per row only the phrase's count in the row and the row's
length, and the index's average length. This module computes those exactly as FTS5 does
(fts5_aux.c, fts5Bm25Function): the lengths from the index's own shadow tables and the
counts from FTS5's own tokenizer, in a scratch in-memory FTS5 table. Anything it cannot
vouch for (not one phrase, a text that no longer tokenizes to what the index holds, two
scores so close that the IDF's rounding could tie them) returns None: the caller then
asks FTS5 for its rank.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from itertools import pairwise

__all__ = [
    "K1",
    "TOKENIZE",
    "B",
    "avgdl",
    "bm25_f",
    "phrase_counts",
    "phrase_text",
    "rank_order",
    "scores",
    "varints",
]

#: fts5Bm25Function's constants.
K1 = 1.2
B = 0.75
#: messages_fts's tokenizer (hub/store/sqlite/schema.py; tests/store/test_rank.py checks they agree).
TOKENIZE = "porter unicode61"
# Two scores this close (relative) might round to one product with the IDF, where FTS5
# would order by rowid: too close to call without the IDF. Products round at 2**-53.
_TIE = 1e-12


def phrase_text(expr: str) -> str | None:
    """The text of ``expr`` when it is one quoted FTS5 phrase (hub.store.fts.phrase_query), else None."""
    if len(expr) < 2 or expr[0] != '"' or expr[-1] != '"':
        return None
    inner = expr[1:-1]
    # Inside a phrase a quote is doubled; a lone one would end it (two phrases).
    if inner.replace('""', "").count('"'):
        return None
    return inner.replace('""', '"')


def varints(blob: bytes) -> list[int]:
    """SQLite's varints (1-9 bytes, big-endian, 7 bits a byte, the 9th byte all 8), as FTS5
    writes its averages record and its docsize rows."""
    out: list[int] = []
    i, n = 0, len(blob)
    while i < n:
        value = 0
        for j in range(9):
            if i >= n:
                raise ValueError("truncated varint")
            byte = blob[i]
            i += 1
            if j == 8:
                value = (value << 8) | byte
                break
            value = (value << 7) | (byte & 0x7F)
            if byte < 0x80:
                break
        out.append(value & 0xFFFFFFFFFFFFFFFF)
    return out


def avgdl(conn: sqlite3.Connection, table: str) -> float | None:
    """FTS5's average row length of ``table`` (all columns: xColumnTotalSize(-1) / xRowCount),
    from its averages record (``%_data`` id 1: the row count, then each column's total)."""
    row = conn.execute(f"SELECT block FROM {table}_data WHERE id = 1").fetchone()
    if row is None or not isinstance(row[0], bytes):
        return None
    counts = varints(row[0])
    if len(counts) < 2 or counts[0] <= 0:
        return None
    return float(sum(counts[1:])) / float(counts[0])


def bm25_f(tf: int, dl: int, avg: float) -> float:
    """fts5Bm25Function's score of one phrase without its IDF, in its order of operations
    (so the same double)."""
    freq = float(tf)
    return (freq * (K1 + 1.0)) / (freq + K1 * (1 - B + B * float(dl) / avg))


class _Scratch(threading.local):
    conn: sqlite3.Connection | None = None


_scratch = _Scratch()


def _scratch_conn() -> sqlite3.Connection:
    # One per thread (the event loop's and the reader's): sqlite3 connections stay on theirs.
    conn = _scratch.conn
    if conn is None:
        conn = sqlite3.connect(":memory:", isolation_level=None)
        conn.execute(f"CREATE VIRTUAL TABLE t USING fts5(body, content='', tokenize='{TOKENIZE}')")
        conn.execute("CREATE VIRTUAL TABLE v USING fts5vocab(t, 'instance')")
        _scratch.conn = conn
    return conn


def _reset_scratch() -> None:
    conn, _scratch.conn = _scratch.conn, None
    if conn is not None:
        conn.close()


def phrase_counts(phrase: str, texts: Sequence[str]) -> tuple[list[int], list[int]] | None:
    """How often ``phrase`` occurs in each of ``texts`` as FTS5 counts a phrase's instances
    (each start position where its tokens follow one another, overlaps included), and each
    text's length in tokens; None when the phrase has no token."""
    conn = _scratch_conn()
    conn.execute("BEGIN")
    try:
        # Row 0 is the phrase, tokenized as the index tokenizes text: its terms in order.
        conn.execute("INSERT INTO t(rowid, body) VALUES (0, ?)", (phrase,))
        terms = [t for t, _ in sorted(conn.execute("SELECT term, offset FROM v"), key=lambda r: r[1])]
        if not terms:
            return None
        conn.executemany(
            "INSERT INTO t(rowid, body) VALUES (?, ?)", [(i + 1, t) for i, t in enumerate(texts)]
        )
        at: dict[tuple[int, str], set[int]] = {}
        for term in set(terms):
            for doc, offset in conn.execute("SELECT doc, offset FROM v WHERE term = ?", (term,)):
                if doc:
                    at.setdefault((doc, term), set()).add(offset)
        sizes = dict(conn.execute("SELECT id, sz FROM t_docsize WHERE id > 0"))
    finally:
        # Nothing is kept: the rows were only ever pending in this transaction.
        conn.execute("ROLLBACK")
    first, rest = terms[0], list(enumerate(terms))[1:]
    counts: list[int] = []
    lengths: list[int] = []
    for i in range(1, len(texts) + 1):
        starts = at.get((i, first), set())
        follow = [(k, at.get((i, term), set())) for k, term in rest]
        counts.append(sum(1 for p in starts if all(p + k in seen for k, seen in follow)))
        size = sizes.get(i)
        lengths.append(varints(size)[0] if isinstance(size, bytes) else 0)
    return counts, lengths


def scores(
    conn: sqlite3.Connection, table: str, expr: str, rows: Sequence[tuple[int, str, bytes]]
) -> list[float] | None:
    """Each row's bm25 score over its IDF (:func:`bm25_f`), for ``rows`` — ``(rowid, text,
    docsize blob)`` of the rows of ``table`` that matched ``body : (expr)``; None when
    ``expr`` is not one phrase or a text does not tokenize to what the index holds for it."""
    phrase = phrase_text(expr)
    if phrase is None or not rows:
        return None
    avg = avgdl(conn, table)
    try:
        found = phrase_counts(phrase, [text for _, text, _ in rows])
    except sqlite3.Error:
        # The scratch table is ours alone, so this is unexpected: start it afresh next time
        # and let FTS5 rank (an error here must never read as "no match").
        _reset_scratch()
        return None
    if avg is None or found is None:
        return None
    out: list[float] = []
    for (_, _, blob), tf, length in zip(rows, *found, strict=True):
        sizes = varints(blob) if isinstance(blob, bytes) else []
        # The text must tokenize to what the index holds for it (body is the last column),
        # and hold the phrase it matched. bm25's length is the whole row's (every column).
        if not sizes or sizes[-1] != length or tf < 1:
            return None
        out.append(bm25_f(tf, sum(sizes), avg))
    return out


def rank_order(
    conn: sqlite3.Connection, table: str, expr: str, rows: Sequence[tuple[int, str, bytes]]
) -> list[int] | None:
    """The indexes of ``rows`` (as :func:`scores` takes them) in FTS5's ``ORDER BY rank,
    rowid`` with rank ``bm25(0.0, 1.0)``; None when that order cannot be had exactly here."""
    found = scores(conn, table, expr, rows)
    if found is None:
        return None
    keyed = sorted((-f, row[0], i) for i, (f, row) in enumerate(zip(found, rows, strict=True)))
    for (a, _, _), (b, _, _) in pairwise(keyed):
        if a != b and b - a <= -a * _TIE:
            return None
    return [i for _, _, i in keyed]
