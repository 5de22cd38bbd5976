"""`PostgresStore`: the shared backend for several hub nodes, on asyncpg with a pool.

Design (docs/postgres.md):

- Each operation is one transaction on one pooled connection. Statements go through
  asyncpg's per-connection prepared-statement cache, so a hot statement is parsed and
  planned once per connection. Batches travel as arrays (``unnest``), paths are recursive
  CTEs, and most reads are a single statement (a single snapshot, no BEGIN/COMMIT).
- Every write transaction that reads a session's state before changing it (the latest
  leaf, a parent, the path) first takes a transaction-scoped advisory lock on the session's
  stream, in the same round trip as ``BEGIN``: writers of one session are serialized across
  nodes exactly as SQLite's ``BEGIN IMMEDIATE`` serializes them, writers of different
  sessions never wait for each other.
- Event seqs come from a counter row per stream (``streams``), incremented inside the
  writing transaction: the row lock orders concurrent writers, a rollback undoes the
  increment, so a stream's log is always 1..N without a gap or a duplicate.
- After the events, in the same transaction, one ``pg_notify`` per stream written (the
  cross-node doorbell, delivered on commit only); after the commit, ``bus.publish`` as
  SqliteStore does.
- Messages are keyed ``(session_id, id)``; ``pk`` (an identity) is insertion order and
  ``parent_pk`` the parent's pk, with the same invariants as SqliteStore's rowids.
- Full text: ``tsvector`` columns computed at insert (from :func:`~hub.store.fts.fts_text`'s
  words) with GIN indexes, under the ``sessionhub`` text search configuration (Porter
  stemming, no stop words); a hit's text is read from the stored message, no copy kept.
- A ``message.appended`` event refers to its message (``events.ref``) until the message
  changes or goes, when it gets its body back (docs/postgres.md, "Storage").

The package, by concern: :mod:`.schema` (the shipped ``postgres_schema.sql`` and the
migrations), :mod:`.sql` (the statements and the functions running them), :mod:`.tx` (the
write transaction), :mod:`.store` (:class:`PostgresStore`). Importing it needs asyncpg
(the ``sessionhub[postgres]`` extra); ``import hub`` never does (hub/extras.py).
"""

from __future__ import annotations

from ..fts import MAX_INDEXED_CHARS, fts_text
from ..policy import SEARCH_WINDOW
from .schema import MIGRATIONS, SCHEMA_SQL
from .store import PostgresStore

__all__ = ["MAX_INDEXED_CHARS", "MIGRATIONS", "SCHEMA_SQL", "SEARCH_WINDOW", "PostgresStore", "fts_text"]
