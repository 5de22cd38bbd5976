"""Postgres LISTEN/NOTIFY as the doorbell between hub nodes on one database.

The store sends ``pg_notify`` inside each writing transaction (so a doorbell exists
exactly when the commit does); this bus holds one dedicated connection that LISTENs and
rings the local waiters. Postgres delivers notifications in commit order and only while
the connection lives: :class:`~hub.bus.remote.RemoteBus` covers the gaps.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import asyncpg

from ..store.postgres.timeouts import limits
from . import doorbell
from .remote import RemoteBus

__all__ = ["PgListenBus"]

log = logging.getLogger("sessionhub.bus")


class PgListenBus(RemoteBus):
    """``PgListenBus(dsn)``; hand it to ``PostgresStore.connect(dsn, bus=...)``.

    A dead TCP connection sends no error until something is written, so the listener
    pings every ``ping_interval`` seconds and counts a ping slower than ``ping_timeout``
    as a loss.
    """

    def __init__(
        self,
        dsn: str,
        *,
        channel: str = doorbell.CHANNEL,
        ping_interval: float = 5.0,
        ping_timeout: float = 5.0,
        poll_interval: float = 1.0,
    ) -> None:
        super().__init__(poll_interval=poll_interval)
        self.dsn = dsn
        self.channel = channel
        self.ping_interval = ping_interval
        self.ping_timeout = ping_timeout
        self.relay_channel = channel + "_relay"
        self._conn: asyncpg.Connection | None = None
        self._sender: asyncpg.Connection | None = None
        self._lost: asyncio.Event = asyncio.Event()

    @property
    def backend_pid(self) -> int | None:
        """The listening connection's server process id (to find it in ``pg_stat_activity``)."""
        return None if self._conn is None else self._conn.get_server_pid()

    async def _open(self, name: str) -> asyncpg.Connection:
        # With the store's limits, and the DSN's: a DSN naming the client's timeouts
        # (``?command_timeout=5``) opens here as it does for the store.
        lim = limits(self.dsn)
        return await asyncpg.connect(
            lim.dsn,
            server_settings={**lim.server_settings, "application_name": name},
            timeout=lim.connect_timeout,
            command_timeout=lim.command_timeout,
        )

    async def _connect(self) -> None:
        self._lost = asyncio.Event()
        conn = await self._open("sessionhub-listen")
        self._conn = conn
        conn.add_termination_listener(lambda c: self._lost.set())
        await conn.add_listener(self.channel, self._on_notify)
        await conn.add_listener(self.relay_channel, self._on_relay_notify)

    def _on_notify(self, conn: object, pid: int, channel: str, payload: object) -> None:
        try:
            stream, seq = doorbell.decode(str(payload))
        except ValueError:
            log.warning("ignoring a foreign payload on channel %s", channel)
            return
        self.heard(stream, seq)

    def _on_relay_notify(self, conn: object, pid: int, channel: str, payload: object) -> None:
        self.relayed(str(payload))

    #: NOTIFY payloads must be shorter than 8,000 bytes.
    relay_chunk = doorbell.MAX_PAYLOAD

    async def _send_relay(self, payloads: list[str]) -> None:
        # Its own connection: the listener's must stay free for its pings, and a sender
        # failure must not look like a lost listener.
        if self._sender is None or self._sender.is_closed():
            self._sender = await self._open("sessionhub-relay")
        try:
            await self._sender.execute(
                "SELECT pg_notify($1, p) FROM unnest($2::text[]) WITH ORDINALITY AS t(p, i) ORDER BY i",
                self.relay_channel,
                payloads,
            )
        except BaseException:
            sender, self._sender = self._sender, None
            sender.terminate()
            raise

    async def _listen(self) -> None:
        conn = self._conn
        assert conn is not None
        while not self._closing:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._lost.wait(), self.ping_interval)
            if self._lost.is_set() or conn.is_closed():
                raise ConnectionError("the listening connection closed")
            try:
                await asyncio.wait_for(conn.fetchval("SELECT 1"), self.ping_timeout)
            except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                raise ConnectionError(f"ping failed: {exc!r}") from exc

    async def close(self) -> None:
        await super().close()
        sender, self._sender = self._sender, None
        if sender is not None:
            try:
                await asyncio.wait_for(sender.close(), 2.0)
            except Exception:
                sender.terminate()

    async def _disconnect(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            await asyncio.wait_for(conn.close(), 2.0)
        except Exception:
            conn.terminate()
