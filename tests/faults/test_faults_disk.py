"""The fault matrix: the disk full under a SQLite hub, then freed (issue 24, item 11).

A real ``sessionhub serve --db`` on a tmpfs the test mounts; a filler file takes all but a
few MiB, and three writers append 128 KiB messages until the disk is full. Meanwhile writes
must answer ``unavailable`` (a full disk is one to retry later; the write was rolled back),
reads must work and a subscriber must stay exact. Then the filler goes, and the writes must
come back and keep working: 100 more appends, a restart of the node, 20 more.

Before the WAL was bounded in bytes, the WAL was checkpointed every 50 commits only, and
50 such commits are ~50 MiB of WAL: freed space went to the WAL, the checkpoint that would
copy it into the database file found the disk full again, and the WAL could never restart
(writes failed for good, across restarts too). The tmpfs is 64 MiB, not smaller, because
the 100 appends after the free need their room: noise does not deflate and the full-text
index posts each of its words, so each message takes ~330 KiB of the database file.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hub import Session, SqliteStore
from protocol import StoreUnavailable
from tests.support.figures import Figures, duplicates, gaps
from tests.support.hubtest import Client, Frame, noise, text
from tests.support.load import Writer
from tests.support.nodes import Node
from tests.support.services import unavailable

WRITERS = 3
MESSAGE = 128 * 1024
HEADROOM = 3 * 2**20  # what the filler leaves: a few appends' worth
AFTER_FREE = 100
AFTER_RESTART = 20


@contextlib.contextmanager
def tmpfs(size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted on a new directory (root only; else the test skips)."""
    root = Path(tempfile.mkdtemp(prefix="sessionhub-full-"))
    try:
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(root)],
            capture_output=True,
            text=True,
            check=False,
        )
        if mounted.returncode != 0:
            unavailable(f"cannot mount a tmpfs ({mounted.stderr.strip() or mounted.returncode})")
        try:
            yield root
        finally:
            subprocess.run(["umount", str(root)], check=False)
    finally:
        root.rmdir()


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def fill(path: Path, leave: int) -> None:
    """Write a file that takes all the free space of ``path``'s filesystem but ``leave``."""
    chunk = b"\0" * 2**20
    with open(path, "wb") as out:
        for _ in range(max(0, free_bytes(path.parent) - leave) // len(chunk)):
            out.write(chunk)


def used_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.iterdir())


async def history_ids(client: Client, session_id: str) -> list[str]:
    return [m["id"] for m in await client.call("get_history", session_id=session_id)]


async def events_through(watcher: Client, session_id: str, last_seq: int) -> list[Frame]:
    return await watcher.until_seq(session_id, last_seq, timeout=30)


def bodies(first_seed: int) -> Callable[[int], str]:
    """A writer's texts: its own noise for each append."""
    return lambda n: noise(MESSAGE, first_seed + n)


def connect(node: Node) -> contextlib.AbstractAsyncContextManager[Client]:
    return Client.connect(node.ws_url, max_size=None)  # whole histories of big messages


@pytest.mark.timeout(120)
async def test_a_full_disk_answers_unavailable_and_recovers_once_freed() -> None:
    with tmpfs("64m") as root:
        node = Node(str(root / "hub.db"))
        await node.start()
        try:
            await run_the_fault(node, root)
        finally:
            await node.stop()
        assert not any("Traceback" in line for line in node.log), "".join(node.log)


