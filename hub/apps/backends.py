"""From the two strings an operator writes (``--db``, ``--bus``) to a running store.

``--db`` is a SQLite path (the default; also ``sqlite:///relative.db``,
``sqlite:////absolute.db`` or ``sqlite:///:memory:``) or a ``postgresql://`` DSN (extra
``sessionhub[postgres]``). ``--bus`` is ``memory`` (one node), ``postgres`` (LISTEN/NOTIFY
on the store's own database: the default with a Postgres store) or a ``redis://`` URL
(extra ``sessionhub[redis]``). A cross-node bus is started before the store is used and
closed after it.

The database records the bus it is served with (setting ``bus``): a node on another bus
would miss the other nodes' live events, so it refuses to start (:class:`BusMismatch`)
unless told to record its own (``bus_override``, ``sessionhub serve --bus-override``).
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

from protocol import InvalidInput

from ..bus import Bus, MemoryBus, RemoteBus
from ..bus.doorbell import CHANNEL
from ..extras import MissingExtra, load
from ..store.base import Store

if TYPE_CHECKING:
    from ..bus import PgListenBus

__all__ = [
    "BackendUnavailable",
    "BusMismatch",
    "bus_identity",
    "is_postgres",
    "make_bus",
    "open_backend",
    "open_store",
    "probe",
    "record_bus",
    "redact",
    "resolve_db",
]

#: What ``--db`` accepts, for messages.
DB_FORMS = "a SQLite path, sqlite:///PATH, or postgresql://USER@HOST:PORT/DB"
#: What ``--bus`` accepts, for messages.
BUS_FORMS = "memory, postgres or a redis:// URL"

# "word:" at the start names a URL scheme; a single letter is a Windows drive ("C:\\x.db").
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):")


class BackendUnavailable(Exception):
    """The store or the bus cannot be reached or opened; the message says which and why."""


class BusMismatch(InvalidInput):
    """The database is recorded as served with another bus than this node's."""

    def __init__(self, recorded: str, mine: str) -> None:
        super().__init__(
            f"this database is served with bus {recorded}, not {mine}: nodes on different buses "
            f"miss each other's live events. Start this node with --bus {recorded}, or pass "
            f"--bus-override to record {mine} (after moving every node to it)"
        )
        self.recorded = recorded
        self.mine = mine


def resolve_db(db: str | Path) -> str | Path:
    """The Postgres DSN or SQLite path ``db`` names; :class:`InvalidInput` for any other
    scheme (rather than a SQLite file named ``mysql://...``)."""
    if isinstance(db, Path):
        return db
    if db.startswith(("postgresql://", "postgres://")):
        return db
    if db.startswith("sqlite:"):
        # SQLAlchemy's form: sqlite:///relative.db, sqlite:////absolute.db, sqlite:///:memory:.
        if not db.startswith("sqlite:///") or db == "sqlite:///":
            raise InvalidInput(f"--db {db!r}: write sqlite:///PATH (three slashes), or a plain path")
        return db[len("sqlite:///") :]
    found = _SCHEME.match(db)
    if found:
        raise InvalidInput(f"--db {redact(db)!r}: unsupported scheme {found.group(1)!r}; use {DB_FORMS}")
    if not db:
        raise InvalidInput(f"--db is empty; use {DB_FORMS}")
    return db


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
        bus_type: type[PgListenBus] = load("hub.bus.postgres", "postgres").PgListenBus
        return bus_type(str(db))
    if choice.startswith(("redis://", "rediss://", "unix://")):
        _redis_address(choice)  # a malformed URL is refused here, not at the first connect
        return load("hub.bus.redis", "redis").RedisBus(choice)  # type: ignore[no-any-return]
    raise InvalidInput(f"unknown bus {redact(choice)!r}: use {BUS_FORMS}")


def _redis_address(url: str) -> str:
    """``redis://host:port/db`` without user or password, defaults filled in: two URLs for
    the same Redis database compare equal."""
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    try:
        if parts.scheme == "unix":
            db = int(query.get("db", ["0"])[0])
            if not parts.path:
                raise ValueError("no socket path")
            return f"unix://{parts.path}?db={db}"
        port = parts.port or 6379
        db = int(parts.path.strip("/") or query.get("db", ["0"])[0])
    except ValueError as exc:
        raise InvalidInput(f"--bus {redact(url)!r} is not a Redis URL ({exc}); use {BUS_FORMS}") from None
    if not parts.hostname:
        raise InvalidInput(f"--bus {redact(url)!r} names no host; use {BUS_FORMS}")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}:{port}/{db}"


def _is(obj: object, module: str, name: str) -> bool:
    # A bus class whose module was never imported cannot be the type of ``obj``: checking
    # this way keeps asyncpg and redis unloaded on a SQLite hub.
    loaded = sys.modules.get(module)
    return loaded is not None and isinstance(obj, getattr(loaded, name))


def bus_identity(ring: Bus) -> str:
    """What the database records about ``ring``: ``memory``, ``postgres`` or the Redis
    address (host, port and db; never the password); ``#channel`` when not the default."""
    channel: str | None = None
    if _is(ring, "hub.bus.redis", "RedisBus"):
        name = _redis_address(str(getattr(ring, "url", "")))
        channel = getattr(ring, "channel", None)
    elif _is(ring, "hub.bus.postgres", "PgListenBus"):
        name = "postgres"
        channel = getattr(ring, "channel", None)
    elif isinstance(ring, MemoryBus) and not isinstance(ring, RemoteBus):
        name = "memory"
    else:
        name = f"{type(ring).__module__}.{type(ring).__qualname__}"
    return name if channel in (None, CHANNEL) else f"{name}#{channel}"


