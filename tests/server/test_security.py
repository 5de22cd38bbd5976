"""The hub's security promises (docs/security.md), end to end against real ``sessionhub
serve`` processes: summaries only from workers allowed on their session, nothing outlives
a token (renewal in band, close 4001 at expiry), and no socket or page for a browser page
that rebound its DNS name to the hub's address.

The summarizer tests run ``serve --summarizer workers`` (:data:`WORKER_SUMMARIES`).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import re
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jwt
import pytest
from websockets.exceptions import InvalidStatus

from clients import HubClient, HubError, TokenExpired
from hub.auth import issue_token
from tests.support.hubtest import Client, Frame, is_event, text
from tests.support.nodes import Node, free_port
from tests.support.rawhttp import send_until_answered
from tests.support.services import node

ROOT = Path(__file__).resolve().parents[2]
SECRET = "a-test-secret-that-is-long-enough-for-hs256"
OTHER = "another-secret-that-is-long-enough-for-hs256"

#: ``sessionhub serve``'s options that hand compaction to connected workers (the sessions
#: here are short: a small tail leaves a middle to summarize).
WORKER_SUMMARIES = ("--summarizer", "workers", "--summarizer-timeout", "5", "--compact-tail-tokens", "10")


class Serve:
    """One ``sessionhub serve`` process on a fixed port (a restart comes back there)."""

    def __init__(self, db: Path, *extra: str, worker_summaries: bool = False) -> None:
        self.db = db
        self.extra = list(extra)
        self.worker_summaries = worker_summaries
        self.port = free_port()
        self.proc: asyncio.subprocess.Process | None = None
        self.log: list[str] = []
        self._reader: asyncio.Task[None] | None = None

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws"

    async def start(self) -> None:
        summaries = WORKER_SUMMARIES if self.worker_summaries else ()
        args = ["-m", "hub.apps.cli", "serve", "--db", str(self.db), "--port", str(self.port), *summaries]
        args += self.extra
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            *args,
            cwd=ROOT,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        stderr = self.proc.stderr
        assert stderr is not None
        async with asyncio.timeout(30):
            while True:
                line = (await stderr.readline()).decode()
                if not line:
                    raise RuntimeError("sessionhub serve exited before listening:\n" + "".join(self.log))
                self.log.append(line)
                if re.search(r"Uvicorn running on http://\S+:\d+", line):
                    break
        self._reader = asyncio.create_task(self._drain(stderr))

    async def _drain(self, stderr: asyncio.StreamReader) -> None:
        while line := await stderr.readline():
            self.log.append(line.decode())

    async def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.returncode is None:
            proc.send_signal(signal.SIGINT)
        async with asyncio.timeout(20):
            await proc.wait()
        if self._reader is not None:
            await self._reader

    async def __aenter__(self) -> Serve:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def client(
        self, token: str | None = None, **kwargs: Any
    ) -> contextlib.AbstractAsyncContextManager[Client]:
        if token is not None:
            kwargs["additional_headers"] = {"Authorization": f"Bearer {token}"}
        return Client.connect(self.ws_url, **kwargs)


def token(scopes: dict[str, str], ttl: float = 600.0, secret: str = SECRET) -> str:
    return issue_token(secret, scopes, ttl=ttl)


def expires_at(value: str) -> float:
    """The token's ``exp``, read whether or not it has passed."""
    return float(jwt.decode(value, options={"verify_signature": False})["exp"])


def event_of(session_id: str, message_id: str) -> Any:
    def match(frame: Frame) -> bool:
        return (
            is_event(frame)
            and frame["session_id"] == session_id
            and frame["type"] == "message.appended"
            and frame["data"].get("message", {}).get("id") == message_id
        )

    return match


def texts(history: list[Frame]) -> list[str]:
    return [p["text"] for m in history for p in m["parts"] if p.get("type") == "text"]


async def next_message(events: AsyncIterator[Any], timeout: float = 15) -> str:
    """The id of the next appended message among a subscription's events."""
    async with asyncio.timeout(timeout):
        async for event in events:
            if event.type == "message.appended":
                return str(event.data["message"]["id"])
    raise AssertionError("the subscription ended")


