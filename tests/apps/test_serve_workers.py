"""``serve --workers N`` (hub/apps/serve_workers.py): N processes on one port, each a node.
Refused in one line where the processes could not see each other's writes; on Postgres,
a client on each worker (found through /proc: which process holds the server side of its
TCP connection) sees the other worker's writes, and SIGTERM drains them all."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import websockets
from websockets.asyncio.client import ClientConnection

from tests.apps.test_cli import environ, one_line, run
from tests.support.nodes import scratch_database
from tests.support.services import postgres_dsn


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ([], "--workers 2 needs a Postgres --db: on SQLite each process would serve alone"),
        (
            ["--db", "postgresql://postgres@127.0.0.1:1/x", "--bus", "memory"],
            "--workers 2 needs a bus that crosses processes (--bus postgres or redis://...)",
        ),
        (["--workers", "0"], "argument --workers"),
    ],
)
def test_workers_are_refused_in_one_line_where_they_would_not_see_each_other(
    tmp_path: Path, args: list[str], says: str
) -> None:
    result = run("serve", "--workers", "2", "--db", str(tmp_path / "hub.db"), *args)
    assert result.returncode == 2
    assert says in one_line(result)


def _listening_sockets(pid: int) -> set[str]:
    """The socket inodes process ``pid`` holds."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    return inodes


def _server_side_inode(server_port: int, client_port: int) -> str | None:
    """The inode of the hub's end of the loopback TCP connection from ``client_port``."""
    with open("/proc/net/tcp") as table:
        next(table)
        for row in table:
            fields = row.split()
            local_port = int(fields[1].split(":")[1], 16)
            remote_port = int(fields[2].split(":")[1], 16)
            if local_port == server_port and remote_port == client_port:
                return fields[9]
    return None


def _worker_of(ws: ClientConnection, server_port: int, workers: list[int]) -> int | None:
    client_port = ws.local_address[1]
    inode = _server_side_inode(server_port, client_port)
    return next((pid for pid in workers if inode in _listening_sockets(pid)), None)


@contextlib.asynccontextmanager
async def _workers(db: str, count: int) -> AsyncIterator[tuple[int, list[int], asyncio.subprocess.Process]]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hub.apps.cli", "serve", "--workers", str(count), "--port", "0",
        "--db", db, stderr=subprocess.PIPE, env=environ(),
    )  # fmt: skip
    assert proc.stderr is not None
    port, pids, started = 0, [], 0
    try:
        async with asyncio.timeout(60):
            while started < count:
                line = (await proc.stderr.readline()).decode()
                assert line, "serve --workers exited before its workers started"
                found = re.search(r"workers on http://127\.0\.0\.1:(\d+) \(pids ([\d, ]+)\)", line)
                if found:
                    port, pids = int(found.group(1)), [int(p) for p in found.group(2).split(", ")]
                started += "Application startup complete" in line
        yield port, pids, proc
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            await proc.communicate()


async def _call(ws: ClientConnection, rid: int, op: str, **fields: object) -> object:
    await ws.send(json.dumps({"op": op, "id": rid, **fields}))
    while True:
        frame = json.loads(await ws.recv())
        if frame.get("id") == rid:
            assert frame["frame"] == "reply", frame
            return frame["result"]


async def _event(ws: ClientConnection, message_id: str) -> None:
    async with asyncio.timeout(10):
        while True:
            frame = json.loads(await ws.recv())
            if frame.get("frame") == "event" and frame["data"].get("message", {}).get("id") == message_id:
                return


async def test_a_client_on_each_worker_sees_the_others_writes() -> None:
    async with scratch_database(postgres_dsn()) as db, _workers(db, 2) as (port, pids, proc):
        url = f"ws://127.0.0.1:{port}/ws"
        on: dict[int, ClientConnection] = {}
        opened: list[ClientConnection] = []
        try:
            # The kernel spreads connections over the workers by a hash: open some until
            # each worker holds one (the chance of 40 on one worker is 2 in a trillion).
            for _ in range(40):
                ws = await websockets.connect(url, proxy=None)
                opened.append(ws)
                await _call(ws, 0, "ping")
                worker = _worker_of(ws, port, pids)
                assert worker is not None, "a connection held by no worker"
                on.setdefault(worker, ws)
                if len(on) == 2:
                    break
            assert len(on) == 2, f"every connection landed on one worker: {on}"
            first, second = on[pids[0]], on[pids[1]]
            session = await _call(first, 1, "create", name="workers")
            assert isinstance(session, dict)
            sid = session["id"]
            await _call(first, 2, "subscribe", session_id=sid, after_seq=0)
            await _call(second, 2, "subscribe", session_id=sid, after_seq=0)
            await _call(
                second, 3, "append", session_id=sid, message={"id": "from-2", "role": "user", "parts": []}
            )
            await _event(first, "from-2")
            await _call(
                first, 3, "append", session_id=sid, message={"id": "from-1", "role": "user", "parts": []}
            )
            await _event(second, "from-1")
        finally:
            for ws in opened:
                await ws.close()
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            _, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()
        assert err.decode().count("Application shutdown complete") == 2
