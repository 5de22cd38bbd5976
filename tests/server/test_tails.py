"""A stream's tail (hub/server/tails.py) reads what was just committed without the reader's
thread when the store can answer at once (``Store.read_events_nowait``): on SQLite a short
read on the event loop. These pin both halves: the inline read answers exactly what
``read_events`` does (or declines), and a tail delivers every event in order through it,
falling back to the awaited read when it declines."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from hub import SessionManager
from hub.server.tails import Tail
from hub.store.policy import session_stream
from hub.store.sqlite import SqliteStore
from hub.store.sqlite.store import INLINE_EVENTS
from protocol import PositionLost
from protocol.codec import decode_frame
from tests.support.hubtest import eventually, text_message


class Inbox:
    """A live subscriber's connection as the tail sees it: frames in a list."""

    def __init__(self) -> None:
        self.frames: list[str] = []

    def try_put(self, data: str, frame: bytes | None = None) -> bool:
        self.frames.append(data)
        return True

    def try_write(self, frames: bytes) -> bool:
        return False  # never at once: every frame through try_put, one by one


def seqs(frames: list[str]) -> list[int]:
    return [decode_frame(f).seq for f in frames]  # type: ignore[union-attr]


async def test_the_inline_read_answers_what_read_events_does(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "s.db")
    try:
        manager = SessionManager(store)
        sid = (await manager.create("t")).id
        session = manager.get_session(sid)
        for i in range(INLINE_EVENTS + 8):
            await session.append_message(text_message(f"m{i}", "user", f"text {i}"))
        stream = session_stream(sid)
        full = await store.read_events(stream, 3, 1000)
        now = store.read_events_nowait(stream, 3, 1000)
        assert now is not None
        # At most INLINE_EVENTS at once, the same events as the awaited read, byte for byte.
        assert len(now) == INLINE_EVENTS
        assert now == full[:INLINE_EVENTS]
        assert store.read_events_nowait(stream, full[-1].seq, 1000) == []
        with pytest.raises(PositionLost):
            store.read_events_nowait(stream, full[-1].seq + 5, 1000)
    finally:
        await store.close()


async def test_the_inline_read_declines_while_a_write_holds_the_connection(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "s.db")
    try:
        manager = SessionManager(store)
        sid = (await manager.create("t")).id
        await manager.get_session(sid).append_message(text_message("m0", "user", "hello"))
        stream = session_stream(sid)
        async with store._write_lock:
            assert store.read_events_nowait(stream, 0, 10) is None
        assert store.read_events_nowait(stream, 0, 10)
    finally:
        await store.close()
    memory = await SqliteStore.open(":memory:")
    try:
        # One connection for both: nothing to gain, and it may be the writer's.
        assert memory.read_events_nowait("anything", 0, 10) is None
    finally:
        await memory.close()


class Counting:
    """Wraps a store's awaited ``read_events`` to count the tail's trips to it."""

    def __init__(self, store: SqliteStore, decline: bool) -> None:
        self.awaited = 0
        self.decline = decline
        self._read = store.read_events
        self._nowait = store.read_events_nowait

    async def read_events(self, *args: Any, **kwargs: Any) -> Any:
        self.awaited += 1
        return await self._read(*args, **kwargs)

    def read_events_nowait(self, *args: Any) -> Any:
        return None if self.decline else self._nowait(*args)


@pytest.mark.parametrize("decline", [False, True], ids=["inline", "declined"])
async def test_a_tail_delivers_every_event_in_order_either_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, decline: bool
) -> None:
    store = await SqliteStore.open(tmp_path / "s.db")
    counting = Counting(store, decline)
    monkeypatch.setattr(store, "read_events", counting.read_events)
    monkeypatch.setattr(store, "read_events_nowait", counting.read_events_nowait)
    try:
        manager = SessionManager(store)
        sid = (await manager.create("t")).id
        session = manager.get_session(sid)
        stream = session_stream(sid)
        tail = Tail(store, stream, size=1000)
        await tail.start()
        inbox = Inbox()
        tail.go_live(inbox, tail.last_seq, (await store.stream_position(stream)).epoch, lambda live: None)
        first = tail.last_seq
        n = 3 * INLINE_EVENTS
        await manager.append_all(
            sid, [text_message(f"a{i}", "user", f"x {i}") for i in range(n)]
        )  # one commit
        for i in range(20):
            await session.append_message(text_message(f"b{i}", "user", f"y {i}"))
            await asyncio.sleep(0)
        await eventually(lambda: len(inbox.frames) == n + 20)
        assert seqs(inbox.frames) == list(range(first + 1, first + n + 21))
        if decline:
            # The awaited read served them; how many trips depends on how the appends and
            # the tail's wake-ups interleave (one, under load: it batches what is there).
            assert counting.awaited >= 1
        else:
            # Every read went inline, also the batch bigger than INLINE_EVENTS (in slices).
            assert counting.awaited == 0
        assert tail.task is not None
        tail.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await tail.task
    finally:
        await store.close()