async def run_the_fault(node: Node, root: Path) -> None:
    figures = Figures("disk full, then freed (SQLite, tmpfs 64 MiB)")
    wrong: list[str] = []  # logs that differ from what was acknowledged, in order
    async with (
        connect(node) as watcher,
        connect(node) as reader,
        contextlib.AsyncExitStack() as stack,
    ):
        clients = [await stack.enter_async_context(connect(node)) for _ in range(WRITERS)]
        writers: list[Writer] = []
        for i, client in enumerate(clients):
            sid = (await client.call("create", name=f"full {i}"))["id"]
            assert (await watcher.subscribe(sid))["frame"] == "reply"
            writers.append(Writer(f"w{i}", sid, bodies(1000 * i)))

        async def load(until: Callable[[], bool]) -> None:
            await asyncio.gather(*(w.run(c, until) for w, c in zip(writers, clients, strict=True)))

        filler = root / "filler"
        fill(filler, HEADROOM)
        # Until every writer was refused: the disk is full for all of them.
        await load(lambda: all(w.errors for w in writers))
        full_acked = sum(len(w.acked) for w in writers)
        refusals = [frame for w in writers for frame in w.errors]
        for frame in refusals:
            assert frame["code"] == "unavailable", frame
            assert frame["detail"] == {"outcome": "not_applied"}, frame
            assert frame["message"] == "sqlite: database or disk is full", frame
        # Reads work on the full disk, and hold every acknowledged append.
        for w in writers:
            assert await history_ids(reader, w.session_id) == w.acked

        filler.unlink()
        freed_at = time.monotonic()
        refused_before = sum(len(w.refused) for w in writers)

        def refused_since_the_free() -> int:
            return sum(len(w.refused) for w in writers) - refused_before

        # Unfixed, the writes came back for a few appends and then failed for good: stop
        # at the first refusals instead of waiting for acknowledgements that never come.
        await load(
            lambda: (
                sum(len(w.acked) for w in writers) >= full_acked + AFTER_FREE or refused_since_the_free() > 0
            )
        )
        assert refused_since_the_free() == 0, (
            f"refused again after the free, after {sum(len(w.acked) for w in writers) - full_acked} appends: "
            f"{[frame for w in writers for frame in w.errors][-1]}; hub files {used_bytes(root)} B"
        )
        back = [t for w in writers for t in w.acked_at if t > freed_at]
        figures.recovery = min(back) - freed_at

        # The subscriber saw every acknowledged append once, in order.
        for w in writers:
            last = (await reader.subscribe(w.session_id))["result"]["last_seq"]
            seen = await events_through(watcher, w.session_id, last)
            figures.gaps += gaps([f["seq"] for f in seen])
            appended = [f["data"]["message"]["id"] for f in seen if f["type"] == "message.appended"]
            figures.duplicates += duplicates(appended)
            figures.lost += len(set(w.acked) - set(appended))
            if appended != w.acked:
                wrong.append(f"{w.name} delivered {appended} for {w.acked}")
        db_bytes = used_bytes(root)

    # Across a restart of the node (its WAL closed and reopened on the same disk).
    await node.stop()
    await node.start()
    async with connect(node) as client:
        target = sum(len(w.acked) for w in writers) + AFTER_RESTART
        await asyncio.gather(
            *(w.run(client, lambda: sum(len(w.acked) for w in writers) >= target) for w in writers)
        )
        for w in writers:
            stored = await history_ids(client, w.session_id)
            figures.lost += len(set(w.acked) - set(stored))
            figures.answered_but_stored += len(set(w.refused) & set(stored))
            figures.duplicates += duplicates(stored)
            if stored != w.acked:
                wrong.append(f"{w.name} stored {stored} for {w.acked}")
    figures.acknowledged = sum(len(w.acked) for w in writers)
    refused_after_free = refused_since_the_free()
    figures.extra = {
        "refused while full": refused_before,
        "refused after the free": refused_after_free,
        "hub files after": f"{db_bytes / 2**20:.1f} MiB",
    }
    figures.print()
    figures.assert_exact()
    assert refused_after_free == 0
    assert not wrong, wrong


async def test_a_write_with_no_room_is_unavailable_and_leaves_the_store_usable(tmp_path: Path) -> None:
    """The same answer without a mount (so wherever the suite runs): the writer's
    ``max_page_count`` caps the file as a full disk would, and SQLite says SQLITE_FULL."""
    async with await SqliteStore.open(tmp_path / "capped.db") as store:
        s = Session(store, session_id="capped")
        await s.append_message(text("m0", "before"))
        pages = await store._writer.call(lambda c: c.execute("PRAGMA page_count").fetchone()[0])
        await store._writer.call(lambda c: c.execute(f"PRAGMA max_page_count = {pages + 8}").fetchone())
        with pytest.raises(StoreUnavailable) as refused:
            await s.append_message(text("big", noise(MESSAGE)))
        assert (refused.value.code, refused.value.outcome) == ("unavailable", "not_applied")
        assert str(refused.value) == "sqlite: database or disk is full"
        assert [m.id for m in await s.get_history()] == ["m0"]  # rolled back, reads work
        await store._writer.call(lambda c: c.execute("PRAGMA max_page_count = 4294967294").fetchone())
        await s.append_message(text("big", noise(MESSAGE)))
        assert [m.id for m in await s.get_history()] == ["m0", "big"]