async def until(deadline: float) -> None:
    await asyncio.sleep(max(0.0, deadline - time.time()))


@contextlib.asynccontextmanager
async def admin_of(hub: Serve) -> AsyncIterator[Client]:
    async with hub.client(token({"*": "admin"})) as admin:
        yield admin


async def long_session(admin: Client, name: str, words: str) -> str:
    sid: str = (await admin.call("create", name=name))["id"]
    messages = [text(f"m{i}", f"turn {i}: {words}", "user" if i % 2 == 0 else "assistant") for i in range(8)]
    await admin.call("append_all", session_id=sid, messages=messages)
    return sid


# -- 1. summaries: only from workers allowed on the session ----------------------------------


async def test_a_read_only_token_cannot_become_a_summarizer(tmp_path: Path) -> None:
    hub = Serve(tmp_path / "hub.db", "--auth-secret", SECRET, worker_summaries=True)
    async with hub, admin_of(hub) as admin:
        a = (await admin.call("create", name="A"))["id"]
        b = await long_session(admin, "B", "B's secret launch plan")
        async with hub.client(token({a: "read"})) as spy:
            refused = await spy.request("hello", name="spy", summarizer=True)
            assert (refused["frame"], refused.get("code")) == ("error", "forbidden"), refused
            # B's summary prompt goes nowhere: there is no summarizer at all.
            assert await admin.call("compact", session_id=b) is None
            await asyncio.sleep(0.2)
            assert not [f for f in spy.received if f["frame"] == "summarize"]
            # A plain hello (presence on A) is still fine with that token.
            assert "connection_id" in await spy.call("hello", name="spy", sessions=[a])


async def test_prompts_go_only_to_workers_with_write_on_their_session(tmp_path: Path) -> None:
    hub = Serve(tmp_path / "hub.db", "--auth-secret", SECRET, worker_summaries=True)
    async with hub, admin_of(hub) as admin:
        a = await long_session(admin, "A", "the spy's own session")
        b = await long_session(admin, "B", "B's secret launch plan")
        async with hub.client(token({a: "write"})) as spy, hub.client(token({b: "write"})) as worker:
            await spy.call("hello", name="spy", summarizer=True)  # a summarizer, for A only
            await worker.call("hello", name="worker", summarizer=True)
            compaction = asyncio.create_task(admin.call("compact", session_id=b))
            ask = await worker.take(lambda f: f["frame"] == "summarize")
            assert ask["session_id"] == b and "secret launch plan" in ask["prompt"]
            # The spy cannot answer in the worker's place, even with the request id.
            forged = await spy.request("summary", request_id=ask["request_id"], summary="forged")
            assert (forged["frame"], forged["code"]) == ("error", "not_found")
            summary = "## Topic\nThe launch, summarized by B's worker."
            await worker.call("summary", request_id=ask["request_id"], summary=summary)
            result = await asyncio.wait_for(compaction, 10)
            assert result is not None and result["summary"] == summary
            history = await admin.call("get_history", session_id=b)
            assert summary in texts(history) and "forged" not in texts(history)

            # The spy's own session is summarized by the spy (the other worker has no
            # write on A)...
            mine = asyncio.create_task(admin.call("compact", session_id=a))
            own = await spy.take(lambda f: f["frame"] == "summarize")
            assert own["session_id"] == a
            await spy.call("summary", request_id=own["request_id"], summary="## Topic\nA, by the spy.")
            assert (await asyncio.wait_for(mine, 10))["summary"] == "## Topic\nA, by the spy."
            assert not [f for f in worker.received if f["frame"] == "summarize" and f["session_id"] != b]

        # ...and with only the spy left, B's compaction fails rather than ask it.
        more = [text(f"n{i}", f"later turn {i} of the secret plan") for i in range(8)]
        await admin.call("append_all", session_id=b, messages=more)
        async with hub.client(token({a: "write"})) as spy:
            await spy.call("hello", name="spy", summarizer=True)
            assert await admin.call("compact", session_id=b) is None
            await asyncio.sleep(0.2)
            assert not [f for f in spy.received if f["frame"] == "summarize"]
        assert (await admin.subscribe(b))["frame"] == "reply"
        failed = await admin.take(lambda f: is_event(f) and f["session_id"] == b and f["type"] == "error")
        assert "no connected worker may summarize this session" in failed["data"]["error"]
        assert "later turn 7 of the secret plan" in texts(await admin.call("get_history", session_id=b))


