"""Turns across hub nodes: a turn this node cannot place is offered to a node with
responders, and turns on other nodes are found in the session's log.

With a cross-node bus (:class:`~hub.bus.RemoteBus`), :class:`TurnNodes` sends a
:class:`TurnOffer` to a node that announced responders and follows the
:class:`TurnStatus` replies (``taken``, ``declined``, ``started``, ``failed``, ``stop``); it
answers other nodes' offers with its own responders (:attr:`TurnBook.foreign`). Two nodes
starting a turn in one session at once race in the log (:meth:`TurnNodes._race`). The hub's
relay hands the messages of other nodes to :meth:`TurnNodes.relayed`.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from typing import Literal

from protocol import Conflict
from protocol import frames as f
from protocol.records import Event

from .remoteturns import REFUSED, RemoteTurn, latest_turn_event
from .turnbook import LiveTurn, TurnBook, in_flight_error, wait_for
from .turnframes import TurnOffer, TurnStatus, settled

__all__ = ["TurnNodes"]


class TurnNodes(TurnBook, ABC):
    """The several-nodes part of the turns; :class:`~hub.server.turndispatch.Turns` adds a
    turn's life on this node (and ends the turns the relay stops or fails)."""

    # What a turn's life on this node does, which this part calls: implemented by
    # :class:`~hub.server.turndispatch.Turns`, the one concrete class.

    @abstractmethod
    def fail(self, turn: LiveTurn, error: str) -> None:
        """End ``turn`` ``failed`` (:class:`~hub.server.turndispatch.Turns` logs it)."""

    @abstractmethod
    def _forget(self, turn: LiveTurn) -> None:
        """Drop a turn from the book (:class:`~hub.server.turndispatch.Turns`)."""

    @abstractmethod
    async def _stop(self, turn: LiveTurn, reason: str, by: str | None) -> None:
        """Stop a turn this node holds (:class:`~hub.server.turndispatch.Turns`)."""

    @abstractmethod
    def _relayed_word(self, node: str, message: TurnStatus) -> None:
        """The user's word (``answer``, ``steer``) to a turn (:mod:`.turnanswers`)."""

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
            error = in_flight_error(*rival)
            self._forget(turn)
            await self._refused(turn, error)  # before the answer: a 409 leaves no open turn behind
            raise Conflict(error)

    async def _refused(self, turn: LiveTurn, error: str) -> None:
        await self._log(
            turn, "turn.ended", {"status": "failed", **settled("failed"), "error": error, REFUSED: True}
        )

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
        if message.status in ("answer", "steer"):
            self._relayed_word(node, message)
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
                await wait_for(turn.changed, deadline - asyncio.get_running_loop().time())
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
