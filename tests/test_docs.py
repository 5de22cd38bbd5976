"""The documentation's runnable examples run and print what the docs say."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_tool_loop_example_output_matches_docs() -> None:
    out = subprocess.run(
        [sys.executable, "-W", "error", str(ROOT / "docs" / "examples" / "tool_loop.py")],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    documented = (ROOT / "docs" / "tools.md").read_text(encoding="utf-8")
    block = re.search(r"```\n(openai tools:.*?)```", documented, re.S)
    assert block is not None
    assert out == block.group(1)


def test_readme_example_runs(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    code = re.search(r"```python\n(.*?)```", readme, re.S)
    assert code is not None
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", code.group(1)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "['u1', 'a1b']" in result.stdout
    assert "1 session.created" in result.stdout
