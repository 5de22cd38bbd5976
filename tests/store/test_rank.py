"""rank: FTS5's bm25 order of a session's small search window, computed without bm25's pass
over the whole index; checked against FTS5's own ``ORDER BY rank, rowid`` and rank values."""

from __future__ import annotations

import asyncio
import math
import sqlite3
import tempfile
from collections.abc import Sequence
from contextlib import closing
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from hub import Message, SqliteStore
from hub.store.fts import phrase_query, words_query
from hub.store.policy import SEARCH_WINDOW
from hub.store.rows import message_json
from hub.store.sqlite import rank, search, sql
from hub.store.sqlite.packing import packed, stored_text
from tests.support.hubtest import text_message

SESSIONS = ("a", "b", "c")
# Stems that meet (deploy/deploying/deployed), case and diacritics that fold (café/CAFE,
# naïve, a combining accent), scripts that do not (Greek, CJK, emoji), and short words
# that repeat, for phrases that occur several times in a row, overlapping ones included.
WORDS = (
    "deploy", "deploying", "deployed", "pipeline", "pipelines", "run", "running", "the", "a",
    "Café", "cafe", "CAFÉ", "naïve", "naive", "e\u0301t\u00e9", "straße", "ελληνικά", "日本語",
    "😀", "x", "x", "y",
)  # fmt: skip
SEPS = (" ", " ", " ", "  ", ", ", "-", "\n", ". ", "/", "'")

words = st.lists(st.sampled_from(WORDS), min_size=0, max_size=24)
seps = st.lists(st.sampled_from(SEPS), min_size=24, max_size=24)
texts = st.builds(lambda ws, ss: "".join(w + s for w, s in zip(ws, ss, strict=False)).strip(), words, seps)
corpora = st.lists(st.tuples(st.sampled_from(SESSIONS), texts), min_size=1, max_size=40)
phrases = st.builds(
    lambda ws, ss: "".join(w + s for w, s in zip(ws, ss, strict=False)),
    st.lists(st.sampled_from(WORDS), min_size=1, max_size=3),
    st.lists(st.sampled_from(SEPS), min_size=3, max_size=3),
)


def _message(message_id: str, text: str) -> Message:
    return Message.from_dict(text_message(message_id, "user", text))


async def _fill(path: Path, corpus: Sequence[tuple[str, str]]) -> None:
    async with await SqliteStore.open(path) as store:
        for i, (session_id, text) in enumerate(corpus):
            await store.append_messages(session_id, [_message(f"m{i}", text)])


def _build(path: Path, corpus: Sequence[tuple[str, str]]) -> sqlite3.Connection:
    asyncio.run(_fill(path, corpus))
    return sqlite3.connect(path)


def _matches(session_id: str, expr: str, by_row: bool) -> tuple[str, tuple[str, ...]]:
    """FTS5's own order of a session's matches, and the MATCH it ran."""
    body = f"body : ({expr})"
    if by_row:
        return body, (session_id,)
    return f"sid : {sql.sid_token(session_id)} AND {body}", ()


def _fts5(conn: sqlite3.Connection, session_id: str, expr: str, by_row: bool) -> list[tuple[int, float]]:
    match, extra = _matches(session_id, expr, by_row)
    join = f"JOIN messages s ON s.pk = f.rowid AND s.sk = {sql.KEY}" if by_row else ""
    return conn.execute(
        f"SELECT f.rowid, f.rank FROM messages_fts f {join} "
        "WHERE messages_fts MATCH ? ORDER BY f.rank, f.rowid",
        (*extra, match),
    ).fetchall()


def _window(
    conn: sqlite3.Connection, session_id: str, expr: str, by_row: bool
) -> list[tuple[int, str, bytes]]:
    """The session's newest matches as rank.rank_order takes them: (rowid, text, docsize)."""
    match, extra = _matches(session_id, expr, by_row)
    if by_row:  # the text alone in MATCH (a session of a quarter of the index or more)
        rows = conn.execute(
            "SELECT f.rowid, m.content, d.sz, m.id, m.role FROM messages_fts f "
            "JOIN messages m ON m.pk = f.rowid JOIN messages_fts_docsize d ON d.id = f.rowid "
            f"WHERE messages_fts MATCH ? AND m.sk = {sql.KEY} ORDER BY f.rowid DESC LIMIT ?",
            (match, *extra, SEARCH_WINDOW),
        ).fetchall()
        return [(r[0], stored_text(r[1], r[3], r[4]), r[2]) for r in rows]
    rows = conn.execute(search.UNRANKED_BY_TOKEN, (match, SEARCH_WINDOW, session_id)).fetchall()
    return [(r[5], stored_text(r[2], r[0], r[1]), r[6]) for r in rows]


def _idf(conn: sqlite3.Connection, expr: str) -> float:
    # fts5Bm25GetData's IDF, from the phrase's match count over the whole index.
    (n_row,) = conn.execute("SELECT count(*) FROM messages_fts").fetchone()
    (n_hit,) = conn.execute(
        "SELECT count(*) FROM messages_fts WHERE messages_fts MATCH ?", (f"body : ({expr})",)
    ).fetchone()
    idf = math.log((n_row - n_hit + 0.5) / (n_hit + 0.5))
    return 1e-6 if idf <= 0.0 else idf


