"""The WAL bound (hub/store/sqlite/checkpoint.py and SqliteStore._write) with several
writers: while one writer runs a catch-up, the others may go on only until the WAL is
twice its limit, then they wait for the catch-up too.

Without that, a catch-up that waits for a slow pass (a pass writes and syncs the database
file; an append only fills the page cache) let the other writers outrun it, and every pass
found a bigger WAL than the last: the 9 GB WAL of a 1M-event prune beside a steady writer
(docs/benchmarks.md, "Retention")."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hub import Session
from hub.store.sqlite import CHECKPOINT_EVERY, SqliteStore, checkpoint
from hub.store.sqlite.checkpoint import Checkpointer
from tests.support.hubtest import text_message

BIG = "lorem ipsum dolor sit amet " * 2400  # ~64 KiB, stored whole (keep_rows_whole)


@pytest.mark.usefixtures("keep_rows_whole")
async def test_writers_wait_for_a_slow_catch_up_past_twice_the_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    limit = 2 * 2**20
    monkeypatch.setattr(checkpoint, "WAL_LIMIT_BYTES", limit)
    real_pass = Checkpointer._pass

    def slow_pass(self: Checkpointer, commits: Callable[[], int]) -> None:
        time.sleep(0.3)  # a disk slower than the writers: what a loaded machine's is
        real_pass(self, commits)

    monkeypatch.setattr(Checkpointer, "_pass", slow_pass)
    db = tmp_path / "wal.db"
    wal = Path(f"{db}-wal")
    peak = 0

    async with await SqliteStore.open(db) as store:

        async def writer(name: str, n: int) -> None:
            nonlocal peak
            s = Session(store, session_id=name)
            for i in range(n):
                await s.append_message(text_message(f"{name}{i}", "user", BIG))
                peak = max(peak, os.stat(wal).st_size)
                await asyncio.sleep(0)

        await asyncio.gather(writer("a", 120), writer("b", 120))
        checkpointer = store._checkpointer
        assert checkpointer is not None
        assert checkpointer.catch_ups >= 2
        for name in ("a", "b"):
            assert len(await Session(store, session_id=name).get_history()) == 120
    # At most twice the limit plus the commits in flight when the waiting began (each
    # ~330 KiB: the message, its event and index pages). Unbounded, the other writer fills
    # the WAL for the whole slow pass: ~30 MiB here.
    assert peak < 3 * limit, peak


@pytest.mark.usefixtures("keep_rows_whole")
async def test_big_commits_wake_passes_by_wal_bytes_not_only_every_50(tmp_path: Path) -> None:
    # 45 commits of ~140 KiB of WAL each (message, event and index pages): fewer than
    # CHECKPOINT_EVERY, and ~6 MiB, under the 64 MiB hard limit. Woken by the commit count
    # alone, no pass ran: the database file held none of it, and on a disk that filled
    # meanwhile the copy it still needed could never be made (issue 24, item 11).
    db = tmp_path / "bytes.db"
    async with await SqliteStore.open(db) as store:
        s = Session(store, session_id="big")
        assert CHECKPOINT_EVERY > 45
        for i in range(45):
            await s.append_message(text_message(f"m{i}", "user", BIG))
        checkpointer = store._checkpointer
        assert checkpointer is not None
        await checkpointer.settle()
        assert checkpointer.passes >= 2
        assert checkpointer.catch_ups == 0
        assert os.path.getsize(db) > 15 * len(BIG)  # noqa: ASYNC240
