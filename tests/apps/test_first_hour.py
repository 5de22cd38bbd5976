"""The first hour as a new user meets it (issue 29 §2): each mistake a user makes on a fresh
clone is one line and a documented exit code, and the setup the README gives just works."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from hub.auth import issue_token
from hub.server import HubConfig
from tests.apps.test_cli import SECRET, environ, one_line, run
from tests.apps.test_responder import model_server
from tests.support.hubtest import served
from tests.support.services import postgres_dsn


@pytest.mark.parametrize(
    "command", [["export"], ["prune", "--older-than", "1d"], ["prune", "--keep-per-session", "5"]]
)
def test_reading_commands_refuse_a_database_that_is_not_there(tmp_path: Path, command: list[str]) -> None:
    result = run(*command, "--db", "typo.db", cwd=tmp_path)
    assert result.returncode == 2
    assert one_line(result) == (
        "sessionhub: --db 'typo.db': no database there "
        "(is the path right? `sessionhub serve --db PATH` creates one)"
    )
    assert list(tmp_path.iterdir()) == []  # nothing created


async def test_serve_creates_a_missing_postgres_database() -> None:
    import asyncpg

    from hub.apps.backends import ensure_database, probe

    base = postgres_dsn()
    name = f"sessionhub_fresh_{uuid.uuid4().hex[:8]}"
    dsn = base.rsplit("/", 1)[0] + f"/{name}"
    try:
        await probe(dsn)  # what `serve --db` does before it listens
        assert await ensure_database(dsn) is False  # there now
    finally:
        admin = await asyncpg.connect(base)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()


# -- sessionhub respond: its options and the model server checked at start ------------------

RESPOND = ("respond", "--model", "tiny")


def test_respond_refuses_no_concurrency() -> None:
    result = run(*RESPOND, "--base-url", "http://127.0.0.1:9/v1", "--concurrency", "0")
    assert result.returncode == 2
    assert "argument --concurrency: must be at least 1, not 0" in one_line(result)


def test_respond_refuses_a_read_only_token() -> None:
    token = issue_token(SECRET, {"*": "read"})
    result = run(*RESPOND, "--base-url", "http://127.0.0.1:9/v1", "--token", token)
    assert result.returncode == 2
    assert one_line(result).startswith("sessionhub: --token is read-only: respond writes the replies")


async def test_respond_names_the_hub_it_cannot_reach_once_the_model_server_answers() -> None:
    async with model_server() as model:
        result = await asyncio.to_thread(
            run, *RESPOND, "--base-url", model.base_url, "--url", "ws://127.0.0.1:9/ws"
        )
    assert result.returncode == 2
    assert one_line(result).startswith("sessionhub: cannot connect to the hub")


async def test_respond_says_what_it_serves_and_asks_for_a_missing_token(tmp_path: Path) -> None:
    async with (
        model_server() as model,
        served(config=HubConfig(auth_secret=SECRET), db=tmp_path / "h.db") as h,
    ):
        refused = await asyncio.to_thread(run, *RESPOND, "--base-url", model.base_url, "--url", h.ws_url)
        assert refused.returncode == 4
        assert "needs a token" in one_line(refused) and "--token" in refused.stderr
        token = issue_token(SECRET, {"*": "write"})
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "hub.apps.cli", *RESPOND, "--base-url", model.base_url,
            "--url", h.ws_url, "--token", token, stderr=subprocess.PIPE, env=environ(),
        )  # fmt: skip
        assert proc.stderr is not None
        try:
            async with asyncio.timeout(20):
                line = (await proc.stderr.readline()).decode().strip()
        finally:
            proc.send_signal(signal.SIGINT)
            await proc.wait()
        assert line == (
            f"sessionhub: answering turns on {h.ws_url} as 'responder' with 'tiny' at {model.base_url} "
            "(up to 64 at once)"
        )


async def test_a_url_without_ws_says_where_the_hub_is(tmp_path: Path) -> None:
    async with served(db=tmp_path / "h.db") as h:
        root = h.ws_url.removesuffix("ws")
        result = await asyncio.to_thread(run, "sessions", "--url", root)
    assert result.returncode == 3
    assert one_line(result) == (
        f"sessionhub: no hub endpoint at {root} (HTTP 404): the hub's WebSocket is /ws, "
        "e.g. ws://127.0.0.1:8000/ws (--url)"
    )


def test_no_docs_sample_writes_the_hubs_database() -> None:
    """Samples run by a user in the checkout must not write ./sessionhub.db, the file
    `scripts/serve` serves: their output would depend on what ran before."""
    root = Path(__file__).resolve().parents[2]
    for doc in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        for block in doc.read_text(encoding="utf-8").split("```python")[1:]:
            code = block.split("```", 1)[0]
            assert '.open("sessionhub.db")' not in code, doc.name


async def test_a_token_given_to_a_hub_that_checks_none_is_said_to_be_ignored(tmp_path: Path) -> None:
    async with served(db=tmp_path / "h.db") as h:
        result = await asyncio.to_thread(run, "sessions", "--url", h.ws_url, "--token", "anything")
    assert result.returncode == 0
    assert one_line(result) == (
        f"sessionhub: the hub at {h.ws_url} checks no tokens (no --auth-secret): --token is ignored"
    )