def _scores(
    conn: sqlite3.Connection, expr: str, window: Sequence[tuple[int, str, bytes]]
) -> dict[int, float]:
    """Each row's bm25 rank as FTS5 computes it, from rank.scores and the phrase's IDF."""
    found = rank.scores(conn, "messages_fts", expr, window)
    assert found is not None
    idf = _idf(conn, expr)
    return {rowid: -(0.0 + idf * f) for (rowid, _, _), f in zip(window, found, strict=True)}


def _close_call(conn: sqlite3.Connection, expr: str, window: Sequence[tuple[int, str, bytes]]) -> bool:
    values = sorted(set(_scores(conn, expr, window).values()))
    return any(b - a <= -a * 1e-12 for a, b in pairwise(values))


def _check(conn: sqlite3.Connection, expr: str, limit: int) -> int:
    """Every session, both ways of finding its rows: the order and the scores are FTS5's.
    Returns how many windows of two rows or more were ordered here."""
    ordered = 0
    for session_id in SESSIONS:
        for by_row in (False, True):
            expected = _fts5(conn, session_id, expr, by_row)
            window = _window(conn, session_id, expr, by_row)
            assert sorted(r for r, _, _ in window) == sorted(r for r, _ in expected)
            if not window:
                continue
            scores = _scores(conn, expr, window)
            assert [scores[r] for r, _ in expected] == [s for _, s in expected]
            order = rank.rank_order(conn, "messages_fts", expr, window)
            if order is None:
                assert _close_call(conn, expr, window)
            else:
                ordered += len(window) > 1
                assert [window[i][0] for i in order] == [r for r, _ in expected]
    # The hook in sql gives the rows FTS5's statement gives, whichever way it goes (an index
    # of a million rows a message of the session: always worth ranking here).
    for session_id in SESSIONS:
        got = [r.id for r in search._search_session(conn, expr, session_id, limit, (1, 1_000_000))]
        match, _ = _matches(session_id, expr, False)
        want = [r[0] for r in conn.execute(search.SEARCH_BY_TOKEN, (match, SEARCH_WINDOW, session_id, limit))]
        assert got == want
    return ordered


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(corpus=corpora, phrase=phrases, limit=st.integers(1, 12))
def test_the_order_and_the_scores_are_fts5s(corpus: list[tuple[str, str]], phrase: str, limit: int) -> None:
    expr = phrase_query(phrase)
    assume(expr is not None)
    assert expr is not None
    with tempfile.TemporaryDirectory() as tmp, closing(_build(Path(tmp) / "h.db", corpus)) as conn:
        _check(conn, expr, limit)


def test_repeated_phrases_long_texts_and_many_sessions(tmp_path: Path) -> None:
    """tf above 1 (overlapping instances too), lengths past one varint byte (128 and 16,384
    tokens), a window ordered here (so the property above is not vacuous)."""
    corpus = [
        ("a", "x x x"),
        ("a", "x x"),
        ("a", "x y x x y x x x"),
        ("a", " ".join(["x"] * 300)),
        ("a", " ".join(["y"] * 20_000) + " x x"),
        ("a", "Café naïve x x"),
        ("b", "x x x x"),
    ] + [(f"s{k}", f"filler {k} x") for k in range(50)]
    with closing(_build(tmp_path / "h.db", corpus)) as conn:
        for expr in ('"x x"', '"x"', '"cafe naive"', '"x x x"'):
            assert _check(conn, expr, 10) >= 1 or expr == '"cafe naive"'


def test_the_schema_tokenizes_as_the_scratch_table(tmp_path: Path) -> None:
    with closing(_build(tmp_path / "h.db", [("a", "x")])) as conn:
        (create,) = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'messages_fts'").fetchone()
    assert f"tokenize='{rank.TOKENIZE}'" in create


def test_a_text_that_no_longer_tokenizes_as_indexed_is_left_to_fts5(tmp_path: Path) -> None:
    """The stored text of m0 says the phrase three times, the index holds it once: counted
    here, m0 would come first; FTS5 (which has only the index) puts m1 first."""
    with closing(
        _build(tmp_path / "h.db", [("a", "deploy pipeline z"), ("a", "deploy pipeline deploy pipeline")])
    ) as conn:
        stale = Message.from_dict(
            text_message("m0", "user", "deploy pipeline deploy pipeline deploy pipeline")
        )
        conn.execute(
            "UPDATE messages SET content = ? WHERE id = 'm0'", (packed(message_json(stale), "m0", "user"),)
        )
        conn.commit()
        window = _window(conn, "a", '"deploy pipeline"', False)
        assert rank.rank_order(conn, "messages_fts", '"deploy pipeline"', window) is None
        hits = search._search_session(conn, '"deploy pipeline"', "a", 10, (1, 1_000_000))
        assert [h.id for h in hits] == ["m1", "m0"]


