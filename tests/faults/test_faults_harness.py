"""The fault harness itself (tests/support/faultkit.py): the scratch cluster stops, restarts and dies
for real, and the proxy holds, cuts and balances."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from tests.support.faultkit import TcpProxy, scratch_postgres

pytestmark = pytest.mark.timeout(120)


async def test_scratch_postgres_stops_restarts_and_is_killed() -> None:
    async with scratch_postgres() as pg:
        conn = await asyncpg.connect(pg.dsn)
        assert await conn.fetchval("SELECT 1") == 1
        await pg.restart()
        with pytest.raises((asyncpg.PostgresError, OSError, asyncpg.InterfaceError)):
            await conn.fetchval("SELECT 1")
        conn = await asyncpg.connect(pg.dsn)
        assert await conn.fetchval("SELECT 2") == 2
        await pg.kill()
        with pytest.raises((asyncpg.PostgresError, OSError, asyncpg.InterfaceError)):
            await asyncio.wait_for(conn.fetchval("SELECT 3"), 10)
        await pg.start()  # a crash recovery
        conn = await asyncpg.connect(pg.dsn)
        assert await conn.fetchval("SELECT 4") == 4
        await conn.close()


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(1024):
        writer.write(b"%d:" % writer.get_extra_info("sockname")[1] + data)
        await writer.drain()
    writer.close()


async def _closed(reader: asyncio.StreamReader) -> bool:
    """Whether the proxy ended the connection (EOF or a reset) rather than sending data."""
    try:
        return await asyncio.wait_for(reader.read(100), 5) == b""
    except ConnectionResetError:
        return True


async def test_proxy_holds_cuts_refuses_and_balances() -> None:
    one = await asyncio.start_server(_echo, "127.0.0.1", 0)
    two = await asyncio.start_server(_echo, "127.0.0.1", 0)
    ports = [s.sockets[0].getsockname()[1] for s in (one, two)]
    async with TcpProxy(*(("127.0.0.1", p) for p in ports)) as proxy:
        seen = set()
        for _ in range(2):
            reader, writer = await asyncio.open_connection(*proxy.address)
            writer.write(b"x")
            seen.add(int((await reader.read(100)).split(b":")[0]))
            writer.close()
        assert seen == set(ports)

        reader, writer = await asyncio.open_connection(*proxy.address)
        proxy.hold()
        writer.write(b"held")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(reader.read(100), 0.3)
        proxy.release()
        assert (await asyncio.wait_for(reader.read(100), 5)).endswith(b"held")

        proxy.cut()
        assert await _closed(reader)

        two.close()
        await two.wait_closed()
        for _ in range(3):  # the dead upstream is skipped
            reader, writer = await asyncio.open_connection(*proxy.address)
            writer.write(b"y")
            assert int((await reader.read(100)).split(b":")[0]) == ports[0]
            writer.close()

        proxy.refuse()
        reader, writer = await asyncio.open_connection(*proxy.address)
        assert await _closed(reader)
    one.close()
