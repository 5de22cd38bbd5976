"""Write load for the fault tests: a writer appending to one session over its own raw
connection, keeping what was acknowledged and what was refused (and how)."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from typing import Any

from .hubtest import Client, Frame, text

__all__ = ["Writer"]


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

    async def run(self, client: Client, until: Callable[[], bool], pause_after_error: float = 0.02) -> None:
        while not until():
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