async def test_without_a_secret_any_worker_summarizes_as_before(tmp_path: Path) -> None:
    async with Serve(tmp_path / "hub.db", worker_summaries=True) as hub:

        def summarize(prompt: str) -> str:
            return "## Topic\nSummarized without auth."

        async with (
            HubClient(hub.ws_url, name="w", summarize=summarize),
            HubClient(hub.ws_url) as ui,
        ):
            info = await ui.sessions.create("loopback")
            await ui.sessions.append_all(info.id, [text(f"m{i}", f"turn {i}") for i in range(8)])
            await asyncio.sleep(0.1)  # the worker's hello is in
            result = await ui.session(info.id).compact()
            assert result is not None and result["summary"] == "## Topic\nSummarized without auth."


# -- 2. nothing outlives its token ------------------------------------------------------------


async def test_a_subscription_ends_when_its_token_expires(tmp_path: Path) -> None:
    async with Serve(tmp_path / "hub.db", "--auth-secret", SECRET) as hub, admin_of(hub) as admin:
        sid = (await admin.call("create", name="watched"))["id"]
        short = token({sid: "read"}, ttl=2)
        async with hub.client(short) as reader:
            assert (await reader.subscribe(sid))["frame"] == "reply"
            await admin.call("append", session_id=sid, message=text("before", "before exp"))
            await reader.take(event_of(sid, "before"))
            await asyncio.wait_for(reader.closed.wait(), expires_at(short) - time.time() + 3)
            assert time.time() >= expires_at(short) - 0.05
            assert reader.close_code == 4001
            assert "token expired" in (reader.close_reason or "")
            await admin.call("append", session_id=sid, message=text("after", "after exp"))
            await asyncio.sleep(0.3)
            assert not [f for f in reader.received if event_of(sid, "after")(f)]


async def test_auth_renews_the_token_in_band(tmp_path: Path) -> None:
    async with Serve(tmp_path / "hub.db", "--auth-secret", SECRET) as hub, admin_of(hub) as admin:
        sid = (await admin.call("create", name="watched"))["id"]
        short = token({sid: "read"}, ttl=2)
        async with hub.client(short) as reader:
            assert (await reader.subscribe(sid))["frame"] == "reply"
            fresh = token({sid: "read"}, ttl=600)
            renewed = await reader.call("auth", token=fresh)
            assert renewed == {"sub": "sessionhub", "exp": int(expires_at(fresh)), "ended": []}
            await until(expires_at(short) + 1.0)
            await admin.call("append", session_id=sid, message=text("later", "after the old exp"))
            await reader.take(event_of(sid, "later"))
            assert not reader.closed.is_set()
            assert len(await reader.call("get_history", session_id=sid)) == 1


async def test_a_token_that_fails_verification_leaves_the_old_grant(tmp_path: Path) -> None:
    async with Serve(tmp_path / "hub.db", "--auth-secret", SECRET) as hub, admin_of(hub) as admin:
        sid = (await admin.call("create", name="mine"))["id"]
        async with hub.client(token({sid: "read"})) as client:
            assert (await client.subscribe(sid))["frame"] == "reply"
            for bad in ("not-a-token", token({"*": "admin"}, secret=OTHER), token({"*": "admin"}, ttl=-5)):
                refused = await client.request("auth", token=bad)
                assert (refused["frame"], refused["code"], refused["message"]) == (
                    "error",
                    "forbidden",
                    "forbidden",
                )
            assert await client.call("get_history", session_id=sid) == []  # still allowed
            assert (await client.request("create", name="x"))["code"] == "forbidden"  # no admin gained
            await admin.call("append", session_id=sid, message=text("m1", "still delivered"))
            await client.take(event_of(sid, "m1"))


