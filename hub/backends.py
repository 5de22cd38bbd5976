"""From the two strings an operator writes (``--db``, ``--bus``) to a running store.

``--db`` is a SQLite path (the default) or a ``postgresql://`` DSN. ``--bus`` is
``memory`` (one node), ``postgres`` (LISTEN/NOTIFY on the store's own database: the
default with a Postgres store) or a ``redis://`` URL. A cross-node bus is started before
the store is used and closed after it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from protocol import InvalidInput

from .bus import Bus, MemoryBus, PgListenBus, RedisBus, RemoteBus
from .store.base import Store

__all__ = ["BackendUnavailable", "is_postgres", "make_bus", "open_backend", "probe", "redact"]


class BackendUnavailable(Exception):
    """The store or the bus cannot be reached or opened; the message says which and why."""


def is_postgres(db: str | Path) -> bool:
    return str(db).startswith(("postgresql://", "postgres://"))


def make_bus(db: str | Path, bus: str | None) -> Bus:
    """The bus ``bus`` names for a store on ``db`` (not started yet)."""
    choice = bus or ("postgres" if is_postgres(db) else "memory")
    if choice == "memory":
        return MemoryBus()
    if choice == "postgres":
        if not is_postgres(db):
            raise InvalidInput("--bus postgres needs a Postgres --db (it listens on that database)")
        return PgListenBus(str(db))
    if choice.startswith(("redis://", "rediss://", "unix://")):
        return RedisBus(choice)
    raise InvalidInput(f"unknown bus {choice!r}: use memory, postgres or a redis:// URL")


@contextlib.asynccontextmanager
async def open_backend(db: str | Path, bus: str | Bus | None = None) -> AsyncIterator[Store]:
    """Open the store for ``db`` with the bus ``bus`` names (or is), closing both at the end."""
    ring = bus if bus is not None and not isinstance(bus, str) else make_bus(db, bus)
    if isinstance(ring, RemoteBus):
        await ring.start()
    try:
        store: Store
        if is_postgres(db):
            from .store.postgres import PostgresStore

            # NOTIFY rides in the store's transactions only when somebody LISTENs for it.
            store = await PostgresStore.connect(str(db), bus=ring, notify=isinstance(ring, PgListenBus))
        else:
            from .store.sqlite import SqliteStore

            store = await SqliteStore.open(db, bus=ring)
        try:
            yield store
        finally:
            await store.close()
    finally:
        if isinstance(ring, RemoteBus):
            await ring.close()


async def probe(db: str | Path, bus: str | None = None) -> None:
    """Open and close the store and its bus once (migrating the store if needed), so that
    ``sessionhub serve`` can refuse to start with one clear line instead of a traceback."""
    try:
        async with open_backend(db, bus):
            pass
    except InvalidInput:
        raise
    except Exception as exc:
        ring = bus or ("postgres" if is_postgres(db) else "memory")
        raise BackendUnavailable(
            f"cannot open the store {redact(str(db))} with bus {redact(ring)}: {type(exc).__name__}: {exc}"
        ) from exc


def redact(url: str) -> str:
    """A URL without its password, for messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@")))
