"""SessionManager: registry, cross-session operations, departures, unknown ids."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import pytest

from hub import (
    InvalidInput,
    InvalidMessage,
    Message,
    SessionManager,
    SessionNotFound,
    SqliteStore,
    session_stream,
)
from protocol import Conflict
from tests.support.hubtest import text_message as T


def ids(messages: list[Message]) -> list[str]:
    return [m.id for m in messages]


@pytest.fixture
def manager(store: SqliteStore) -> SessionManager:
    return SessionManager(store)


async def test_create_and_get(manager: SessionManager) -> None:
    info = await manager.create("My Chat", model="gpt-x", source="web")
    assert info.name == "My Chat" and info.model == "gpt-x" and info.source == "web"
    assert info.parent_session_id is None and info.end_reason is None
    assert (info.input_tokens, info.output_tokens, info.estimated_cost) == (0, 0, 0.0)
    assert info.created_at == info.updated_at
    assert await manager.get(info.id) == info
    assert await manager.get("nope") is None


async def test_list_by_updated_at(manager: SessionManager) -> None:
    a = await manager.create("A")
    b = await manager.create("B")
    assert [i.name for i in await manager.list()] == ["B", "A"]
    await manager.append(a.id, T("m1", "user", "touch A"))
    assert [i.name for i in await manager.list()] == ["A", "B"]
    await manager.rename(b.id, "B2")
    assert [i.name for i in await manager.list()] == ["B2", "A"]


async def test_delete_removes_session_and_messages(manager: SessionManager, store: SqliteStore) -> None:
    info = await manager.create("doomed")
    await manager.append(info.id, T("m1", "user", "findable secret"))
    await manager.add_compaction(info.id, "sum", "m1", "m1")
    await manager.delete(info.id)
    assert await manager.get(info.id) is None
    assert await store.get_history(info.id) == []
    assert await store.get_compactions(info.id) == []
    assert await manager.search("secret") == []
    with pytest.raises(SessionNotFound):
        await manager.delete(info.id)


async def test_append_upsert_and_counts(manager: SessionManager) -> None:
    a = await manager.create("A")
    assert await manager.append(a.id, T("a-1", "user", "How do I deploy?")) == "a-1"
    assert await manager.append(a.id, T("a-2", "assistant", "Run deploy.")) == "a-2"
    assert await manager.upsert(a.id, T("a-2", "assistant", "Run deploy after checks.")) == "a-2"
    assert await manager.upsert(a.id, T("a-3", "user", "Thanks!")) == "a-3"
    history = await manager.get_history(a.id)
    assert ids(history) == ["a-1", "a-2", "a-3"]
    assert history[1].parts[0]["text"] == "Run deploy after checks."
    assert await manager.get_message_count(a.id) == 3
    assert ids(await manager.get_branches(a.id, "a-1")) == ["a-2"]


async def test_append_all_chains_from_the_latest_leaf(manager: SessionManager) -> None:
    # Departure: the original's appendAll started a new root when no parent was given.
    a = await manager.create("A")
    await manager.append(a.id, T("x", "user", "existing"))
    last = await manager.append_all(a.id, [T("b-1", "user", "one"), T("b-2", "assistant", "two")])
    assert last == "b-2"
    assert ids(await manager.get_history(a.id)) == ["x", "b-1", "b-2"]
    await manager.append_all(a.id, [T("r-1", "user", "root")], None)
    assert ids(await manager.get_history(a.id)) == ["r-1"]
    await manager.append_all(a.id, [T("c-1", "user", "after x")], "x")
    assert ids(await manager.get_history(a.id)) == ["x", "c-1"]
    assert await manager.append_all(a.id, []) == "c-1"
    assert await manager.append_all(a.id, [], "x") == "x"
    assert await manager.append_all(a.id, [], None) is None


async def test_append_all_is_one_transaction(manager: SessionManager) -> None:
    a = await manager.create("A")
    with pytest.raises(InvalidInput):
        await manager.append_all(a.id, [T("ok", "user", "x"), {"id": "bad"}])
    assert await manager.get_history(a.id) == []
    with pytest.raises(InvalidInput):
        await manager.append_all(a.id, T("single", "user", "not a list"))  # type: ignore[arg-type]


async def test_clear_and_delete_messages_target_one_session(manager: SessionManager) -> None:
    s1 = await manager.create("s1")
    s2 = await manager.create("s2")
    await manager.append(s1.id, T("dm-a1", "user", "a1"))
    await manager.append(s1.id, T("dm-a2", "assistant", "a2"))
    await manager.append(s2.id, T("dm-b1", "user", "b1"))
    await manager.delete_messages(s1.id, ["dm-a2"])
    assert ids(await manager.get_history(s1.id)) == ["dm-a1"]
    assert ids(await manager.get_history(s2.id)) == ["dm-b1"]
    await manager.clear_messages(s1.id)
    assert await manager.get_history(s1.id) == []
    assert ids(await manager.get_history(s2.id)) == ["dm-b1"]


async def test_fork_keeps_ids_and_applicable_overlays(manager: SessionManager) -> None:
    src = await manager.create("source", model="gpt")
    await manager.append_all(src.id, [T(f"m{i}", "user", f"message {i}") for i in range(8)])
    await manager.append(src.id, T("side", "assistant", "side branch"), "m3")
    on_path = await manager.add_compaction(src.id, "sum 1-2", "m1", "m2")
    await manager.add_compaction(src.id, "sum 4-6 (beyond the fork point)", "m4", "m6")
    await manager.add_compaction(src.id, "sum to side (other branch)", "m2", "side")
    fork = await manager.fork(src.id, "m5", "forked")
    assert fork.parent_session_id == src.id and fork.name == "forked"
    assert fork.updated_at >= fork.created_at
    history = await manager.get_history(fork.id)
    # Departure: the original re-id'd the copies and flattened overlays into messages.
    assert ids(history) == ["m0", f"compaction_{on_path.id}", "m3", "m4", "m5"]
    assert await manager.get_message_count(fork.id) == 6
    assert [c.id for c in await manager.get_compactions(fork.id)] == [on_path.id]
    assert next(i.id for i in await manager.list()) == fork.id
    # Source untouched.
    assert len(await manager.get_compactions(src.id)) == 3


async def test_fork_at_unknown_message_is_empty(manager: SessionManager) -> None:
    src = await manager.create("source")
    await manager.append(src.id, T("m1", "user", "x"))
    fork = await manager.fork(src.id, "nope", "empty fork")
    assert await manager.get_history(fork.id) == []


async def test_compact_and_split(manager: SessionManager) -> None:
    a = await manager.create("Chat A", model="gpt-x", source="web")
    await manager.append(a.id, T("a-1", "user", "hi"))
    new = await manager.compact_and_split(a.id, "We discussed deploying workers.", "A (continued)")
    assert new.name == "A (continued)" and new.parent_session_id == a.id
    assert (new.model, new.source) == ("gpt-x", "web")
    old = await manager.get(a.id)
    assert old is not None and old.end_reason == "compaction"
    history = await manager.get_history(new.id)
    assert len(history) == 1 and history[0].role == "assistant"
    assert history[0].parts == [
        {
            "type": "text",
            "text": "[Context from previous session]\n\nWe discussed deploying workers.",
        }
    ]
    default = await manager.compact_and_split(new.id, "again")
    assert default.name == "A (continued)"


async def test_end_marks_the_session_ended_and_logs_it_like_a_split(
    manager: SessionManager, store: SqliteStore
) -> None:
    a = await manager.create("A", model="gpt-x")
    other = await manager.create("B")
    await manager.append(a.id, T("a-1", "user", "hi"))
    before = await manager.get(a.id)
    assert before is not None and before.end_reason is None
    ended = await manager.end(a.id, "done by the user")
    assert ended.end_reason == "done by the user" and ended.name == "A" and ended.model == "gpt-x"
    assert ended.updated_at >= before.updated_at
    assert await manager.get(a.id) == ended
    # Ended sessions stay listed (first: ending touched it) and keep their messages.
    assert [s.id for s in await manager.list()] == [a.id, other.id]
    assert ids(await manager.get_history(a.id)) == ["a-1"]
    registry = await manager.read_registry_events()
    assert registry[-1].type == "session.ended" and registry[-1].session_id == a.id
    assert registry[-1].data == {"session": msgspec.to_builtins(ended)}
    own = await store.read_events(session_stream(a.id))
    assert own[-1].type == "session.ended" and own[-1].data == registry[-1].data
    # The other session is untouched; the default reason is "ended".
    assert (await manager.end(other.id)).end_reason == "ended"


async def test_ending_an_ended_session_is_a_conflict_and_writes_nothing(
    manager: SessionManager, store: SqliteStore
) -> None:
    a = await manager.create("A")
    await manager.end(a.id, "first")
    split = await manager.create("S")
    await manager.compact_and_split(split.id, "summary")
    registry = await manager.read_registry_events()
    for sid, reason in ((a.id, "first"), (split.id, "compaction")):
        own = await store.read_events(session_stream(sid))
        with pytest.raises(Conflict, match=f"already ended \\({reason}\\)") as info:
            await manager.end(sid, "second")
        assert info.value.code == "conflict"
        again = await manager.get(sid)
        assert again is not None and again.end_reason == reason
        assert await store.read_events(session_stream(sid)) == own
    assert await manager.read_registry_events() == registry


async def test_concurrent_ends_end_it_once(manager: SessionManager, store: SqliteStore) -> None:
    a = await manager.create("A")
    results = await asyncio.gather(*(manager.end(a.id, f"r{i}") for i in range(6)), return_exceptions=True)
    won = [r for r in results if not isinstance(r, BaseException)]
    assert len(won) == 1 and all(isinstance(r, Conflict) for r in results if r not in won)
    own = await store.read_events(session_stream(a.id))
    assert [e.type for e in own].count("session.ended") == 1
    assert own[-1].data["session"]["end_reason"] == won[0].end_reason


async def test_splitting_an_ended_session_is_a_conflict_and_writes_nothing(
    manager: SessionManager, store: SqliteStore
) -> None:
    """A split used to overwrite the reason of a session that had ended (and to split an
    already split one again, leaving two continuations)."""
    a = await manager.create("A")
    await manager.end(a.id, "done by the user")
    split = await manager.create("S")
    await manager.compact_and_split(split.id, "summary")
    listed = await manager.list()
    registry = await manager.read_registry_events()
    for sid, reason in ((a.id, "done by the user"), (split.id, "compaction")):
        own = await store.read_events(session_stream(sid))
        before = await manager.get(sid)
        with pytest.raises(Conflict, match=f"already ended \\({reason}\\)") as info:
            await manager.compact_and_split(sid, "a second summary", "continued")
        assert info.value.code == "conflict"
        assert await manager.get(sid) == before  # the reason and updated_at are kept
        assert await store.read_events(session_stream(sid)) == own
    # No continuation was created, and the registry logged nothing.
    assert await manager.list() == listed
    assert await manager.read_registry_events() == registry


async def test_a_split_racing_an_end_ends_the_session_once(manager: SessionManager) -> None:
    a = await manager.create("A")
    racers = [manager.compact_and_split(a.id, f"summary {i}") for i in range(3)]
    racers += [manager.end(a.id, f"r{i}") for i in range(3)]
    results = await asyncio.gather(*racers, return_exceptions=True)
    won = [r for r in results if not isinstance(r, BaseException)]
    assert len(won) == 1 and all(isinstance(r, Conflict) for r in results if r not in won)
    ended = await manager.get(a.id)
    assert ended is not None and ended.end_reason is not None
    continuations = [s for s in await manager.list() if s.parent_session_id == a.id]
    assert len(continuations) == (1 if ended.end_reason == "compaction" else 0)


@pytest.mark.parametrize(
    ("reason", "problem"),
    [
        ("", "must not be empty"),
        ("   ", "must not be empty"),
        ("x" * 201, "at most 200 characters, got 201"),
        (5, "must be a string, got int"),
        (None, "must be a string, got NoneType"),
    ],
    ids=["empty", "blank", "too-long", "int", "none"],
)
async def test_a_bad_end_reason_is_invalid_and_the_session_stays_open(
    manager: SessionManager, reason: Any, problem: str
) -> None:
    a = await manager.create("A")
    events = await manager.read_registry_events()
    with pytest.raises(InvalidInput, match=problem):
        await manager.end(a.id, reason)
    after = await manager.get(a.id)
    assert after is not None and after.end_reason is None
    assert await manager.read_registry_events() == events
    assert (await manager.end(a.id, "y" * 200)).end_reason == "y" * 200


async def test_add_usage_accumulates(manager: SessionManager) -> None:
    a = await manager.create("A")
    await manager.add_usage(a.id, 100, 50, 0.0123)
    info = await manager.add_usage(a.id, 1, 2, 0.5)
    assert (info.input_tokens, info.output_tokens) == (101, 52)
    assert info.estimated_cost == pytest.approx(0.5123)
    with pytest.raises(InvalidInput):
        await manager.add_usage(a.id, "many", 0, 0)  # type: ignore[arg-type]


async def test_concurrent_usage_is_not_lost(manager: SessionManager) -> None:
    a = await manager.create("A")
    await asyncio.gather(*(manager.add_usage(a.id, 1, 2, 0.5) for _ in range(50)))
    info = await manager.get(a.id)
    assert info is not None and (info.input_tokens, info.output_tokens) == (50, 100)
    assert info.estimated_cost == pytest.approx(25.0)


async def test_cross_session_search(manager: SessionManager, store: SqliteStore) -> None:
    a = await manager.create("A")
    b = await manager.create("B")
    await manager.append(a.id, T("a1", "user", "I like TypeScript"))
    await manager.append(b.id, T("b1", "user", "Deploying TypeScript on Friday?"))
    await manager.append(b.id, T("b2", "assistant", "Never deploy on Friday."))
    hits = await manager.search("TypeScript")
    assert {(h.id, h.session_id) for h in hits} == {("a1", a.id), ("b1", b.id)}
    assert all(h.created_at is not None for h in hits)
    # Word-AND, stemmed, any order.
    assert {h.id for h in await manager.search("friday deploy")} == {"b1", "b2"}
    assert len(await manager.search("friday", limit=1)) == 1
    for hostile in ['"foo', "NEAR(", "*", "", "   ", "wrangler OR friday"]:
        assert await manager.search(hostile) == []
    # Unregistered namespaces are not part of the manager's world.
    await store.append_messages(
        "not-registered",
        [Message(id="n", role="user", parts=[{"type": "text", "text": "TypeScript"}])],
    )
    assert "n" not in {h.id for h in await manager.search("TypeScript")}


async def test_get_session_is_cached(manager: SessionManager) -> None:
    a = await manager.create("A")
    assert manager.get_session(a.id) is manager.get_session(a.id)
    await manager.get_session(a.id).append_message(T("m1", "user", "x"))
    assert ids(await manager.get_history(a.id)) == ["m1"]


UNKNOWN = "no-such-session"

OPS: list[tuple[str, Callable[[SessionManager], Awaitable[Any]]]] = [
    ("rename", lambda m: m.rename(UNKNOWN, "x")),
    ("delete", lambda m: m.delete(UNKNOWN)),
    ("end", lambda m: m.end(UNKNOWN)),
    ("append", lambda m: m.append(UNKNOWN, T("m", "user", "x"))),
    ("upsert", lambda m: m.upsert(UNKNOWN, T("m", "user", "x"))),
    ("append_all", lambda m: m.append_all(UNKNOWN, [T("m", "user", "x")])),
    ("get_history", lambda m: m.get_history(UNKNOWN)),
    ("get_branches", lambda m: m.get_branches(UNKNOWN, "m")),
    ("get_message_count", lambda m: m.get_message_count(UNKNOWN)),
    ("clear_messages", lambda m: m.clear_messages(UNKNOWN)),
    ("delete_messages", lambda m: m.delete_messages(UNKNOWN, ["m"])),
    ("fork", lambda m: m.fork(UNKNOWN, "m", "f")),
    ("add_compaction", lambda m: m.add_compaction(UNKNOWN, "s", "a", "b")),
    ("get_compactions", lambda m: m.get_compactions(UNKNOWN)),
    ("compact_and_split", lambda m: m.compact_and_split(UNKNOWN, "s")),
    ("add_usage", lambda m: m.add_usage(UNKNOWN, 1, 1, 0.1)),
]


@pytest.mark.parametrize(("name", "op"), OPS, ids=[n for n, _ in OPS])
async def test_unknown_session_raises_session_not_found(
    manager: SessionManager,
    store: SqliteStore,
    name: str,
    op: Callable[[SessionManager], Awaitable[Any]],
) -> None:
    with pytest.raises(SessionNotFound) as info:
        await op(manager)
    assert info.value.session_id == UNKNOWN and info.value.code == "not_found"
    # Nothing half-written: no messages, no sessions, no events.
    assert await store.get_path(UNKNOWN) == []
    assert await manager.list() == []
    assert await manager.read_registry_events() == []


async def test_bad_arguments_are_typed_errors(manager: SessionManager) -> None:
    with pytest.raises(InvalidInput):
        await manager.create(None)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        await manager.create("x", model=3)  # type: ignore[arg-type]
    a = await manager.create("A")
    with pytest.raises(InvalidInput):
        await manager.rename(a.id, 7)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        await manager.fork(a.id, None, "f")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        await manager.get_history(None)  # type: ignore[arg-type]


# -- bad numbers and values (issue 12) -------------------------------------------------------

INT64_MAX = 2**63 - 1


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        ((2**63, 0, 0.0), "input_tokens must fit in 64 bits"),
        ((0, -(2**63) - 1, 0.0), "output_tokens must fit in 64 bits"),
        ((0, 0, float("nan")), "cost must be finite"),
        ((0, 0, float("inf")), "cost must be finite"),
        ((float("inf"), 0, 0.0), "input_tokens must be finite"),
        ((0, 0, 10**400), "cost must be finite"),
    ],
)
async def test_add_usage_refuses_out_of_range_numbers(
    manager: SessionManager, args: tuple[Any, Any, Any], problem: str
) -> None:
    a = await manager.create("A")
    with pytest.raises(InvalidInput, match=problem):
        await manager.add_usage(a.id, *args)
    assert await manager.get(a.id) == a  # nothing added, updated_at untouched


async def test_add_usage_refuses_a_total_that_would_overflow(manager: SessionManager) -> None:
    """The issue's poison: twice 1e308 (an infinity, sent as null) and twice 2**62 (beyond
    int64) broke list() and get() for every client. The second call is refused instead."""
    a = await manager.create("A")
    first = await manager.add_usage(a.id, 2**62, 2**62, 1e308)
    for args in ((2**62, 0, 0.0), (0, 2**62, 0.0), (0, 0, 1e308)):
        with pytest.raises(InvalidInput, match="nothing was added"):
            await manager.add_usage(a.id, *args)
    assert await manager.get(a.id) == first
    assert await manager.list() == [first]
    # Up to the bound exactly is fine.
    top = await manager.add_usage(a.id, INT64_MAX - 2**62, 0, 0.0)
    assert top.input_tokens == INT64_MAX


async def test_concurrent_usage_cannot_overflow_between_checks(manager: SessionManager) -> None:
    """Each call alone fits; any two together do not. The check runs on the row the write
    transaction holds, so exactly one wins whatever the interleaving."""
    a = await manager.create("A")
    results = await asyncio.gather(
        *(manager.add_usage(a.id, 2**62 + 1, 0, 0.0) for _ in range(8)), return_exceptions=True
    )
    assert sum(not isinstance(r, BaseException) for r in results) == 1
    assert all(isinstance(r, InvalidInput) for r in results if isinstance(r, BaseException))
    info = await manager.get(a.id)
    assert info is not None and info.input_tokens == 2**62 + 1


@pytest.mark.parametrize("limit", [2**63, 2**64 + 1, -(2**63) - 1])
async def test_search_limit_beyond_int64_is_invalid_not_overflow(manager: SessionManager, limit: int) -> None:
    a = await manager.create("A")
    await manager.append(a.id, T("m1", "user", "hello"))
    with pytest.raises(InvalidInput, match="limit must be at most"):
        await manager.search("hello", limit=limit)
    with pytest.raises(InvalidInput, match="limit must be at most"):
        await manager.get_session(a.id).search("hello", limit=limit)
    with pytest.raises(InvalidInput, match="limit must be an integer"):
        await manager.search("hello", limit="10")  # type: ignore[arg-type]
    assert len(await manager.search("hello", limit=INT64_MAX)) == 1


async def test_a_non_string_session_id_is_invalid_on_every_store(manager: SessionManager) -> None:
    # SQLite used to look 5 up and say SessionNotFound, Postgres raised a TypeError.
    calls: list[Callable[[], Awaitable[Any]]] = [
        lambda: manager.append(5, T("m1", "user", "x")),  # type: ignore[arg-type]
        lambda: manager.append_all(5, [T("m1", "user", "x")]),  # type: ignore[arg-type]
        lambda: manager.upsert(None, T("m1", "user", "x")),  # type: ignore[arg-type]
        lambda: manager.get(5),  # type: ignore[arg-type]
        lambda: manager.rename(5, "x"),  # type: ignore[arg-type]
        lambda: manager.delete(b"id"),  # type: ignore[arg-type]
        lambda: manager.end(5),  # type: ignore[arg-type]
        lambda: manager.add_usage(5, 1, 1, 0.0),  # type: ignore[arg-type]
        lambda: manager.add_compaction(5, "s", "a", "b"),  # type: ignore[arg-type]
        lambda: manager.delete_messages(5, ["a"]),  # type: ignore[arg-type]
        lambda: manager.clear_messages(5),  # type: ignore[arg-type]
        lambda: manager.fork(5, "m1", "f"),  # type: ignore[arg-type]
        lambda: manager.compact_and_split(5, "s"),  # type: ignore[arg-type]
    ]
    for call in calls:
        with pytest.raises(InvalidInput, match="session id must be a string"):
            await call()


class Opaque:
    pass


async def test_messages_json_cannot_carry_are_invalid_and_nothing_is_written(
    manager: SessionManager,
) -> None:
    a = await manager.create("A")
    await manager.append(a.id, T("m0", "user", "kept"))
    loop: dict[str, Any] = {"type": "text", "text": "x"}
    loop["self"] = loop
    bad_parts: list[tuple[dict[str, Any], str]] = [
        ({"type": "text", "text": "x", "obj": Opaque()}, "cannot be stored as JSON"),  # was TypeError
        (loop, "nests deeper"),  # was RecursionError
        ({"type": "text", "text": "lone \ud800 surrogate"}, "cannot be stored as JSON"),  # UnicodeEncodeError
        ({"type": "text", "text": "x", "score": float("nan")}, "NaN or Infinity"),  # was stored as null
    ]
    for part, problem in bad_parts:
        message = {"id": "bad", "role": "user", "parts": [part]}
        with pytest.raises(InvalidMessage, match=problem):
            await manager.append(a.id, message)
        with pytest.raises(InvalidMessage, match=problem):
            await manager.append_all(a.id, [T("ok", "user", "fine"), message])
        with pytest.raises(InvalidMessage, match=problem):
            await manager.upsert(a.id, {**message, "id": "m0"})
    assert [m.to_dict() for m in await manager.get_history(a.id)] == [T("m0", "user", "kept")]


async def test_a_lone_surrogate_in_any_text_argument_is_invalid(manager: SessionManager) -> None:
    a = await manager.create("A")
    for call in (
        lambda: manager.create("bad \udfff name"),
        lambda: manager.rename(a.id, "bad \udfff name"),
        lambda: manager.end(a.id, "bad \udfff reason"),
        lambda: manager.get("\ud800"),
        lambda: manager.append("\ud800", T("m1", "user", "x")),
    ):
        with pytest.raises(InvalidInput):
            await call()
    assert [i.id for i in await manager.list()] == [a.id]


async def test_dates_outside_the_calendar_are_invalid(manager: SessionManager) -> None:
    a = await manager.create("A")
    early = {**T("m1", "user", "x"), "createdAt": "0001-01-01T00:30:00+01:00"}
    with pytest.raises(InvalidMessage, match="createdAt"):
        await manager.append(a.id, early)
    # An early but valid year is stored and read back (it used to vanish on read).
    year5 = {**T("m2", "user", "x"), "createdAt": "0005-01-01T00:30:00.000Z"}
    await manager.append(a.id, year5)
    assert [m.to_dict() for m in await manager.get_history(a.id)] == [year5]
