"""Shared fixtures.

``store`` runs every test that takes it (directly or through another fixture) twice: on a
real SQLite file in the test's temporary directory (``[sqlite]``) and on Postgres
(``[postgres]``). Tests that also take ``db_path`` read or change the SQLite file itself,
or are marked ``sqlite_only``; they run on SQLite alone.

Postgres: one database per test run (``sessionhub_test_<pid>``, created and migrated once,
dropped at the end) on the server named by ``SESSIONHUB_TEST_POSTGRES``; each test gets it
with every table emptied (a few ``DELETE``s: ~0.2 ms, against ~40 ms for a fresh schema
and ~15 ms for ``TRUNCATE``). When the server is unreachable the ``[postgres]`` runs skip
(or fail, under ``SESSIONHUB_REQUIRE_SERVICES=1``: see ``tests/support/services.py``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import os
import uuid
from collections.abc import AsyncIterator, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from hub import PostgresStore, SqliteStore, Store
from tests.support.hubtest import text_message as text_message  # the suites' `T(...)`; built in hubtest
from tests.support.services import postgres_dsn, unavailable

T = TypeVar("T")

BACKENDS = ("sqlite", "postgres")

#: Every table of the Postgres schema, emptied before each test.
PG_TABLES = (
    "file_refs",
    "file_uploads",
    "file_chunks",
    "files",
    "sessions",
    "messages",
    "compactions",
    "streams",
    "events",
    "context_blocks",
    "search_entries",
    "session_stats",
    "graph_checkpoints",
    "graph_writes",
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "sqlite_only: run a test taking `store` on SQLite only")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "store" not in metafunc.fixturenames:
        return
    direct = inspect.signature(metafunc.function).parameters
    only_sqlite = "db_path" in direct or metafunc.definition.get_closest_marker("sqlite_only") is not None
    backends = ["sqlite"] if only_sqlite else list(BACKENDS)
    metafunc.parametrize("store", backends, indirect=True, ids=backends)


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion on its own loop in another thread (from sync code,
    whatever loop the caller's thread has)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def with_database(dsn: str, database: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path="/" + database))


def pg_server() -> str:
    return postgres_dsn()


@pytest.fixture(scope="session")
def pg_dsn() -> Iterator[str]:
    """The DSN of a database of this test run (migrated, shared by the run's tests; a test
    that needs it empty takes ``store`` or ``pg_schema``). Skips when Postgres is down."""
    server = pg_server()
    database = f"sessionhub_test_{os.getpid()}"

    async def create() -> str | None:
        try:
            conn = await asyncpg.connect(server, timeout=5)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as exc:
            return f"Postgres not reachable at {server} (SESSIONHUB_TEST_POSTGRES): {exc}"
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{database}"')
            await conn.execute(f'CREATE DATABASE "{database}"')
        finally:
            await conn.close()
        store = await PostgresStore.connect(with_database(server, database), min_size=1, max_size=1)
        await store.close()
        return None

    async def drop() -> None:
        conn = await asyncpg.connect(server, timeout=5)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        finally:
            await conn.close()

    problem = run_sync(create())
    if problem is not None:
        unavailable(problem)
    try:
        yield with_database(server, database)
    finally:
        run_sync(drop())


@pytest.fixture
async def pg_schema(pg_dsn: str) -> AsyncIterator[str]:
    """A fresh, empty schema in the run's database (dropped afterwards); connect with
    ``server_settings={"search_path": name}``."""
    name = "t_" + uuid.uuid4().hex[:12]
    conn = await asyncpg.connect(pg_dsn)
    try:
        await conn.execute(f"CREATE SCHEMA {name}")
        yield name
    finally:
        await conn.execute(f"DROP SCHEMA {name} CASCADE")
        await conn.close()


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "sessionhub.db"


@pytest.fixture
def keep_rows_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SQLite store deflates no message: for tests about how big rows grow the file
    and its WAL, whose texts repeat (and would deflate to almost nothing)."""
    from hub.store.sqlite import packing

    monkeypatch.setattr(packing, "DEFLATE_AT", 1 << 30)


@pytest.fixture
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    s: Store
    if request.param == "sqlite":
        s = await SqliteStore.open(request.getfixturevalue("db_path"))
    else:
        dsn: str = request.getfixturevalue("pg_dsn")
        pg = await PostgresStore.connect(dsn, min_size=1, max_size=4)
        async with pg._pool.acquire() as conn:
            await conn.execute(";".join(f"DELETE FROM {table}" for table in PG_TABLES))
        s = pg
    try:
        yield s
    finally:
        await s.close()