async def test_a_narrower_token_ends_the_subscriptions_it_does_not_cover(tmp_path: Path) -> None:
    async with Serve(tmp_path / "hub.db", "--auth-secret", SECRET) as hub, admin_of(hub) as admin:
        a = (await admin.call("create", name="A"))["id"]
        b = (await admin.call("create", name="B"))["id"]
        async with hub.client(token({a: "read", b: "read"})) as client:
            assert (await client.subscribe(a))["frame"] == "reply"
            assert (await client.subscribe(b))["frame"] == "reply"
            renewed = await client.call("auth", token=token({a: "read"}))
            assert renewed["ended"] == [b]
            await admin.call("append", session_id=b, message=text("b1", "not for you any more"))
            await admin.call("append", session_id=a, message=text("a1", "still yours"))
            await client.take(event_of(a, "a1"))
            await asyncio.sleep(0.2)
            assert not [f for f in client.received if is_event(f) and f["session_id"] == b and f["seq"] > 1]
            assert (await client.subscribe(b))["code"] == "forbidden"
            # A connection that began without a token can present one in band.
        async with hub.client() as anonymous:
            assert (await anonymous.request("get", session_id=a))["code"] == "forbidden"
            await anonymous.call("auth", token=token({a: "read"}))
            assert (await anonymous.call("get", session_id=a))["id"] == a


async def test_the_python_client_renews_and_reconnects_with_the_newest_token(tmp_path: Path) -> None:
    hub = Serve(tmp_path / "hub.db", "--auth-secret", SECRET)
    await hub.start()
    try:
        async with admin_of(hub) as admin:
            sid = (await admin.call("create", name="followed"))["id"]
        short = token({sid: "read"}, ttl=3)
        async with HubClient(hub.ws_url, token=short, max_backoff=0.5) as client:
            events = client.subscribe(sid)
            async with admin_of(hub) as admin:
                await admin.call("append", session_id=sid, message=text("m1", "one"))
            assert await next_message(events) == "m1"
            reply = await client.renew(token({sid: "read"}, ttl=600))
            assert reply["ended"] == [] and client.token != short
            # A restart after the old token's exp: the client reconnects and resubscribes
            # with the new one.
            await hub.stop()
            await until(expires_at(short) + 0.5)
            await hub.start()
            async with admin_of(hub) as admin:
                await admin.call("append", session_id=sid, message=text("m2", "two"))
            assert await next_message(events) == "m2"
            assert client.reconnects >= 1  # (a draining hub may take one more)
            await events.aclose()
            with pytest.raises(HubError) as refused:
                await client.renew("not-a-token")
            assert refused.value.code == "forbidden"
            assert await client.sessions.get(sid) is not None  # the renewed token still works
    finally:
        await hub.stop()


async def test_the_python_client_stops_at_expiry_until_renewed(tmp_path: Path) -> None:
    async with Serve(tmp_path / "hub.db", "--auth-secret", SECRET) as hub:
        async with admin_of(hub) as admin:
            sid = (await admin.call("create", name="followed"))["id"]
        short = token({sid: "read"}, ttl=2)
        async with HubClient(hub.ws_url, token=short, max_backoff=0.5) as client:
            events = client.subscribe(sid)
            with pytest.raises(TokenExpired):
                await next_message(events, expires_at(short) - time.time() + 5)
            with pytest.raises(TokenExpired):
                await client.sessions.get(sid)
            assert client.reconnects == 0  # no reconnect with a token that expired
            await client.renew(token({sid: "read"}))
            assert (await client.sessions.get(sid)) is not None


# -- 3. the Origin and Host checks: DNS rebinding ---------------------------------------------


