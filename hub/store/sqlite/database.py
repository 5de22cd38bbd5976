"""`SqliteDatabase`: the file under :class:`~.store.SqliteStore`, its two connections, and
how an operation runs on them.

One writer connection and one reader connection (one for both in memory), each with its
thread (:mod:`.connection`). A write is one transaction under the write lock: small ones
inline on the event loop, big ones, and any that finds the file locked, in the writer's
thread; after each commit the bus is rung and the WAL checkpointer (:mod:`.checkpoint`) is
woken, or waited for when the WAL is past its bound. A read runs in the reader's thread, or
inline on the writer's connection when it is free and the read is small.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, Self, TypeVar

import aiosqlite

from protocol import InvalidInput, StoreClosed

from ...bus import Bus, MemoryBus
from . import checkpoint
from .checkpoint import CHECKPOINT_EVERY, WAL_CHECKPOINT_BYTES, WAL_LIMIT_BYTES, Checkpointer
from .connection import Conn, Connection, configure, is_busy, is_full, patient, read_tx, write_tx
from .errors import translate
from .schema import migrate
from .tx import SqliteTx

__all__ = ["SqliteDatabase"]

log = logging.getLogger("sessionhub.store")

T = TypeVar("T")


class SqliteDatabase:
    """One SQLite file (or ``":memory:"``) and the transaction shape of every operation."""

    def __init__(
        self,
        path: str,
        writer: Connection,
        reader: Connection,
        bus: Bus,
        synchronous: str = "NORMAL",
        wal_limit: int = WAL_LIMIT_BYTES,
        wal_checkpoint: int = WAL_CHECKPOINT_BYTES,
    ) -> None:
        self.path = path
        self.bus = bus
        self._writer = writer
        self._reader = reader
        self._closed = False
        self._write_lock = asyncio.Lock()
        self._commits = 0
        self._checkpointer: Checkpointer | None = None
        #: Set while one writer runs a catch-up; the others may wait on it (``_write``).
        self._caught_up: asyncio.Event | None = None
        self._wal_limit = wal_limit
        self._wal_checkpoint = wal_checkpoint
        #: The WAL's file size when a pass was last asked for (``_wal_grew``).
        self._woken_at = 0
        if path != ":memory:":
            self._checkpointer = Checkpointer(path, synchronous)

    @classmethod
    async def open(
        cls,
        path: str | Path = "sessionhub.db",
        *,
        bus: Bus | None = None,
        synchronous: Literal["OFF", "NORMAL", "FULL", "EXTRA"] = "NORMAL",
    ) -> Self:
        """Open (creating and migrating as needed) the database at ``path``.

        ``synchronous="NORMAL"`` with WAL survives a crash of the process (the commit is in
        the WAL before the call returns) but may lose the last commits on power loss;
        ``"FULL"`` fsyncs every commit.
        """
        path = str(path)
        memory = path == ":memory:"
        # Read at each open, so that a test can lower the bounds for the stores it opens.
        wal_limit = checkpoint.WAL_LIMIT_BYTES
        wal_checkpoint = checkpoint.WAL_CHECKPOINT_BYTES
        # Never above the hard bound: past the file's cut-back size, its size is the WAL's
        # length, which is what the catch-up test in ``_write`` reads.
        file_limit = min(wal_checkpoint, wal_limit)
        writer = await aiosqlite.connect(path, isolation_level=None, check_same_thread=False)
        try:
            w = Connection(writer)
            if not memory:
                await w.call(lambda c: c.execute("PRAGMA journal_mode = WAL").fetchone())
            await w.call(lambda c: configure(c, synchronous=synchronous, reader=False, wal_limit=file_limit))
            await w.call(migrate)
            if memory:
                r = w
            else:
                reader = await aiosqlite.connect(path, isolation_level=None, check_same_thread=False)
                r = Connection(reader)
                await r.call(lambda c: configure(c, synchronous=synchronous, reader=True))
        except BaseException:
            await writer.close()
            raise
        return cls(path, w, r, bus or MemoryBus(), synchronous, wal_limit, wal_checkpoint)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        async with self._write_lock:
            if self._checkpointer is not None:
                await self._checkpointer.close()
            if self._reader is not self._writer:
                await self._reader.conn.close()
            await self._writer.conn.close()

    async def __aenter__(self) -> Self:
        return self

    # -- plumbing ------------------------------------------------------------------------
    async def _write(self, fn: Callable[..., T], *args: Any, inline: bool = True) -> T:
        """Run ``fn(tx, *args)`` as one write transaction, then ring the bus.

        Small transactions (``inline``, on a file) run right here on the event loop: they take
        ~80 µs, less than the two cross-thread wake-ups a trip to the writer's thread costs
        on this kind of machine (docs/benchmarks.md). Big ones, and any that finds the
        database locked by another process, run in the writer's thread with the busy
        timeout, so the event loop never waits on a lock or a long write.
        """
        if self._closed:
            raise StoreClosed("store is closed")
        attempts: list[SqliteTx] = []

        def body(conn: Conn) -> T:
            # A fresh transaction (clock, notes) per attempt: a busy inline attempt is
            # retried in the writer's thread, and only the committed one is rung.
            tx = SqliteTx(conn)
            attempts.append(tx)
            return fn(tx, *args)

        # In memory the reader is the writer's connection, and a read may be running in its
        # thread: an inline BEGIN there would meet the read's ("cannot start a transaction
        # within a transaction"). The connection's thread runs one call at a time.
        inline = inline and self._reader is not self._writer
        async with self._write_lock:
            try:
                if inline:
                    try:
                        result = write_tx(body)(self._writer.raw)
                    except sqlite3.OperationalError as exc:
                        if not is_busy(exc):
                            raise
                        result = await self._writer.call(patient(write_tx(body)))
                else:
                    result = await self._writer.call(patient(write_tx(body)))
            except sqlite3.Error as exc:
                if is_full(exc) and self._checkpointer is not None:
                    # What the WAL holds that the file has already is space to give back.
                    self._checkpointer.reclaim(self._commit_count)
                raise translate(exc, write=True) from exc
            except UnicodeEncodeError as exc:  # binding a str with a lone surrogate
                raise InvalidInput(f"text that is not valid Unicode: {exc.reason}") from None
        attempts[-1].ring(self.bus)
        self._commits += 1
        checkpointer = self._checkpointer
        if checkpointer is not None:
            wal = checkpointer.wal_file_size()
            if (self._commits % CHECKPOINT_EVERY == 0 or self._wal_grew(wal)) and checkpointer.wake(
                self._commit_count
            ):
                self._woken_at = wal
            caught_up = self._caught_up
            if caught_up is None and wal > self._wal_limit:
                # The bound on the WAL. This writer (committed already) runs the catch-up
                # inline rather than in a task, so the bound holds even for a caller that
                # never yields to the event loop; other writers go on until it takes the lock.
                self._caught_up = caught_up = asyncio.Event()
                try:
                    await checkpointer.settle()
                    async with self._write_lock:
                        if not self._closed:
                            await checkpointer.catch_up(self._commit_count)
                except Exception as exc:  # committed already; the next catch-up retries
                    log.warning("WAL checkpoint failed: %s", exc)
                finally:
                    self._caught_up = None
                    caught_up.set()
            elif caught_up is not None and wal > 2 * self._wal_limit:
                # A catch-up waits for a pass that copies what the WAL held when it began, and
                # writers that went on meanwhile grew it: a pass costs disk writes and syncs, an
                # append only the page cache, so without this the WAL outran every pass (a
                # 9 GB WAL behind a prune, docs/benchmarks.md). Past twice the limit, writers
                # wait for the catch-up too: the WAL grows no faster than it is checkpointed.
                await caught_up.wait()
        return result

    def _wal_grew(self, wal: int) -> bool:
        """Whether the WAL passed the checkpoint bound by a quarter of it since the last
        pass was asked for (or restarted and passed it again). Up to the bound the file is
        reused (``journal_size_limit``), and the commit count wakes the passes; past it
        the file's size is the WAL's length, and a pass per quarter keeps what the database
        file lacks near the bound without a pass (and its sync) after every commit."""
        if wal <= self._wal_checkpoint:
            return False
        grown = wal - self._woken_at
        return grown < 0 or grown >= self._wal_checkpoint // 4

    def _commit_count(self) -> int:
        return self._commits

    async def _read(self, fn: Callable[..., T], *args: Any) -> T:
        if self._closed:
            raise StoreClosed("store is closed")
        try:
            return await self._reader.call(read_tx(fn), *args)
        except sqlite3.Error as exc:
            raise translate(exc) from exc
        except UnicodeEncodeError as exc:
            raise InvalidInput(f"text that is not valid Unicode: {exc.reason}") from None

    def _read_inline(self, fn: Callable[..., T | None], *args: Any) -> T | None:
        """Run the read ``fn(conn, *args)`` right here on the event loop, on the writer's
        connection, in a read transaction of its own; None when it cannot (a write holds the
        connection, an in-memory store shares one connection, the database is busy) or when
        ``fn`` declines. Only for reads whose cost ``fn`` bounds: a trip to the reader's
        thread costs two cross-thread wake-ups (docs/benchmarks.md)."""
        if self._closed:
            raise StoreClosed("store is closed")
        if self._reader is self._writer or self._write_lock.locked():
            return None
        try:
            return read_tx(fn)(self._writer.raw, *args)
        except sqlite3.OperationalError as exc:
            if is_busy(exc):
                return None
            raise translate(exc) from exc
        except sqlite3.Error as exc:
            raise translate(exc) from exc
        except UnicodeEncodeError as exc:
            raise InvalidInput(f"text that is not valid Unicode: {exc.reason}") from None
