"""The JS client's tests under Node's test runner (``node --test web/test/``): unit tests of
its resume logic with a fake socket, and tests against a real hub started here (and a
draining one, to fail over from)."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

from hub.server import HubConfig
from tests.support.hubtest import Client, eventually, served
from tests.support.services import node

ROOT = Path(__file__).resolve().parents[2]


def _websocket_flags(node_path: str) -> list[str]:
    """Node 20 has a global WebSocket only behind a flag (22 and later have it by default)."""
    has = subprocess.run(
        [node_path, "-e", "process.exit(typeof WebSocket === 'function' ? 0 : 1)"], check=False
    )
    return [] if has.returncode == 0 else ["--experimental-websocket"]


async def test_node_test_runner_passes(tmp_path: Path) -> None:
    node_path = node()  # skips (fails under SESSIONHUB_REQUIRE_SERVICES=1) without it
    async with (
        served(db=tmp_path / "hub.db") as h,
        served(db=tmp_path / "draining.db") as draining,
        served(db=tmp_path / "full.db", config=HubConfig(max_connections=1)) as full,
        Client.connect(full.ws_url),  # the one connection the full hub admits
    ):
        # What SIGTERM runs: from now on it accepts each socket and closes it with 1001.
        await draining.hub.drain()
        await eventually(lambda: full.hub.admission.full)
        proc = await asyncio.create_subprocess_exec(
            node_path,
            *_websocket_flags(node_path),
            "--test",
            "--test-reporter=spec",
            str(ROOT / "web" / "test"),
            cwd=ROOT,
            env={
                "PATH": "/usr/bin:/bin",
                "SESSIONHUB_WS_URL": h.ws_url,
                "SESSIONHUB_DRAINING_WS_URL": draining.ws_url,
                "SESSIONHUB_FULL_WS_URL": full.ws_url,
                "NO_COLOR": "1",
            },
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 45)
    report = out.decode()
    assert proc.returncode == 0, report
    assert "# fail 0" in report or "fail 0" in report, report
    assert "skipped 0" in report or "# skipped 0" in report, report
