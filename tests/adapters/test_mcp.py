"""The /mcp endpoint, driven by the official ``mcp`` client (``ClientSession`` over streamable
HTTP): against a real ``sessionhub serve`` process with tokens, and against a real uvicorn
whose manager has context blocks (SQLite file and Postgres)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPError

from clients import HubClient
from hub import FileSkillProvider, SessionManager, Store, StoreSearchProvider
from hub.auth import issue_token
from hub.server import HubConfig
from tests.support.hubtest import served, text
from tests.support.mcpkit import ROOT, body, mcp_client, serve_process

SECRET = "mcp-test-secret-of-at-least-32-bytes!"


async def ok(session: ClientSession, name: str, arguments: dict[str, Any]) -> str:
    result = await session.call_tool(name, arguments)
    assert not result.is_error, body(result)
    return body(result)


# -- a real `sessionhub serve`, with tokens ------------------------------------------------


async def test_serve_process_tools_events_and_scopes(tmp_path: Path) -> None:
    admin = issue_token(SECRET, {"*": "admin"})
    async with serve_process(tmp_path / "hub.db", "--auth-secret", SECRET) as port:
        url = f"http://127.0.0.1:{port}/mcp"
        async with HubClient(f"ws://127.0.0.1:{port}/ws", token=admin) as hub:
            info = await hub.sessions.create("support")
            other = await hub.sessions.create("private")
            await hub.sessions.append(info.id, text("u1", "the deploy failed on friday"))

            async with mcp_client(url, admin) as mcp:
                listed = {t.name: t for t in (await mcp.list_tools()).tools}
                # serve has no context blocks: the manager's tool and the hub's own.
                assert set(listed) == {
                    "session_search",
                    "list_sessions",
                    "get_history",
                    "append_message",
                    "search",
                }
                assert listed["session_search"].description == (
                    "Search past conversations for relevant context. Searches across all sessions."
                )
                assert listed["get_history"].input_schema["required"] == ["session_id"]

                sessions = json.loads(await ok(mcp, "list_sessions", {}))
                assert {s["id"] for s in sessions} == {info.id, other.id}

                # A write through MCP is an event for a WebSocket subscriber.
                seen: list[Any] = []

                async def watch() -> None:
                    async for event in hub.subscribe(info.id, after_seq=0):
                        seen.append(event)
                        if event.type == "message.appended" and event.data["message"]["id"] == "m2":
                            return

                watcher = asyncio.create_task(watch())
                answer = await ok(
                    mcp,
                    "append_message",
                    {
                        "session_id": info.id,
                        "text": "rolled back at 17:00",
                        "role": "assistant",
                        "message_id": "m2",
                    },
                )
                assert answer == "Appended message m2."
                async with asyncio.timeout(5):
                    await watcher
                assert seen[-1].data["message"]["parts"] == [{"type": "text", "text": "rolled back at 17:00"}]

                history = await ok(mcp, "get_history", {"session_id": info.id})
                assert (
                    history
                    == "[user] (u1) the deploy failed on friday\n\n[assistant] (m2) rolled back at 17:00"
                )
                hits = json.loads(await ok(mcp, "search", {"query": "friday deploy"}))
                assert [(h["session_id"], h["id"]) for h in hits] == [(info.id, "u1")]
                found = await ok(mcp, "session_search", {"query": "rolled", "session_id": info.id})
                assert found == "[assistant] rolled back at 17:00"
                assert (
                    body(await mcp.call_tool("session_search", {"query": "nothing-like-this"}))
                    == "No results found."
                )

                prompt = await mcp.read_resource(f"sessionhub://sessions/{info.id}/prompt")
                first = prompt.contents[0]
                assert isinstance(first, types.TextResourceContents) and first.text == ""

            # A token for one session, read only.
            reader = issue_token(SECRET, {info.id: "read"})
            async with mcp_client(url, reader) as mcp:
                assert "m2" in await ok(mcp, "get_history", {"session_id": info.id})
                everyone = "every session (*)"
                for name, arguments, needed in [
                    (
                        "append_message",
                        {"session_id": info.id, "text": "no"},
                        f"write scope on session {info.id}",
                    ),
                    ("get_history", {"session_id": other.id}, f"read scope on session {other.id}"),
                    ("list_sessions", {}, f"read scope on {everyone}"),
                    ("search", {"query": "friday"}, f"read scope on {everyone}"),
                    (
                        "session_search",
                        {"query": "friday", "session_id": info.id},
                        f"write scope on {everyone}",
                    ),
                ]:
                    refused = await mcp.call_tool(name, arguments)
                    assert refused.is_error, name
                    assert body(refused) == f"forbidden: tool {name} needs the {needed}"
                resources = (await mcp.list_resources()).resources
                # Reading the prompt freezes it (a write), and serve has no blocks: the list
                # (of this session only) and this session's history.
                assert {r.uri for r in resources} == {
                    "sessionhub://sessions",
                    f"sessionhub://sessions/{info.id}/history",
                }
                with pytest.raises(MCPError, match="forbidden"):
                    await mcp.read_resource(f"sessionhub://sessions/{other.id}/prompt")

            # No token at all, and a forged one: a 401 before the body is read, nothing written.
            arguments = {"session_id": info.id, "text": "x"}
            call = {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "tools/call",
                "params": {"name": "append_message", "arguments": arguments},
            }
            for token in (None, issue_token("another-secret-of-at-least-32-bytes!!", {"*": "admin"})):
                headers = {"accept": "application/json, text/event-stream"}
                if token is not None:
                    headers["authorization"] = f"Bearer {token}"
                async with httpx2.AsyncClient() as http:
                    response = await http.post(url, json=call, headers=headers)
                assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"
                assert response.json()["error"]["data"] == {"code": "unauthorized"}
            assert [m.id for m in await hub.sessions.get_history(info.id)] == ["u1", "m2"]


# -- context tools, on SQLite and Postgres -------------------------------------------------


def context_manager(store: Store, skills: Path) -> SessionManager:
    (skills / "deploy.md").write_text("Deploy with blue/green.")
    return (
        SessionManager(store)
        .with_context("memory", description="Learned facts", max_tokens=1100)
        .with_context("skills", description="How-tos", provider=FileSkillProvider(skills))
        .with_context("notes", description="Searchable notes", provider=StoreSearchProvider(store))
        .with_cached_prompt()
    )


async def test_context_tools_match_the_sessions_own(store: Store, tmp_path: Path) -> None:
    (tmp_path / "skills").mkdir()
    manager = context_manager(store, tmp_path / "skills")
    async with served(manager=manager) as hub:
        info = await manager.create("with context")
        own = {t.name: t for t in await manager.get_session(info.id).tools()}
        assert set(own) == {"set_context", "load_context", "unload_context", "search_context"}
        async with mcp_client(f"{hub.url}/mcp") as mcp:
            listed = {t.name: t for t in (await mcp.list_tools()).tools}
            for name, tool in own.items():
                assert listed[name].description == tool.description
                schema = listed[name].input_schema
                assert schema["required"] == ["session_id", *tool.input_schema["required"]]
                assert {k: v for k, v in schema["properties"].items() if k != "session_id"} == (
                    tool.input_schema["properties"]
                )

            written = await ok(
                mcp, "set_context", {"session_id": info.id, "label": "memory", "content": "likes tea"}
            )
            assert written.startswith("Written to memory. Usage: ")
            block = await manager.get_session(info.id).get_context_block("memory")
            assert block is not None and block.content == "likes tea"

            loaded = await ok(
                mcp, "load_context", {"session_id": info.id, "label": "skills", "key": "deploy.md"}
            )
            assert loaded == "Deploy with blue/green."
            unloaded = await ok(
                mcp, "unload_context", {"session_id": info.id, "label": "skills", "key": "deploy.md"}
            )
            assert unloaded == 'Unloaded "deploy.md" from skills. Context reclaimed.'
            again = await own["unload_context"].execute({"label": "skills", "key": "deploy.md"})
            assert again == 'Skill "deploy.md" is not currently loaded in "skills".'  # same state

            indexed = await ok(
                mcp,
                "set_context",
                {"session_id": info.id, "label": "notes", "content": "the vpn password rotates monthly",
                 "metadata": {"title": "vpn"}},
            )  # fmt: skip
            assert indexed == 'Indexed "vpn" in notes.'
            searched = await ok(
                mcp, "search_context", {"session_id": info.id, "label": "notes", "query": "vpn"}
            )
            assert "rotates monthly" in searched

            # The original's error strings come back as tool errors.
            bad = await mcp.call_tool(
                "search_context", {"session_id": info.id, "label": "memory", "query": "x"}
            )
            assert bad.is_error and body(bad).startswith('Error: "memory" is not searchable.')
            missing = await mcp.call_tool("set_context", {"session_id": info.id, "label": "memory"})
            assert missing.is_error and body(missing) == 'Error: missing required argument "content"'
            unknown = await mcp.call_tool(
                "set_context", {"session_id": "nope", "label": "memory", "content": "x"}
            )
            assert unknown.is_error and body(unknown) == "not_found: session not found: 'nope'"

            # Resources: the frozen prompt and every block of every session.
            uris = {r.uri for r in (await mcp.list_resources()).resources}
            base = f"sessionhub://sessions/{info.id}"
            assert {
                f"{base}/prompt",
                f"{base}/blocks/memory",
                f"{base}/blocks/skills",
                f"{base}/blocks/notes",
            } <= uris
            prompt = (await mcp.read_resource(f"{base}/prompt")).contents[0]
            assert isinstance(prompt, types.TextResourceContents)
            assert prompt.text == await manager.get_session(info.id).freeze_system_prompt()
            assert "likes tea" in prompt.text
            memory = (await mcp.read_resource(f"{base}/blocks/memory")).contents[0]
            assert isinstance(memory, types.TextResourceContents) and memory.text == "likes tea"
            with pytest.raises(MCPError, match="no context block"):
                await mcp.read_resource(f"{base}/blocks/nothing")
            templates = (await mcp.list_resource_templates()).resource_templates
            assert [t.uri_template for t in templates] == [
                "sessionhub://sessions/{session_id}/history",
                "sessionhub://sessions/{session_id}/prompt",
                "sessionhub://sessions/{session_id}/blocks/{label}",
            ]


async def test_scope_is_per_session(tmp_path: Path) -> None:
    async with served(db=tmp_path / "hub.db", config=HubConfig(auth_secret=SECRET)) as hub:
        manager = hub.hub.manager
        mine, theirs = await manager.create("mine"), await manager.create("theirs")
        token = issue_token(SECRET, {mine.id: "write"})
        async with mcp_client(f"{hub.url}/mcp", token) as mcp:
            assert await ok(mcp, "append_message", {"session_id": mine.id, "text": "hi", "message_id": "a"})
            refused = await mcp.call_tool("append_message", {"session_id": theirs.id, "text": "hi"})
            assert refused.is_error
            assert (
                body(refused)
                == f"forbidden: tool append_message needs the write scope on session {theirs.id}"
            )
            uris = {r.uri for r in (await mcp.list_resources()).resources}
            base = f"sessionhub://sessions/{mine.id}"
            assert uris == {"sessionhub://sessions", f"{base}/history", f"{base}/prompt"}
        assert await manager.get_message_count(theirs.id) == 0


async def test_a_foreign_origin_is_refused(tmp_path: Path) -> None:
    async with served(db=tmp_path / "hub.db") as hub, httpx2.AsyncClient() as http:
        response = await http.post(
            f"{hub.url}/mcp",
            headers={"Origin": "http://evil.example"},
            json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
        )
        assert response.status_code == 403


def test_without_the_mcp_package_there_is_no_route() -> None:
    code = (
        "import sys; sys.modules['mcp'] = None\n"
        "from hub.server import create_app\n"
        "app = create_app(db=':memory:')\n"
        "print(sorted(getattr(r, 'path', '') for r in app.routes))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "/mcp" not in done.stdout and "/ws" in done.stdout
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines == ['no /mcp endpoint: the mcp package is not installed (pip install "sessionhub[mcp]")']
