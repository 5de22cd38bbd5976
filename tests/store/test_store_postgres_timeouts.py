"""The Postgres store's own connection limits (``hub/store/postgres/timeouts.py``): what
reaches the server and the socket, how the DSN and the arguments change it, and what a
caller is told when a limit ends an operation: ``unavailable``, never a hang."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, cast

import asyncpg
import pytest

from hub import InvalidInput, PostgresStore, SessionManager, session_stream
from hub.store.postgres.errors import is_lost, translate
from hub.store.postgres.schema import lock_key
from hub.store.postgres.timeouts import SERVER_DEFAULTS, limits
from protocol import StoreUnavailable
from tests.support.faultkit import TcpProxy
from tests.support.hubtest import text_message as T
from tests.support.nodes import scratch_database
from tests.support.services import postgres_dsn


@pytest.fixture
async def dsn() -> AsyncIterator[str]:
    async with scratch_database(postgres_dsn(), "sessionhub_limits") as url:
        yield url


async def shown(store: PostgresStore, *names: str) -> dict[str, Any]:
    """The server's view of a pooled connection's settings, and its socket's options."""
    async with store._pool.acquire() as conn:
        values: dict[str, Any] = {name: await conn.fetchval(f"SHOW {name}") for name in names}
        raw: Any = cast(Any, conn)._con  # asyncpg's connection behind the pool's proxy
        sock = raw._transport.get_extra_info("socket")
        values["SO_KEEPALIVE"] = sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE)
        values["TCP_KEEPIDLE"] = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE)
        values["TCP_USER_TIMEOUT"] = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT)
        values["command_timeout"] = raw._config.command_timeout
    return values


async def test_every_connection_carries_the_limits_whatever_the_server_says(dsn: str) -> None:
    store = await PostgresStore.connect(dsn)
    try:
        got = await shown(store, *SERVER_DEFAULTS)
    finally:
        await store.close()
    assert got == {
        "statement_timeout": "30s",
        "lock_timeout": "10s",
        "idle_in_transaction_session_timeout": "5s",
        "tcp_keepalives_idle": "10",
        "tcp_keepalives_interval": "5",
        "tcp_keepalives_count": "3",
        "tcp_user_timeout": "20000",
        "SO_KEEPALIVE": 1,
        "TCP_KEEPIDLE": 10,
        "TCP_USER_TIMEOUT": 20000,
        "command_timeout": 35.0,
    }


async def test_the_dsn_changes_them_and_the_arguments_win_over_the_dsn(dsn: str) -> None:
    tuned = (
        f"{dsn}?lock_timeout=2s&tcp_keepalives_idle=30&command_timeout=7&tcp_user_timeout=&application_name=t"
    )
    store = await PostgresStore.connect(tuned, server_settings={"lock_timeout": "3s"})
    try:
        got = await shown(store, "lock_timeout", "tcp_user_timeout", "application_name", "statement_timeout")
    finally:
        await store.close()
    assert got["lock_timeout"] == "3s"  # the argument over the DSN
    assert (got["TCP_KEEPIDLE"], got["command_timeout"], got["application_name"]) == (30, 7.0, "t")
    assert (got["tcp_user_timeout"], got["TCP_USER_TIMEOUT"]) == ("0", 0)  # empty: not sent
    assert got["statement_timeout"] == "30s"
    assert limits(tuned, command_timeout=0).command_timeout is None  # 0: none
    with pytest.raises(InvalidInput, match="command_timeout='soon'"):
        limits(f"{dsn}?command_timeout=soon")


async def test_a_write_behind_a_lock_held_too_long_is_answered_unavailable_and_not_applied(dsn: str) -> None:
    store = await PostgresStore.connect(f"{dsn}?lock_timeout=300ms")
    holder = await asyncpg.connect(dsn)
    manager = SessionManager(store)
    try:
        sid = (await manager.create("locked")).id
        async with holder.transaction():
            await holder.execute(f"SELECT pg_advisory_xact_lock({lock_key(session_stream(sid))})")
            with pytest.raises(StoreUnavailable) as caught:
                await manager.append(sid, T("m1", "user", "hello"))
        assert caught.value.outcome == "not_applied"
        assert await store.get_message(sid, "m1") is None
        await manager.append(sid, T("m1", "user", "hello"))  # the lock gone, it goes in
        assert await store.get_message(sid, "m1") is not None
    finally:
        await holder.close()
        await store.close()


async def test_a_database_that_stops_answering_gets_unavailable_within_command_timeout(dsn: str) -> None:
    """Bytes held between the store and the server (a partition): reads and writes are
    answered ``unavailable`` after ``command_timeout``, and work again once bytes flow."""
    parts = dsn.split("@", 1)[1].split("/", 1)
    host, port = parts[0].rsplit(":", 1)
    async with TcpProxy((host, int(port))) as proxy:
        through = f"postgresql://postgres@127.0.0.1:{proxy.port}/{parts[1]}?command_timeout=0.5"
        store = await PostgresStore.connect(through, max_size=2)
        manager = SessionManager(store)
        try:
            sid = (await manager.create("cut off")).id
            proxy.hold()
            operations: list[Callable[[], Awaitable[object]]] = [
                lambda: store.get_session(sid),
                lambda: manager.append(sid, T("m1", "user", "hi")),
            ]
            for operation in operations:
                start = time.monotonic()
                with pytest.raises(StoreUnavailable) as caught:
                    async with asyncio.timeout(20):  # a hang fails here, not at the suite's timeout
                        await operation()
                print(f"answered {caught.value.outcome!r} after {time.monotonic() - start:.2f} s")
                assert caught.value.outcome in ("not_applied", "unknown")
            proxy.cut()
            proxy.release()
            async with asyncio.timeout(20):
                await manager.append(sid, T("m2", "user", "again"))
            assert [m.id for m in await store.get_history(sid)][-1] == "m2"
        finally:
            proxy.cut()
            await store.close()


def test_a_timeout_is_not_a_lost_connection() -> None:
    """TimeoutError is an OSError: taken for a lost connection, a write that timed out ran
    once more and was answered after twice its ``command_timeout`` (a partitioned node's
    clients waited past its 1013 close). It is answered at once, ``unavailable``."""
    assert not is_lost(TimeoutError())
    assert is_lost(ConnectionResetError())
    answer = translate(TimeoutError(), write=True)
    assert isinstance(answer, StoreUnavailable) and answer.outcome == "not_applied"
    assert translate(TimeoutError(), write=True, committing=True).detail == {"outcome": "unknown"}
