"""AG-UI 1.0 at ``/agui`` (hub/adapters/agui.py).

The real client drives it first: ``@ag-ui/client`` 1.0's ``HttpAgent``, every event checked
by ``@ag-ui/core``'s schemas and the client's own order verifier, on Node 22
(tests/js7/agui.test.mjs): runs, re-attach, follow mode across runs, STATE_DELTA, stop. Then
raw HTTP for the doors: tokens, bounds, bad bodies and states, a follower too far behind, a
draining hub, an expired token. A follower on another node: tests/adapters/test_doors_on_nodes.py.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

import httpx2
import pytest

from hub import ReadonlyText, SessionManager, SqliteStore
from hub.adapters.aguirun import agui_run, held_run, posting
from hub.auth import issue_token
from hub.server import HubConfig
from tests.adapters.test_aisdk_ws import SECRET
from tests.support.chatkit import responder
from tests.support.hubtest import served
from tests.support.nodetests import JS7, node22, run_node_tests


def _run(thread: str, *texts: str) -> dict[str, Any]:
    return {
        "threadId": thread,
        "runId": str(uuid.uuid4()),
        "messages": [{"id": str(uuid.uuid4()), "role": "user", "content": t} for t in texts],
        "tools": [],
        "context": [],
    }


async def test_the_ag_ui_client_against_the_hub(tmp_path: Path) -> None:
    """Runs, re-attach, follow mode across runs, STATE_DELTA and stop (tests/js7/agui.test.mjs),
    on a hub whose sessions have a read-only block (soul) and a writable one (memory)."""
    store = await SqliteStore.open(tmp_path / "hub.db")
    manager = (
        SessionManager(store)
        .with_context("soul", provider=ReadonlyText("kind"))
        .with_context("memory", max_tokens=50)
    )
    try:
        async with (
            served(manager=manager) as h,
            responder(h.ws_url, lambda: len(h.hub.turns.responders) == 1),
        ):
            await run_node_tests(
                node22(),
                JS7 / "agui.test.mjs",
                {"SESSIONHUB_URL": h.url, "SESSIONHUB_WS_URL": h.ws_url},
                passes=7,
            )
    finally:
        await store.close()


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"not json", "invalid"),
        (b'{"threadId": "t", "runId": "r"}', "invalid"),
        (b'{"threadId": "t", "runId": "r", "messages": [{"role": "user", "content": "x"}]}', "invalid"),
        (
            b'{"threadId": "t", "runId": "r", "messages": [{"id": "m", "role": "wizard", "content": "x"}]}',
            "invalid",
        ),
        (
            b'{"threadId": "t", "runId": "r", "messages": [{"id": "m", "role": "user", "content": 5}]}',
            "invalid",
        ),
        (
            b'{"threadId": "t", "runId": "r", "messages": [{"id": "m", "role": "user", "content": "x"}]}'
            + b" " * 5000,
            "too_large",
        ),
    ],
)
async def test_bad_bodies_are_typed_and_nothing_is_written(tmp_path: Path, body: bytes, code: str) -> None:
    async with (
        served(db=tmp_path / "hub.db", config=HubConfig(max_body_bytes=4096)) as h,
        httpx2.AsyncClient(base_url=h.url) as http,
    ):
        answer = await http.post("/agui", content=body, headers={"content-type": "application/json"})
        assert answer.status_code in (400, 413)
        assert answer.json()["error"]["code"] == code
        assert await h.hub.manager.get("t") is None


async def test_tokens_run_needs_write_reattach_needs_read(tmp_path: Path) -> None:
    config = HubConfig(auth_secret=SECRET)
    async with served(db=tmp_path / "hub.db", config=config) as h, httpx2.AsyncClient(base_url=h.url) as http:
        thread = "t-" + uuid.uuid4().hex
        await h.hub.store.create_session("chat", session_id=thread)

        def auth(scopes: dict[str, str] | None) -> dict[str, str]:
            return {} if scopes is None else {"authorization": f"Bearer {issue_token(SECRET, scopes)}"}

        for scopes, status in (
            (None, 401),
            ({thread: "read"}, 403),
            ({"t-other": "admin"}, 403),
        ):
            answer = await http.post("/agui", json=_run(thread, "hi"), headers=auth(scopes))
            assert answer.status_code == status, (scopes, answer.text)
        assert await h.hub.manager.get_history(thread) == []
        assert (await http.get(f"/agui/{thread}/stream", headers=auth({thread: "read"}))).status_code == 204
        assert (
            await http.get(f"/agui/{thread}/stream", headers=auth({"t-other": "read"}))
        ).status_code == 403
        assert (await http.get(f"/agui/{thread}/stream")).status_code == 401

        worker = issue_token(SECRET, {"*": "write"})
        async with (
            responder(h.ws_url, lambda: len(h.hub.turns.responders) == 1, token=worker),
            http.stream("POST", "/agui", json=_run(thread, "hi"), headers=auth({thread: "write"})) as r,
        ):
            assert r.status_code == 200
            events = [json.loads(line[6:]) async for line in r.aiter_lines() if line.startswith("data: ")]
        assert events[0]["type"] == "RUN_STARTED"
        assert events[-1]["type"] == "RUN_FINISHED"
        assert (
            "".join(e.get("delta", "") for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")
            == "You said: hi"
        )


async def test_state_is_the_context_blocks_and_a_run_may_write_them(tmp_path: Path) -> None:
    """``STATE_SNAPSHOT`` after ``RUN_STARTED`` and before the end carries the plain blocks;
    an input ``state`` writes the blocks it changes, all or none."""
    store = await SqliteStore.open(tmp_path / "hub.db")
    try:
        await _state_run(store)
    finally:
        await store.close()


async def _state_run(store: SqliteStore) -> None:
    manager = (
        SessionManager(store)
        .with_context("soul", provider=ReadonlyText("kind"))
        .with_context("memory", max_tokens=50)
        .with_context("notes", max_tokens=50)
    )
    async with (
        served(manager=manager) as h,
        responder(h.ws_url, lambda: len(h.hub.turns.responders) == 1),
        httpx2.AsyncClient(base_url=h.url) as http,
    ):
        thread = "t-" + uuid.uuid4().hex
        await h.hub.store.create_session("chat", session_id=thread)

        async def run(state: Any) -> tuple[int, list[dict[str, Any]]]:
            body = {**_run(thread, "hi"), "state": state}
            async with http.stream("POST", "/agui", json=body) as r:
                lines = [line async for line in r.aiter_lines()]
            assert r.status_code == 200, lines
            return 200, [json.loads(line[6:]) for line in lines if line.startswith("data: ")]

        status, events = await run({"contextBlocks": {"memory": "likes tea", "soul": "kind"}})
        assert status == 200
        types = [e["type"] for e in events]
        assert types[:2] == ["RUN_STARTED", "STATE_SNAPSHOT"]
        assert types[-2:] == ["STATE_SNAPSHOT", "RUN_FINISHED"]
        assert events[1]["snapshot"] == {
            "contextBlocks": {"soul": "kind", "memory": "likes tea", "notes": ""}
        }
        session = h.hub.manager.get_session(thread)
        assert (await session.get_context_block("memory")).content == "likes tea"  # type: ignore[union-attr]

        # All or none: notes is fine, the read-only soul is not, and memory is too long. The
        # refusal is AG-UI's own: one RUN_ERROR with the hub's code, and no run.
        seen = (await session.read_events())[-1].seq
        for bad in (
            {"contextBlocks": {"notes": "n", "soul": "cruel"}},
            {"contextBlocks": {"notes": "n", "memory": "word " * 200}},
            {"contextBlocks": {"nope": "x"}},
            {"contextBlocks": {"notes": 5}},
            {"contextBlocks": ["notes"]},
            "not an object",
        ):
            status, events = await run(bad)
            assert [(e["type"], e.get("code")) for e in events] == [("RUN_ERROR", "invalid")], (bad, events)
        blocks = {b.label: b.content for b in await session.get_context_blocks()}
        assert blocks == {"soul": "kind", "memory": "likes tea", "notes": ""}
        assert len(await h.hub.manager.get_history(thread)) == 2  # only the first run's
        # Refused before any block is written: no reader saw notes change, even for a moment.
        assert [e.type for e in await session.read_events(seen)] == []


async def test_follow_and_stop_check_their_scopes(tmp_path: Path) -> None:
    """Following needs ``read`` on the thread, stopping ``write``; a token for another
    thread reaches neither."""
    config = HubConfig(auth_secret=SECRET)
    async with served(db=tmp_path / "hub.db", config=config) as h, httpx2.AsyncClient(base_url=h.url) as http:
        thread = "t-" + uuid.uuid4().hex
        await h.hub.store.create_session("chat", session_id=thread)

        def auth(scopes: dict[str, str]) -> dict[str, str]:
            return {"authorization": f"Bearer {issue_token(SECRET, scopes)}"}

        follow = f"/agui/{thread}/stream?follow=1"
        assert (await http.get(follow)).status_code == 401
        assert (await http.get(follow, headers=auth({"t-other": "admin"}))).status_code == 403
        async with http.stream("GET", follow, headers=auth({thread: "read"})) as r:
            assert r.status_code == 200
            events = []
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line[6:])["type"])
                    if events[-1] == "RUN_FINISHED":
                        break
        assert events == ["RUN_STARTED", "MESSAGES_SNAPSHOT", "STATE_SNAPSHOT", "RUN_FINISHED"]
        # A follow stream does not outlive its token: it ends, typed, when the token expires.
        short = {"authorization": f"Bearer {issue_token(SECRET, {thread: 'read'}, ttl=1.5)}"}
        async with http.stream("GET", follow, headers=short) as r:
            assert r.status_code == 200
            async with asyncio.timeout(5):
                kinds = [json.loads(line[6:]) async for line in r.aiter_lines() if line.startswith("data: ")]
        assert (kinds[-1]["type"], kinds[-1]["code"]) == ("RUN_ERROR", "unauthorized")
        stop = f"/agui/{thread}/stop"
        assert (await http.post(stop)).status_code == 401
        for scopes in ({thread: "read"}, {"t-other": "admin"}):
            answer = await http.post(stop, headers=auth(scopes))
            assert answer.status_code == 403 and answer.json()["error"]["code"] == "forbidden"
        nothing = await http.post(stop, headers=auth({thread: "write"}))
        assert nothing.status_code == 404 and nothing.json()["error"]["code"] == "not_found"


async def test_a_follower_too_far_behind_is_ended_and_the_others_get_everything(tmp_path: Path) -> None:
    """Each follower's queue is bounded (``outbox_bytes``): one that does not read is ended
    (a ``RUN_ERROR`` of code ``slow_consumer``, or its connection cut when it takes not even
    that), counted in ``sessionhub_sse_dropped``; a reader that keeps up gets the whole run."""
    config = HubConfig(outbox_bytes=256 << 10, send_timeout=1.0)
    async with (
        served(db=tmp_path / "hub.db", config=config) as h,
        responder(h.ws_url, lambda: len(h.hub.turns.responders) == 1),
        httpx2.AsyncClient(base_url=h.url, timeout=30) as http,
    ):
        thread = "t-" + uuid.uuid4().hex
        await h.hub.store.create_session("chat", session_id=thread)
        dropped = h.hub.metrics.sse_dropped

        def drops() -> float:
            return float(sum(dropped.labels(r)._value.get() for r in ("behind", "timeout")))

        before = drops()
        async with http.stream("GET", f"/agui/{thread}/stream?follow=1") as stalled:
            assert stalled.status_code == 200
            async with http.stream("POST", "/agui", json=_run(thread, "big 8192")) as posted:
                kinds = [
                    json.loads(line[6:])["type"]
                    async for line in posted.aiter_lines()
                    if line[:6] == "data: "
                ]
            assert kinds[-1] == "RUN_FINISHED"
            assert drops() > before  # the stalled follower, not the POST's reader
            tail, cut = b"", False
            try:
                async for piece in stalled.aiter_bytes():
                    tail = (tail + piece)[-4096:]
            except httpx2.HTTPError:
                cut = True
            assert cut or b'"code":"slow_consumer"' in tail, tail[-300:]


async def test_a_draining_hub_ends_its_followers(tmp_path: Path) -> None:
    """A follow stream never ends by itself, and uvicorn waits for every response to end:
    the hub's drain (``sessionhub serve`` on SIGINT runs it first) ends each follower with
    ``RUN_ERROR {code: "unavailable"}`` (no id: the reader's ``Last-Event-ID`` still names
    its last event)."""
    async with served(db=tmp_path / "hub.db") as h, httpx2.AsyncClient(base_url=h.url, timeout=30) as http:
        async with http.stream("GET", "/agui/t-drain/stream?follow=1") as r:
            assert r.status_code == 200
            lines = r.aiter_lines()
            async for line in lines:
                if '"RUN_FINISHED"' in line:
                    break
            started = time.monotonic()
            draining = asyncio.create_task(h.hub.drain())
            rest = [line async for line in lines]
            await draining
        assert time.monotonic() - started < 3
        last = json.loads(next(line for line in reversed(rest) if line.startswith("data: "))[6:])
        assert (last["type"], last["code"]) == ("RUN_ERROR", "unavailable")
        assert not any(line.startswith("id: ") for line in rest)


async def test_a_run_refused_for_a_turn_in_flight_leaves_the_state_as_it_was(tmp_path: Path) -> None:
    """A run's state is written before its turn starts; a turn already in flight refuses the
    run (409), and the blocks its state changed are put back: all or nothing."""
    store = await SqliteStore.open(tmp_path / "hub.db")
    manager = SessionManager(store).with_context("memory", max_tokens=50).with_context("notes", max_tokens=50)
    try:
        async with (
            served(manager=manager, config=HubConfig(turn_timeout=30)) as h,
            httpx2.AsyncClient(base_url=h.url) as http,
        ):
            thread = "t-" + uuid.uuid4().hex
            await h.hub.store.create_session("chat", session_id=thread)
            session = h.hub.manager.get_session(thread)
            await session.replace_context_block("memory", "likes tea")
            first = {"id": "u0", "role": "user", "parts": [{"type": "text", "text": "wait"}]}
            await h.hub.manager.append(thread, first)
            await h.hub.turns.start(thread, "u0")  # no responder: it stays in flight
            body = {
                **_run(thread, "hi"),
                "state": {"contextBlocks": {"memory": "likes coffee", "notes": "n"}},
            }
            r = await http.post("/agui", json=body)
            assert r.status_code == 409 and r.json()["error"]["code"] == "conflict", r.text
            blocks = {b.label: b.content for b in await session.get_context_blocks()}
            assert blocks == {"memory": "likes tea", "notes": ""}
    finally:
        await store.close()


async def test_two_hubs_in_one_process_name_their_own_runs(tmp_path: Path) -> None:
    """The runId a client is posting is its hub's: another hub of the process (two apps, as
    tests run them) rendering its own turn of a thread of the same name keeps the reply's
    id as the run's, and each hub holds its own ended runs."""
    async with served(db=tmp_path / "a.db") as a, served(db=tmp_path / "b.db") as b:
        for h in (a, b):
            await h.hub.store.create_session("chat", session_id="t")
            await h.hub.manager.append(
                "t", {"id": "u0", "role": "user", "parts": [{"type": "text", "text": "hi"}]}
            )
        turn_b = await b.hub.turns.start("t", "u0")
        with posting(a.hub, "t", "a-client-run"):
            run = await agui_run(b.hub, turn_b)
        assert run.run_id == turn_b.reply_id
        assert held_run(b.hub, "t", run.seq) is run and held_run(a.hub, "t", run.seq) is None
        await b.hub.turns.stop("t")
