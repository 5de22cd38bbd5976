"""The Postgres schema: the shipped SQL file, the versioned migrations, and applying them
(two nodes starting at once take turns)."""

from __future__ import annotations

import hashlib
from importlib import resources
from typing import TYPE_CHECKING

from protocol import StoreError

if TYPE_CHECKING:
    from .tx import Conn

__all__ = ["MIGRATIONS", "SCHEMA_SQL", "lock_key", "migrate"]

#: The schema as a plain SQL file, shipped for roles that may not create tables.
SCHEMA_SQL: str = resources.files("hub.store.postgres").joinpath("postgres_schema.sql").read_text("utf-8")

# Versioned migrations: index i brings the schema from version i to i + 1. Migration 1 is
# the shipped file itself, so the file and what connect() creates cannot drift apart.
#: Migration 2 adds the settings table (already in the file, hence IF NOT EXISTS) to
#: databases created at version 1.
#: Migration 3, the footprint (docs/operations.md, "Sizes"): a ``message.appended`` event
#: refers to its message (``events.ref``, ``messages.event_seq``) instead of copying it, and
#: the indexed copy of the text (``messages.body``) goes: the search vector was always
#: computed at insert, and a hit's text is read from ``content``. Existing events keep their
#: full bodies (``ref`` NULL), so they read back the same. Idempotent: a database created
#: from the file (which has all of it) runs it too.
MIGRATION_3 = """
ALTER TABLE messages DROP COLUMN IF EXISTS body;
ALTER TABLE messages ADD COLUMN IF NOT EXISTS event_seq bigint;
ALTER TABLE events ADD COLUMN IF NOT EXISTS ref bigint;
"""

MIGRATIONS: list[str] = [
    SCHEMA_SQL,
    "CREATE TABLE IF NOT EXISTS settings ("
    "key text PRIMARY KEY, value text NOT NULL, updated_at timestamptz NOT NULL DEFAULT now())",
    MIGRATION_3,
]


def lock_key(name: str) -> int:
    """A 64-bit advisory-lock key for a name."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big", signed=True)


_MIGRATION_LOCK = lock_key("sessionhub.schema_migrations")


async def migrate(conn: Conn) -> int:
    """Bring the schema to the newest version; two nodes starting at once take turns."""
    if await conn.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL"):
        current = await conn.fetchval("SELECT coalesce(max(version), 0) FROM schema_migrations")
        if current == len(MIGRATIONS):
            return int(current)  # nothing to create: works for a role that may not create
    async with conn.transaction():
        await conn.execute(f"SELECT pg_advisory_xact_lock({_MIGRATION_LOCK})")
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations "
            "(version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        version = int(await conn.fetchval("SELECT coalesce(max(version), 0) FROM schema_migrations"))
        if version > len(MIGRATIONS):
            raise StoreError(
                f"database schema version {version} is newer than "
                f"this sessionhub supports ({len(MIGRATIONS)})"
            )
        for i in range(version, len(MIGRATIONS)):
            await conn.execute(MIGRATIONS[i])
            await conn.execute(
                "INSERT INTO schema_migrations (version) VALUES ($1) ON CONFLICT (version) DO NOTHING", i + 1
            )
    return len(MIGRATIONS)
