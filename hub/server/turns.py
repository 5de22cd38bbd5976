"""Turns: "an assistant reply to this message", handed to one connected responder.

A responder is a connection that sent ``take_turns``. :meth:`Turns.start` (op
``start_turn``, or ``POST /api/chat``) picks one allowed to write the session (the least
busy, in turn), sends it a ``turn`` frame, and waits for it to start the reply
(``stream_start`` with the turn's ``turn_id`` and ``reply_id``). With no responder, it waits
up to ``timeout`` seconds for one to connect; a responder that goes away before it started
answering has its turn handed to another. Once started, the turn follows its stream: it
ends with the stream (``finished``; ``aborted`` and ``interrupted`` are failures). The
watchers of a turn (the SSE responses) see every stream frame of the reply and then its
:class:`TurnOutcome`. ``turn.started`` and ``turn.ended`` are logged in the session.

With several nodes, a node whose own responders cannot take a turn offers it to another
node that has some (:meth:`Turns.relayed`); the reply's stream frames come back through the
relay like any other stream's.

Turns see the hub as a :class:`~hub.server.ports.TurnHost` and a connection as a
:class:`~hub.server.ports.Responder` (a :class:`~hub.server.ports.ReplyWriter` when it
starts a stream): this module imports neither the hub nor the connection module.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from protocol import Conflict, Forbidden, InvalidInput, NotFound, StoreError
from protocol import frames as f
from protocol.codec import encode
from protocol.records import Event

from ..bus import RemoteBus
from ..store.base import LogEntry
from .outbox import Evicted
from .ports import ReplyWriter, Responder, TurnHost
from .remoteturns import REFUSED, RemoteTurn, TurnLog, latest_turn_event
from .turnframes import TurnOffer, TurnOutcome, TurnStatus, Watcher

__all__ = ["LiveTurn", "TurnOffer", "TurnOutcome", "TurnStatus", "Turns", "Watcher"]

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


#: How long a closing hub waits for its turns' ``turn.ended`` writes (seconds).
_ENDING_GRACE = 5.0


class Turns:
    """The hub's turns and responders."""

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

    # -- starting ------------------------------------------------------------------------
    async def start(
        self, session_id: str, message_id: str | None = None, trigger: str | None = None
    ) -> LiveTurn:
        """Start a turn answering ``message_id`` (default: the latest leaf); see the module."""
        session = await self.host.session(session_id)
        if message_id is None:
            leaf = await session.get_latest_leaf()
            if leaf is None:
                raise InvalidInput("the session has no message to answer")
            message_id = leaf.id
        path = await self.host.store.get_path(session_id, message_id)
        if not path or path[-1].id != message_id:
            raise NotFound(f"message not found: {message_id!r}")
        target = path[-1]
        regenerates: str | None = None
        if target.role == "assistant":
            # Regenerate: the new reply is a sibling of this one, on the same parent.
            regenerates = target.id
            path = path[:-1]
            trigger = trigger or "regenerate-message"
        if not path:
            raise InvalidInput(f"message {message_id!r} has nothing before it to answer")
        trigger = trigger or "submit-message"
        if trigger not in ("submit-message", "regenerate-message"):
            raise InvalidInput(f"trigger must be submit-message or regenerate-message; got {trigger!r}")
        self._refuse_local(session_id)
        if self._bus is not None:
            elsewhere = await self.find(session_id)
            if isinstance(elsewhere, RemoteTurn):
                raise Conflict(_in_flight(elsewhere.turn_id, elsewhere.node))
            self._refuse_local(session_id)  # one may have started here meanwhile
        answered = path[-1]
        turn = LiveTurn(
            turn_id=uuid.uuid4().hex,
            session_id=session_id,
            message_id=answered.id,
            parent_id=answered.id,
            reply_id=uuid.uuid4().hex,
            trigger=trigger,
            regenerates=regenerates,
        )
        self.live[turn.turn_id] = turn
        self._by_reply[(session_id, turn.reply_id)] = turn
        self._follow(session_id)
        try:
            # ``node``: another node resuming the chat follows the turn while this one is heard.
            started = {"message_id": turn.message_id, "trigger": trigger, "node": self._node_id()}
            seq = await self._log(turn, "turn.started", started)
        except BaseException:
            self._forget(turn)
            raise
        if self._bus is not None:
            await self._race(turn, seq)
        self._spawn(self._assign(turn, [m.to_dict() for m in await session.get_history(answered.id)]))
        return turn

    @staticmethod
    def describe(turn: LiveTurn | None) -> dict[str, Any] | None:
        """A turn as the ``start_turn`` and ``get_turn`` ops answer it."""
        if turn is None:
            return None
        return {
            "turn_id": turn.turn_id,
            "reply_id": turn.reply_id,
            "message_id": turn.message_id,
            "parent_id": turn.parent_id,
            "trigger": turn.trigger,
            "started": turn.started,
        }

    def _refuse_local(self, session_id: str) -> None:
        running = self.in_flight(session_id)
        if running is not None:
            raise Conflict(_in_flight(running.turn_id))

    async def _race(self, turn: LiveTurn, seq: int) -> None:
        """Two nodes that started a turn in one session at once both logged ``turn.started``:
        the log's order (one counter per stream, taken under its row lock, so every lower
        seq is committed when ours is) decides. Ours loses when a turn of another node that
        is heard from is open below ``seq``: it is forgotten, ended ``refused`` in the log
        (so that scans look past it), and the start answers ``conflict``."""
        try:
            event = await latest_turn_event(self.host.store, turn.session_id, below=seq)
        except BaseException:
            self._forget(turn)
            self._spawn(self._refused(turn, "the hub could not check for a turn in flight on another node"))
            raise
        rival = None if event is None else self._open_elsewhere(event)
        if rival is not None:
            error = _in_flight(*rival)
            self._forget(turn)
            await self._refused(turn, error)  # before the answer: a 409 leaves no open turn behind
            raise Conflict(error)

    async def _refused(self, turn: LiveTurn, error: str) -> None:
        await self._log(turn, "turn.ended", {"status": "failed", "error": error, REFUSED: True})

    def _open_elsewhere(self, event: Event) -> tuple[str, str] | None:
        """``(turn_id, node)`` of a ``turn.started`` still running on another node, else None."""
        if event.type != "turn.started":
            return None
        node, turn_id = event.data.get("node"), event.data.get("turn_id")
        if not (isinstance(node, str) and isinstance(turn_id, str)):
            return None  # logged before turns named their node: long over
        if node == self._node_id() or not self.node_alive(node):
            return None  # this node's turns are all in ``live``; a silent node's are over
        return turn_id, node

    def in_flight(self, session_id: str) -> LiveTurn | None:
        """The session's turn that has not ended, if any (the newest)."""
        running = [t for t in self.live.values() if t.session_id == session_id and t.outcome is None]
        return max(running, key=lambda t: t.created) if running else None

    async def find(self, session_id: str) -> LiveTurn | RemoteTurn | None:
        """The session's turn in flight on this node or, with several nodes, on another one
        (:mod:`.remoteturns`: found in the session's log, its node still heard from)."""
        local = self.in_flight(session_id)
        if local is not None or self._bus is None:
            return local
        event = await latest_turn_event(self.host.store, session_id)
        open_ = None if event is None else self._open_elsewhere(event)
        reply_id = None if event is None else event.data.get("reply_id")
        if event is None or open_ is None or not isinstance(reply_id, str):
            return None
        turn_id, node = open_
        return RemoteTurn(
            session_id=session_id,
            turn_id=turn_id,
            reply_id=reply_id,
            node=node,
            seq=event.seq,
            store=self.host.store,
            watchers=self.host.streams.watchers,
            alive=self.node_alive,
        )

    def node_alive(self, node: str) -> bool:
        """Whether ``node`` (another hub node) was heard from within the presence ttl."""
        heard = self.remote_responders.get(node)
        return heard is not None and time.monotonic() - heard[1] <= self.host.config.presence_ttl

    async def _assign(self, turn: LiveTurn, history: list[dict[str, Any]]) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        frame = turn.frame(history)
        declined: set[str] = set()
        while turn.outcome is None and not turn.started:
            responder = self._pick(turn.session_id)
            node = None if responder is not None else self._remote_node(declined)
            if responder is None and node is None:
                arrived = self._arrived
                if not await _wait(arrived, deadline - loop.time()):
                    self.fail(
                        turn,
                        f"no worker is connected to answer this turn (waited {self.timeout:g}s); "
                        "start one with `sessionhub respond`",
                    )
                    return
                continue
            turn.changed.clear()
            if responder is not None:
                turn.responder = responder
                self.responders[responder] += 1
                sent = await self._give(responder, frame)
                if not sent:
                    self._release(turn)
                    continue
            else:
                assert node is not None and self._bus is not None
                turn.remote = node
                self._relay(TurnOffer(origin=self._node_id(), to=node, turn=frame))
            if not await _wait(turn.changed, deadline - loop.time()):
                label = _label(turn.responder) if turn.responder is not None else f"node {turn.remote}"
                self.fail(turn, f"responder {label} did not start answering within {self.timeout:g}s")
                return
            if turn.remote is not None and not turn.started and turn.outcome is None:
                declined.add(turn.remote)  # that node could not place it: try another
                turn.remote = None
            elif turn.responder is None and not turn.started:
                self._release(turn)  # lost before it started: hand the turn on

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

    # -- answering -----------------------------------------------------------------------
    def claim(self, connection: Responder, request: f.StreamStart) -> LiveTurn:
        """A ``stream_start`` naming a turn: only its responder may start it, and only as
        the turn's reply (its ``reply_id``, on its parent)."""
        assert request.turn_id is not None
        turn = self.live.get(request.turn_id)
        if turn is None:
            held = self.foreign.get(request.turn_id)
            turn = held[1] if held is not None else None
        if turn is None or turn.outcome is not None:
            raise NotFound(f"no turn {request.turn_id!r} is waiting for an answer")
        if turn.responder is not connection:
            log.warning(
                "refused stream_start of turn %s from %s: it was given to another connection",
                turn.turn_id,
                _label(connection),
            )
            raise Forbidden(f"turn {request.turn_id!r} was given to another connection")
        if turn.started:
            raise Conflict(f"turn {request.turn_id!r} is already being answered")
        if request.session_id != turn.session_id or request.message_id != turn.reply_id:
            raise InvalidInput(f"turn {turn.turn_id!r} is answered in message {turn.reply_id!r}")
        if request.parent_id is msgspec.UNSET:
            request.parent_id = turn.parent_id
        elif request.parent_id != turn.parent_id:
            raise InvalidInput(f"turn {turn.turn_id!r} is answered under message {turn.parent_id!r}")
        turn.metadata = request.metadata
        turn.started = True
        return turn

    def _reply_of(self, session_id: str, message_id: str) -> LiveTurn | None:
        """The turn in flight on this node whose reply is ``message_id``, if any (one this
        node posted, or one it answers for another node)."""
        turn = self._by_reply.get((session_id, message_id))
        if turn is None:
            turn = next(
                (
                    t
                    for _, t in self.foreign.values()
                    if (t.session_id, t.reply_id) == (session_id, message_id)
                ),
                None,
            )
        return turn if turn is not None and turn.outcome is None else None

    async def _guard_reply(self, connection: ReplyWriter, request: f.StreamStart) -> None:
        """A turn's ``reply_id`` is in the log (``turn.started``) for any reader to see: a
        stream of that id that does not claim that very turn is refused ``forbidden``, so
        that only the turn's responder can answer it. A turn another node holds is found in
        the log (:class:`~hub.server.remoteturns.TurnLog`: with several nodes only)."""
        local = self._reply_of(request.session_id, request.message_id)
        if local is not None:
            if request.turn_id == local.turn_id:
                return  # :meth:`claim` checks it was given to this connection
            turn_id = local.turn_id
        else:
            # A turn given to one of this node's responders would be held here (``foreign``):
            # one found only in the log is not this connection's, whatever it claims.
            event = None if self._bus is None else await self._turn_log.latest(request.session_id)
            open_ = None if event is None else self._open_elsewhere(event)
            if event is None or open_ is None or event.data.get("reply_id") != request.message_id:
                return
            turn_id = open_[0]
        log.warning(
            "refused stream_start of %s in session %s from %s: the reply of turn %s, given to another",
            request.message_id,
            request.session_id,
            _label(connection),
            turn_id,
        )
        raise Forbidden(
            f"message {request.message_id!r} is the reply of turn {turn_id!r}, given to another connection"
        )

    async def start_stream(self, connection: ReplyWriter, request: f.StreamStart) -> dict[str, Any]:
        """``stream_start``, claiming its turn first when it names one."""
        await self._guard_reply(connection, request)
        if request.turn_id is None:
            return await self.host.streams.start(connection, request)
        turn = self.claim(connection, request)
        try:
            result = await self.host.streams.start(connection, request)
        except BaseException:
            turn.started = False
            raise
        turn.changed.set()
        origin = self._origin_of(turn)
        if origin is not None:
            self._relay(self._status(origin, turn, "started"))
        return result

    def refused(self, connection: Responder, request: f.TurnFailed) -> None:
        """``turn_failed``: the responder cannot answer."""
        held = self.foreign.get(request.turn_id)
        turn = self.live.get(request.turn_id) or (held[1] if held is not None else None)
        if turn is None or turn.responder is not connection:
            raise NotFound(f"no turn {request.turn_id!r} was given to this connection")
        label = _label(connection)
        turn.error = f"responder {label} failed: {request.error}"
        origin = self._origin_of(turn)
        if origin is not None:
            self._relay(self._status(origin, turn, "failed", turn.error))
            if not turn.started:
                self._drop_foreign(turn)
            return
        if not turn.started:
            self.fail(turn, turn.error)

    # -- stopping ------------------------------------------------------------------------
    async def stop(
        self, session_id: str, turn_id: str | None = None, reason: str = "stopped by request"
    ) -> dict[str, Any]:
        """``stop_turn``: stop the session's turn in flight (``turn_id``: that one), on
        whichever node holds it. The reply ends as it stands (stream status ``stopped``),
        the responder is told first (``turn_stopped``), and the turn ends ``stopped``."""
        turn = self.in_flight(session_id)
        if turn is None:
            turn = next(
                (t for _, t in self.foreign.values() if t.session_id == session_id and t.outcome is None),
                None,
            )
        if turn is not None and turn_id is not None and turn.turn_id != turn_id:
            turn = None
        if turn is not None:
            await self._stop(turn, reason, by=None)
            return {**self._summary(turn.turn_id, turn.reply_id), "started": turn.started}
        remote = await self.find(session_id)
        if (
            remote is None
            or isinstance(remote, LiveTurn)
            or (turn_id is not None and remote.turn_id != turn_id)
        ):
            what = "no turn" if turn_id is None else f"turn {turn_id!r} is not"
            raise NotFound(f"{what} in flight in session {session_id!r}")
        self._relay(
            TurnStatus(
                origin=self._node_id(), to=remote.node, turn_id=remote.turn_id, status="stop", error=reason
            )
        )
        return {**self._summary(remote.turn_id, remote.reply_id), "started": None}

    @staticmethod
    def _summary(turn_id: str, reply_id: str) -> dict[str, Any]:
        return {"turn_id": turn_id, "reply_id": reply_id}

    async def _stop(self, turn: LiveTurn, reason: str, by: str | None) -> None:
        """Stop a turn this node holds (its own, or one it answers for ``origin``)."""
        if turn.stopped is not None:
            return
        turn.stopped = reason
        origin = self._origin_of(turn)
        if origin is not None and origin != by:
            # The posting node logs the end: it should give this reason.
            self._relay(
                TurnStatus(
                    origin=self._node_id(), to=origin, turn_id=turn.turn_id, status="stop", error=reason
                )
            )
        if turn.remote is not None and turn.remote != by:
            self._relay(
                TurnStatus(
                    origin=self._node_id(), to=turn.remote, turn_id=turn.turn_id, status="stop", error=reason
                )
            )
        responder = turn.responder
        if responder is not None and not responder.closed:
            # Before the stream ends: the responder learns of the stop before any refusal
            # of a delta it sent meanwhile.
            with contextlib.suppress(Evicted):
                await responder.send(
                    f.TurnStoppedFrame(
                        turn_id=turn.turn_id,
                        session_id=turn.session_id,
                        reply_id=turn.reply_id,
                        reason=reason,
                    )
                )
        ended = turn.started and await self.host.streams.stop(turn.session_id, turn.reply_id)
        if origin is not None:
            if not turn.started:
                self._drop_foreign(turn)
            return
        if not ended and (not turn.started or turn.remote is None):
            # Nothing streams (not started), or its stream is gone: end the turn now. A
            # stream on another node ends there; its relayed end ends the turn here.
            self._finish(turn, TurnOutcome("stopped", reason=reason))

    # -- following the reply -------------------------------------------------------------
    def _follow(self, session_id: str) -> None:
        count = self._watched.get(session_id, 0)
        if count == 0:
            self.host.streams.watchers.setdefault(session_id, []).append(self._on_stream)
        self._watched[session_id] = count + 1

    def _unfollow(self, session_id: str) -> None:
        count = self._watched.get(session_id, 0) - 1
        if count > 0:
            self._watched[session_id] = count
            return
        self._watched.pop(session_id, None)
        watchers = self.host.streams.watchers.get(session_id, [])
        if self._on_stream in watchers:
            watchers.remove(self._on_stream)
        if not watchers:
            self.host.streams.watchers.pop(session_id, None)

    def _on_stream(self, frame: f.StreamFrame) -> None:
        turn = self._by_reply.get((frame.session_id, frame.message_id))
        if turn is None:
            return
        if frame.action == "start" and turn.remote is not None and not turn.started:
            turn.started = True  # another node's responder started it
            turn.changed.set()
        for watcher in list(turn.watchers):
            watcher(frame)
        if frame.action == "end" and turn.outcome is None:
            if frame.status == "stopped" or turn.stopped is not None:
                self._finish(turn, TurnOutcome("stopped", reason=turn.stopped or "stopped"))
            elif frame.status == "finished":
                self._finish(turn, TurnOutcome("finished"))
            elif frame.status == "interrupted":
                self._finish(turn, TurnOutcome("failed", "the responder disconnected mid-reply"))
            elif frame.status == "too_large":
                self._finish(turn, TurnOutcome("failed", _TOO_LARGE))
            else:
                self._finish(turn, TurnOutcome("failed", turn.error or "the responder aborted the reply"))

    def fail(self, turn: LiveTurn, error: str) -> None:
        if turn.outcome is None:
            self._finish(turn, TurnOutcome("failed", error))

    def _finish(self, turn: LiveTurn, outcome: TurnOutcome) -> None:
        turn.outcome = outcome
        turn.changed.set()
        self._release(turn)
        self._forget(turn)
        data: dict[str, Any] = {"status": outcome.status}
        if outcome.error is not None:
            data["error"] = outcome.error
        if outcome.reason is not None:
            data["reason"] = outcome.reason

        def tell(_: object) -> None:
            for watcher in list(turn.watchers):
                watcher(outcome)

        # The watchers (the chat streams) hear of the end once ``turn.ended`` is written (or
        # its write failed, or the hub closed): a client that saw its reply end, and posts
        # the next message on another node, finds no turn in flight there. A done-callback
        # runs even for a task cancelled before it ran.
        ending = self._spawn(self._log(turn, "turn.ended", data))
        ending.add_done_callback(tell)
        self._ending.add(ending)
        ending.add_done_callback(self._ending.discard)

    def _forget(self, turn: LiveTurn) -> None:
        if self.live.pop(turn.turn_id, None) is not None:
            self._by_reply.pop((turn.session_id, turn.reply_id), None)
            self._unfollow(turn.session_id)

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

    async def close(self) -> None:
        for turn in list(self.live.values()):
            self.fail(turn, "the hub is shutting down")
        if self._ending:
            # Written before the hub stops: a turn left open in the log is one a chat resume on
            # another node waits for until this node is no longer heard from.
            await asyncio.wait(set(self._ending), timeout=_ENDING_GRACE)
        for task in list(self._tasks):
            if not task.done():
                task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

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

    def _origin_of(self, turn: LiveTurn) -> str | None:
        held = self.foreign.get(turn.turn_id)
        return held[0] if held is not None and held[1] is turn else None

    def _status(
        self,
        origin: str,
        turn: LiveTurn,
        status: Literal["taken", "declined", "started", "failed", "stop"],
        error: str | None = None,
    ) -> TurnStatus:
        return TurnStatus(origin=self._node_id(), to=origin, turn_id=turn.turn_id, status=status, error=error)

    def _drop_foreign(self, turn: LiveTurn) -> None:
        held = self.foreign.pop(turn.turn_id, None)
        if held is not None:
            self._release(turn)

    def relayed(self, node: str, message: TurnOffer | TurnStatus) -> None:
        """A turn message from another node."""
        me = self._node_id()
        if isinstance(message, TurnStatus) and message.status == "responders":
            new = node not in self.remote_responders
            self.remote_responders[node] = (message.responders, time.monotonic())
            if new:  # a node that just started learns of this one now, not a heartbeat later
                self._announce()
            if message.responders:  # turns waiting for a responder may go there now
                self._arrived.set()
                self._arrived = asyncio.Event()
            return
        if message.to != me:
            return
        if isinstance(message, TurnOffer):
            self._spawn(self._answer_offer(message))
            return
        if message.status == "stop":
            held = self.foreign.get(message.turn_id)
            stopping = self.live.get(message.turn_id) or (held[1] if held is not None else None)
            if stopping is not None:
                self._spawn(self._stop(stopping, message.error or "stopped", by=node))
            return
        turn = self.live.get(message.turn_id)
        if turn is None or turn.remote != node:
            return
        if message.status == "declined":
            turn.changed.set()
        elif message.status == "started":
            turn.started = True
            turn.changed.set()
        elif message.status == "failed":
            turn.error = message.error
            if not turn.started:
                self.fail(turn, message.error or "the responder failed")

    async def _answer_offer(self, offer: TurnOffer) -> None:
        """Another node's turn: give it to one of ours; tell the origin how it went."""
        frame = offer.turn
        turn = LiveTurn(
            turn_id=frame.turn_id,
            session_id=frame.session_id,
            message_id=frame.message_id,
            parent_id=frame.parent_id,
            reply_id=frame.reply_id,
            trigger=frame.trigger,
            regenerates=frame.regenerates,
        )
        self.foreign[turn.turn_id] = (offer.origin, turn)
        deadline = asyncio.get_running_loop().time() + self.timeout
        while not turn.started:
            responder = self._pick(turn.session_id)
            if responder is None:
                self._drop_foreign(turn)
                self._relay(self._status(offer.origin, turn, "declined"))
                return
            turn.responder = responder
            self.responders[responder] += 1
            turn.changed.clear()
            if await self._give(responder, frame):
                self._relay(self._status(offer.origin, turn, "taken"))
                await _wait(turn.changed, deadline - asyncio.get_running_loop().time())
            if turn.started or offer.turn.turn_id not in self.foreign:
                break
            if turn.responder is not None:  # it neither started nor went away: give up
                break
            self._release(turn)
        if turn.started:
            # The stream's end (seen locally) releases the responder.
            self._follow_foreign(turn)
        else:
            self._drop_foreign(turn)

    def _follow_foreign(self, turn: LiveTurn) -> None:
        def ended(frame: f.StreamFrame) -> None:
            if frame.message_id == turn.reply_id and frame.action == "end":
                self._drop_foreign(turn)
                watchers = self.host.streams.watchers.get(turn.session_id, [])
                if ended in watchers:
                    watchers.remove(ended)
                if not watchers:
                    self.host.streams.watchers.pop(turn.session_id, None)

        self.host.streams.watchers.setdefault(turn.session_id, []).append(ended)


async def _wait(event: asyncio.Event, timeout: float) -> bool:
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


def _in_flight(turn_id: str, node: str | None = None) -> str:
    where = "" if node is None else f" (on hub node {node})"
    return f"turn {turn_id} is still in flight in this session{where}"


#: The error of a turn whose reply outgrew ``max_stream_bytes`` (its partial reply is stored).
_TOO_LARGE = (
    "the reply grew past the hub's limit of a streamed message (max_stream_bytes); what it had is kept"
)


def _label(connection: Responder) -> str:
    return connection.name or connection.connection_id
