"""Connection plumbing: an aiosqlite connection that runs whole transactions as one call in
its thread, the BEGIN/COMMIT wrappers, and the pragmas each connection is opened with."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable
from typing import Any, TypeVar, cast

import aiosqlite

__all__ = [
    "BUSY_TIMEOUT_MS",
    "Conn",
    "Connection",
    "configure",
    "is_busy",
    "is_full",
    "patient",
    "read_tx",
    "write_tx",
]

T = TypeVar("T")
Conn = sqlite3.Connection

BUSY_TIMEOUT_MS = 10_000


class Connection:
    """One aiosqlite connection; runs whole transactions as single calls in its thread."""

    def __init__(self, conn: aiosqlite.Connection) -> None:
        self.conn = conn

    @property
    def raw(self) -> Conn:
        return self.conn._conn

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        raw = self.conn._conn
        # aiosqlite's queue runs callables on the connection's own thread, in order.
        return cast(T, await self.conn._execute(fn, raw, *args))  # type: ignore[no-untyped-call]


def in_tx(begin: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
    def wrap(fn: Callable[..., T]) -> Callable[..., T]:
        def run(conn: Conn, *args: Any) -> T:
            conn.execute(begin)
            try:
                result = fn(conn, *args)
                # COMMIT inside the try: one that fails (a full disk cannot take the WAL's
                # frames) may leave the transaction open (SQLite rolls back some failures
                # itself, not all), and then every later BEGIN would fail.
                conn.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):  # the first error is the one to tell
                    conn.rollback()
                raise
            return result

        return run

    return wrap


write_tx = in_tx("BEGIN IMMEDIATE")
read_tx = in_tx("BEGIN")


def configure(conn: Conn, *, synchronous: str, reader: bool, wal_limit: int = 0) -> None:
    # The writer runs small transactions inline on the event loop, so it must never wait
    # there: no busy wait (a contended write retries in the thread, with the timeout) and
    # no automatic checkpoint at commit (the store's checkpointer thread does them).
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS if reader else 0}")
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    conn.execute("PRAGMA foreign_keys = OFF")
    conn.execute("PRAGMA cache_size = -65536")
    if reader:
        conn.execute("PRAGMA query_only = 1")
    else:
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        conn.execute(f"PRAGMA journal_size_limit = {wal_limit}")


def patient(fn: Callable[[Conn], T]) -> Callable[[Conn], T]:
    """Run ``fn`` with the busy timeout on: for the writer's thread, never the event loop."""

    def run(conn: Conn) -> T:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        try:
            return fn(conn)
        finally:
            conn.execute("PRAGMA busy_timeout = 0")

    return run


def is_busy(exc: sqlite3.Error) -> bool:
    return isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc)


def is_full(exc: sqlite3.Error) -> bool:
    """SQLITE_FULL: the disk (or the temporary store) had no room for the change."""
    return getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL
