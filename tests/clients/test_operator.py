"""``sessionhub tail`` and ``sessionhub sessions`` against a real hub, as processes."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import signal
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from clients.operator import describe
from hub import Event, SessionManager, SqliteStore
from hub.server import create_app
from tests.support.hubtest import Served, eventually, served, text


async def start_serve(db: Path, port: int = 0) -> tuple[asyncio.subprocess.Process, int]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hub.apps.cli", "serve", "--db", str(db), "--port", str(port),
        stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    assert proc.stderr is not None
    async with asyncio.timeout(20):
        while True:
            line = (await proc.stderr.readline()).decode()
            assert line, "server exited before listening"
            found = re.search(r"http://127\.0\.0\.1:(\d+)", line)
            if found:
                return proc, int(found.group(1))


async def stop(proc: asyncio.subprocess.Process) -> None:
    proc.send_signal(signal.SIGINT)
    async with asyncio.timeout(20):
        await proc.wait()


async def cli(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hub.apps.cli", *args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip


async def read_lines(proc: asyncio.subprocess.Process, n: int) -> list[str]:
    assert proc.stdout is not None
    lines: list[str] = []
    async with asyncio.timeout(20):
        while len(lines) < n:
            line = (await proc.stdout.readline()).decode()
            assert line, f"tail exited early: {(await proc.stderr.read()).decode() if proc.stderr else ''}"
            lines.append(line.rstrip("\n"))
    return lines


async def test_sessions_lists_what_the_hub_holds(tmp_path: Path) -> None:
    db = tmp_path / "hub.db"
    async with await SqliteStore.open(db) as store:
        manager = SessionManager(store)
        a = await manager.create("Support chat", model="gpt-x")
        await manager.add_usage(a.id, 10, 20, 0.5)
        await manager.create("Other")
    proc, port = await start_serve(db)
    try:
        listing = await cli("sessions", "--url", f"ws://127.0.0.1:{port}/ws")
        out, err = await asyncio.wait_for(listing.communicate(), 20)
        assert listing.returncode == 0, err.decode()
        lines = out.decode().splitlines()
        assert len(lines) == 2
        assert lines[0].split()[0] != a.id  # "Other" was created last: most recent first
        assert lines[1].startswith(a.id) and "'Support chat'" in lines[1] and "in=10 out=20" in lines[1]
        raw = await cli("sessions", "--url", f"ws://127.0.0.1:{port}/ws", "--json")
        out, _ = await asyncio.wait_for(raw.communicate(), 20)
        assert {json.loads(line)["name"] for line in out.decode().splitlines()} == {"Support chat", "Other"}
    finally:
        await stop(proc)


async def test_tail_follows_live_and_resumes_across_a_hub_restart(tmp_path: Path) -> None:
    db = tmp_path / "hub.db"
    async with await SqliteStore.open(db) as store:
        info = await SessionManager(store).create("tailed")
        await SessionManager(store).append(info.id, text("m1", "hello from the log"))
    proc, port = await start_serve(db)
    tail = await cli("tail", info.id, "--url", f"ws://127.0.0.1:{port}/ws")
    try:
        first = await read_lines(tail, 2)
        assert "session.created" in first[0] and '"tailed"' in first[0]
        assert first[1].startswith("#2 ") and 'm1 (user): "hello from the log" (root)' in first[1]
        # Restart the hub on the same port; write while it is down.
        await stop(proc)
        async with await SqliteStore.open(db) as store:
            await SessionManager(store).append(info.id, text("m2", "written while the hub was down"))
        proc, _ = await start_serve(db, port)
        async with await SqliteStore.open(db):
            pass
        from clients import HubClient

        async with HubClient(f"ws://127.0.0.1:{port}/ws") as hub:
            await hub.sessions.append(info.id, text("m3", "after the restart"))
        later = await read_lines(tail, 2)
        assert later[0].startswith("#3 ") and "m2 (user)" in later[0] and "← m1" in later[0]
        assert later[1].startswith("#4 ") and "m3 (user)" in later[1]
    finally:
        tail.send_signal(signal.SIGINT)
        async with asyncio.timeout(20):
            await tail.wait()
        await stop(proc)


async def test_tail_json_prints_raw_events(tmp_path: Path) -> None:
    async with served(db=tmp_path / "hub.db") as hub:
        from clients import HubClient

        async with HubClient(hub.ws_url) as client:
            info = await client.sessions.create("json")
        tail = await cli("tail", info.id, "--url", hub.ws_url, "--json", "--after", "0")
        try:
            (line,) = await read_lines(tail, 1)
            event = json.loads(line)
            assert (event["seq"], event["type"], event["session_id"]) == (1, "session.created", info.id)
        finally:
            tail.kill()
            await tail.wait()


def test_describe_is_one_readable_line() -> None:
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)

    def ev(type_: str, data: dict[str, object]) -> Event:
        return Event(session_id="s", seq=7, epoch="e", type=type_, data=data, created_at=now)

    long_text = "word " * 40
    line = describe(
        ev("message.appended", {"message": text("m9", long_text, "assistant"), "parent_id": "m8"})
    )
    assert line.startswith('#7 03:04:05 message.appended m9 (assistant): "word word')
    assert line.endswith('…" ← m8') and "\n" not in line
    assert describe(ev("message.deleted", {"ids": ["a", "b"], "reparented": []})).endswith("a, b")
    status = describe(
        ev(
            "status",
            {"phase": "idle", "token_estimate": 5, "token_threshold": 9, "compacted": {"tokens_before": 20}},
        )
    )
    assert status.endswith("idle ~5 tokens / 9 (was 20)")
    assert "boom" in describe(ev("error", {"error": "boom"}))
    assert describe(ev("context.updated", {"label": "memory", "content": "likes tea"})).endswith(
        'memory: "likes tea"'
    )


async def test_keepalive_drops_a_silent_peer(tmp_path: Path) -> None:
    # A peer that completes the handshake and then never answers a ping is dropped within
    # the keepalive timeout and leaves the hub's connection set.
    app = create_app(db=tmp_path / "hub.db")
    server = Served(app, ws_ping_interval=0.2, ws_ping_timeout=0.3)
    await server.start()
    try:
        port = server.port
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        key = base64.b64encode(os.urandom(16)).decode()
        writer.write(
            (
                f"GET /ws HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        await writer.drain()
        status = await asyncio.wait_for(reader.readline(), 5)
        assert b"101" in status
        hub = app.state.hub
        await eventually(lambda: len(hub.connections) == 1)
        # Never read, never pong: within interval + timeout (+ slack) the hub lets go.
        await eventually(lambda: not hub.connections, timeout=5, interval=0.05)
        writer.close()
    finally:
        await server.stop()


async def test_invalid_utf8_frames_are_one_log_line_not_a_traceback_each(tmp_path: Path) -> None:
    # uvicorn logs a traceback per invalid UTF-8 text frame; `sessionhub serve` makes that
    # one line for the whole burst (rate limit: one such line per 60 s).
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosedError

    proc, port = await start_serve(tmp_path / "hub.db")
    try:
        for _ in range(8):
            async with connect(f"ws://127.0.0.1:{port}/ws") as ws:
                await ws.send(b"\xff\xfe not utf-8", text=True)
                # uvicorn logs before it closes: the line is written once the close arrives.
                with pytest.raises(ConnectionClosedError) as closed:
                    await asyncio.wait_for(ws.recv(), 5)
                assert closed.value.rcvd is not None and closed.value.rcvd.code == 1007
        from clients import HubClient

        async with HubClient(f"ws://127.0.0.1:{port}/ws") as hub:  # still serving
            await hub.ping()
    finally:
        await stop(proc)
    assert proc.stderr is not None
    log = (await proc.stderr.read()).decode()
    assert "Traceback" not in log
    noisy = [line for line in log.splitlines() if "UTF-8" in line]
    assert len(noisy) == 1, log
    assert "closed with 1007" in noisy[0]


def test_peer_noise_filter_reports_what_it_suppressed() -> None:
    # The rate limit over time, with a clock the test advances (a real logger and records).
    import logging

    from hub.server.logfilter import PeerNoiseFilter

    now = [0.0]
    logger = logging.getLogger("sessionhub.test.peer-noise")
    logger.propagate = False
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    handler = Keep()
    logger.addHandler(handler)
    noise = PeerNoiseFilter(window=10.0, burst=2, clock=lambda: now[0])
    logger.addFilter(noise)
    try:
        for t in (0.0, 1.0, 2.0, 3.0, 9.0, 10.0, 11.0):
            now[0] = t
            try:
                b"\xff".decode()
            except UnicodeDecodeError:
                logger.exception("Invalid UTF-8 sequence received from client.")
        logger.error("something else")
    finally:
        logger.removeHandler(handler)
        logger.removeFilter(noise)
    lines = [r.getMessage() for r in seen]
    assert all(r.exc_info is None for r in seen[:-1])
    assert len(lines) == 5  # 0 and 1 pass, 2, 3, 9 are suppressed; 10 and 11 pass
    assert "3 more since the last such line" in lines[2]
    assert "more since" not in lines[3]
    assert lines[4] == "something else"
