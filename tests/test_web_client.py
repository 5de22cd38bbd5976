"""The JS client's tests under Node's test runner (``node --test web/test/``): unit tests of
its resume logic with a fake socket, and one test against a real hub started here."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

import pytest

from .hubtest import served

ROOT = Path(__file__).resolve().parent.parent
NODE = shutil.which("node")

pytestmark = pytest.mark.skipif(NODE is None, reason="needs node on PATH")


def _websocket_flags() -> list[str]:
    """Node 20 has a global WebSocket only behind a flag (22 and later have it by default)."""
    assert NODE is not None
    has = subprocess.run([NODE, "-e", "process.exit(typeof WebSocket === 'function' ? 0 : 1)"], check=False)
    return [] if has.returncode == 0 else ["--experimental-websocket"]


async def test_node_test_runner_passes(tmp_path: Path) -> None:
    assert NODE is not None
    async with served(db=tmp_path / "hub.db") as h:
        proc = await asyncio.create_subprocess_exec(
            NODE,
            *_websocket_flags(),
            "--test",
            "--test-reporter=spec",
            str(ROOT / "web" / "test"),
            cwd=ROOT,
            env={"PATH": "/usr/bin:/bin", "SESSIONHUB_WS_URL": h.ws_url, "NO_COLOR": "1"},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 45)
    report = out.decode()
    assert proc.returncode == 0, report
    assert "# fail 0" in report or "fail 0" in report, report
    assert "skipped 0" in report or "# skipped 0" in report, report
