"""`SqliteStore`: the embedded default, on aiosqlite with WAL.

Design (measured in docs/benchmarks.md):

- Each operation is one Python function run in the connection's worker thread, wrapping
  ``BEGIN IMMEDIATE .. COMMIT`` (writes) or ``BEGIN .. COMMIT`` (reads). One thread hop per
  operation instead of one per statement; a transaction can never interleave with another
  task's statements; a failure rolls the whole change back, events included.
- Writes go through one connection, reads through another: in WAL mode a reader sees a
  committed snapshot and never waits for the writer. (``:memory:`` uses one connection.)
- Messages are keyed ``(sk, id)``, ``sk`` the session's small integer key (its log's,
  ``streams.sk``; :mod:`.packing` says how rows are kept small). ``pk`` (the rowid) is insertion order and
  ``parent_pk`` points at the parent's rowid. A parent is always older than its children
  (deleting a message hands its children to its own, older, parent), so the session's
  newest row is always a leaf: the latest leaf is one index probe, and a path walk follows
  rowids and must strictly descend, so it ends even on a corrupted file.
- FTS5 (``porter unicode61``) keyed by the message rowid; a hashed session token column
  lets one session's search intersect posting lists instead of filtering every hit.

The package, by concern: :mod:`.schema` (migrations), :mod:`.sql` (the statements),
:mod:`.connection` (aiosqlite plumbing and pragmas), :mod:`.checkpoint` (the background WAL
checkpointer), :mod:`.store` (:class:`SqliteStore`). The tuning constants are re-exported
here; ``WAL_LIMIT_BYTES`` and ``WAL_CHECKPOINT_BYTES`` are read from :mod:`.checkpoint` when
a store opens.
"""

from __future__ import annotations

from ..policy import SEARCH_WINDOW
from .checkpoint import CHECKPOINT_EVERY, WAL_CHECKPOINT_BYTES, WAL_LIMIT_BYTES
from .connection import BUSY_TIMEOUT_MS
from .schema import MIGRATIONS
from .search import BY_ROW_SHARE
from .store import INLINE_BATCH, SqliteStore

__all__ = [
    "BUSY_TIMEOUT_MS",
    "BY_ROW_SHARE",
    "CHECKPOINT_EVERY",
    "INLINE_BATCH",
    "MIGRATIONS",
    "SEARCH_WINDOW",
    "WAL_CHECKPOINT_BYTES",
    "WAL_LIMIT_BYTES",
    "SqliteStore",
]
