"""Every code sample in README.md and docs/*.md runs and prints what the docs say.

The convention, for whoever adds a sample:

- Every ```python block is a **complete program**: imports, an ``async def main()`` and
  ``asyncio.run(main())`` (a top-level ``await`` or ``async with`` is a SyntaxError in a
  file), and it exits by itself (close what it opens, ``break`` out of a subscription).
  The test saves it to a file and runs it with ``python -W error`` in an empty temporary
  directory (so relative paths like ``"sessionhub.db"`` are fresh), with this checkout on
  ``PYTHONPATH``, and fails if it exits non-zero or runs longer than SAMPLE_TIMEOUT.
- A sample that talks to a hub uses ``ws://127.0.0.1:8000/ws``: the test starts one
  ``sessionhub serve`` on a free port (fresh SQLite file, no secret) and puts its URL in
  place of that text. A sample that needs Postgres uses
  ``postgresql://postgres@127.0.0.1:5432/postgres``, replaced by ``$SESSIONHUB_TEST_POSTGRES``
  (skipped, or failed under SESSIONHUB_REQUIRE_SERVICES=1, when it does not answer, as in
  tests/support/services.py).
- **Output.** A ```text block right after the sample (only blank lines between) is its
  whole expected stdout, compared exactly. Otherwise every ``# -> expected`` comment is an
  expected stdout line, in order (other lines may come between); ``...`` inside one
  matches anything. A sample with neither is only run.
- A block that cannot run on its own (it needs an LLM endpoint, or is an excerpt of a
  runnable file under docs/examples/) is marked on the line before its fence with
  ``<!-- fragment: the reason -->``. Keep these few: the test lists them, and fails on a
  marker without a reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.services import DEFAULT_POSTGRES, postgres_dsn


@contextlib.contextmanager
def scratch_postgres() -> Iterator[str]:
    """A new empty database for one sample: a sample's tables must not land in the server's
    own ``postgres`` database (where a later schema version would then be refused)."""
    from tests.support.nodes import scratch_database

    loop = asyncio.new_event_loop()
    manager = scratch_database(postgres_dsn(), "sessionhub_docs")
    try:
        yield loop.run_until_complete(manager.__aenter__())
    finally:
        try:
            loop.run_until_complete(manager.__aexit__(None, None, None))
        finally:
            loop.close()


ROOT = Path(__file__).resolve().parents[2]
SAMPLE_TIMEOUT = 20
HUB_URL = "ws://127.0.0.1:8000/ws"
FENCE = re.compile(r"^```(\w*)\s*$")
FRAGMENT = re.compile(r"^<!--\s*fragment(?::\s*(.*?))?\s*-->\s*$")


@dataclass
class Sample:
    doc: str
    line: int
    code: str
    fragment: str | None  # the reason, if marked as a fragment
    output: str | None  # a following ```text block

    @property
    def name(self) -> str:
        return f"{self.doc}:{self.line}"


def parse(path: Path) -> list[Sample]:
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[tuple[int, str, str, str | None]] = []  # (line, lang, body, marker before)
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        start = i
        i += 1
        content: list[str] = []
        while i < len(lines) and not lines[i].startswith("```"):
            content.append(lines[i])
            i += 1
        marker = FRAGMENT.match(lines[start - 1]) if start else None
        reason = None if marker is None else (marker.group(1) or "")
        blocks.append((start, fence.group(1), "\n".join(content) + "\n", reason))
        i += 1
    samples = []
    for n, (start, lang, body, reason) in enumerate(blocks):
        if lang != "python":
            continue
        output = None
        if n + 1 < len(blocks) and blocks[n + 1][1] == "text":
            between = lines[start + body.count("\n") + 2 : blocks[n + 1][0]]
            if all(not line.strip() for line in between):
                output = blocks[n + 1][2]
        samples.append(Sample(str(path.relative_to(ROOT)), start + 1, body, reason, output))
    return samples


SAMPLES = [s for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))] for s in parse(doc)]
RUNNABLE = [s for s in SAMPLES if s.fragment is None]


def test_fragments_are_few_and_say_why() -> None:
    fragments = [s for s in SAMPLES if s.fragment is not None]
    for s in fragments:
        assert s.fragment, f"{s.name}: a fragment marker needs a reason (<!-- fragment: why -->)"
    assert len(fragments) <= len(SAMPLES) // 2, [s.name for s in fragments]


def expected_lines(code: str) -> list[str]:
    return [m.group(1).rstrip() for m in re.finditer(r"#\s*->\s*(.*)$", code, re.M)]


def matches(pattern: str, line: str) -> bool:
    regex = ".*".join(re.escape(part) for part in pattern.split("..."))
    return re.fullmatch(regex, line.rstrip()) is not None


def check_lines(expected: list[str], stdout: str) -> None:
    out = stdout.splitlines()
    at = 0
    for want in expected:
        while at < len(out) and not matches(want, out[at]):
            at += 1
        assert at < len(out), f"no line matching {want!r} (in order) in:\n{stdout}"
        at += 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def sample_env() -> dict[str, str]:
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}


@pytest.fixture(scope="module")
def hub_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One real ``sessionhub serve`` for the samples that talk to a hub."""
    db = tmp_path_factory.mktemp("hub") / "hub.db"
    port = free_port()
    with subprocess.Popen(
        [sys.executable, "-m", "hub.apps.cli", "serve", "--db", str(db), "--port", str(port)],
        stderr=subprocess.PIPE,
        text=True,
        env=sample_env(),
    ) as proc:
        try:
            assert proc.stderr is not None
            deadline = time.monotonic() + 20
            for line in proc.stderr:  # readiness: uvicorn's line naming the address
                if f"http://127.0.0.1:{port}" in line:
                    break
                assert time.monotonic() < deadline, "sessionhub serve did not start"
            else:
                pytest.fail("sessionhub serve exited before listening")
            yield f"ws://127.0.0.1:{port}/ws"
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(20)


@pytest.mark.parametrize("sample", RUNNABLE, ids=[s.name for s in RUNNABLE])
def test_sample_runs_and_prints_what_the_doc_shows(
    sample: Sample, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    code = sample.code
    if HUB_URL in code:
        code = code.replace(HUB_URL, request.getfixturevalue("hub_url"))
    with contextlib.ExitStack() as stack:
        if DEFAULT_POSTGRES in code:
            code = code.replace(DEFAULT_POSTGRES, stack.enter_context(scratch_postgres()))
        run_sample(sample, code, tmp_path)


def run_sample(sample: Sample, code: str, tmp_path: Path) -> None:
    script = tmp_path / "sample.py"
    script.write_text(code, encoding="utf-8")
    try:
        result = subprocess.run(
            [sys.executable, "-W", "error", str(script)],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=sample_env(),
            timeout=SAMPLE_TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{sample.name} did not exit within {SAMPLE_TIMEOUT}s (a sample must end by itself)")
    assert result.returncode == 0, f"{sample.name} failed:\n{result.stderr}"
    if sample.output is not None:
        assert result.stdout == sample.output
    else:
        check_lines(expected_lines(sample.code), result.stdout)


def test_tool_loop_example_output_matches_docs() -> None:
    out = subprocess.run(
        [sys.executable, "-W", "error", str(ROOT / "docs" / "examples" / "tool_loop.py")],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env=sample_env(),
    ).stdout
    documented = (ROOT / "docs" / "tools.md").read_text(encoding="utf-8")
    block = re.search(r"```\w*\n(openai tools:.*?)```", documented, re.S)
    assert block is not None
    assert out == block.group(1)
