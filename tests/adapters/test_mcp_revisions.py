"""``/mcp`` on both revisions ``mcp`` 2.3 serves, driven by the official ``mcp`` client:
2026-07-28 (negotiated by the client's ``server/discover`` probe; ``subscriptions/listen``)
and 2025-11-25 (the ``initialize`` handshake; ``resources/subscribe`` on ``/mcp/stateful``).
Writes made over the WebSocket (``HubClient``), ``/api/chat`` and another MCP client reach
the listeners of a real ``sessionhub serve``; scopes and bounds are checked in process."""

from __future__ import annotations

import asyncio
import json
import time
import warnings
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.subscriptions import Subscription
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError
from mcp.shared.subscriptions import ResourcesListChanged, ResourceUpdated, ServerEvent

from clients import HubClient
from hub import SessionManager, SqliteStore, StoreSearchProvider
from hub.adapters.caller import Caller
from hub.adapters.mcp import McpEndpoint
from hub.adapters.mcp_feed import Listener, McpFeed
from hub.apps.backends import open_store
from hub.auth import Grant, issue_token
from hub.server import HubConfig, create_app
from tests.support.hubtest import WAIT, eventually, served, text
from tests.support.mcpkit import body, mcp_modern, serve_process
from tests.support.nodes import scratch_database
from tests.support.services import postgres_dsn

SECRET = "mcp-revisions-secret-of-at-least-32-bytes"
MODERN, HANDSHAKE = "2026-07-28", "2025-11-25"
LIST = "sessionhub://sessions"


def history(session_id: str) -> str:
    return f"sessionhub://sessions/{session_id}/history"


async def next_event(sub: Subscription) -> ServerEvent:
    async with asyncio.timeout(WAIT):
        return await anext(aiter(sub))


async def read_json(client: Client, uri: str) -> Any:
    first = (await client.read_resource(uri)).contents[0]
    assert isinstance(first, types.TextResourceContents) and first.mime_type == "application/json"
    return json.loads(first.text)


async def chat(url: str, token: str, session_id: str, message_id: str) -> None:
    """A user message posted to ``/api/chat`` (no responder: the turn times out; the
    message is written first, like any write)."""
    message = {"id": message_id, "role": "user", "parts": [{"type": "text", "text": "from the chat"}]}
    async with (
        httpx2.AsyncClient(headers={"authorization": f"Bearer {token}"}, timeout=10) as http,
        http.stream("POST", f"{url}/api/chat", json={"id": session_id, "messages": [message]}) as r,
    ):
        assert r.status_code == 200
        async for _ in r.aiter_bytes():
            pass


