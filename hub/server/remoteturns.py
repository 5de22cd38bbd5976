"""A turn in flight on another hub node, as a chat resume on this node follows it.

Nothing new travels between nodes for it: the turn is found in the session's log (the
newest ``turn.started`` with no ``turn.ended`` after it, logged by a node that is still
heard from), its reply's stream frames come through the stream relay (this node mirrors
every running stream), and its end is read from the log: ``stream.ended`` (logged with the
final message, in one transaction) brings the whole reply, so a relayed frame lost or late
costs nothing, and ``turn.ended`` says how the turn ended, with the same ``error`` the
posting node shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from protocol import PositionLost
from protocol import frames as f
from protocol.records import Event

from ..events import follow
from ..store.base import Store, session_stream
from .turnframes import TurnOutcome, Watcher

__all__ = ["REFUSED", "RemoteTurn", "TurnLog", "latest_turn_event"]

log = logging.getLogger("sessionhub.turns")

#: How far back a resume looks for the session's newest turn event (events, newest first).
SCAN_LIMIT = 4096
_WINDOW = 256

#: The error a reply followed here ends with when the node running its turn stops being heard.
NODE_LOST = "the hub node running this turn went away"

#: The key a ``turn.ended`` carries (true) when its turn lost a start race to another node's
#: turn: it never ran, and a scan of the log looks past the pair.
REFUSED = "refused"


async def latest_turn_event(store: Store, session_id: str, below: int | None = None) -> Event | None:
    """The session's newest ``turn.started`` or ``turn.ended`` (with a seq under ``below``),
    looking back at most :data:`SCAN_LIMIT` events; None when there is none. The pair of a
    turn refused for a start race (:data:`REFUSED`) is skipped: the turn that won it may be
    older, and still running."""
    stream = session_stream(session_id)
    position = await store.stream_position(stream)
    top = position.last_seq if below is None else min(position.last_seq, below - 1)
    high, floor = top, max(position.first_seq - 1, top - SCAN_LIMIT)
    refused: set[object] = set()
    while high > floor:
        low = max(floor, high - _WINDOW)
        try:
            events = await store.read_events(stream, low, high - low)
        except PositionLost:  # pruned under us: nothing older to find
            return None
        for event in reversed(events):
            if event.type == "turn.ended" and event.data.get(REFUSED) is True:
                refused.add(event.data.get("turn_id"))
            elif event.type == "turn.started" and event.data.get("turn_id") in refused:
                continue
            elif event.type in ("turn.started", "turn.ended"):
                return event
        high = low
    return None


@dataclass
class _Seen:
    seq: int  # the log is read up to here
    events: list[Event] = field(default_factory=list)  # its newest turn events, oldest first


class TurnLog:
    """Each session's newest turn event as :func:`latest_turn_event` finds it, kept current
    by reading only what the log gained since the last look: every ``stream_start`` on a
    hub with several nodes asks (is this id the reply of another node's turn?), and a full
    scan each time cost ~50 ms in a session of 5,000 events with no turn. Holds ``size``
    sessions, the least recently asked dropped first."""

    #: Turn events kept per session: enough to look past refused start races.
    keep = 16

    def __init__(self, store: Store, size: int = 1024) -> None:
        self.store = store
        self.size = size
        self._seen: OrderedDict[str, _Seen] = OrderedDict()

    async def latest(self, session_id: str) -> Event | None:
        stream = session_stream(session_id)
        seen = self._seen.pop(session_id, None)
        if seen is not None:
            try:
                await self._advance(stream, seen)
            except PositionLost:  # pruned or re-created under us: look again from scratch
                seen = None
        if seen is None:
            top = (await self.store.stream_position(stream)).last_seq
            event = await latest_turn_event(self.store, session_id, below=top + 1)
            seen = _Seen(top, [] if event is None else [event])
        self._seen[session_id] = seen
        while len(self._seen) > self.size:
            self._seen.popitem(last=False)
        return seen.events[-1] if seen.events else None

    async def _advance(self, stream: str, seen: _Seen) -> None:
        while events := await self.store.read_events(stream, seen.seq, 500):
            for event in events:
                if event.type == "turn.ended" and event.data.get(REFUSED) is True:
                    # The pair of a turn that lost a start race is looked past, as in a scan.
                    turn = event.data.get("turn_id")
                    seen.events = [e for e in seen.events if e.data.get("turn_id") != turn]
                elif event.type in ("turn.started", "turn.ended"):
                    seen.events.append(event)
            del seen.events[: -self.keep]
            seen.seq = events[-1].seq


@dataclass(eq=False)
class RemoteTurn:
    """A turn another node runs (see the module): a :class:`~hub.adapters.port.ChatTurn`."""

    session_id: str
    turn_id: str
    reply_id: str
    node: str
    #: The seq of its ``turn.started``: its end is logged after it.
    seq: int
    store: Store
    watchers: dict[str, list[Callable[[f.StreamFrame], None]]]
    alive: Callable[[str], bool]
    check_every: float = 1.0

    def watch(self, watcher: Watcher) -> Callable[[], None]:
        def relayed(frame: f.StreamFrame) -> None:
            if frame.message_id == self.reply_id:
                watcher(frame)

        self.watchers.setdefault(self.session_id, []).append(relayed)
        task = asyncio.get_running_loop().create_task(self._follow(watcher), name=f"turn {self.turn_id}")

        def stop() -> None:
            task.cancel()
            watchers = self.watchers.get(self.session_id, [])
            if relayed in watchers:
                watchers.remove(relayed)
            if not watchers:
                self.watchers.pop(self.session_id, None)

        return stop

    async def _follow(self, watcher: Watcher) -> None:
        ended = asyncio.ensure_future(self._ended(watcher))
        try:
            while not ended.done():
                await asyncio.wait([ended], timeout=self.check_every)
                if not ended.done() and not self.alive(self.node):
                    watcher(TurnOutcome("failed", NODE_LOST))
                    return
            outcome = ended.result()
            watcher(outcome)
        except Exception:
            log.exception("following turn %s of another node failed", self.turn_id)
            watcher(TurnOutcome("failed", "the hub could not follow this turn's log"))
        finally:
            ended.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await ended

    async def _ended(self, watcher: Watcher) -> TurnOutcome:
        """Read the log from the turn's start to its end; hand on the reply's stored end."""
        async for event in follow(self.store, session_stream(self.session_id), self.seq):
            data = event.data
            if event.type == "stream.ended" and data.get("message_id") == self.reply_id:
                final = await self.store.get_message(self.session_id, self.reply_id)
                if final is not None:
                    watcher(
                        f.StreamFrame(
                            session_id=self.session_id,
                            message_id=self.reply_id,
                            action="end",
                            index=int(data.get("deltas", 0)),
                            message=final.to_dict(),
                            status=str(data.get("status")),
                        )
                    )
            elif event.type == "turn.ended" and data.get("turn_id") == self.turn_id:
                status, error, reason = data.get("status"), data.get("error"), data.get("reason")
                return TurnOutcome(
                    status if status in ("finished", "failed", "stopped") else "failed",
                    error if isinstance(error, str) else None,
                    reason if isinstance(reason, str) else None,
                )
        raise AssertionError("the log follower ended")  # pragma: no cover - follow() never ends