def test_only_one_phrase_is_ranked_here(tmp_path: Path) -> None:
    with closing(_build(tmp_path / "h.db", [("a", "deploy pipeline"), ("a", "pipeline x deploy")])) as conn:
        expr = words_query("deploy pipeline")
        assert expr is not None
        window = _window(conn, "a", expr, False)
        assert len(window) == 2
        assert rank.rank_order(conn, "messages_fts", expr, window) is None


def test_scores_too_close_to_call_are_left_to_fts5(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with closing(_build(tmp_path / "h.db", [("a", "x"), ("a", "x y")])) as conn:
        window = _window(conn, "a", '"x"', False)
        assert rank.rank_order(conn, "messages_fts", '"x"', window) is not None
        near = iter([1.0, 1.0 + 4e-16])
        monkeypatch.setattr(rank, "bm25_f", lambda *_: next(near))
        assert rank.rank_order(conn, "messages_fts", '"x"', window) is None


def count_rank_order(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Spy on rank.rank_order: the window sizes it was asked to order."""
    calls: list[int] = []
    real = rank.rank_order

    def counted(*args: Any) -> list[int] | None:
        calls.append(len(args[3]))
        return real(*args)

    monkeypatch.setattr(rank, "rank_order", counted)
    return calls


def test_a_window_larger_than_rank_rows_is_ranked_by_fts5(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    corpus = [("a", "x " * (i % 7 + 1) + "y " * (i % 5)) for i in range(search.RANK_ROWS + 6)]
    calls = count_rank_order(monkeypatch)
    with closing(_build(tmp_path / "h.db", corpus)) as conn:
        want = [
            r[0]
            for r in conn.execute(
                search.SEARCH_BY_TOKEN, (_matches("a", '"x"', False)[0], SEARCH_WINDOW, "a", 20)
            )
        ]
        got = [h.id for h in search._search_session(conn, '"x"', "a", 20, (1, 1_000_000))]
        assert got == want and calls == []
        monkeypatch.setattr(search, "RANK_ROWS", SEARCH_WINDOW)  # now ranked here: the same
        assert [h.id for h in search._search_session(conn, '"x"', "a", 20, (1, 1_000_000))] == want
        assert calls == [len(corpus)]


@pytest.mark.parametrize(
    ("blob", "values"),
    [
        (b"\x00", [0]),
        (b"\x7f\x01", [127, 1]),
        (b"\x81\x00", [128]),
        (b"\x81\x80\x00", [16_384]),
        (b"\xff" * 9, [2**64 - 1]),
    ],
)
def test_varints_read_sqlites_format(blob: bytes, values: list[int]) -> None:
    assert rank.varints(blob) == values


def test_a_truncated_varint_is_an_error() -> None:
    with pytest.raises(ValueError, match="truncated"):
        rank.varints(b"\x81")


@pytest.mark.parametrize(
    ("expr", "text"),
    [('"a b"', "a b"), ('"say ""hi"""', 'say "hi"'), ('"a" "b"', None), ("a", None), ('"', None)],
)
def test_phrase_text_reads_one_quoted_phrase(expr: str, text: str | None) -> None:
    assert rank.phrase_text(expr) == text


def test_a_window_is_ranked_here_only_where_that_costs_less(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FTS5's pass costs as many matches as the whole index holds, estimated from the
    session's share of them; ranking here costs a fixed part and a part a window row."""
    calls = count_rank_order(monkeypatch)
    corpus = [("a", "x " * (i % 3 + 1) + "y " * (i % 4)) for i in range(10)]
    with closing(_build(tmp_path / "h.db", corpus)) as conn:
        match, _ = _matches("a", '"x"', False)
        want = [r[0] for r in conn.execute(search.SEARCH_BY_TOKEN, (match, SEARCH_WINDOW, "a", 20))]
        for index_rows, ranked_here in (
            (10 * search.RANK_ROW_HITS, False),  # the session is too large a share of the index
            (10 * (search.RANK_ROW_HITS + 1), False),  # 10 matches: the fixed part outweighs
            (10 * (search.RANK_ROW_HITS + search.RANK_FIXED_HITS // 10 + 1), True),
        ):
            calls.clear()
            got = [h.id for h in search._search_session(conn, '"x"', "a", 20, (10, index_rows))]
            assert got == want
            assert calls == ([10] if ranked_here else [])


def test_a_scratch_table_that_fails_is_left_for_fts5_and_made_afresh(tmp_path: Path) -> None:
    with closing(_build(tmp_path / "h.db", [("a", "x"), ("a", "x x y")])) as conn:
        window = _window(conn, "a", '"x"', False)
        want = rank.rank_order(conn, "messages_fts", '"x"', window)
        assert want is not None
        rank._scratch_conn().execute("BEGIN")  # a transaction left open: BEGIN now fails
        assert rank.rank_order(conn, "messages_fts", '"x"', window) is None
        assert rank.rank_order(conn, "messages_fts", '"x"', window) == want
