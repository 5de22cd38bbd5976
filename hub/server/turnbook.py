"""The book of a node's turns: the live turns, the responders and how busy each is.

:class:`TurnBook` is the state every part of :class:`~hub.server.turndispatch.Turns` shares,
with the bookkeeping that touches nothing but it: who may answer, picking the least busy
responder, handing a turn frame over, logging a turn's events, and telling the other nodes
how many responders this one has. :class:`LiveTurn` is one turn as this node holds it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from protocol import StoreError
from protocol import frames as f
from protocol.codec import encode

from ..bus import RemoteBus
from ..store.base import LogEntry
from .outbox import Evicted
from .ports import Responder, TurnHost
from .remoteturns import TurnLog
from .turnframes import TurnOffer, TurnOutcome, TurnStatus, Watcher

__all__ = ["TOO_LARGE", "LiveTurn", "TurnBook", "in_flight_error", "responder_label", "wait_for"]

log = logging.getLogger("sessionhub.turns")


@dataclass(eq=False)
class LiveTurn:
    turn_id: str
    session_id: str
    message_id: str
    parent_id: str | None
    reply_id: str
    trigger: str
    regenerates: str | None
    metadata: Any = None
    responder: Responder | None = None
    #: With several nodes: the node answering it, when not this one.
    remote: str | None = None
    started: bool = False
    error: str | None = None
    #: Set by ``stop_turn``: the reason its ``turn.ended`` gives.
    stopped: str | None = None
    outcome: TurnOutcome | None = None
    #: Its reply waits for the user (the last delta was ``await``): ``turn.awaiting`` logged.
    awaiting: bool = False
    #: The tools of its reply the user answered (``a:<approval id>``, ``c:<call id>``): once each.
    answered: set[str] = field(default_factory=set)
    watchers: list[Watcher] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    created: float = field(default_factory=time.monotonic)

    def frame(self, history: list[dict[str, Any]]) -> f.TurnFrame:
        return f.TurnFrame(
            turn_id=self.turn_id,
            session_id=self.session_id,
            message_id=self.message_id,
            parent_id=self.parent_id,
            reply_id=self.reply_id,
            trigger=self.trigger,
            history=history,
            regenerates=self.regenerates,
        )

    def watch(self, watcher: Watcher) -> Callable[[], None]:
        """Call ``watcher`` with each stream frame of the reply, then the outcome."""
        self.watchers.append(watcher)
        return lambda: self.watchers.remove(watcher) if watcher in self.watchers else None


class TurnBook:
    """The hub's turns and responders, as the dispatch and the relay share them."""

    def __init__(self, host: TurnHost, timeout: float = 30.0) -> None:
        self.host = host
        self.timeout = timeout
        # With a cross-node bus, turn messages go to the other nodes through its relay
        # (the hub's relay hands theirs to :meth:`relayed`).
        bus = host.store.bus
        self._bus = bus if isinstance(bus, RemoteBus) else None
        #: The newest turn event of sessions streamed into here (with several nodes).
        self._turn_log = TurnLog(host.store)
        #: responder -> how many turns it is answering now
        self.responders: dict[Responder, int] = {}
        self.live: dict[str, LiveTurn] = {}
        self._by_reply: dict[tuple[str, str], LiveTurn] = {}
        self._watched: dict[str, int] = {}
        self._arrived = asyncio.Event()
        self._order = itertools.count()
        self._tasks: set[asyncio.Task[Any]] = set()
        #: The ``turn.ended`` writes under way: :meth:`close` lets them finish.
        self._ending: set[asyncio.Task[Any]] = set()
        #: Turns this node answers for another node: turn id -> (origin node, turn).
        self.foreign: dict[str, tuple[str, LiveTurn]] = {}
        #: Other nodes' responder counts (node id -> (count, when heard)).
        self.remote_responders: dict[str, tuple[int, float]] = {}

    # -- responders ----------------------------------------------------------------------
    def serve(self, connection: Responder) -> None:
        """``take_turns``: the connection answers turns from now on."""
        if connection not in self.responders:
            self.responders[connection] = 0
            self._arrived.set()
            self._arrived = asyncio.Event()
            self._announce()

    def _may_answer(self, connection: Responder, session_id: str) -> bool:
        if connection.closed:
            return False
        if self.host.config.auth_secret is None:
            return True
        grant = connection.grant
        return grant is not None and grant.allows("stream_start", session_id)

    def _pick(self, session_id: str) -> Responder | None:
        allowed = [c for c in self.responders if self._may_answer(c, session_id)]
        if not allowed:
            return None
        least = min(self.responders[c] for c in allowed)
        idle = [c for c in allowed if self.responders[c] == least]
        return idle[next(self._order) % len(idle)]

    def connection_lost(self, connection: Responder) -> None:
        """A responder went away: turns it had not started go to another one (its started
        replies end ``interrupted`` with its streams)."""
        if self.responders.pop(connection, None) is not None:
            self._announce()
        for turn in [*self.live.values(), *(t for _, t in self.foreign.values())]:
            if turn.responder is connection and not turn.started:
                turn.responder = None
                turn.changed.set()

    def in_flight(self, session_id: str) -> LiveTurn | None:
        """The session's turn that has not ended, if any (the newest)."""
        running = [t for t in self.live.values() if t.session_id == session_id and t.outcome is None]
        return max(running, key=lambda t: t.created) if running else None

    async def _give(self, responder: Responder, frame: f.TurnFrame) -> bool:
        try:
            await responder.send(frame)
        except Evicted:
            return False
        return True

    def _release(self, turn: LiveTurn) -> None:
        responder, turn.responder = turn.responder, None
        if responder is not None and responder in self.responders:
            self.responders[responder] = max(0, self.responders[responder] - 1)

    async def _log(self, turn: LiveTurn, type_: str, data: dict[str, Any]) -> int:
        """Log a turn event; its seq (0 when the write failed, for all but ``turn.started``)."""
        entry = {"turn_id": turn.turn_id, "reply_id": turn.reply_id, **data}
        try:
            return await self.host.store.log_event(
                LogEntry(session_id=turn.session_id, type=type_, data=entry)
            )
        except Exception as exc:
            if type_ == "turn.started":
                raise
            if isinstance(exc, StoreError):  # the database out of reach: one line, no traceback
                log.warning("logging %s of turn %s failed: %s", type_, turn.turn_id, exc)
            else:
                log.exception("logging %s of turn %s failed", type_, turn.turn_id)
            return 0

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- several nodes -------------------------------------------------------------------
    def _node_id(self) -> str:
        return "" if self._bus is None else self._bus.node_id

    def _relay(self, message: TurnOffer | TurnStatus) -> None:
        if self._bus is not None:
            self._bus.relay(encode(message).decode())

    def _announce(self) -> None:
        """Tell the other nodes how many responders this node has."""
        if self._bus is not None:
            self._relay(
                TurnStatus(
                    origin=self._node_id(),
                    to="",
                    turn_id="",
                    status="responders",
                    responders=len(self.responders),
                )
            )

    def heartbeat(self) -> None:
        """On the presence heartbeat: announce again (a node that started later learns)."""
        self._announce()

    def _remote_node(self, declined: set[str]) -> str | None:
        now = time.monotonic()
        ttl = self.host.config.presence_ttl
        nodes = sorted(
            n for n, (count, seen) in self.remote_responders.items() if count > 0 and now - seen <= ttl
        )
        nodes = [n for n in nodes if n not in declined]
        return nodes[next(self._order) % len(nodes)] if nodes else None


async def wait_for(event: asyncio.Event, timeout: float) -> bool:
    if event.is_set():
        return True
    if timeout <= 0:
        return False
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        return False
    return True


def in_flight_error(turn_id: str, node: str | None = None) -> str:
    where = "" if node is None else f" (on hub node {node})"
    return f"turn {turn_id} is still in flight in this session{where}"


#: The error of a turn whose reply outgrew ``max_stream_bytes`` (its partial reply is stored).
TOO_LARGE = (
    "the reply grew past the hub's limit of a streamed message (max_stream_bytes); what it had is kept"
)


def responder_label(connection: Responder) -> str:
    return connection.name or connection.connection_id
