"""hub/apps/backends.py: what ``--db`` and ``--bus`` accept, and the bus a database records so
that nodes on different buses (which would miss each other's live events) are refused."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from hub import InvalidInput, PostgresStore, SqliteStore
from hub.apps.backends import BusMismatch, bus_identity, make_bus, open_backend, resolve_db
from hub.bus import MemoryBus, PgListenBus, RedisBus
from tests.support.nodes import scratch_database
from tests.support.services import postgres_dsn, redis_url


@pytest.mark.parametrize(
    ("db", "path"),
    [
        ("hub.db", "hub.db"),
        ("./data/hub.db", "./data/hub.db"),
        ("sqlite:///hub.db", "hub.db"),
        ("sqlite:////var/lib/hub.db", "/var/lib/hub.db"),
        ("sqlite:///:memory:", ":memory:"),
        ("postgresql://u@h/db", "postgresql://u@h/db"),
        ("postgres://u@h/db", "postgres://u@h/db"),
        ("C:\\hub.db", "C:\\hub.db"),  # a Windows drive is not a scheme
    ],
)
def test_resolve_db_accepts(db: str, path: str) -> None:
    assert str(resolve_db(db)) == path


@pytest.mark.parametrize(
    ("db", "says"),
    [
        ("mysql://root:pw@h/db", "unsupported scheme 'mysql'"),
        ("sqlite:z.db", "write sqlite:///PATH"),
        ("sqlite://z.db", "write sqlite:///PATH"),
        ("sqlite:///", "write sqlite:///PATH"),
        ("http://example.com/x.db", "unsupported scheme 'http'"),
        ("", "--db is empty"),
    ],
)
def test_resolve_db_refuses(db: str, says: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        resolve_db(db)
    assert says in str(refused.value)
    assert ":pw@" not in str(refused.value)


async def test_open_backend_on_a_sqlite_url(tmp_path: Path) -> None:
    async with open_backend(f"sqlite:///{tmp_path / 'u.db'}") as store:
        assert isinstance(store, SqliteStore)
    assert (tmp_path / "u.db").exists()
    async with open_backend("sqlite:///:memory:") as store:
        assert await store.list_sessions() == []


def test_bus_identity_names_the_redis_database_never_its_password() -> None:
    assert bus_identity(MemoryBus()) == "memory"
    assert bus_identity(RedisBus("redis://:hunter2@10.0.0.5")) == "redis://10.0.0.5:6379/0"
    assert bus_identity(RedisBus("redis://user:pw@cache:6380/3")) == "redis://cache:6380/3"
    assert bus_identity(RedisBus("rediss://[::1]:6379/1")) == "rediss://[::1]:6379/1"
    assert bus_identity(RedisBus("unix:///run/redis.sock?db=2")) == "unix:///run/redis.sock?db=2"
    assert bus_identity(RedisBus("redis://h/0", channel="blue")) == "redis://h:6379/0#blue"
    assert bus_identity(PgListenBus("postgresql://u:pw@h/db")) == "postgres"
    assert bus_identity(make_bus("postgresql://u@h/db", None)) == "postgres"


async def test_sqlite_settings_first_claim_wins_until_replaced(tmp_path: Path) -> None:
    async with await SqliteStore.open(tmp_path / "s.db") as store:
        assert await store.claim_setting("bus", "memory") == "memory"
        assert await store.claim_setting("bus", "redis://h:6379/0") == "memory"
        assert await store.claim_setting("bus", "redis://h:6379/0", replace=True) == "redis://h:6379/0"
    async with await SqliteStore.open(tmp_path / "s.db") as store:  # it is stored, not cached
        assert await store.claim_setting("bus", "memory") == "redis://h:6379/0"


async def test_postgres_settings_first_claim_wins_until_replaced(pg_dsn: str, pg_schema: str) -> None:
    store = await PostgresStore.connect(pg_dsn, server_settings={"search_path": pg_schema})
    try:
        assert await store.claim_setting("bus", "postgres") == "postgres"
        assert await store.claim_setting("bus", "memory") == "postgres"
        assert await store.claim_setting("bus", "memory", replace=True) == "memory"
    finally:
        await store.close()


async def test_postgres_migration_2_adds_settings_to_a_version_1_database(
    pg_dsn: str, pg_schema: str
) -> None:
    settings = {"search_path": pg_schema}
    await (await PostgresStore.connect(pg_dsn, server_settings=settings)).close()
    conn = await asyncpg.connect(pg_dsn, server_settings=settings)
    try:  # a database created at version 1 has no settings table and records no later version
        # (the later migrations are idempotent, so they run again over this schema)
        await conn.execute("DROP TABLE settings; DELETE FROM schema_migrations WHERE version >= 2")
    finally:
        await conn.close()
    store = await PostgresStore.connect(pg_dsn, server_settings=settings)
    try:
        assert await store.claim_setting("bus", "postgres") == "postgres"
    finally:
        await store.close()


@pytest.fixture
async def database() -> AsyncIterator[str]:
    async with scratch_database(postgres_dsn(), "sessionhub_backends") as dsn:
        yield dsn


async def test_postgres_nodes_on_different_buses_are_refused(database: str) -> None:
    redis = redis_url()
    async with open_backend(database) as store:  # NOTIFY, the default: recorded
        assert isinstance(store.bus, PgListenBus)
    with pytest.raises(BusMismatch) as refused:
        async with open_backend(database, redis):
            pass
    assert refused.value.recorded == "postgres"
    assert refused.value.mine == bus_identity(RedisBus(redis))
    async with open_backend(database, "postgres"):  # the same bus, said explicitly: fine
        pass
    async with open_backend(database, redis, bus_override=True) as store:
        assert isinstance(store.bus, RedisBus)
    same = redis.removesuffix("/0") if redis.endswith("/0") else redis + "?db=0"  # another spelling
    async with open_backend(database, same):
        pass
    with pytest.raises(BusMismatch, match="served with bus redis://"):
        async with open_backend(database):
            pass
