"""Following an AG-UI thread: ``GET /agui/{thread_id}/stream?follow=1``, its runs one after
another for as long as the reader stays.

The stream is a sequence of AG-UI runs, each ``RUN_STARTED`` ... ``RUN_FINISHED`` (or
``RUN_ERROR``), which AG-UI's own order checks accept (a new run may start once the last
one ended). On attach the reader is told the thread: the run in flight, from its start,
with a ``MESSAGES_SNAPSHOT`` of the thread before its reply; with none in flight a short
*sync run* (``RUN_STARTED``, ``MESSAGES_SNAPSHOT``, ``STATE_SNAPSHOT``, ``RUN_FINISHED``,
``runId`` ``sync-<seq>``). Then every later run of the thread, started by any door on any
node, as it streams, each with a ``MESSAGES_SNAPSHOT`` first (its user message came in
through another client's POST: the snapshot is how this reader learns of it). The runs are
found in the session's log (each ``turn.started``), so none is skipped.

Ids are :mod:`.aguirun`'s (``<seq>:<n>:<tag>``; a sync run's tag is ``s``). A reader that
comes back with ``Last-Event-ID`` continues after that event exactly when this node still
holds the run (in flight, or ended a moment ago), then follows the runs after it; when it
does not (another node's rendering, a run long over, a node restarted), it is attached
afresh, as above: the snapshot replaces what it held, and no event comes twice.

The stream ends with a ``RUN_ERROR`` (no id) of code ``unavailable`` when the hub drains
and ``unauthorized`` when the reader's token expires: a follow stream would otherwise outlive
both. Keep-alive comments go out when nothing else does (``chat_keepalive``). Each reader's queue
is bounded by ``outbox_bytes`` (:class:`~.sse.SseFeed`): a reader that falls that far behind
is ended with a ``RUN_ERROR`` of code ``slow_consumer`` (no id, so its ``Last-Event-ID``
still names the last event it got, and it can come back), or cut when it does not take
even that within ``send_timeout``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from protocol import PositionLost, SessionHubError, SessionNotFound

from ..events import follow
from ..store.base import session_stream
from .aguievents import to_agui_messages
from .aguirun import AguiRun, agui_run, event_id, held_run, parse_id, sse_event
from .aguistate import KEY, blocks_state
from .port import ChatHost
from .sse import SseFeed

__all__ = ["CLOSING", "SLOW", "SYNC_TAG", "Follower", "run_error"]

log = logging.getLogger("sessionhub.agui")

#: The tag of a sync run's ids.
SYNC_TAG = "s"


def run_error(code: str, message: str) -> str:
    """A ``RUN_ERROR`` without an id (the reader's ``Last-Event-ID`` stays its last event)."""
    return sse_event({"type": "RUN_ERROR", "code": code, "message": message})


#: The last event of every follower when the hub drains (it reconnects to another node).
CLOSING = run_error("unavailable", "the hub is shutting down; reconnect with Last-Event-ID")
#: The last event of a follower whose token expired (it comes back with a fresh one).
EXPIRED = run_error("unauthorized", "the token expired; reconnect with a fresh one and Last-Event-ID")
#: How often the followers' watcher looks whether the hub drains (seconds).
CLOSING_POLL = 0.25

#: The last event of a reader dropped for being too far behind.
SLOW = run_error("slow_consumer", "this reader fell too far behind; reconnect with Last-Event-ID to continue")


class Follower:
    """One follow-mode reader of a thread, writing into its ``feed``; :meth:`serve` runs
    until the reader goes (then its task is cancelled)."""

    def __init__(self, hub: ChatHost, thread: str, feed: SseFeed, expires_at: float | None = None) -> None:
        self.hub, self.thread, self.feed = hub, thread, feed
        #: When the reader's token expires (wall clock): the stream ends then.
        self.expires_at = expires_at
        self.run: AguiRun | None = None
        self.task: asyncio.Task[None] | None = None
        self._ended = asyncio.Event()

    # A run's :class:`~.aguirun.Sink`: the run's end is not the stream's.
    def push(self, text: str, *, last: bool = False) -> None:
        if text:
            self.feed.push(text)
        if last:
            self._ended.set()

    def leave(self) -> None:
        _LIVE.discard(self)
        if self.run is not None:
            self.run.leave(self)

    def end(self, last: str) -> None:
        """End the stream with ``last`` (a draining hub, an expired token)."""
        self.leave()
        if self.task is not None:
            self.task.cancel()
        self.feed.push(last, last=True)

    def start(self, last_event_id: str | None) -> asyncio.Task[None]:
        """Serve in a task of its own; watched, so that a draining hub ends it (a follow
        stream never ends by itself, and uvicorn waits for every response to end), and ended
        when the reader's token expires."""
        global _WATCHER
        loop = asyncio.get_running_loop()
        task = loop.create_task(self.serve(last_event_id), name=f"agui follow {self.thread}")
        self.task = task
        _LIVE.add(self)
        if _WATCHER is None or _WATCHER.done() or _WATCHER.get_loop() is not loop:
            _WATCHER = loop.create_task(_watch(), name="agui followers")
        return task

    async def serve(self, last_event_id: str | None) -> None:
        try:
            position = await self._start(parse_id(last_event_id))
            async for event in follow(self.hub.store, session_stream(self.thread), position):
                if event.type == "turn.started":
                    await self._next(event.seq, event.data.get("reply_id"))
        except asyncio.CancelledError:
            raise
        except PositionLost:
            # The log was pruned or re-created under the reader: it reconnects, and is
            # attached afresh (its Last-Event-ID names no run held any more).
            self.feed.push(
                run_error("reset", "the thread's log moved under this reader: reconnect"), last=True
            )
        except Exception:
            log.exception("following the AG-UI thread %s failed", self.thread)
            self.feed.push(run_error("internal", "the hub could not follow this thread"), last=True)
        finally:
            self.leave()

    async def _start(self, last: tuple[int, int, str] | None) -> int:
        """Where the reader is: continue its run, or attach it afresh; the log seq after
        which the runs still to come begin."""
        if last is not None:
            seq, n, tag = last
            if tag == SYNC_TAG and n == 3:
                return seq  # it had the whole sync run: only what came after it
            run = held_run(self.hub, self.thread, seq)
            if run is not None and run.continues(seq, n, tag):
                await self._stream(run, n, None)
                return seq
        return await self._attach()

    async def _attach(self) -> int:
        position = (await self.hub.store.stream_position(session_stream(self.thread))).last_seq
        try:
            turn = await self.hub.turns.find(self.thread)
        except SessionNotFound:
            turn = None
        if turn is None:
            await self._sync(position)
            return position
        run = await agui_run(self.hub, turn)
        await self._stream(run, None, await self._history(run.reply_id))
        return run.seq

    async def _next(self, seq: int, reply_id: object) -> None:
        """A run began (its ``turn.started`` at ``seq``): stream it whole, or tell the
        reader the thread if it ended before this node could watch it."""
        run = held_run(self.hub, self.thread, seq)
        if run is None:
            with contextlib.suppress(SessionHubError):
                turn = await self.hub.turns.find(self.thread)
                if turn is not None and turn.reply_id == reply_id:
                    run = await agui_run(self.hub, turn, seq=seq)
        if run is None:
            await self._sync(seq)
            return
        await self._stream(run, None, await self._history(run.reply_id))

    async def _stream(self, run: AguiRun, after: int | None, history: list[dict[str, Any]] | None) -> None:
        self.run = run
        self._ended.clear()
        run.attach(self, after, history)
        await self._ended.wait()
        self.run = None

    async def _history(self, reply_id: str) -> list[dict[str, Any]]:
        try:
            return [m.to_dict() for m in await self.hub.manager.get_history(self.thread) if m.id != reply_id]
        except SessionNotFound:
            return []

    async def _sync(self, seq: int) -> None:
        """The thread as it is now, in a run of its own (AG-UI sends snapshots in a run)."""
        history = await self._history("")
        try:
            state = await blocks_state(self.hub, self.thread)
        except SessionNotFound:
            state = {KEY: {}}
        run_id = f"sync-{seq}"
        events: list[dict[str, Any]] = [
            {"type": "RUN_STARTED", "threadId": self.thread, "runId": run_id},
            {"type": "MESSAGES_SNAPSHOT", "messages": to_agui_messages(history)},
            {"type": "STATE_SNAPSHOT", "snapshot": state},
            {
                "type": "RUN_FINISHED",
                "threadId": self.thread,
                "runId": run_id,
                "outcome": {"type": "success"},
            },
        ]
        self.feed.push("".join(sse_event(e, event_id(seq, n, SYNC_TAG)) for n, e in enumerate(events)))


#: The followers serving now, and the task that ends them when their hub drains.
_LIVE: set[Follower] = set()
_WATCHER: asyncio.Task[None] | None = None


async def _watch() -> None:
    while _LIVE:
        now = time.time()
        for follower in list(_LIVE):
            if follower.hub.closing:
                follower.end(CLOSING)
            elif follower.expires_at is not None and now >= follower.expires_at:
                follower.end(EXPIRED)
        await asyncio.sleep(CLOSING_POLL)
