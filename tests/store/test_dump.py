"""Export and import (hub/dump.py): a lossless round trip on each store and between them,
the refusals (an existing session, a bad line: its number, nothing written), the events an
import logs, the command line, and the UIMessage source (the OpenAI Agents source is
tests/apps/test_importers.py)."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from clients import HubClient, HubError
from hub import REGISTRY, PostgresStore, SessionManager, SqliteStore, session_stream
from hub.auth import issue_token
from hub.dump import DumpError, export_lines, from_ui_messages, import_dumps, import_lines, parse_dump
from hub.server import HubConfig, create_app, ops
from hub.server.ops import DUMP_BATCH_BYTES
from hub.store.base import Store, context_key
from protocol import Conflict, InvalidInput, SessionNotFound
from tests.apps.test_cli import one_line, run
from tests.support import dumps
from tests.support.dumps import bad_dumps
from tests.support.hubtest import served, text


async def rich_session(store: Store) -> list[str]:
    """Two sessions: one with branches, an overlay, usage, context rows and a frozen
    prompt; its fork. Returns their ids."""
    manager = SessionManager(store)
    sid = (await manager.create("rich", model="m1", source="tests")).id
    await manager.append_all(sid, [text(f"a{i}", f"first path {i}") for i in range(4)])
    await manager.append(sid, text("b1", "a branch"), "a1")
    await manager.append(
        sid,
        {
            "id": "b2",
            "role": "assistant",
            "parts": [{"type": "reasoning", "text": "hm"}],
            "metadata": {"k": [1, 2.5, None]},
            "createdAt": "2026-01-02T03:04:05.678Z",
        },
    )
    await manager.add_compaction(sid, "summary of a0..a2", "a0", "a2")
    await manager.add_usage(sid, 10, 20, 0.5)
    await store.set_context_value(context_key("memory", sid), "remembered")
    await store.set_context_value(context_key("_system_prompt", sid), "You are frozen.")
    fork = await manager.fork(sid, "a2", "the fork")
    return [sid, fork.id]


async def export_all(store: Store) -> list[str]:
    return [line async for line in export_lines(store)]


async def test_export_import_export_is_identical(store: Store, tmp_path: Path) -> None:
    await rich_session(store)
    first = await export_all(store)
    header = json.loads(first[0])
    assert header == {"sessionhub_dump": 1, "sessions": 2}
    kinds = [json.loads(line)["type"] for line in first[1:]]
    assert kinds.count("session") == 2 and kinds.count("end") == 2 and kinds.count("compaction") == 2
    async with await SqliteStore.open(tmp_path / "copy.db") as copy:
        result = await import_lines(copy, first)
        assert len(result.sessions) == 2
        assert await export_all(copy) == first
        # What was imported reads as the original does.
        for sid in result.sessions:
            assert await copy.get_history(sid) == await store.get_history(sid)
            assert await copy.get_session(sid) == await store.get_session(sid)
        assert await copy.get_context_value(context_key("memory", result.sessions[0])) == "remembered"


async def test_sqlite_to_postgres_and_back(tmp_path: Path, pg_dsn: str, pg_schema: str) -> None:
    async with await SqliteStore.open(tmp_path / "a.db") as a:
        await rich_session(a)
        original = await export_all(a)
    pg = await PostgresStore.connect(pg_dsn, server_settings={"search_path": pg_schema})
    try:
        await import_lines(pg, original)
        via_pg = await export_all(pg)
    finally:
        await pg.close()
    assert via_pg == original
    async with await SqliteStore.open(tmp_path / "b.db") as b:
        await import_lines(b, via_pg)
        assert await export_all(b) == original


async def test_a_session_exports_only_its_own_context_blocks(store: Store) -> None:
    # Keys are `<label>_<session id>`: the key of label "x" in session "a_b" also ends in
    # "_b". It belongs to "a_b" (the longest id it ends with that exists), not to "b".
    for sid in ("b", "a_b"):
        await store.create_session(sid, session_id=sid)
    await store.set_context_value(context_key("x", "a_b"), "a_b's")
    await store.set_context_value(context_key("memory", "b"), "b's")
    await store.set_context_value(context_key("notes_c", "b"), "b's too")  # no session "c_b"
    lines = [json.loads(line) for line in await export_all(store)]
    dumps = {d["session"]["id"]: d for d in lines if d.get("type") == "session"}
    assert dumps["b"]["context"] == {"memory": "b's", "notes_c": "b's too"}
    assert dumps["a_b"]["context"] == {"x": "a_b's"}


async def test_an_existing_session_is_refused_unless_replace(store: Store) -> None:
    ids = await rich_session(store)
    lines = await export_all(store)
    manager = SessionManager(store)
    await manager.append(ids[0], text("extra", "written after the export"))
    with pytest.raises(Conflict, match="already exists"):
        await import_lines(store, lines)
    assert "extra" in [m.id for m in await manager.get_history(ids[0])]
    await import_lines(store, lines, replace=True)
    assert await export_all(store) == lines


async def test_an_import_logs_what_a_subscriber_needs(store: Store) -> None:
    await rich_session(store)
    lines = await export_all(store)
    async with await SqliteStore.open(":memory:") as copy:
        result = await import_lines(copy, lines)
        sid = result.sessions[0]
        types = [e.type for e in await copy.read_events(session_stream(sid))]
        assert types[0] == "session.created"
        assert types.count("message.appended") == 6  # a0..a3, b1, b2: every branch
        assert types[-1] == "compaction.added"
        await import_lines(copy, lines, replace=True)
        types = [e.type for e in await copy.read_events(session_stream(sid))]
        assert types[-9:] == [
            "messages.cleared",
            "session.renamed",
            *["message.appended"] * 6,
            "compaction.added",
        ]


@pytest.mark.parametrize(
    ("mutate", "line", "says"),
    [
        (lambda ls: ['{"nope": 1}', *ls[1:]], 1, "not a sessionhub dump"),
        (lambda ls: ['{"sessionhub_dump": 9}', *ls[1:]], 1, "dump version 9"),
        (lambda ls: [*ls[:3], "{not json", *ls[3:]], 4, "not JSON"),
        (lambda ls: [*ls[:3], ls[3].replace('"role":', '"rolex":'), *ls[4:]], 4, "bad message"),
        (
            lambda ls: [*ls[:3], ls[3].replace('"parent_id":"a0"', '"parent_id":"zz"'), *ls[4:]],
            4,
            "not an earlier",
        ),
        (lambda ls: ls[:-1], None, "truncated"),
    ],
)
async def test_a_bad_line_stops_the_import_with_its_number_and_writes_nothing(
    store: Store, mutate: object, line: int | None, says: str
) -> None:
    await rich_session(store)
    lines = await export_all(store)
    broken = mutate(lines)  # type: ignore[operator]
    async with await SqliteStore.open(":memory:") as copy:
        with pytest.raises(DumpError, match=says) as error:
            await import_lines(copy, broken)
        if line is not None:
            assert error.value.line == line
        assert await copy.list_sessions() == []


# -- the command line --------------------------------------------------------------------------


async def test_export_and_import_commands(tmp_path: Path) -> None:
    src, dst = tmp_path / "src.db", tmp_path / "dst.db"
    async with await SqliteStore.open(src) as s:
        ids = await rich_session(s)
    exported = await asyncio.to_thread(run, "export", "--db", str(src))
    assert exported.returncode == 0, exported.stderr
    dump = tmp_path / "dump.jsonl"
    dump.write_text(exported.stdout)
    done = await asyncio.to_thread(run, "import", str(dump), "--db", str(dst))
    assert (done.returncode, done.stdout.strip()) == (0, "imported 2 sessions, 9 messages"), done.stderr
    again = await asyncio.to_thread(run, "export", "--db", str(dst))
    assert again.stdout == exported.stdout
    one = await asyncio.to_thread(run, "export", ids[1], "--db", str(dst))
    assert json.loads(one.stdout.splitlines()[0])["sessions"] == 1
    refused = await asyncio.to_thread(run, "import", str(dump), "--db", str(dst))
    assert refused.returncode == 7 and "already exists" in one_line(refused)
    assert (await asyncio.to_thread(run, "import", str(dump), "--db", str(dst), "--replace")).returncode == 0
    missing = await asyncio.to_thread(run, "export", "no-such-session", "--db", str(dst))
    assert missing.returncode == 5 and "no-such-session" in one_line(missing)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(exported.stdout.replace('"type":"message"', '"type":"massage"', 1))
    failed = await asyncio.to_thread(run, "import", str(bad), "--db", str(tmp_path / "empty.db"))
    assert failed.returncode == 2 and "line 3: unknown line type 'massage'" in one_line(failed)


def test_import_from_ui_messages(tmp_path: Path) -> None:
    file = tmp_path / "chat.json"
    file.write_text(json.dumps([text("u1", "hello"), {**text("a1", "hi there"), "role": "assistant"}]))
    db = tmp_path / "hub.db"
    assert run("import", str(file), "--from", "ui-messages", "--db", str(db)).returncode == 2
    done = run("import", str(file), "--from", "ui-messages", "--session", "chat-1", "--db", str(db))
    assert done.stdout.strip() == "imported 1 sessions, 2 messages", done.stderr

    async def check() -> None:
        async with await SqliteStore.open(db) as s:
            history = await s.get_history("chat-1")
            assert [m.id for m in history] == ["u1", "a1"]
            assert (await s.get_session("chat-1")).source == "ui-messages"  # type: ignore[union-attr]

    asyncio.run(check())
    dump = from_ui_messages(file.read_text(), "x")
    assert [m.parent_id for m in dump.messages] == [None, "u1"]


# -- over the socket (admin tokens; hub/server/ops.py) -----------------------------------------

SECRET = "a-test-secret-that-is-long-enough-for-hs256"


async def test_export_and_import_over_the_socket(store: Store, tmp_path: Path) -> None:
    await rich_session(store)
    expected = await export_all(store)
    async with served(manager=SessionManager(store)) as h, HubClient(h.ws_url, open_timeout=5) as client:
        assert [line async for line in client.sessions.export()] == expected
        one = json.loads(expected[1])["session"]["id"]
        assert [line async for line in client.sessions.export([one])] == [
            line async for line in export_lines(store, [one])
        ]
        with pytest.raises(SessionNotFound):
            [line async for line in client.sessions.export(["nobody"])]
    async with await SqliteStore.open(tmp_path / "empty.db") as empty:
        async with served(manager=SessionManager(empty)) as h, HubClient(h.ws_url, open_timeout=5) as client:
            result = await client.sessions.import_(line + "\n" for line in expected)
            assert len(result["sessions"]) == 2 and result["messages"] > 0
            assert [line async for line in client.sessions.export()] == expected
            # Like the CLI: over existing sessions only with replace.
            with pytest.raises(Conflict):
                await client.sessions.import_(expected)
            assert (await client.sessions.import_(expected, replace=True))["sessions"] == result["sessions"]
        assert await export_all(empty) == expected


async def test_export_and_import_need_admin_on_every_session(store: Store) -> None:
    await rich_session(store)
    lines = await export_all(store)
    app = create_app(manager=SessionManager(store), config=HubConfig(auth_secret=SECRET))
    async with served(app=app) as h:
        for scopes in ({"*": "write"}, {json.loads(lines[1])["session"]["id"]: "admin"}):
            token = issue_token(SECRET, scopes)
            async with HubClient(h.ws_url, token=token, open_timeout=5) as client:
                with pytest.raises(HubError) as refused:
                    [line async for line in client.sessions.export()]
                assert refused.value.code == "forbidden"
                with pytest.raises(HubError) as refused:
                    await client.sessions.import_(lines, replace=True)
                assert refused.value.code == "forbidden"
        async with HubClient(h.ws_url, token=issue_token(SECRET, {"*": "admin"}), open_timeout=5) as client:
            assert [line async for line in client.sessions.export()] == lines


async def big_store(path: Path) -> SqliteStore:
    """About 3 MB of dump: many ``dump`` frames and ``import`` chunks."""
    store = await SqliteStore.open(path)
    manager = SessionManager(store)
    for s in range(3):
        sid = (await manager.create(f"big {s}")).id
        for batch in range(10):
            await manager.append_all(
                sid, [text(f"m{batch}-{i}", f"{s} {i} " + "x" * 3500) for i in range(32)]
            )
    return store


async def test_a_dump_larger_than_one_frame_goes_through_in_many(tmp_path: Path) -> None:
    async with await big_store(tmp_path / "big.db") as store:
        expected = await export_all(store)
        async with served(manager=SessionManager(store)) as h:
            async with h.client() as raw:  # the frames themselves
                rid = await raw.send("export")
                reply = await raw.answer(rid)
            frames = [fr for fr in raw.received if fr["frame"] == "dump"]
            assert reply["result"] == {"sessions": 3, "lines": len(expected)}
            assert len(frames) >= 10 and all(fr["id"] == rid for fr in frames)
            assert [line for fr in frames for line in fr["lines"]] == expected
            assert all(len(json.dumps(fr)) < DUMP_BATCH_BYTES + 4096 for fr in frames)
        # Three times the frame limit: one frame could not hold it; the client sends chunks.
        assert sum(len(line) for line in expected) > 3 * HubConfig().max_frame_bytes
        async with (
            await SqliteStore.open(tmp_path / "copy.db") as copy,
            served(manager=SessionManager(copy)) as h,
            HubClient(h.ws_url, open_timeout=5) as client,
        ):
            assert (await client.sessions.import_(expected))["messages"] == 3 * 320
            assert [line async for line in client.sessions.export()] == expected


async def test_a_bad_line_over_the_socket_names_it_and_writes_nothing(tmp_path: Path) -> None:
    async with await big_store(tmp_path / "big.db") as store:
        lines = await export_all(store)
    # A line well past the first chunk (the sessions before it are complete, still unwritten).
    bad = len(lines) - 5
    broken = [*lines[: bad - 1], '{"type": "message", "nonsense": 1', *lines[bad:]]
    async with (
        await SqliteStore.open(tmp_path / "copy.db") as copy,
        served(manager=SessionManager(copy)) as h,
        HubClient(h.ws_url, open_timeout=5) as client,
    ):
        with pytest.raises(InvalidInput, match=f"line {bad}: not JSON"):
            await client.sessions.import_(broken)
        assert await copy.list_sessions() == []
        # The connection goes on: a good import after it starts afresh.
        assert len((await client.sessions.import_(lines))["sessions"]) == 3


async def test_an_import_past_the_per_connection_bound_is_too_large(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    await rich_session(store)
    lines = await export_all(store)
    monkeypatch.setattr(ops, "IMPORT_MAX_BYTES", sum(len(line) for line in lines) // 2)
    async with (
        await SqliteStore.open(":memory:") as empty,
        served(manager=SessionManager(empty)) as h,
        h.client() as raw,
    ):
        refused = await raw.request("import", lines=lines, final=True)
        assert refused["code"] == "too_large" and "nothing was written" in refused["message"]
        assert await empty.list_sessions() == []


async def test_a_chunk_over_the_frame_limit_ends_the_import_in_progress(store: Store) -> None:
    """A frame too large to read may have been the import's next chunk: the import ends
    with nothing written, and the next import on the connection starts afresh instead of
    continuing the broken one."""
    await rich_session(store)
    lines = await export_all(store)
    async with (
        await SqliteStore.open(":memory:") as empty,
        served(manager=SessionManager(empty), config=HubConfig(max_frame_bytes=64 << 10)) as h,
        h.client() as raw,
    ):
        first = await raw.request("import", lines=lines[:1], final=False)
        assert first["result"] == {"lines": 1}
        huge = json.dumps({"op": "import", "id": "huge", "lines": ["x" * (80 << 10)], "final": True})
        await raw.send_raw(huge)
        assert (await raw.answer("huge"))["code"] == "too_large"
        done = await raw.request("import", lines=lines, final=True)
        assert "result" in done, done
        assert [s.id for s in await empty.list_sessions()] == [s.id for s in await store.list_sessions()]


# -- all or nothing, every record checked first (issue 24, items 5-7) --------------------------


async def snapshot(store: Store) -> tuple[list[str], object]:
    """What a failed import must leave as it was: a whole export and the registry's log."""
    return await export_all(store), await store.stream_position(REGISTRY)


