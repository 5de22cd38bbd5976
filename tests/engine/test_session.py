"""Session message semantics (spec §16.1 provider.test.ts, ported) on a real SQLite file."""

from __future__ import annotations

import sqlite3
import time
import zlib
from pathlib import Path

import pytest

from hub import LATEST, InvalidInput, InvalidMessage, Message, Session, SqliteStore
from tests.support.hubtest import text_message as T


def ids(messages: list[Message]) -> list[str]:
    return [m.id for m in messages]


async def chain(session: Session, n: int, prefix: str = "m", start: int = 0) -> None:
    for i in range(start, start + n):
        await session.append_message(T(f"{prefix}{i}", "user" if i % 2 == 0 else "assistant", f"message {i}"))


# -- tree-structured messages ------------------------------------------------------------


async def test_starts_with_empty_history(store: SqliteStore) -> None:
    s = Session(store)
    assert await s.get_history() == []
    assert await s.get_latest_leaf() is None
    assert await s.get_path_length() == 0


async def test_append_and_retrieve_in_order(store: SqliteStore) -> None:
    s = Session(store)
    assert await s.append_message(T("m1", "user", "Hello"))
    assert await s.append_message(T("m2", "assistant", "Hi"))
    history = await s.get_history()
    assert ids(history) == ["m1", "m2"]
    assert history[0].to_dict() == T("m1", "user", "Hello")


async def test_get_message_by_id(store: SqliteStore) -> None:
    s = Session(store)
    await s.append_message(T("m1", "user", "Hello"))
    m = await s.get_message("m1")
    assert m is not None and m.to_dict() == T("m1", "user", "Hello")
    assert await s.get_message("missing") is None


async def test_parent_links_form_a_path(store: SqliteStore) -> None:
    s = Session(store)
    await s.append_message(T("m1", "user", "a"))
    await s.append_message(T("m2", "assistant", "b"), "m1")
    assert await s.get_path_length() == 2
    assert await s.get_path_length("m1") == 1


async def test_branching_children_of_one_parent(store: SqliteStore) -> None:
    s = Session(store)
    await s.append_message(T("m1", "user", "q"))
    await s.append_message(T("m2a", "assistant", "a"), "m1")
    await s.append_message(T("m2b", "assistant", "b"), "m1")
    assert ids(await s.get_branches("m1")) == ["m2a", "m2b"]
    leaf = await s.get_latest_leaf()
    assert leaf is not None and leaf.id == "m2b"
    assert ids(await s.get_history("m2a")) == ["m1", "m2a"]
    assert ids(await s.get_history("m2b")) == ["m1", "m2b"]
    assert ids(await s.get_history()) == ["m1", "m2b"]
    assert await s.get_branches("m2b") == []
    assert await s.get_branches("nope") == []


async def test_update_message_replaces_content(store: SqliteStore) -> None:
    s = Session(store)
    await s.append_message(T("m1", "user", "original"))
    assert await s.update_message(T("m1", "user", "edited"))
    history = await s.get_history()
    assert history[0].parts == [{"type": "text", "text": "edited"}]


async def test_update_of_unknown_id_changes_nothing(store: SqliteStore) -> None:
    s = Session(store)
    await s.append_message(T("m1", "user", "x"))
    before = await s.read_events()
    assert not await s.update_message(T("ghost", "user", "y"))
    assert await s.get_message("ghost") is None
    assert await s.read_events() == before


async def test_clear_removes_messages_and_overlays(store: SqliteStore) -> None:
    s = Session(store)
    await chain(s, 4)
    await s.add_compaction("sum", "m1", "m2")
    await s.clear_messages()
    assert await s.get_history() == []
    assert await s.get_path_length() == 0
    assert await s.get_compactions() == []
    assert await s.get_latest_leaf() is None
    assert await s.search("message") == []


async def test_idempotent_append_keeps_first_content(store: SqliteStore) -> None:
    s = Session(store)
    assert await s.append_message(T("m1", "user", "first"))
    assert not await s.append_message(T("m1", "user", "second"))
    history = await s.get_history()
    assert len(history) == 1
    assert history[0].parts[0]["text"] == "first"
    assert len(await s.read_events()) == 1


async def test_explicit_none_parent_creates_a_root(store: SqliteStore) -> None:
    s = Session(store)
    await s.append_message(T("m1", "user", "a"))
    await s.append_message(T("m2", "assistant", "b"))
    await s.append_message(T("m3", "user", "new root"), None)
    assert ids(await s.get_history("m3")) == ["m3"]
    assert ids(await s.get_history()) == ["m3"]
    assert ids(await s.get_history("m2")) == ["m1", "m2"]