class Notes:
    """The notifications a 2025-11-25 client is handed (its ``message_handler``)."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.arrived = asyncio.Event()

    async def __call__(self, message: Any) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            self.seen.append(str(message.params.uri))
        elif isinstance(message, types.ResourceListChangedNotification):
            self.seen.append("list_changed")
        else:
            return
        self.arrived.set()

    async def wait_for(self, note: str) -> None:
        async with asyncio.timeout(WAIT):
            while note not in self.seen:
                self.arrived.clear()
                await self.arrived.wait()
        self.seen.clear()


async def subscribe(client: Client, uri: str, *, drop: bool = False) -> None:
    # resources/subscribe is the 2025-11-25 way; the SDK marks it deprecated for 2026-07-28.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MCPDeprecationWarning)
        if drop:
            await client.unsubscribe_resource(uri)
        else:
            await client.subscribe_resource(uri)


async def test_both_revisions_follow_writes_from_every_door(tmp_path: Path) -> None:
    admin = issue_token(SECRET, {"*": "admin"})
    extra = ("--auth-secret", SECRET, "--turn-timeout", "0.3")
    async with serve_process(tmp_path / "hub.db", *extra) as port, AsyncExitStack() as stack:
        url = f"http://127.0.0.1:{port}"
        hub = await stack.enter_async_context(HubClient(f"ws://127.0.0.1:{port}/ws", token=admin))
        info = await hub.sessions.create("support")
        await hub.sessions.append(info.id, text("u1", "the deploy failed"))

        modern = await stack.enter_async_context(mcp_modern(f"{url}/mcp", admin))
        notes = Notes()
        stateful = await stack.enter_async_context(
            mcp_modern(f"{url}/mcp/stateful", admin, mode="legacy", message_handler=notes)
        )
        other = await stack.enter_async_context(mcp_modern(f"{url}/mcp", admin, mode="legacy"))
        assert (modern.protocol_version, stateful.protocol_version) == (MODERN, HANDSHAKE)
        # The client's server/discover probe found 2026-07-28, and resources to follow.
        discovered = modern.session.discover_result
        assert discovered is not None and MODERN in discovered.supported_versions
        assert discovered.capabilities.resources is not None and discovered.capabilities.resources.subscribe
        assert other.protocol_version == HANDSHAKE
        assert stateful.server_capabilities.resources is not None
        assert stateful.server_capabilities.resources.subscribe
        assert other.server_capabilities.resources is not None
        assert not other.server_capabilities.resources.subscribe  # stateless

        for client in (modern, stateful):
            names = {t.name for t in (await client.list_tools()).tools}
            assert {"list_sessions", "get_history", "append_message", "search"} <= names
            listed = json.loads(body(await client.call_tool("list_sessions", {})))
            assert [s["id"] for s in listed] == [info.id]
            sessions = await read_json(client, LIST)
            assert [(s["id"], s["name"]) for s in sessions] == [(info.id, "support")]
            messages = await read_json(client, history(info.id))
            assert [(m["id"], m["parts"][0]["text"]) for m in messages] == [("u1", "the deploy failed")]
            uris = {r.uri for r in (await client.list_resources()).resources}
            assert {LIST, history(info.id)} <= uris

        await subscribe(stateful, history(info.id))
        await subscribe(stateful, LIST)
        async with modern.listen(
            resource_subscriptions=[history(info.id), LIST], resources_list_changed=True
        ) as sub:
            # Over the WebSocket.
            await hub.sessions.append(info.id, text("u2", "over the socket"))
            assert await next_event(sub) == ResourceUpdated(history(info.id))
            await notes.wait_for(history(info.id))
            assert [m["id"] for m in await read_json(modern, history(info.id))] == ["u1", "u2"]
            # Over /api/chat.
            await chat(url, admin, info.id, "u3")
            assert await next_event(sub) == ResourceUpdated(history(info.id))
            await notes.wait_for(history(info.id))
            assert "u3" in [m["id"] for m in await read_json(stateful, history(info.id))]
            # By another MCP client.
            answer = body(await other.call_tool("append_message", {"session_id": info.id, "text": "x"}))
            assert answer.startswith("Appended message ")
            await notes.wait_for(history(info.id))
            events = {await next_event(sub)}
            # A new session: the list and the resources changed.
            await hub.sessions.create("another")
            while ResourcesListChanged() not in events or ResourceUpdated(LIST) not in events:
                events.add(await next_event(sub))
            assert ResourceUpdated(history(info.id)) in events
            await notes.wait_for("list_changed")
            assert len(await read_json(modern, LIST)) == 2


async def test_scopes_on_both_revisions(tmp_path: Path) -> None:
    async with served(db=tmp_path / "hub.db", config=HubConfig(auth_secret=SECRET)) as h:
        manager = h.hub.manager
        mine, theirs = await manager.create("mine"), await manager.create("theirs")
        reader = issue_token(SECRET, {mine.id: "read"})
        admin = issue_token(SECRET, {"*": "admin"})
        async with (
            mcp_modern(f"{h.url}/mcp", reader) as modern,
            mcp_modern(f"{h.url}/mcp/stateful", reader, mode="legacy") as stateful,
            mcp_modern(f"{h.url}/mcp", admin) as watcher,
        ):
            for client in (modern, stateful):
                # A token scoped to one session sees only it, in the list too.
                assert [s["id"] for s in await read_json(client, LIST)] == [mine.id]
                assert await read_json(client, history(mine.id)) == []
                refused = (
                    f"forbidden: reading {history(theirs.id)} needs the read scope on session {theirs.id}"
                )
                with pytest.raises(MCPError) as caught:
                    await client.read_resource(history(theirs.id))
                assert caught.value.error.message == refused
                wrote = await client.call_tool("append_message", {"session_id": mine.id, "text": "x"})
                assert wrote.is_error
                assert (
                    body(wrote)
                    == f"forbidden: tool append_message needs the write scope on session {mine.id}"
                )
            with pytest.raises(MCPError, match=f"needs the read scope on session {theirs.id}"):
                await subscribe(stateful, history(theirs.id))
            with pytest.raises(MCPError, match=f"needs the read scope on session {theirs.id}"):
                async with modern.listen(resource_subscriptions=[history(theirs.id)]):
                    pass
            # Listening to the list, a scoped token hears only of its sessions: the admin's
            # listener (the same feed, served in the same call) hears of the new session
            # first; the reader's first event is then its own session's.
            async with (
                modern.listen(
                    resource_subscriptions=[LIST, history(mine.id)], resources_list_changed=True
                ) as sub,
                watcher.listen(resources_list_changed=True) as everything,
            ):
                await manager.create("third")
                assert await next_event(everything) == ResourcesListChanged()
                await manager.append(theirs.id, text("t1", "not for the reader"))
                await manager.append(mine.id, text("m1", "for the reader"))
                assert await next_event(sub) == ResourceUpdated(history(mine.id))


async def test_an_unknown_tool_names_the_tools(tmp_path: Path) -> None:
    async with await SqliteStore.open(str(tmp_path / "hub.db")) as store:
        manager = SessionManager(store)
        info = await manager.create("one")
        # A block configured on this session alone: its tools are this session's.
        manager.get_session(info.id).with_context("scratch", description="Notes", max_tokens=500)
        async with served(manager=manager) as h, mcp_modern(f"{h.url}/mcp") as client:
            result = await client.call_tool("delete_everything", {"session_id": "x"})
            assert result.is_error
            assert body(result) == (
                'Error: unknown tool "delete_everything". The tools are: '
                "session_search, list_sessions, get_history, append_message, search"
            )
            result = await client.call_tool("delete_everything", {"session_id": info.id})
            assert body(result).endswith(
                "The tools are: set_context, session_search, list_sessions, "
                "get_history, append_message, search"
            )
            written = await client.call_tool(
                "set_context", {"session_id": info.id, "label": "scratch", "content": "kept"}
            )
            assert not written.is_error, body(written)
        block = await manager.get_session(info.id).get_context_block("scratch")
        assert block is not None and block.content == "kept"


def endpoint_of(app: Any) -> McpEndpoint:
    """The app's MCP door (its routes' endpoints are the door's two ASGI apps)."""
    door: Any = next(getattr(r, "endpoint", None) for r in app.routes if getattr(r, "path", "") == "/mcp")
    endpoint = door.endpoint
    assert isinstance(endpoint, McpEndpoint)
    return endpoint


