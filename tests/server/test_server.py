"""The ASGI app on a real uvicorn, and the ``sessionhub serve`` command as a process."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2
import pytest

from hub import Session, SessionManager, SqliteStore
from hub.server import create_app
from tests.support.hubtest import served as serve


@pytest.fixture
async def served(db_path: Path) -> AsyncIterator[str]:
    async with serve(db=db_path) as hub:
        yield hub.url


async def test_healthz(served: str) -> None:
    async with httpx2.AsyncClient() as client:
        response = await client.get(f"{served}/healthz")
    assert response.status_code == 200
    assert response.json() == {
        "status": "ok",
        "connections": 0,
        "compaction": False,
        "admitted": 0,
        "max_connections": None,
    }


async def test_app_over_a_shared_store(db_path: Path) -> None:
    store = await SqliteStore.open(db_path)
    try:
        async with serve(store=store) as hub, httpx2.AsyncClient() as client:
            assert (await client.get(f"{hub.url}/healthz")).status_code == 200
        # The app did not close a store it does not own.
        await Session(store).append_message({"id": "m", "role": "user", "parts": []})
    finally:
        await store.close()


async def test_configure_manager_sets_up_the_manager_the_app_builds(db_path: Path) -> None:
    configured: list[SessionManager] = []
    app = create_app(db=db_path, configure_manager=configured.append)
    async with serve(app=app):
        assert configured == [app.state.hub.manager]
    store = await SqliteStore.open(db_path)
    try:
        # A manager the caller passes is theirs to configure: both at once is a mistake.
        with pytest.raises(ValueError, match="pass manager or configure_manager, not both"):
            create_app(manager=SessionManager(store), configure_manager=configured.append)
    finally:
        await store.close()


async def test_sessionhub_serve_command(tmp_path: Path) -> None:
    db = tmp_path / "cli.db"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "hub.apps.cli",
        "serve",
        "--db",
        str(db),
        "--port",
        "0",
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stderr is not None
    try:
        port = None
        async with asyncio.timeout(20):
            while port is None:
                line = (await proc.stderr.readline()).decode()
                assert line, "server exited before listening"
                found = re.search(r"http://127\.0\.0\.1:(\d+)", line)
                if found:
                    port = int(found.group(1))
        async with httpx2.AsyncClient() as client:
            response = await client.get(f"http://127.0.0.1:{port}/healthz")
        assert response.json()["status"] == "ok"
        assert db.exists()
    finally:
        proc.send_signal(signal.SIGINT)
        async with asyncio.timeout(20):
            await proc.wait()
    assert proc.returncode == 0


async def run_serve(*args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "hub.apps.cli",
        "serve",
        *args,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    async with asyncio.timeout(30):
        _, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, err.decode()


async def test_serve_refuses_an_unreachable_store_in_one_line() -> None:
    code, err = await run_serve("--db", "postgresql://app:s3cret@127.0.0.1:1/db", "--port", "0")
    assert code == 2
    assert err.startswith("sessionhub: cannot open the store postgresql://app:***@127.0.0.1:1/db")
    assert "s3cret" not in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


async def test_serve_refuses_a_bad_bus(tmp_path: Path) -> None:
    code, err = await run_serve("--db", str(tmp_path / "a.db"), "--bus", "carrier-pigeon", "--port", "0")
    assert (code, err.strip()) == (
        2,
        "sessionhub: unknown bus 'carrier-pigeon': use memory, postgres or a redis:// URL",
    )
    code, err = await run_serve(
        "--db", str(tmp_path / "a.db"), "--bus", "redis://127.0.0.1:1/0", "--port", "0"
    )
    assert code == 2 and "with bus redis://127.0.0.1:1/0" in err and "Traceback" not in err


async def test_serve_exits_nonzero_when_the_port_is_taken(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, err = await run_serve("--db", str(tmp_path / "a.db"), "--port", str(port))
    assert code == 3, err
    # One line, said before anything started (uvicorn used to log its startup around it).
    assert err.strip() == (
        f"sessionhub: cannot listen on 127.0.0.1:{port}: the port is taken (another hub? pick another --port)"
    )
    assert not (tmp_path / "a.db").exists()


async def test_compact_on_a_hub_without_a_summarizer_says_how_to_give_it_one(tmp_path: Path) -> None:
    from clients import HubClient
    from protocol.errors import InvalidInput

    async with serve(db=tmp_path / "hub.db") as hub:
        async with httpx2.AsyncClient() as http:
            assert (await http.get(f"{hub.url}/healthz")).json()["compaction"] is False
        async with HubClient(hub.ws_url) as client:
            info = await client.sessions.create("s")
            with pytest.raises(InvalidInput, match="this hub has no summarizer, so it cannot compact"):
                await client.session(info.id).compact()