async def test_omitted_parent_attaches_to_latest_leaf(store: SqliteStore) -> None:
    s = Session(store)
    await s.append_message(T("m1", "user", "a"))
    await s.append_message(T("b1", "assistant", "branch"), "m1")
    await s.append_message(T("m2", "assistant", "b"), "m1")
    await s.append_message(T("m3", "user", "c"), LATEST)
    assert ids(await s.get_history()) == ["m1", "m2", "m3"]


async def test_unknown_parent_becomes_a_root(store: SqliteStore) -> None:
    s = Session(store)
    await s.append_message(T("m1", "user", "a"))
    await s.append_message(T("orphan", "user", "b"), "ghost")
    assert ids(await s.get_history()) == ["orphan"]


async def test_parent_in_another_session_is_unknown(store: SqliteStore) -> None:
    a = Session(store, session_id="a")
    b = Session(store, session_id="b")
    await a.append_message(T("pa", "user", "in a"))
    await b.append_message(T("b1", "user", "in b"))
    await b.append_message(T("b2", "user", "parent is in a"), "pa")
    assert ids(await b.get_history()) == ["b2"]


async def test_history_to_a_non_leaf_and_missing_leaf(store: SqliteStore) -> None:
    s = Session(store)
    await chain(s, 4)
    assert ids(await s.get_history("m1")) == ["m0", "m1"]
    assert await s.get_history("nope") == []
    assert await s.get_path_length("nope") == 0


async def test_empty_leaf_id_means_latest(store: SqliteStore) -> None:
    s = Session(store)
    await chain(s, 3)
    assert ids(await s.get_history("")) == ["m0", "m1", "m2"]


async def test_persistence_across_store_reopen(db_path: Path) -> None:
    async with await SqliteStore.open(db_path) as store:
        await chain(Session(store, session_id="p"), 5)
    async with await SqliteStore.open(db_path) as store:
        s = Session(store, session_id="p")
        assert ids(await s.get_history()) == [f"m{i}" for i in range(5)]
        leaf = await s.get_latest_leaf()
        assert leaf is not None and leaf.id == "m4"


async def test_a_new_session_object_sees_the_same_tip(store: SqliteStore) -> None:
    s = Session(store, session_id="x")
    await chain(s, 3)
    await s.append_message(T("b", "user", "branch"), "m0")
    other = Session(store).for_session("x")
    leaf = await other.get_latest_leaf()
    assert leaf is not None and leaf.id == "b"


