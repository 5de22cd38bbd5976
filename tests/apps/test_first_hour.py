"""The first hour as a new user meets it (issue 29 §2): each mistake a user makes on a fresh
clone is one line and a documented exit code, and the setup the README gives just works."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.apps.test_cli import one_line, run
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