@pytest.mark.parametrize("case", sorted(bad_dumps()))
async def test_a_bad_record_anywhere_in_the_dump_writes_nothing(store: Store, case: str) -> None:
    """Each line is refused naming its number and field, before the sessions ahead of it
    in the dump are written (they were: item 5; a 5,000-deep line was a RecursionError)."""
    await rich_session(store)
    before = await snapshot(store)
    bad = bad_dumps()[case]
    with pytest.raises(DumpError) as refused:
        await import_lines(store, bad.lines)
    assert refused.value.line == bad.line and bad.says in str(refused.value), refused.value
    assert "nothing was written" in str(refused.value)
    assert await snapshot(store) == before


async def test_a_refusal_by_the_store_rolls_back_the_whole_dump(store: Store) -> None:
    """The store writes a dump in one transaction: its second copy of a session (past the
    reader's checks, as a caller of import_dumps may hand it) rolls back the first."""
    await rich_session(store)
    before = await snapshot(store)
    twice = parse_dump(dumps.dump(dumps.session("imp-a"), dumps.session("imp-b")))
    with pytest.raises(Conflict, match="'imp-a' already exists"):
        await store.import_sessions([*twice, twice[0]])
    assert await snapshot(store) == before
    with pytest.raises(InvalidInput, match="'imp-a': it is in the dump twice; nothing was written"):
        await import_dumps(store, [*twice, twice[0]])  # checked before the store is asked
    # An existing session later in the dump, without replace: nothing of the dump either.
    existing = parse_dump(await export_all(store))
    with pytest.raises(Conflict, match="already exists"):
        await import_dumps(store, [*twice, *existing])
    assert await snapshot(store) == before
    # With replace, the whole dump is written, in one go.
    done = await import_dumps(store, [*twice, *existing], replace=True)
    assert done.sessions == ["imp-a", "imp-b", *(d.info.id for d in existing)]
    assert {s.id for s in await store.list_sessions()} == {"imp-a", "imp-b", *(d.info.id for d in existing)}