async def test_latest_leaf_is_deterministic_on_equal_timestamps(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(time, "time", lambda: 1_700_000_000.0)
    s = Session(store)
    await s.append_message(T("r", "user", "root"))
    for name in ["x", "y", "z"]:
        await s.append_message(T(name, "assistant", name), "r")
    leaf = await s.get_latest_leaf()
    assert leaf is not None and leaf.id == "z"
    assert ids(await s.get_branches("r")) == ["x", "y", "z"]


# -- delete (departure: children re-attach to the deleted message's parent) -------------


async def test_delete_middle_message_reattaches_children(store: SqliteStore) -> None:
    s = Session(store)
    await chain(s, 5)
    assert await s.delete_messages(["m2"]) == ["m2"]
    # The original cut every path through m2 (history from m4 would be [m3, m4]).
    assert ids(await s.get_history()) == ["m0", "m1", "m3", "m4"]
    assert await s.get_path_length() == 4
    assert ids(await s.get_branches("m1")) == ["m3"]


async def test_delete_a_run_of_messages_and_a_branch_point(store: SqliteStore) -> None:
    s = Session(store)
    await chain(s, 3)
    await s.append_message(T("a", "assistant", "branch a"), "m2")
    await s.append_message(T("b", "assistant", "branch b"), "m2")
    assert await s.delete_messages(["m1", "m2", "missing"]) == ["m1", "m2"]
    assert ids(await s.get_branches("m0")) == ["a", "b"]
    assert ids(await s.get_history("a")) == ["m0", "a"]
    assert ids(await s.get_history()) == ["m0", "b"]


async def test_delete_a_root_makes_its_children_roots(store: SqliteStore) -> None:
    s = Session(store)
    await chain(s, 3)
    await s.delete_messages(["m0"])
    assert ids(await s.get_history()) == ["m1", "m2"]


async def test_delete_the_tip_moves_the_latest_leaf(store: SqliteStore) -> None:
    s = Session(store)
    await chain(s, 3)
    await s.delete_messages(["m2"])
    leaf = await s.get_latest_leaf()
    assert leaf is not None and leaf.id == "m1"
    await s.append_message(T("m3", "user", "next"))
    assert ids(await s.get_history()) == ["m0", "m1", "m3"]


async def test_delete_rejects_a_bare_string(store: SqliteStore) -> None:
    s = Session(store)
    with pytest.raises(InvalidInput):
        await s.delete_messages("m1")


# -- compaction overlays ------------------------------------------------------------------


async def test_overlay_replaces_its_range(store: SqliteStore) -> None:
    s = Session(store)
    await chain(s, 6)
    c = await s.add_compaction("Summary of 1-3", "m1", "m3")
    history = await s.get_history()
    assert ids(history) == ["m0", f"compaction_{c.id}", "m4", "m5"]
    assert history[1].role == "assistant"
    assert history[1].parts == [{"type": "text", "text": "Summary of 1-3"}]
    assert await s.get_path_length() == 6


async def test_newer_overlay_with_same_start_supersedes(store: SqliteStore) -> None:
    s = Session(store)
    await chain(s, 15)
    await s.add_compaction("summary 1", "m1", "m7")
    c2 = await s.add_compaction("summary 2", "m1", "m12")
    assert ids(await s.get_history()) == ["m0", f"compaction_{c2.id}", "m13", "m14"]
    assert len(await s.get_compactions()) == 2


async def test_insertion_order_breaks_timestamp_ties(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = Session(store)
    await chain(s, 6)
    monkeypatch.setattr(time, "time", lambda: 1_700_000_000.0)
    await s.add_compaction("older", "m1", "m4")
    c2 = await s.add_compaction("newer", "m1", "m3")
    history = await s.get_history()
    assert ids(history) == ["m0", f"compaction_{c2.id}", "m4", "m5"]
    assert [c.summary for c in await s.get_compactions()] == ["older", "newer"]


async def test_sibling_branch_overlays_stay_isolated(store: SqliteStore) -> None:
    s = Session(store)
    await chain(s, 3)  # m0 m1 m2
    for i in range(3, 6):
        await s.append_message(T(f"a{i}", "user", f"a {i}"))
    await s.append_message(T("b3", "user", "b 3"), "m2")
    for i in range(4, 6):
        await s.append_message(T(f"b{i}", "user", f"b {i}"))
    await s.add_compaction("Branch A summary 1", "m1", "a4")
    await s.add_compaction("Branch B summary", "m1", "b4")
    await s.add_compaction("Branch A summary 2", "m1", "a5")
    a = await s.get_history("a5")
    b = await s.get_history("b5")
    assert [m.parts[0]["text"] for m in a] == ["message 0", "Branch A summary 2"]
    assert [m.parts[0]["text"] for m in b] == ["message 0", "Branch B summary", "b 5"]


async def test_overlay_spans_history_of_any_size(store: SqliteStore) -> None:
    s = Session(store)
    await store.append_messages("", [Message(id=f"m{i}", role="user", parts=[]) for i in range(120)], None)
    c = await s.add_compaction("big", "m10", "m100")
    history = await s.get_history()
    assert len(history) == 120 - 91 + 1
    assert history[10].id == f"compaction_{c.id}"
    assert history[11].id == "m101"


async def test_overlays_are_scoped_to_their_session(store: SqliteStore) -> None:
    s1 = Session(store, session_id="s1")
    s2 = Session(store, session_id="s2")
    await chain(s1, 4)
    await chain(s2, 4)
    await s1.add_compaction("only s1", "m1", "m2")
    assert len(await s1.get_history()) == 3
    assert len(await s2.get_history()) == 4
    assert await s2.get_compactions() == []


async def test_overlay_on_deleted_anchor_stops_applying(store: SqliteStore) -> None:
    s = Session(store)
    await chain(s, 5)
    await s.add_compaction("sum", "m1", "m3")
    await s.delete_messages(["m1"])
    assert ids(await s.get_history()) == ["m0", "m2", "m3", "m4"]


# -- histories of any depth and size, corrupt rows ----------------------------------------


@pytest.mark.parametrize("n", [1, 50, 51, 120])
async def test_chunk_boundaries_are_invisible(store: SqliteStore, n: int) -> None:
    s = Session(store)
    await store.append_messages("", [Message(id=f"m{i}", role="user", parts=[]) for i in range(n)], None)
    assert ids(await s.get_history()) == [f"m{i}" for i in range(n)]
    assert await s.get_path_length() == n


async def test_selected_branch_across_a_long_path(store: SqliteStore) -> None:
    s = Session(store)
    await store.append_messages("", [Message(id=f"m{i}", role="user", parts=[]) for i in range(60)], None)
    await s.append_message(T("main-61", "user", "x"))
    await s.append_message(T("side-61", "user", "y"), "m59")
    assert ids(await s.get_history("main-61"))[-2:] == ["m59", "main-61"]
    assert len(await s.get_history("main-61")) == 61


async def test_no_silent_depth_cap(store: SqliteStore) -> None:
    # The original stopped walking at 10,001 rows; we walk the whole path.
    n = 12_345
    s = Session(store)
    await store.append_messages("", [Message(id=f"m{i}", role="user", parts=[]) for i in range(n)], None)
    history = await s.get_history()
    assert len(history) == n
    assert history[0].id == "m0" and history[-1].id == f"m{n - 1}"
    assert await s.get_path_length() == n


async def test_large_messages_round_trip(store: SqliteStore) -> None:
    s = Session(store)
    big = "x" * 200_000
    await s.append_message(T("big", "user", big))
    assert (await s.get_history())[0].parts[0]["text"] == big
    # Several multi-megabyte messages on one path.
    for i in range(4):
        await s.append_message(T(f"mb{i}", "assistant", chr(ord("a") + i) * 1_500_000 + "🙂"))
    history = await s.get_history()
    assert [len(m.parts[0]["text"]) for m in history] == [200_000] + [1_500_001] * 4
    assert history[-1].parts[0]["text"].endswith("d🙂")


async def test_corrupt_row_is_skipped(store: SqliteStore, db_path: Path) -> None:
    s = Session(store)
    await chain(s, 5)
    raw = sqlite3.connect(db_path)
    raw.execute("UPDATE messages SET content = '{not json' WHERE id = 'm2'")
    raw.execute("""UPDATE messages SET content = '{"id": "m3", "role": "user"}' WHERE id = 'm3'""")
    # Deflated rows (long messages) that do not inflate, or not to text.
    raw.execute("UPDATE messages SET content = X'00ff' WHERE id = 'm1'")
    raw.execute("UPDATE messages SET content = ? WHERE id = 'm4'", (zlib.compress(b"\xff\xfe"),))
    raw.commit()
    raw.close()
    assert ids(await s.get_history()) == ["m0"]
    assert await s.get_message("m2") is None
    assert await s.get_message("m1") is None
    assert await s.get_path_length() == 5
    # Search still answers; a damaged row's hit has no text, as a row of bad JSON's.
    hits = {h.id: h.content for h in await s.search("message")}
    assert hits["m0"] == "message 0" and hits.get("m1", "") == hits.get("m4", "") == ""


async def test_latest_leaf_returns_the_full_message(store: SqliteStore) -> None:
    s = Session(store)
    await s.append_message(
        {"id": "t", "role": "assistant", "parts": [{"type": "text", "text": "full"}], "x": 1}
    )
    leaf = await s.get_latest_leaf()
    assert leaf is not None
    assert leaf.to_dict() == {
        "id": "t",
        "role": "assistant",
        "parts": [{"type": "text", "text": "full"}],
        "x": 1,
    }


# -- isolation, ids per session -----------------------------------------------------------


async def test_sessions_are_isolated(store: SqliteStore) -> None:
    s1 = Session(store, session_id="s1")
    s2 = Session(store, session_id="s2")
    await chain(s1, 2)
    await chain(s2, 1, prefix="x")
    assert ids(await s1.get_history()) == ["m0", "m1"]
    assert ids(await s2.get_history()) == ["x0"]


async def test_same_message_id_in_two_sessions(store: SqliteStore) -> None:
    # Departure: the original's SQLite store keyed messages by id alone and threw here.
    x = Session(store, session_id="chat-x")
    y = Session(store, session_id="chat-y")
    assert await x.append_message(T("same-id", "user", "in x"))
    assert await y.append_message(T("same-id", "user", "in y"))
    mx, my = await x.get_message("same-id"), await y.get_message("same-id")
    assert mx is not None and mx.parts[0]["text"] == "in x"
    assert my is not None and my.parts[0]["text"] == "in y"
    await y.delete_messages(["same-id"])
    assert await x.get_message("same-id") is not None


# -- search -------------------------------------------------------------------------------


async def test_search_finds_text_parts_only(store: SqliteStore) -> None:
    s = Session(store)
    await s.append_message(T("m1", "user", "I love TypeScript"))
    await s.append_message(
        {
            "id": "m2",
            "role": "assistant",
            "parts": [
                {"type": "reasoning", "text": "TypeScript reasoning"},
                {
                    "type": "tool-x",
                    "toolCallId": "c",
                    "input": "TypeScript",
                    "output": "TypeScript",
                },
            ],
        }
    )
    results = await s.search("TypeScript")
    assert [r.id for r in results] == ["m1"]
    assert results[0].content == "I love TypeScript"
    assert results[0].session_id == ""


async def test_search_is_a_phrase_search_with_stemming(store: SqliteStore) -> None:
    s = Session(store)
    await s.append_message(T("m1", "user", "How do I configure the deployment pipeline?"))
    await s.append_message(T("m2", "user", "Running runs ran runner"))
    assert [r.id for r in await s.search("deployment pipeline")] == ["m1"]
    assert await s.search("pipeline deployment") == []
    assert [r.id for r in await s.search("run")] == ["m2"]


async def test_search_follows_updates_and_deletes(store: SqliteStore) -> None:
    s = Session(store)
    await s.append_message(T("m1", "user", "about cats"))
    await s.update_message(T("m1", "user", "about dogs"))
    assert await s.search("cats") == []
    assert [r.id for r in await s.search("dogs")] == ["m1"]
    await s.delete_messages(["m1"])
    assert await s.search("dogs") == []


@pytest.mark.parametrize(
    "query",
    [
        '"',
        '"foo',
        'foo"',
        "NEAR(",
        "NEAR(foo bar)",
        "*",
        "foo*",
        "^foo",
        "foo AND",
        "OR",
        "NOT foo",
        "body : foo",
        "sid:x",
        "{body}: foo",
        "(((",
        ")",
        "-",
        "+",
        "\\",
        "'",
        "%",
        "\x00",
        "foo\x00bar",
        "",
        "   ",
        "\ufeff",
        "🙂" * 100,
        "x" * 10_000,
        "a " * 500,
        '😀 AND 東京 OR "quoted" NEAR/3 col:word',
    ],
)
async def test_hostile_queries_never_raise(store: SqliteStore, query: str) -> None:
    s = Session(store)
    await s.append_message(T("m1", "user", 'foo "quoted" bar NEAR(baz) *star* AND OR NOT'))
    results = await s.search(query)
    assert isinstance(results, list)
    assert all(r.id == "m1" for r in results)


async def test_search_operators_are_literal_words(store: SqliteStore) -> None:
    s = Session(store)
    await s.append_message(T("m1", "user", 'foo "quoted" bar NEAR(baz) *star* AND OR NOT'))
    await s.append_message(T("m2", "user", "just foo"))
    assert [r.id for r in await s.search("NEAR")] == ["m1"]
    assert [r.id for r in await s.search("AND OR NOT")] == ["m1"]
    assert {r.id for r in await s.search("foo")} == {"m1", "m2"}
    assert await s.search("foo OR just") == []


async def test_search_limit_and_isolation(store: SqliteStore) -> None:
    a = Session(store, session_id="a")
    b = Session(store, session_id="b")
    for i in range(5):
        await a.append_message(T(f"a{i}", "user", f"deploy number {i}"))
    await b.append_message(T("b0", "user", "deploy elsewhere"))
    assert len(await a.search("deploy", limit=3)) == 3
    assert len(await a.search("deploy")) == 5
    assert [r.id for r in await b.search("deploy")] == ["b0"]
    assert await a.search("deploy", limit=0) == []


# -- bad input ----------------------------------------------------------------------------


async def test_bad_message_is_rejected_and_nothing_written(store: SqliteStore) -> None:
    s = Session(store)
    with pytest.raises(InvalidMessage) as info:
        await s.append_message({"id": "m1", "role": "user", "parts": [{"text": "no type"}]})
    assert info.value.field == "parts[0].type"
    with pytest.raises(InvalidMessage):
        await s.append_message({"role": "user", "parts": []})
    with pytest.raises(InvalidMessage):
        await s.update_message({"id": "m1", "role": 5, "parts": []})
    assert await s.get_history() == []
    assert await s.read_events() == []


async def test_bad_parent_and_ids_are_typed_errors(store: SqliteStore) -> None:
    s = Session(store)
    with pytest.raises(InvalidInput, match="parent_id"):
        await s.append_message(T("m1", "user", "x"), 42)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        await s.get_history(5)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        await s.delete_messages([1])  # type: ignore[list-item]
    with pytest.raises(InvalidInput):
        Session(store, session_id=None)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        await s.search(None)  # type: ignore[arg-type]


async def test_message_objects_are_accepted(store: SqliteStore) -> None:
    s = Session.create(store).for_session("objects")
    m = Message(id="m1", role="user", parts=[{"type": "text", "text": "hi"}], metadata={"k": 1})
    await s.append_message(m)
    assert await s.get_message("m1") == m
