"""`PostgresPool`: the connections under :class:`~.store.PostgresStore`, and how an
operation runs on them.

Opening creates or migrates the schema on a connection of its own, then opens the pool. A
write is one transaction (its session's advisory lock first, its doorbells sent with its
COMMIT, the bus rung after), run once more on a fresh connection when its connection was
lost before the COMMIT went out; a read, likewise. A driver error becomes the store's
answer (:func:`.errors.translate`), an outage one log line (:class:`~..faultlog.FaultLog`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Self, TypeVar

import asyncpg

from protocol import InvalidInput, StoreClosed, StoreError, StoreUnavailable

from ...bus import Bus, MemoryBus, RemoteBus
from ...bus.doorbell import CHANNEL
from ...bus.doorbell import encode as doorbell
from ..faultlog import FaultLog
from .errors import install_log_filter, is_lost, translate
from .schema import lock_key, migrate
from .timeouts import limits, set_keepalives
from .tx import PostgresTx

if TYPE_CHECKING:
    from .tx import Conn

__all__ = ["PostgresPool"]

T = TypeVar("T")

log = logging.getLogger("sessionhub.store")


class _Connection(asyncpg.Connection):
    """Pooled connections skip asyncpg's reset query on release (one round trip per
    operation): the store keeps no session state (advisory locks are transaction-scoped,
    no LISTEN, no cursors), and an open transaction is still rolled back. Their socket gets
    the keepalives their server settings name (:func:`.timeouts.set_keepalives`)."""

    def __init__(self, protocol: Any, transport: Any, loop: Any, addr: Any, config: Any, params: Any) -> None:
        super().__init__(protocol, transport, loop, addr, config, params)
        set_keepalives(transport.get_extra_info("socket"), params.server_settings or {})

    def get_reset_query(self) -> str:
        return ""


#: What asyncpg raises: the server's errors, its own, and the socket's.
_DRIVER_ERRORS = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    OSError,
    TimeoutError,
)


class _Attempt:
    """How far one run of a write transaction got, for the answer to its failure."""

    __slots__ = ("committing", "gone")

    def __init__(self) -> None:
        self.committing = False  # its COMMIT was sent: it may have been applied
        self.gone = False  # its connection died under it


def _gone(conn: Conn) -> bool:
    """Whether the connection is closed. The pool takes back (and detaches) a connection
    that dies while in use, after which every call on it raises: that too is gone."""
    try:
        return conn.is_closed()
    except asyncpg.InterfaceError:
        return True


def _healthy_after(exc: BaseException) -> bool:
    """Whether a connection is idle and usable after ``exc``: the server answered with an
    error, or the operation's own code raised between statements. Anything else (a
    cancellation or a timeout mid-statement, a lost socket, the protocol confused) leaves
    the connection in a state no later statement may meet."""
    if isinstance(exc, asyncpg.PostgresError):
        return not is_lost(exc)
    if isinstance(exc, asyncpg.exceptions.DataError):  # a value asyncpg refused to encode: nothing sent
        return True
    return isinstance(exc, Exception) and not isinstance(exc, _DRIVER_ERRORS)


def _terminate(conn: Conn) -> None:
    # Closing the socket makes the server roll the transaction back, and the pool replaces
    # the connection: nothing else can ever run on it, mid-operation or not.
    with contextlib.suppress(asyncpg.InterfaceError):
        conn.terminate()


async def _abandon(conn: Conn, exc: BaseException) -> bool:
    """Leave a failed transaction: ROLLBACK on a connection that can take it, else close
    the connection. Returns whether the connection had died already."""
    if _gone(conn):
        return True
    if _healthy_after(exc):
        try:
            await conn.execute("ROLLBACK")
            return False
        except _DRIVER_ERRORS:
            pass
    _terminate(conn)
    return False


class PostgresPool:
    """The pool of one Postgres database and the transaction shape of every operation."""

    def __init__(
        self,
        pool: asyncpg.Pool[asyncpg.Record],
        bus: Bus,
        *,
        notify: bool = True,
        acquire_timeout: float | None = None,
    ) -> None:
        self.bus = bus
        self.notify = notify
        self._pool = pool
        #: How long an operation waits for a pooled connection (all may be stuck in a partition).
        self._acquire_timeout = acquire_timeout
        self._closed = False
        self._faults = FaultLog("postgres", on_recovery=self._recovered)

    @classmethod
    async def connect(
        cls,
        dsn: str,
        *,
        bus: Bus | None = None,
        min_size: int = 1,
        max_size: int = 10,
        notify: bool = True,
        server_settings: dict[str, str] | None = None,
        command_timeout: float | None = None,
        connect_timeout: float | None = None,
    ) -> Self:
        """Open a pool on ``dsn`` and create or migrate the schema as needed.

        ``notify=True`` sends a ``pg_notify`` doorbell per stream written, in each write's
        transaction, for the hub nodes listening on :data:`hub.bus.doorbell.CHANNEL`.
        ``server_settings`` (e.g. ``{"search_path": "tenant_a"}``) apply to every connection,
        over the store's timeouts and keepalives (:mod:`.timeouts`, which the DSN's query can
        change too); ``command_timeout`` and ``connect_timeout`` are the client's, in
        seconds (``0``: none).
        """
        lim = limits(dsn, server_settings, command_timeout, connect_timeout)
        install_log_filter()
        try:
            # The migration may copy whole tables, and may wait for another node's: on a
            # connection of its own with no statement, lock or client timeout.
            admin = await asyncpg.connect(
                lim.dsn,
                server_settings={**lim.server_settings, "statement_timeout": "0", "lock_timeout": "0"},
                timeout=lim.connect_timeout,
                connection_class=_Connection,
            )
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise StoreError(f"postgres: cannot connect: {exc}") from exc
        try:
            await migrate(admin)
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as exc:
            raise StoreError(f"postgres: cannot migrate: {exc}") from exc
        finally:
            await admin.close()
        try:
            pool = await asyncpg.create_pool(
                lim.dsn,
                min_size=min_size,
                max_size=max_size,
                server_settings=lim.server_settings,
                command_timeout=lim.command_timeout,
                timeout=lim.connect_timeout,
                connection_class=_Connection,
            )
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise StoreError(f"postgres: cannot connect: {exc}") from exc
        return cls(pool, bus or MemoryBus(), notify=notify, acquire_timeout=lim.command_timeout)

    def _recovered(self) -> None:
        if isinstance(self.bus, RemoteBus):  # its listener is on the same server
            self.bus.retry_soon()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._pool.close()

    async def __aenter__(self) -> Self:
        return self

    # -- plumbing ------------------------------------------------------------------------
    async def _write(self, fn: Callable[..., Awaitable[T]], *args: Any, lock: str | None = None) -> T:
        """Run ``fn(tx, *args)`` as one transaction (after locking session stream
        ``lock``), send the doorbells inside it, commit, then ring the bus. A transaction
        whose connection was lost before its COMMIT was sent never happened: it runs once
        more, on a fresh connection."""
        for again in (True, False):
            attempt = _Attempt()
            try:
                result, tx = await self._transact(attempt, fn, args, lock)
            except _DRIVER_ERRORS as exc:
                if again and not attempt.committing and is_lost(exc, gone=attempt.gone) and not self._closed:
                    continue
                raise self._failure(
                    exc, write=True, committing=attempt.committing, gone=attempt.gone
                ) from exc
            except UnicodeEncodeError as exc:  # a lone surrogate, in a lock key or a parameter
                raise InvalidInput(f"text that is not valid Unicode: {exc.reason}") from None
            self._faults.recovered()
            tx.ring(self.bus)
            return result
        raise AssertionError("unreachable")

    async def _transact(
        self, attempt: _Attempt, fn: Callable[..., Awaitable[T]], args: tuple[Any, ...], lock: str | None
    ) -> tuple[T, PostgresTx]:
        if self._closed:
            raise StoreClosed("store is closed")
        async with self._pool.acquire(timeout=self._acquire_timeout) as conn:
            tx = PostgresTx(conn)
            try:
                await conn.execute(
                    "BEGIN" if lock is None else f"BEGIN; SELECT pg_advisory_xact_lock({lock_key(lock)})"
                )
                result = await fn(tx, *args)
                attempt.committing = True
                await conn.execute(self._commit(tx))
            except BaseException as exc:
                attempt.gone = await _abandon(conn, exc)
                raise
            return result, tx

    def _failure(
        self, exc: BaseException, *, write: bool = False, committing: bool = False, gone: bool = False
    ) -> BaseException:
        """The answer to a driver error (its one log line included, for an outage)."""
        if self._closed:
            return StoreClosed("store is closed")
        error = translate(exc, write=write, committing=committing, gone=gone)
        if isinstance(error, StoreUnavailable):
            self._faults.failed(str(error))
        elif not isinstance(error, InvalidInput):
            log.error("postgres failed: %r", exc)
        return error

    async def analyze(self) -> None:
        """Refresh the planner's statistics of the store's tables. Autovacuum does it soon
        after a big change; call it yourself right after a bulk import, before searching."""

        async def fn(conn: Conn) -> None:
            await conn.execute("ANALYZE messages, events, search_entries, sessions")

        await self._read(fn)

    def _commit(self, tx: PostgresTx) -> str:
        """COMMIT, after the doorbells not yet sent: one round trip. The payloads go as
        hex literals, so no stream name can ever be read as SQL."""
        if not self.notify:
            return "COMMIT"
        last = {stream: seq for stream, seq in tx.notes if stream not in tx.notified}
        payloads = [doorbell(stream, seq).encode().hex() for stream, seq in last.items()]
        notices = "".join(
            f"SELECT pg_notify('{CHANNEL}', convert_from(decode('{p}', 'hex'), 'UTF8'));" for p in payloads
        )
        return notices + "COMMIT"

    async def _read(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run ``fn(conn, *args)``; a read whose connection was lost runs once more, on a
        fresh connection."""
        for again in (True, False):
            if self._closed:
                raise StoreClosed("store is closed")
            attempt = _Attempt()
            try:
                async with self._pool.acquire(timeout=self._acquire_timeout) as conn:
                    try:
                        result = await fn(conn, *args)
                    except BaseException as exc:
                        attempt.gone = _gone(conn)
                        if not attempt.gone and not _healthy_after(exc):
                            _terminate(conn)
                        raise
            except _DRIVER_ERRORS as exc:
                if again and is_lost(exc, gone=attempt.gone) and not self._closed:
                    continue
                raise self._failure(exc, gone=attempt.gone) from exc
            except UnicodeEncodeError as exc:
                raise InvalidInput(f"text that is not valid Unicode: {exc.reason}") from None
            self._faults.recovered()
            return result
        raise AssertionError("unreachable")