async def test_a_dropped_listener_frees_everything(tmp_path: Path) -> None:
    app = create_app(db=str(tmp_path / "hub.db"))
    async with served(app=app) as h:
        manager = h.hub.manager
        info = await manager.create("one")
        endpoint = endpoint_of(app)
        feed, listening = endpoint.feed, endpoint.tools.listening
        assert feed is not None and listening is not None
        async with mcp_modern(f"{h.url}/mcp") as client:
            async with client.listen(resource_subscriptions=[history(info.id)]) as sub:
                assert feed.followed == ["registry", f"s:{info.id}"]
                await manager.append(info.id, text("u1", "hi"))
                assert await next_event(sub) == ResourceUpdated(history(info.id))
            await eventually(lambda: not feed.listeners and not feed.followed)
        async with mcp_modern(f"{h.url}/mcp/stateful", mode="legacy") as client:
            await subscribe(client, history(info.id))
            await subscribe(client, LIST)
            assert len(listening.sessions) == 1 and feed.followed == ["registry", f"s:{info.id}"]
            await subscribe(client, history(info.id), drop=True)
            assert feed.followed == ["registry"]
        # The client's DELETE ends its MCP session: its subscriptions go with it.
        await eventually(lambda: not listening.sessions and not feed.listeners and not feed.followed)

        # Bounded: past the feed's listeners, a listen is refused with a typed error.
        feed.max_listeners = 1
        async with (
            mcp_modern(f"{h.url}/mcp") as first,
            mcp_modern(f"{h.url}/mcp") as second,
            first.listen(resources_list_changed=True),
        ):
            with pytest.raises(MCPError, match="1 MCP listeners at most") as refused:
                async with second.listen(resources_list_changed=True):
                    pass
            # The hub's typed code (a WebSocket's subscription limit's), not "internal".
            assert refused.value.error.data == {"code": "too_many"}, refused.value.error
            assert str(refused.value).startswith("too_many: ")