async def record_bus(store: Store, ring: Bus, *, override: bool = False) -> str:
    """Record ``ring`` as the bus the store's database is served with, or raise
    :class:`BusMismatch` if another is recorded (``override``: record this one anyway).
    Returns the identity recorded. Stores without settings (a custom store) are skipped."""
    mine = bus_identity(ring)
    claim: Any = getattr(store, "claim_setting", None)
    if claim is None:
        return mine
    recorded = str(await claim("bus", mine, replace=override))
    if recorded != mine:
        raise BusMismatch(recorded, mine)
    return mine


@contextlib.asynccontextmanager
async def open_backend(
    db: str | Path, bus: str | Bus | None = None, *, bus_override: bool = False
) -> AsyncIterator[Store]:
    """Open the store for ``db`` with the bus ``bus`` names (or is), closing both at the
    end. Refuses (:class:`BusMismatch`) a bus other than the one the database records."""
    db = resolve_db(db)
    ring = bus if bus is not None and not isinstance(bus, str) else make_bus(db, bus)
    if isinstance(ring, RemoteBus):
        await ring.start()
    try:
        # NOTIFY rides in the store's transactions only when somebody LISTENs for it.
        store = await _connect(db, ring, notify=_is(ring, "hub.bus.postgres", "PgListenBus"))
        try:
            await record_bus(store, ring, override=bus_override)
            yield store
        finally:
            await store.close()
    finally:
        if isinstance(ring, RemoteBus):
            await ring.close()


@contextlib.asynccontextmanager
async def open_store(db: str | Path, *, must_exist: bool = False) -> AsyncIterator[Store]:
    """The store ``db`` names (as ``--db``), for a one-off command (``prune``, ``export``,
    ``import``): no bus is recorded or started. On Postgres the writes still send their
    doorbells, so hubs serving the database see imported sessions live. ``must_exist``
    (commands that only read or trim): a SQLite file that is not there is refused, not
    created empty, so a typo in ``--db`` is not a silent "nothing to do"."""
    resolved = resolve_db(db)
    local = not is_postgres(resolved) and str(resolved) != ":memory:"
    if must_exist and local and not Path(resolved).is_file():  # noqa: ASYNC240 (one stat, before any I/O)
        raise InvalidInput(
            f"--db {str(db)!r}: no database there "
            "(is the path right? `sessionhub serve --db PATH` creates one)"
        )
    store = await _connect(resolved, None, notify=True, max_size=2)
    try:
        yield store
    finally:
        await store.close()


async def _connect(db: str | Path, ring: Bus | None, *, notify: bool, max_size: int = 10) -> Store:
    """Open the store of a resolved ``db`` on ``ring`` (None: the store's own memory bus);
    ``notify`` and ``max_size`` (the pool) are Postgres's."""
    if is_postgres(db):
        postgres = load("hub.store.postgres", "postgres")
        store: Store = await postgres.PostgresStore.connect(
            str(db), bus=ring, notify=notify, max_size=max_size
        )
        return store
    from ..store.sqlite import SqliteStore

    folder = Path(db).parent
    if str(db) != ":memory:" and not folder.is_dir():
        # Refused here: aiosqlite's failed open leaves a thread that outlives the loop.
        raise InvalidInput(f"--db {str(db)!r}: the directory {str(folder)!r} does not exist")
    return await SqliteStore.open(db, bus=ring)


async def probe(db: str | Path, bus: str | None = None, *, bus_override: bool = False) -> None:
    """Open and close the store and its bus once (migrating the store if needed, recording
    the bus), so that ``sessionhub serve`` can refuse to start with one clear line instead
    of a traceback."""
    try:
        if is_postgres(resolve_db(db)):
            await ensure_database(str(resolve_db(db)))
        async with open_backend(db, bus, bus_override=bus_override):
            pass
    except (InvalidInput, MissingExtra):
        raise
    except Exception as exc:
        ring = bus or ("postgres" if is_postgres(db) else "memory")
        raise BackendUnavailable(
            f"cannot open the store {redact(str(db))} with bus {redact(ring)}: {type(exc).__name__}: {exc}"
        ) from exc


async def ensure_database(dsn: str) -> bool:
    """Create the database ``dsn`` names when the server has none of that name (a fresh
    server has only ``postgres``); True when it was created. Connecting as the same role to
    the ``postgres`` database does it, as ``createdb`` would."""
    asyncpg = load("asyncpg", "postgres")
    try:
        connection = await asyncpg.connect(dsn)
    except asyncpg.InvalidCatalogNameError:
        pass
    else:
        await connection.close()
        return False
    parts = urlsplit(dsn)
    name = parts.path.lstrip("/")
    admin = await asyncpg.connect(urlunsplit(parts._replace(path="/postgres")))
    try:
        quoted = '"' + name.replace('"', '""') + '"'
        with contextlib.suppress(asyncpg.DuplicateDatabaseError):  # another node won the race
            await admin.execute(f"CREATE DATABASE {quoted}")
    finally:
        await admin.close()
    print(f"sessionhub: created the database {name!r} on {parts.hostname or 'localhost'}", file=sys.stderr)
    return True


def redact(url: str) -> str:
    """A URL without its password, for messages."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return url
    if password is None:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.replace(f":{password}@", ":***@")))
