"""Load for the fault tests: a writer appending to one session over its own raw connection,
keeping what was acknowledged and what was refused (and how); a follower keeping every event
its connection is sent, with the time it came."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable
from typing import Any

from tests.support.hubtest import Client, Frame, is_event, text

__all__ = ["Follower", "Writer"]


class Writer:
    """Appends ``body(n)`` messages with ids ``{name}-{n}``, one at a time, to ``session_id``.

    Every attempt gets a new id, so an id answered with an error and found in the log later
    is a write that was refused yet stored ("answered-but-stored")."""

    def __init__(self, name: str, session_id: str, body: Callable[[int], str]) -> None:
        self.name = name
        self.session_id = session_id
        self.body = body
        self.acked: list[str] = []
        self.refused: list[str] = []
        self.errors: list[Frame] = []
        #: time.monotonic() of each acknowledgement, in order.
        self.acked_at: list[float] = []
        self._n = itertools.count()

    async def run(
        self, client: Client, until: Callable[[], bool], pause_after_error: float = 0.02, pace: float = 0.0
    ) -> None:
        """Append until ``until()``; ``pace`` seconds between appends spread them over a fault."""
        while not until():
            if pace:
                await asyncio.sleep(pace)
            mid = f"{self.name}-{next(self._n)}"
            message: dict[str, Any] = text(mid, self.body(len(self.acked) + len(self.refused)))
            frame = await client.request("append", session_id=self.session_id, message=message)
            if frame["frame"] == "reply":
                self.acked.append(mid)
                self.acked_at.append(time.monotonic())
            else:
                self.refused.append(mid)
                self.errors.append(frame)
                # A client told to retry later does not spin: the pause is the client's.
                await asyncio.sleep(pause_after_error)


class Follower:
    """Every event frame of a raw connection's subscriptions, by session, as it comes."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.seen: dict[str, list[Frame]] = {}
        #: Message id of each ``message.appended`` seen -> time.monotonic() it came.
        self.arrived: dict[str, float] = {}
        self._task: asyncio.Task[None] | None = None

    async def follow(self, session_ids: list[str]) -> None:
        for sid in session_ids:
            self.seen[sid] = []
            assert (await self.client.subscribe(sid))["frame"] == "reply"
        self._task = asyncio.create_task(self._collect())

    async def _collect(self) -> None:
        while True:
            frame = await self.client.take(is_event, timeout=3600)
            self.seen[frame["session_id"]].append(frame)
            if frame["type"] == "message.appended":
                self.arrived.setdefault(frame["data"]["message"]["id"], time.monotonic())

    def has(self, message_ids: list[str]) -> bool:
        return all(mid in self.arrived for mid in message_ids)

    def appended(self, session_id: str) -> list[str]:
        return [f["data"]["message"]["id"] for f in self.seen[session_id] if f["type"] == "message.appended"]

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