async def test_an_expired_token_ends_the_listener(tmp_path: Path) -> None:
    async with await SqliteStore.open(str(tmp_path / "hub.db")) as store:
        manager = SessionManager(store)
        info = await manager.create("one")

        class Host:
            pass

        host: Any = Host()
        host.manager = manager
        feed = McpFeed(host, 10)
        grant = Grant("reader", {info.id: "read"}, expires_at=time.time() + 0.3)
        got: list[ServerEvent] = []
        ended = asyncio.Event()
        listener = Listener(Caller(True, grant), frozenset({history(info.id)}), False, got.append, ended.set)
        await feed.add(listener)
        await manager.append(info.id, text("u1", "hi"))
        await eventually(lambda: got == [ResourceUpdated(history(info.id))])
        async with asyncio.timeout(WAIT):
            await ended.wait()
        assert not feed.listeners and not feed.followed
        await feed.close()


@pytest.mark.parametrize("blocks", ["writable", "searchable", "searchable history"])
async def test_memory_tools_are_listed_when_blocks_are_configured(tmp_path: Path, blocks: str) -> None:
    async with await SqliteStore.open(str(tmp_path / "hub.db")) as store:
        manager = SessionManager(store)
        if blocks == "writable":
            manager.with_context("memory", description="Learned facts", max_tokens=500)
        elif blocks == "searchable":
            manager.with_context("notes", description="Notes", provider=StoreSearchProvider(store))
        else:
            manager.with_searchable_history("history")
        info = await manager.create("one")
        own = {t.name for t in await manager.get_session(info.id).tools()}
        async with served(manager=manager) as h, mcp_modern(f"{h.url}/mcp") as client:
            listed = {t.name for t in (await client.list_tools()).tools}
            if blocks == "writable":
                # A write to a block is announced on the block's resource.
                block = f"sessionhub://sessions/{info.id}/blocks/memory"
                async with client.listen(resource_subscriptions=[block]) as sub:
                    arguments = {"session_id": info.id, "label": "memory", "content": "likes tea"}
                    assert not (await client.call_tool("set_context", arguments)).is_error
                    assert await next_event(sub) == ResourceUpdated(block)
        assert own and own <= listed
        expected = {"writable": {"set_context"}, "searchable": {"set_context", "search_context"}}
        assert own == expected.get(blocks, {"search_context"})


async def test_a_draining_hub_closes_listen_streams_gracefully(tmp_path: Path) -> None:
    async with (
        served(db=tmp_path / "hub.db") as h,
        mcp_modern(f"{h.url}/mcp") as client,
        client.listen(resources_list_changed=True) as sub,
    ):
        drained = asyncio.create_task(h.hub.drain())
        async with asyncio.timeout(WAIT):
            # The server's final result ends the loop; a cut stream would raise
            # SubscriptionLost instead.
            assert [event async for event in sub] == []
        await drained


async def test_a_listener_on_one_node_hears_a_write_on_another() -> None:
    # Both nodes in this process, each on its own store and connections: the hub that
    # serves MCP (on the Postgres bus) and an engine whose writes ring the doorbell as
    # another node's do (serve processes on Postgres take seconds to start).
    async with (
        scratch_database(postgres_dsn(), "sessionhub_mcp") as database,
        served(db=database, bus="postgres") as node,
        open_store(database) as store,
        mcp_modern(f"{node.url}/mcp") as client,
    ):
        writer = SessionManager(store)
        info = await writer.create("across nodes")
        async with client.listen(resource_subscriptions=[history(info.id)]) as sub:
            await writer.append(info.id, text("u1", "written elsewhere"))
            assert await next_event(sub) == ResourceUpdated(history(info.id))
        assert [m["id"] for m in await read_json(client, history(info.id))] == ["u1"]
