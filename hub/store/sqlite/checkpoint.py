"""The background WAL checkpointer: passive passes off the write path, one catch-up past the
limit."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import sqlite3
from collections.abc import Callable

from .connection import BUSY_TIMEOUT_MS, Conn

__all__ = ["CHECKPOINT_EVERY", "WAL_CHECKPOINT_BYTES", "WAL_LIMIT_BYTES", "Checkpointer"]

log = logging.getLogger("sessionhub.store")

#: The background checkpointer is woken after this many commits. A pass with nothing to
#: copy costs a few microseconds, so waking it often keeps each pass (and the final
#: catch-up, below) short.
CHECKPOINT_EVERY = 50
#: Past this many bytes of WAL the checkpointer is woken for each further quarter of it, not
#: only every ``CHECKPOINT_EVERY`` commits: fifty commits of big messages are tens of MiB of
#: WAL, and frames the database file does not hold yet need that space a second time when
#: they are copied. On a disk that filled meanwhile that copy can never be made, and the WAL
#: never restarts (issue 24, item 11). It is also the ``journal_size_limit``: each time the
#: WAL restarts its file is cut back to this, so a burst gives its space back.
WAL_CHECKPOINT_BYTES = 4 * 2**20
#: When the WAL holds more than this, the next writer waits for one catch-up pass with
#: the write lock held, so the WAL is reused from its start: the bound on its size. It is
#: a hard bound: passes woken past ``WAL_CHECKPOINT_BYTES`` keep the WAL near that unless
#: writers outrun them.
WAL_LIMIT_BYTES = 64 * 2**20


class Checkpointer:
    """PASSIVE checkpoints on a connection and thread of their own, off the write path.

    A passive checkpoint copies WAL frames into the database file while writers go on
    appending (it takes no write lock), so a pass costs the writers nothing but disk
    bandwidth. What it cannot do under steady writes is *finish*: frames appended during a
    pass are left for the next, and SQLite reuses the WAL from its start only once every
    frame is copied. So the WAL grows until either a pass ends with no commit having
    happened meanwhile (any pause in writing), or its file passes ``WAL_LIMIT_BYTES``: then one
    writer holds the write lock for a last pass, which copies only the frames appended
    since the previous pass (the bulk is already in the file), and the next write starts
    the WAL over. Submitting a pass needs no event-loop turn: a writer that never yields
    still gets its WAL checkpointed.
    """

    def __init__(self, path: str, synchronous: str) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sessionhub-checkpoint")
        self._pending: concurrent.futures.Future[None] | None = None
        self._conn: Conn | None = None
        self._path = path
        self._wal = path + "-wal"
        self._synchronous = synchronous
        #: WAL size (bytes) at the start of the last pass; 0 once a pass copied everything.
        self.wal_bytes = 0
        self.passes = 0
        self.catch_ups = 0
        #: The cause of the failing passes, while they fail (logged once).
        self._failing: str | None = None

    def _connection(self) -> Conn:
        if self._conn is None:
            self._conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
            self._conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            self._conn.execute(f"PRAGMA synchronous = {self._synchronous}")
        return self._conn

    def _pass(self, commits: Callable[[], int], mode: str = "PASSIVE") -> None:
        conn = self._connection()
        before = commits()
        _busy, log, done = conn.execute(f"PRAGMA wal_checkpoint({mode})").fetchone()
        page = int(conn.execute("PRAGMA page_size").fetchone()[0])
        self.passes += 1
        # log == done and no commit since: every frame is in the database file, and the
        # next write restarts the WAL. Otherwise the WAL is at least `log` frames long.
        caught_up = log == done and commits() == before
        self.wal_bytes = 0 if caught_up else max(0, int(log)) * (page + 24)

    def wal_file_size(self) -> int:
        """The -wal file's size: a stat, ~1 µs. It is the WAL's length whenever that is over
        ``journal_size_limit``, since SQLite cuts the file back to it when the WAL restarts."""
        try:
            return os.stat(self._wal).st_size
        except FileNotFoundError:
            return 0

    def wake(self, commits: Callable[[], int]) -> bool:
        """Start a background pass unless one is queued or running; never blocks. Whether
        it started one."""
        return self._submit(lambda: self._pass(commits))

    def reclaim(self, commits: Callable[[], int]) -> None:
        """After a write the disk had no room for: a TRUNCATE checkpoint in the background
        (unless a pass is queued or running), which copies what the WAL holds and cuts its
        file to nothing, giving its space back to the writes to come. It waits for the
        write lock and for readers, so it is for this rare case only. On a disk still full
        it fails (logged); the next write that fails asks again."""
        self._submit(lambda: self._pass(commits, "TRUNCATE"))

    def _submit(self, job: Callable[[], None]) -> bool:
        if self._pending is not None and not self._pending.done():
            return False
        self._pending = self._pool.submit(job)
        self._pending.add_done_callback(self._log_failed_pass)
        return True

    async def settle(self) -> None:
        """Wait for the running pass, if any (writers go on meanwhile)."""
        pending = self._pending
        if pending is not None and not pending.done():
            await asyncio.wrap_future(pending)

    async def catch_up(self, commits: Callable[[], int]) -> None:
        """One pass while the caller holds the write lock: the WAL ends fully copied.

        After ``settle()`` it copies only what was appended during the last pass."""
        self.catch_ups += 1
        await asyncio.wrap_future(self._pool.submit(self._pass, commits))

    def _log_failed_pass(self, future: concurrent.futures.Future[None]) -> None:
        # Once per run of failures, not per pass: on a full disk every failed write asks
        # for a pass, and each fails the same way until space is freed.
        exc = future.exception()
        if exc is None:
            if self._failing is not None:
                log.info("WAL checkpoints work again (after: %s)", self._failing)
                self._failing = None
        elif str(exc) != self._failing:  # the next pass catches up
            self._failing = str(exc)
            log.warning("WAL checkpoint failed: %s", exc)

    async def close(self) -> None:
        def shut() -> None:
            self._pool.submit(self._close_conn).result()
            self._pool.shutdown(wait=True)

        await asyncio.to_thread(shut)

    def _close_conn(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