async def http_get(port: int, path: str, host: str) -> tuple[int, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body.decode(errors="replace")


def rebound(hub: Serve, name: str, origin: str | None = None, **kwargs: Any) -> Any:
    """A WebSocket as a browser that resolved ``name`` to the hub's address opens it: the
    Host header says ``name:port``, the TCP connection goes to 127.0.0.1."""
    url = f"ws://{name}:{hub.port}/ws"
    return Client.connect(url, host="127.0.0.1", port=hub.port, origin=origin, **kwargs)


async def test_a_page_that_rebinds_its_name_to_the_hub_gets_no_socket(tmp_path: Path) -> None:
    async with Serve(tmp_path / "hub.db") as hub:
        evil = f"evil.example:{hub.port}"
        with pytest.raises(InvalidStatus) as refused:
            async with rebound(hub, "evil.example", origin=f"http://{evil}"):
                pass
        assert refused.value.response.status_code in (403, 421)
        with pytest.raises(InvalidStatus):  # nor without an Origin (not a browser): the Host decides
            async with rebound(hub, "evil.example"):
                pass
        with pytest.raises(InvalidStatus):  # a foreign page, even on a good Host
            async with hub.client(origin="http://evil.example"):
                pass
        # The hub's own names: loopback names and addresses; a page on any loopback port.
        async with hub.client(origin=f"http://127.0.0.1:{hub.port}") as c:
            assert await c.call("create", name="mine")
        async with rebound(hub, "localhost", origin="http://localhost:5173") as c:
            assert len(await c.call("list")) == 1


async def test_a_rebound_name_gets_no_page_either(tmp_path: Path) -> None:
    async with Serve(tmp_path / "hub.db") as hub:
        evil = f"evil.example:{hub.port}"
        for path in ("/", "/index.html", "/sessionhub.js", "/metrics", "/healthz", "/api/sessions"):
            status, body = await http_get(hub.port, path, evil)
            assert status == 421, (path, status, body)
            assert body.endswith("\n") and body.count("\n") == 1, body
        for name in (f"127.0.0.1:{hub.port}", f"localhost:{hub.port}", f"[::1]:{hub.port}", "127.0.0.2"):
            status, body = await http_get(hub.port, "/", name)
            assert status == 200 and "<html" in body.lower(), name
        assert (await http_get(hub.port, "/metrics", f"localhost:{hub.port}"))[0] == 200


async def test_an_allowed_origin_names_the_hub(tmp_path: Path) -> None:
    async with Serve(tmp_path / "hub.db", "--allowed-origin", "https://app.example") as hub:
        assert (await http_get(hub.port, "/healthz", "app.example"))[0] == 200
        assert (await http_get(hub.port, "/healthz", "evil.example"))[0] == 421
        async with rebound(hub, "app.example", origin="https://app.example") as c:
            assert await c.call("list") == []
        with pytest.raises(InvalidStatus):  # the name, but another origin
            async with rebound(hub, "app.example", origin="https://evil.example"):
                pass


async def test_with_a_secret_the_token_decides_whatever_the_name(tmp_path: Path) -> None:
    # Behind a proxy the hub answers to names it cannot know; a page without a token gets
    # nothing from it, so its own origin (Origin == Host) is accepted.
    async with Serve(tmp_path / "hub.db", "--auth-secret", SECRET) as hub:
        name = f"hub.example:{hub.port}"
        assert (await http_get(hub.port, "/healthz", name))[0] == 200
        async with rebound(hub, "hub.example", origin=f"http://{name}") as c:
            assert (await c.request("list"))["code"] == "forbidden"
        headers = {"Authorization": f"Bearer {token({'*': 'read'})}"}
        async with rebound(hub, "hub.example", origin=f"http://{name}", additional_headers=headers) as c:
            assert await c.call("list") == []
        with pytest.raises(InvalidStatus):  # another site's page is still turned away
            async with rebound(hub, "hub.example", origin="http://evil.example"):
                pass


#: The JS client (web/sessionhub.js) renewing its token, under Node (env: the hub and tokens).
JS_RENEW = """
import { HubClient, HubError } from "%s";
const env = process.env;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
async function waitFor(predicate, what) {
  for (let i = 0; i < 500; i++) { if (predicate()) return; await sleep(20); }
  throw new Error(`timed out waiting for ${what}`);
}
const admin = new HubClient(env.URL, { token: env.ADMIN });
const client = new HubClient(env.URL, { token: env.SHORT });
await admin.connect();
await client.connect();
const got = [];
let ready = 0;
let ended = null;
client.subscribe(env.A, {
  onReady: () => ready++,
  onEvent: (e) => { if (e.type === "message.appended") got.push(e.data.message.id); },
});
client.subscribe(env.B, { onReady: () => ready++, onError: (e) => { ended = e; } });
await waitFor(() => ready === 2, "both subscriptions");
const reply = await client.renew(env.FRESH);
if (JSON.stringify(reply.ended) !== JSON.stringify([env.B])) throw new Error(JSON.stringify(reply));
if (!(ended instanceof HubError) || ended.code !== "forbidden") throw new Error(`B not ended: ${ended}`);
let refused = null;
try { await client.renew("not-a-token"); } catch (e) { refused = e; }
if (!refused || refused.code !== "forbidden") throw new Error(`a bad token was not refused: ${refused}`);
await sleep(Number(env.WAIT_MS));  // past the first token's exp
await admin.request("append", { session_id: env.A, message: { id: "late", role: "user", parts: [] } });
await waitFor(() => got.includes("late"), "the event after the old exp");
console.log("renewed");
admin.close();
client.close();
"""


async def test_the_js_client_renews_its_token(tmp_path: Path) -> None:
    node_path = node()
    has = await asyncio.create_subprocess_exec(
        node_path, "-e", "process.exit(typeof WebSocket === 'function' ? 0 : 1)"
    )
    flags = [] if await has.wait() == 0 else ["--experimental-websocket"]
    async with Serve(tmp_path / "hub.db", "--auth-secret", SECRET) as hub, admin_of(hub) as admin:
        a = (await admin.call("create", name="A"))["id"]
        b = (await admin.call("create", name="B"))["id"]
        short = token({a: "read", b: "read"}, ttl=3)
        env = {
            "PATH": "/usr/bin:/bin",
            "URL": hub.ws_url,
            "ADMIN": token({"*": "admin"}),
            "SHORT": short,
            "FRESH": token({a: "read"}),
            "A": a,
            "B": b,
            "WAIT_MS": str(int(max(0.0, expires_at(short) - time.time() + 1.0) * 1000)),
        }
        script = JS_RENEW % (ROOT / "web" / "sessionhub.js").as_uri()
        proc = await asyncio.create_subprocess_exec(
            node_path, *flags, "--input-type=module", "-e", script,
            env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        out, _ = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode == 0 and out.decode().strip().endswith("renewed"), out.decode()


# -- HTTP bodies (issue 24, item 2) ---------------------------------------------------------


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


async def test_http_bodies_are_not_read_before_the_token_nor_past_the_bound(tmp_path: Path) -> None:
    """One 128 MiB POST without a token raised a served hub's RSS by 159-256 MiB before its
    401; six 64 MiB at once, by 506-521 MiB. Here the bodies are really sent, and each
    answer comes while most of its body is still unsent: RSS stays where it was."""
    MiB = 1 << 20
    admin = issue_token(SECRET, {"*": "admin"})
    json_type = {"content-type": "application/json"}
    async with Node(
        str(tmp_path / "hub.db"), None, None, "--auth-secret", SECRET, "--max-body-bytes", "1M"
    ) as hub:
        assert hub.proc is not None
        pid, peak = hub.proc.pid, 0.0
        base = _rss_mib(pid)

        async def sample() -> None:
            nonlocal peak
            while True:
                peak = max(peak, _rss_mib(pid) - base)
                await asyncio.sleep(0.02)

        sampler = asyncio.create_task(sample())
        try:
            # /mcp is served only with the optional `mcp` package (not in the lowest-versions run).
            routes = ["/api/chat", "/mcp"] if importlib.util.find_spec("mcp") else ["/api/chat"]
            cases = [("/api/chat", json_type, 128 * MiB)] + [("/api/chat", json_type, 64 * MiB)] * 3
            cases += [(route, json_type, 64 * MiB) for route in routes[1:]] * 3
            bearer = {**json_type, "authorization": f"Bearer {admin}"}
            cases += [(route, bearer, 64 * MiB) for route in routes]
            answers = await asyncio.gather(*(send_until_answered(hub.port, p, h, n) for p, h, n in cases))
        finally:
            sampler.cancel()
        statuses = [answer.status for answer, _ in answers]
        sent = [n // MiB for _, n in answers]
        print(f"answers {statuses}, MiB sent by each before its answer {sent}, RSS peak +{peak:.1f} MiB")
        assert statuses == [401] * (4 + 3 * (len(routes) - 1)) + [413] * len(routes)
        assert all(n < total // 4 for (_, n), (_, _, total) in zip(answers, cases, strict=True))
        assert peak < 48, f"RSS rose by {peak:.1f} MiB"