async def test_a_year_one_session_stored_before_the_checks_does_not_break_export(store: Store) -> None:
    """Item 7: on Postgres 0001-01-01T00:00Z was stored as -infinity, read back naive, and
    every whole-store export failed comparing it. A row like it still exports (as the
    calendar's first instant), and importing that export is refused naming the field."""
    ids = await rich_session(store)
    if isinstance(store, PostgresStore):
        async with store._pool.acquire() as conn:
            await conn.execute("UPDATE sessions SET created_at = '-infinity' WHERE id = $1", ids[0])
    else:
        assert isinstance(store, SqliteStore)
        store._writer.raw.execute("UPDATE sessions SET created_at = ? WHERE id = ?", (-1e300, ids[0]))
        store._writer.raw.commit()
    lines = await export_all(store)
    first = json.loads(lines[1])["session"]
    assert (first["id"], first["created_at"]) == (ids[0], "0001-01-01T00:00:00Z")
    assert [s.id for s in await store.list_sessions()].count(ids[0]) == 1
    async with await SqliteStore.open(":memory:") as copy:
        with pytest.raises(DumpError, match=re.escape("line 2: 'session.created_at' 0001-01-01T00:00:00")):
            await import_lines(copy, lines)
        assert await copy.list_sessions() == []


@pytest.mark.parametrize("case", ["the same session twice", "input_tokens 2**63", "a 5,000-deep line"])
async def test_a_bad_import_over_the_socket_is_invalid_and_the_connection_stays(
    store: Store, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Item 6: the 5,000-deep line dropped the socket with 1006 and no error frame; item 5:
    2**63 tokens answered `internal` after writing the sessions before it."""
    caplog.set_level(logging.ERROR)
    await rich_session(store)
    before = await snapshot(store)
    bad = bad_dumps()[case]
    async with served(manager=SessionManager(store)) as h, h.client() as raw:
        # In two chunks, as a client sends a big dump: the bad line arrives in the final one.
        chunk = await raw.request("import", lines=bad.lines[:5])
        assert chunk["frame"] == "reply", chunk
        refused = await raw.request("import", lines=bad.lines[5:], final=True)
        assert refused["frame"] == "error" and refused["code"] == "invalid", refused
        assert f"line {bad.line}: " in refused["message"] and bad.says in refused["message"]
        assert (await raw.request("ping"))["frame"] == "reply" and raw.close_code is None
    assert await snapshot(store) == before
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_sessions_built_elsewhere_are_checked_as_dump_lines_are(store: Store) -> None:
    """``--from`` sources and callers of import_dumps build sessions without the reader:
    the same rules hold, naming the session, before the store is asked."""
    await rich_session(store)
    before = await snapshot(store)
    good, bad = parse_dump(dumps.dump(dumps.session("imp-a"), dumps.session("imp-b")))
    bad.info.input_tokens = 2**63
    with pytest.raises(InvalidInput, match="'imp-b': input_tokens must fit in 64 bits"):
        await import_dumps(store, [good, bad])
    bad.info.input_tokens = 0
    bad.messages[1].created_at = datetime(1, 1, 1, tzinfo=UTC)
    with pytest.raises(InvalidInput, match="'imp-b': the created_at of message 'imp-b-m1' 0001-01-01"):
        await import_dumps(store, [good, bad])
    bad.messages[1].created_at = good.messages[1].created_at
    bad.context = {"memory": "a\x00"}
    with pytest.raises(InvalidInput, match=r"'imp-b': 'context\.memory' holds a NUL"):
        await import_dumps(store, [good, bad])
    assert await snapshot(store) == before
    year_one = [{**text("u1", "hello"), "createdAt": "0001-01-01T00:00:00Z"}]
    with pytest.raises(InvalidInput, match="message 0: 'createdAt' 0001-01-01"):
        from_ui_messages(json.dumps(year_one), "ui")


async def test_concurrent_imports_serialize_without_deadlock_or_double_writes(store: Store) -> None:
    """Two imports of the same new session: one is written, the other is `conflict` (on
    Postgres its INSERT waits for the first's commit). Two replacing the same sessions in
    opposite orders both complete: the locks are taken in one order."""
    one = dumps.dump(dumps.session("imp-a"), dumps.session("imp-b"))
    results = await asyncio.gather(import_lines(store, one), import_lines(store, one), return_exceptions=True)
    assert sorted(type(r).__name__ for r in results) == ["Conflict", "ImportResult"], results
    reverse = dumps.dump(dumps.session("imp-b"), dumps.session("imp-a"))
    done = await asyncio.gather(*(import_lines(store, d, replace=True) for d in [one, reverse] * 3))
    assert [r.messages for r in done] == [4] * 6
    assert sorted(s.id for s in await store.list_sessions()) == ["imp-a", "imp-b"]
