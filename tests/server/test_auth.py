"""Tokens and scopes: hub.auth, the `sessionhub token` command, and the whole matrix of
operations × scopes against a real hub."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hub import Forbidden, InvalidInput, SessionManager, SqliteStore
from hub.auth import OP_LEVELS, issue_token, parse_ttl, verify_token
from hub.server import HubConfig, create_app
from hub.server.handshake import host_allowed, origin_allowed
from protocol.frames import REQUEST_TYPES
from tests.support.hubtest import served, text

SECRET = "a-test-secret-that-is-long-enough-for-hs256"
OTHER = "another-secret-that-is-long-enough-for-hs256"


def test_tokens_round_trip() -> None:
    token = issue_token(SECRET, {"abc": "write", "*": "read"}, subject="worker-1", ttl=60)
    grant = verify_token(SECRET, token)
    assert grant.subject == "worker-1"
    assert grant.allows("append", "abc") and grant.allows("get_history", "zzz")
    assert not grant.allows("append", "zzz") and not grant.allows("delete", "abc")
    assert not grant.allows("subscribe", None, registry=True)
    assert not grant.allows("no_such_op", "abc")


@pytest.mark.parametrize(
    "token",
    [
        None,
        "",
        "not-a-jwt",
        issue_token(OTHER, {"*": "admin"}),  # forged: signed with another secret
        issue_token(SECRET, {"*": "admin"}, ttl=-10),  # expired
    ],
)
def test_bad_tokens_are_forbidden_without_detail(token: str | None) -> None:
    with pytest.raises(Forbidden) as info:
        verify_token(SECRET, token)
    assert str(info.value) == "forbidden"


def test_scopes_must_be_known_levels() -> None:
    with pytest.raises(InvalidInput):
        issue_token(SECRET, {"*": "root"})
    import jwt

    weird = jwt.encode({"sub": "x", "exp": int(time.time()) + 60, "scopes": {"*": "root"}}, SECRET, "HS256")
    with pytest.raises(Forbidden):
        verify_token(SECRET, weird)


@pytest.mark.parametrize(
    ("text_", "seconds"), [("90", 90), ("90s", 90), ("15m", 900), ("1h", 3600), ("7d", 604800)]
)
def test_parse_ttl(text_: str, seconds: float) -> None:
    assert parse_ttl(text_) == seconds


def test_token_command_prints_a_valid_token() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "hub.apps.cli", "token", "--secret", SECRET, "--session", "s1",
         "--session", "s2", "--scope", "write", "--ttl", "2h", "--sub", "ci"],
        capture_output=True, text=True, check=True, timeout=30,
    ).stdout.strip()  # fmt: skip
    grant = verify_token(SECRET, out)
    assert grant.subject == "ci" and dict(grant.scopes) == {"s1": "write", "s2": "write"}
    assert 7000 < grant.expires_at - time.time() <= 7200


def test_serve_refuses_a_public_address_without_a_secret() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "hub.apps.cli", "serve", "--host", "0.0.0.0", "--port", "0"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert result.returncode == 2
    assert "--auth-secret" in result.stderr


def checkpoint(session_id: str) -> dict[str, Any]:
    """A LangGraph checkpoint record as the wire carries it (bytes base64)."""
    return {
        "thread_id": session_id,
        "ns": "",
        "checkpoint_id": "c1",
        "parent_id": None,
        "type": "msgpack",
        "data": "AP8=",
        "metadata": {"step": 0},
    }


def request_for(op: str, session_id: str) -> dict[str, Any]:
    """A well-formed request for ``op`` on ``session_id`` (it may still fail for other
    reasons; the matrix only cares whether it is forbidden)."""
    fields: dict[str, dict[str, Any]] = {
        "create": {"name": "new"},
        "get": {"session_id": session_id},
        "list": {},
        "rename": {"session_id": session_id, "name": "renamed"},
        "delete": {"session_id": session_id},
        "end": {"session_id": session_id},
        "append": {"session_id": session_id, "message": text("x1", "hello")},
        "upsert": {"session_id": session_id, "message": text("x2", "hello")},
        "append_all": {"session_id": session_id, "messages": [text("x3", "hello")]},
        "get_history": {"session_id": session_id},
        "get_branches": {"session_id": session_id, "message_id": "m1"},
        "get_message_count": {"session_id": session_id},
        "clear_messages": {"session_id": session_id},
        "delete_messages": {"session_id": session_id, "ids": ["nope"]},
        "fork": {"session_id": session_id, "at_message_id": "m1", "name": "fork"},
        "add_compaction": {"session_id": session_id, "summary": "s", "from_id": "m1", "to_id": "m1"},
        "get_compactions": {"session_id": session_id},
        "compact_and_split": {"session_id": session_id, "summary": "s"},
        "add_usage": {"session_id": session_id, "input_tokens": 1, "output_tokens": 1, "cost": 0.1},
        "search": {"query": "hello"},
        "get_message": {"session_id": session_id, "message_id": "m1"},
        "get_latest_leaf": {"session_id": session_id},
        "get_path_length": {"session_id": session_id},
        "update_message": {"session_id": session_id, "message": text("m1", "edited")},
        "session_search": {"session_id": session_id, "query": "hello"},
        "get_context_blocks": {"session_id": session_id},
        "get_context_block": {"session_id": session_id, "label": "memory"},
        "replace_context_block": {"session_id": session_id, "label": "memory", "content": "x"},
        "append_context_block": {"session_id": session_id, "label": "memory", "content": "x"},
        "freeze_system_prompt": {"session_id": session_id},
        "refresh_system_prompt": {"session_id": session_id},
        "tools": {"session_id": session_id},
        "run_tool": {
            "session_id": session_id,
            "name": "set_context",
            "arguments": {"label": "memory", "content": "y"},
        },
        "compact": {"session_id": session_id},
        "estimate_tokens": {"session_id": session_id},
        "read_events": {"session_id": session_id},
        "prune_events": {"older_than": 3600},
        "subscribe": {"session_id": session_id},
        "unsubscribe": {"session_id": session_id},
        "ping": {},
        "hello": {"name": "me", "role": "worker", "sessions": []},
        "presence": {"session_id": session_id},
        "summary": {"request_id": "nothing-was-asked", "summary": "x"},
        "auth": {"token": "replaced by the connection's own token"},
        "stream_start": {"session_id": session_id, "message_id": "streamed", "role": "assistant"},
        "stream_delta": {"session_id": session_id, "message_id": "streamed", "kind": "text", "text": "x"},
        "stream_end": {"session_id": session_id, "message_id": "streamed"},
        "take_turns": {},
        "start_turn": {"session_id": session_id},
        "get_turn": {"session_id": session_id},
        "stop_turn": {"session_id": session_id},
        "turn_failed": {"turn_id": "nothing-was-given", "error": "x"},
        "answer_tool": {"session_id": session_id, "approval_id": "a1", "approved": True},
        "steer_turn": {"session_id": session_id, "message": {"id": "m1", "role": "user", "parts": []}},
        "export": {"session_ids": [session_id]},
        "import": {"lines": ['{"sessionhub_dump": 1, "sessions": 0}'], "final": True},
        "checkpoint_put": {"session_id": session_id, "checkpoint": checkpoint(session_id)},
        "checkpoint_writes": {"session_id": session_id, "ns": "", "checkpoint_id": "c1", "writes": []},
        "checkpoint_get": {"session_id": session_id},
        "checkpoint_list": {"session_id": session_id},
        "checkpoint_delete": {"session_id": session_id},
        "checkpoint_prune": {"session_id": session_id},
        "checkpoint_delete_runs": {"run_ids": ["r1"]},
    }
    return fields[op]


RANK = {"read": 0, "write": 1, "admin": 2}
GLOBAL_OPS = {
    "create",
    "list",
    "search",
    "export",
    "import",
    "prune_events",
    "checkpoint_delete_runs",
}  # not about one session: on "*"


def expected_allowed(op: str, scopes: dict[str, str], target: str) -> bool:
    if op in ("ping", "hello", "summary", "auth", "take_turns", "turn_failed"):  # any valid token
        return True  # (hello's sessions are checked one by one; a summary or a turn_failed answers
        # only what this connection was asked; auth checks the token it brings, here the
        # connection's own; a responder is given only turns its token can write)
    needed = RANK[OP_LEVELS[op]]
    keys = ["*"] if op in GLOBAL_OPS else ["*", target]
    have = max((RANK[scopes[k]] for k in keys if k in scopes), default=-1)
    return have >= needed


SCOPE_CASES = {
    "read-A": {"A": "read"},
    "write-A": {"A": "write"},
    "admin-A": {"A": "admin"},
    "read-all": {"*": "read"},
    "write-all": {"*": "write"},
    "admin-all": {"*": "admin"},
    "write-B": {"B": "write"},
}


async def test_every_op_against_every_scope(tmp_path: Path) -> None:
    # Destructive ops last, so every other op still finds its session.
    last = ["clear_messages", "compact_and_split", "end", "delete"]
    ops = sorted(set(REQUEST_TYPES) - {"unsubscribe"} - set(last)) + last
    assert set(ops) <= set(OP_LEVELS)
    async with await SqliteStore.open(tmp_path / "hub.db") as store:
        manager = SessionManager(store).with_context("memory", max_tokens=100)
        app = create_app(manager=manager, config=HubConfig(auth_secret=SECRET))
        async with served(app=app) as hub:
            for name, scopes in SCOPE_CASES.items():
                # Fresh target sessions for each token, since some ops delete or end them.
                a = await manager.create("A")
                b = await manager.create("B")
                await manager.append(a.id, text("m1", "hello"))
                ids = {"A": a.id, "B": b.id}
                real = {ids.get(k, k): v for k, v in scopes.items()}
                token = issue_token(SECRET, real)
                async with hub.client(additional_headers={"Authorization": f"Bearer {token}"}) as client:
                    for op in ops:
                        fields = {"token": token} if op == "auth" else request_for(op, a.id)
                        frame = await client.request(op, **fields)
                        forbidden = frame.get("frame") == "error" and frame.get("code") == "forbidden"
                        allowed = expected_allowed(op, real, a.id)
                        assert forbidden != allowed, f"{name}: {op} -> {frame}"
                        if forbidden:
                            assert frame["message"] == "forbidden"
                        if op == "subscribe" and not forbidden:
                            await client.request("unsubscribe", session_id=a.id)
                    # The registry stream needs admin on every session.
                    frame = await client.request("subscribe", session_id=None)
                    registry_ok = scopes.get("*") == "admin"
                    assert (frame.get("code") == "forbidden") != registry_ok, f"{name}: registry -> {frame}"
                    # So does reading the registry's log.
                    frame = await client.request("read_events", session_id=None)
                    assert (frame.get("code") == "forbidden") != registry_ok, (
                        f"{name}: registry read -> {frame}"
                    )


async def test_a_token_for_a_cannot_see_b(tmp_path: Path) -> None:
    async with served(db=tmp_path / "hub.db", config=HubConfig(auth_secret=SECRET)) as hub:
        admin = issue_token(SECRET, {"*": "admin"})
        async with hub.client(additional_headers={"Authorization": f"Bearer {admin}"}) as root:
            a = (await root.call("create", name="A"))["id"]
            b = (await root.call("create", name="B"))["id"]
            await root.call("append", session_id=b, message=text("secret", "B's secret"))
        only_a = issue_token(SECRET, {a: "write"})
        async with hub.client(additional_headers={"Authorization": f"Bearer {only_a}"}) as client:
            for op, fields in [
                ("get_history", {"session_id": b}),
                ("subscribe", {"session_id": b}),
                ("session_search", {"session_id": b, "query": "secret"}),
                ("search", {"query": "secret"}),
                ("list", {}),
                ("append", {"session_id": b, "message": text("x", "intrusion")}),
            ]:
                frame = await client.request(op, **fields)
                assert (frame["frame"], frame["code"], frame["message"]) == (
                    "error",
                    "forbidden",
                    "forbidden",
                )
            assert (await client.call("append", session_id=a, message=text("ok", "mine"))) == "ok"


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer not-a-token"},
        {"Authorization": f"Bearer {issue_token(OTHER, {'*': 'admin'})}"},
        {"Authorization": f"Bearer {issue_token(SECRET, {'*': 'admin'}, ttl=-1)}"},
    ],
    ids=["none", "garbage", "forged", "expired"],
)
async def test_missing_and_bad_tokens_get_forbidden(tmp_path: Path, headers: dict[str, str]) -> None:
    config = HubConfig(auth_secret=SECRET)
    async with (
        served(db=tmp_path / "hub.db", config=config) as hub,
        hub.client(additional_headers=headers) as client,
    ):
        attempts: list[tuple[str, dict[str, Any]]] = [
            ("list", {}),
            ("create", {"name": "x"}),
            ("subscribe", {"session_id": None}),
        ]
        for op, fields in attempts:
            frame = await client.request(op, **fields)
            assert (frame["code"], frame["message"]) == ("forbidden", "forbidden")
        assert await client.call("ping") == "pong"  # the socket stays usable


async def test_browser_token_via_subprotocol_and_origin_check(tmp_path: Path) -> None:
    token = issue_token(SECRET, {"*": "read"})
    async with served(db=tmp_path / "hub.db", config=HubConfig(auth_secret=SECRET)) as hub:
        async with hub.client(subprotocols=["sessionhub", f"bearer.{token}"]) as client:
            assert await client.call("list") == []
        # A browser page from another origin is turned away before the handshake completes.
        from websockets.asyncio.client import connect
        from websockets.exceptions import InvalidStatus

        with pytest.raises(InvalidStatus):
            async with connect(hub.ws_url, origin="http://evil.example"):  # type: ignore[arg-type]
                pass
        async with connect(hub.ws_url, origin=f"http://127.0.0.1:{hub.port}"):  # type: ignore[arg-type]
            pass


async def test_the_python_client_sends_its_token(tmp_path: Path) -> None:
    from clients import HubClient

    async with served(db=tmp_path / "hub.db", config=HubConfig(auth_secret=SECRET)) as hub:
        async with HubClient(hub.ws_url, token=issue_token(SECRET, {"*": "admin"})) as client:
            info = await client.sessions.create("with a token")
            assert (await client.sessions.get(info.id)) == info
        async with HubClient(hub.ws_url, token=issue_token(SECRET, {"*": "read"})) as client:
            with pytest.raises(Exception, match="forbidden") as failure:
                await client.sessions.create("not allowed")
            assert getattr(failure.value, "code", None) == "forbidden"


def test_a_summarizer_needs_write() -> None:
    worker = verify_token(SECRET, issue_token(SECRET, {"b": "write", "a": "read"}))
    assert worker.summarizes()
    assert worker.allows("summarize", "b") and not worker.allows("summarize", "a")
    assert not worker.allows("summarize", None)  # a session not named: judged on "*"
    assert verify_token(SECRET, issue_token(SECRET, {"*": "write"})).allows("summarize", None)
    reader = verify_token(SECRET, issue_token(SECRET, {"*": "read"}))
    assert not reader.summarizes() and not reader.allows("summarize", "a")
    assert reader.allows("auth", None) and reader.allows("auth", "zzz")


class _Headers:
    def __init__(self, **headers: str) -> None:
        self.headers = headers


@pytest.mark.parametrize(
    ("host", "config", "ok"),
    [
        ("127.0.0.1:8000", HubConfig(), True),
        ("127.9.9.9", HubConfig(), True),
        ("localhost:8000", HubConfig(), True),
        ("LOCALHOST", HubConfig(), True),
        ("[::1]:8000", HubConfig(), True),
        (None, HubConfig(), True),  # no Host at all (HTTP/1.0): not a browser page
        ("evil.example:8000", HubConfig(), False),
        ("localhost.evil.example", HubConfig(), False),
        ("127.0.0.1.evil.example", HubConfig(), False),
        ("10.0.0.5:8000", HubConfig(), False),
        ("evil.example:http", HubConfig(), False),  # malformed
        ("user@127.0.0.1", HubConfig(), False),
        ("", HubConfig(), False),
        ("hub.lan:8000", HubConfig(bind_host="hub.lan"), True),
        ("10.0.0.5:8000", HubConfig(bind_host="10.0.0.5"), True),
        ("10.0.0.5:8000", HubConfig(bind_host="0.0.0.0"), True),  # wildcard: any address...
        ("[fe80::1]:8000", HubConfig(bind_host="::"), True),
        ("evil.example", HubConfig(bind_host="0.0.0.0"), False),  # ...but no name
        ("app.example", HubConfig(allowed_origins=("https://app.example",)), True),
        ("evil.example", HubConfig(allowed_origins=("https://app.example",)), False),
        ("evil.example", HubConfig(allowed_origins=("*",)), True),
        ("evil.example", HubConfig(auth_secret=SECRET), True),  # the token decides
    ],
)
def test_the_host_rule(host: str | None, config: HubConfig, ok: bool) -> None:
    assert host_allowed(host, config) is ok


@pytest.mark.parametrize(
    ("origin", "host", "config", "ok"),
    [
        (None, "evil.example", HubConfig(), True),  # not a browser: the token decides
        ("http://127.0.0.1:8000", "127.0.0.1:8000", HubConfig(), True),
        ("http://localhost:5173", "127.0.0.1:8000", HubConfig(), True),  # any loopback port
        ("https://[::1]:8443", "[::1]:8000", HubConfig(), True),
        ("http://evil.example:8000", "evil.example:8000", HubConfig(), False),  # rebinding
        ("http://evil.example", "127.0.0.1:8000", HubConfig(), False),
        ("null", "127.0.0.1:8000", HubConfig(), False),
        ("file://", "127.0.0.1:8000", HubConfig(), False),
        ("http://hub.lan:8000", "hub.lan:8000", HubConfig(bind_host="hub.lan"), True),
        ("http://10.0.0.5:8000", "10.0.0.5:8000", HubConfig(bind_host="0.0.0.0"), True),
        ("http://10.0.0.5:9000", "10.0.0.5:8000", HubConfig(bind_host="0.0.0.0"), False),
        ("https://app.example", "app.example", HubConfig(allowed_origins=("https://app.example",)), True),
        ("http://app.example", "app.example", HubConfig(allowed_origins=("https://app.example",)), False),
        ("http://anything.example", "x", HubConfig(allowed_origins=("*",)), True),
        ("https://hub.example", "hub.example", HubConfig(auth_secret=SECRET), True),  # behind a proxy
        ("https://evil.example", "hub.example", HubConfig(auth_secret=SECRET), False),
    ],
)
def test_the_origin_rule(origin: str | None, host: str, config: HubConfig, ok: bool) -> None:
    headers = {"host": host} if origin is None else {"host": host, "origin": origin}
    assert origin_allowed(_Headers(**headers), config) is ok  # type: ignore[arg-type]
