"""sqlite3's errors as the store's answers.

SQLite answers every failure of a transaction by rolling it back, a failed COMMIT
included, so no outcome is ever unknown here. A database locked by another process past
the busy timeout is not the hub's fault nor the caller's, and a full disk passes once space
is freed: both are :class:`~protocol.StoreUnavailable` (retry later). The rest stays
:class:`~protocol.StoreError` with SQLite's one-line message.
"""

from __future__ import annotations

import sqlite3

from protocol import StoreError, StoreUnavailable

from .connection import is_busy, is_full

__all__ = ["translate"]


def translate(exc: sqlite3.Error, *, write: bool = False) -> StoreError:
    if is_busy(exc):
        written = "; nothing was written" if write else ""
        return StoreUnavailable(f"sqlite unavailable: the database is locked by another process{written}")
    if is_full(exc):
        return StoreUnavailable(f"sqlite: {exc}")
    return StoreError(f"sqlite: {exc}")
