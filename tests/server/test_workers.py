"""Summaries delegated to connected workers: one that answers, one that times out, one that
errors, none at all, and one that disconnects mid-request; with auth, only workers allowed
on the session (tests/server/test_security.py has the same end to end)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from clients import HubClient
from hub import SessionHubError, SessionManager, SqliteStore
from hub.auth import issue_token
from hub.compaction import create_compact_function, summarizing_session
from hub.server import HubConfig, create_app
from hub.server.workers import WorkerSummarizer
from protocol.errors import SummarizerError
from tests.support.hubtest import eventually, served, text


async def setup(tmp_path: Path, timeout: float = 2.0) -> tuple[SqliteStore, SessionManager, WorkerSummarizer]:
    store = await SqliteStore.open(tmp_path / "hub.db")
    workers = WorkerSummarizer(timeout=timeout)
    manager = SessionManager(store).on_compaction(create_compact_function(workers, tail_token_budget=10))
    return store, manager, workers


async def fill(client: HubClient) -> str:
    info = await client.sessions.create("long chat")
    await client.sessions.append_all(info.id, [text(f"m{i}", f"turn {i} about the deploy") for i in range(8)])
    return info.id


async def test_a_worker_writes_the_summary(tmp_path: Path) -> None:
    store, manager, workers = await setup(tmp_path)
    prompts: list[str] = []

    async def summarize(prompt: str) -> str:
        prompts.append(prompt)
        return "## Topic\nDeploys, summarized by the worker."

    try:
        app = create_app(manager=manager, worker_summarizer=workers)
        async with (
            served(app=app) as hub,
            HubClient(hub.ws_url, name="w1", role="worker", summarize=summarize) as worker,
            HubClient(hub.ws_url) as ui,
        ):
            sid = await fill(ui)
            await eventually(lambda: any(c.summarizer for c in hub.hub.connections))  # its hello is in
            result = await ui.session(sid).compact()
            assert result is not None and result["summary"].startswith("## Topic")
            assert len(prompts) == 1 and prompts[0].startswith("Create a concise summary")
            history = await ui.sessions.get_history(sid)
            assert history[3].parts == [
                {"type": "text", "text": "## Topic\nDeploys, summarized by the worker."}
            ]
            del worker
    finally:
        await store.close()


async def test_no_worker_is_a_failed_compaction(tmp_path: Path) -> None:
    store, manager, workers = await setup(tmp_path)
    try:
        async with (
            served(app=create_app(manager=manager, worker_summarizer=workers)) as hub,
            HubClient(hub.ws_url) as ui,
        ):
            sid = await fill(ui)
            assert await ui.session(sid).compact() is None
            errors = [e for e in await store.read_events(f"s:{sid}") if e.type == "error"]
            assert [e.data["error"] for e in errors] == ["no connected worker can summarize"]
            assert len(await ui.sessions.get_history(sid)) == 8
    finally:
        await store.close()


async def test_a_silent_worker_times_out(tmp_path: Path) -> None:
    store, manager, workers = await setup(tmp_path, timeout=0.3)
    never = asyncio.Event()

    async def summarize(prompt: str) -> str:
        await never.wait()
        return "too late"

    try:
        app = create_app(manager=manager, worker_summarizer=workers)
        async with (
            served(app=app) as hub,
            HubClient(hub.ws_url, name="sleepy", summarize=summarize),
            HubClient(hub.ws_url) as ui,
        ):
            sid = await fill(ui)
            await eventually(lambda: any(c.summarizer for c in hub.hub.connections))
            started = asyncio.get_running_loop().time()
            assert await ui.session(sid).compact() is None
            assert asyncio.get_running_loop().time() - started < 3
            errors = [e.data["error"] for e in await store.read_events(f"s:{sid}") if e.type == "error"]
            assert errors == ["worker sleepy did not answer within 0.3s"]
    finally:
        never.set()
        await store.close()


async def test_a_failing_worker_is_reported(tmp_path: Path) -> None:
    store, manager, workers = await setup(tmp_path)

    def summarize(prompt: str) -> str:
        raise RuntimeError("model overloaded")

    try:
        app = create_app(manager=manager, worker_summarizer=workers)
        async with (
            served(app=app) as hub,
            HubClient(hub.ws_url, name="flaky", summarize=summarize),
            HubClient(hub.ws_url) as ui,
        ):
            sid = await fill(ui)
            await eventually(lambda: any(c.summarizer for c in hub.hub.connections))
            assert await ui.session(sid).compact() is None
            errors = [e.data["error"] for e in await store.read_events(f"s:{sid}") if e.type == "error"]
            assert errors == ["worker flaky failed: RuntimeError: model overloaded"]
    finally:
        await store.close()


async def test_a_worker_that_disconnects_fails_fast(tmp_path: Path) -> None:
    store, manager, workers = await setup(tmp_path, timeout=10)
    asked = asyncio.Event()

    async def summarize(prompt: str) -> str:
        asked.set()
        await asyncio.sleep(30)  # a worker that never answers: it disconnects first
        return "never"

    try:
        app = create_app(manager=manager, worker_summarizer=workers)
        async with served(app=app) as hub, HubClient(hub.ws_url) as ui:
            sid = await fill(ui)
            worker = HubClient(hub.ws_url, name="gone", summarize=summarize, reconnect=False)
            await worker.connect()
            await eventually(lambda: any(c.summarizer for c in hub.hub.connections))
            compaction = asyncio.create_task(ui.session(sid).compact())
            await asyncio.wait_for(asked.wait(), 5)
            (conn,) = [c for c in hub.hub.connections if c.name == "gone"]
            await conn.close(1011, "test: worker died")
            assert await asyncio.wait_for(compaction, 5) is None
            errors = [e.data["error"] for e in await store.read_events(f"s:{sid}") if e.type == "error"]
            assert errors == ["worker gone disconnected"]
            await worker.aclose()
    finally:
        await store.close()


async def test_only_the_asked_worker_can_answer(tmp_path: Path) -> None:
    async with (
        served(db=tmp_path / "hub.db", worker_summarizer=WorkerSummarizer()) as hub,
        HubClient(hub.ws_url) as client,
    ):
        with pytest.raises(SessionHubError) as refused:
            await client.request("summary", request_id="made-up", summary="hijack")
        assert refused.value.code == "not_found"


async def test_the_prompt_names_its_session(tmp_path: Path) -> None:
    store, manager, workers = await setup(tmp_path)
    try:
        async with (
            served(app=create_app(manager=manager, worker_summarizer=workers)) as hub,
            hub.client() as worker,
            HubClient(hub.ws_url) as ui,
        ):
            await worker.call("hello", name="raw", summarizer=True)
            sid = await fill(ui)
            compaction = asyncio.create_task(ui.session(sid).compact())
            ask = await worker.take(lambda f: f["frame"] == "summarize")
            assert ask["session_id"] == sid
            await worker.call("summary", request_id=ask["request_id"], summary="## Topic\nNamed.")
            assert (await asyncio.wait_for(compaction, 5)) is not None
    finally:
        await store.close()


async def test_a_compaction_tells_its_summarizer_the_session(tmp_path: Path) -> None:
    seen: list[str | None] = []

    def summarize(prompt: str) -> str:
        seen.append(summarizing_session.get())
        return "## Topic\nx"

    async with await SqliteStore.open(tmp_path / "hub.db") as store:
        manager = SessionManager(store).on_compaction(
            create_compact_function(summarize, tail_token_budget=10)
        )
        info = await manager.create("chat")
        await manager.append_all(info.id, [text(f"m{i}", f"turn {i}") for i in range(8)])
        assert await manager.get_session(info.id).compact() is not None
        assert seen == [info.id]
        assert summarizing_session.get() is None  # only while the summarizer runs


SECRET = "a-test-secret-that-is-long-enough-for-hs256"


async def test_with_auth_a_prompt_needs_write_on_its_session(tmp_path: Path) -> None:
    store, manager, workers = await setup(tmp_path)
    try:
        app = create_app(manager=manager, worker_summarizer=workers, config=HubConfig(auth_secret=SECRET))
        admin = issue_token(SECRET, {"*": "admin"})
        async with served(app=app) as hub, HubClient(hub.ws_url, token=admin) as ui:
            a, b = await fill(ui), await fill(ui)
            bearer = {"Authorization": f"Bearer {issue_token(SECRET, {b: 'write'})}"}
            async with hub.client(additional_headers=bearer) as worker:
                await worker.call("hello", name="b-only", summarizer=True)
                # Not asked about A, nor about a session no one named (that needs "*").
                assert await ui.session(a).compact() is None
                with pytest.raises(SummarizerError, match="may summarize this session"):
                    await workers("a prompt about an unnamed session")
                assert not [f for f in worker.received if f["frame"] == "summarize"]
                # Asked about B; but it renews to a token without write before answering.
                compaction = asyncio.create_task(ui.session(b).compact())
                ask = await worker.take(lambda f: f["frame"] == "summarize")
                assert ask["session_id"] == b
                await worker.call("auth", token=issue_token(SECRET, {b: "read"}))
                late = await worker.request("summary", request_id=ask["request_id"], summary="x")
                assert (late["frame"], late["code"]) == ("error", "forbidden")
                assert await asyncio.wait_for(compaction, 5) is None
            errors = [e.data["error"] for e in await store.read_events(f"s:{b}") if e.type == "error"]
            assert errors == ["worker b-only may no longer summarize this session"]
    finally:
        await store.close()
