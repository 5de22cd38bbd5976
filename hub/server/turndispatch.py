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
node that has some (:mod:`.turnnodes`); the reply's stream frames come back through the
relay like any other stream's. The state the parts share (live turns, responders and
their load) is :mod:`.turnbook`'s.

Turns see the hub as a :class:`~hub.server.ports.TurnHost` and a connection as a
:class:`~hub.server.ports.Responder` (a :class:`~hub.server.ports.ReplyWriter` when it
starts a stream): this module imports neither the hub nor the connection module.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Any

import msgspec

from protocol import Conflict, Forbidden, InvalidInput, NotFound
from protocol import frames as f

from .outbox import Evicted
from .ports import ReplyWriter, Responder
from .remoteturns import RemoteTurn
from .turnanswers import TurnAnswers
from .turnbook import TOO_LARGE, LiveTurn, in_flight_error, log, responder_label, wait_for
from .turnframes import TurnOffer, TurnOutcome, TurnStatus, Watcher, settled

__all__ = ["LiveTurn", "TurnOffer", "TurnOutcome", "TurnStatus", "Turns", "Watcher"]

#: How long a closing hub waits for its turns' ``turn.ended`` writes (seconds).
_ENDING_GRACE = 5.0


class Turns(TurnAnswers):
    """The hub's turns and responders: a turn's life on this node (the state is a
    :class:`~hub.server.turnbook.TurnBook`, other nodes the :class:`~hub.server.turnnodes.TurnNodes`,
    the user's word to a running turn the :class:`~hub.server.turnanswers.TurnAnswers`)."""

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
                raise Conflict(in_flight_error(elsewhere.turn_id, elsewhere.node))
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
            started = {
                "message_id": turn.message_id,
                "trigger": trigger,
                "node": self._node_id(),
                "state": "queued",
            }
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
            raise Conflict(in_flight_error(running.turn_id))

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
                if not await wait_for(arrived, deadline - loop.time()):
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
            if not await wait_for(turn.changed, deadline - loop.time()):
                label = (
                    responder_label(turn.responder) if turn.responder is not None else f"node {turn.remote}"
                )
                self.fail(turn, f"responder {label} did not start answering within {self.timeout:g}s")
                return
            if turn.remote is not None and not turn.started and turn.outcome is None:
                declined.add(turn.remote)  # that node could not place it: try another
                turn.remote = None
            elif turn.responder is None and not turn.started:
                self._release(turn)  # lost before it started: hand the turn on

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
                responder_label(connection),
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
            responder_label(connection),
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
        label = responder_label(connection)
        turn.error = f"responder {label!r} failed: {request.error}"
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
        turn = self._turn_here(session_id, turn_id)
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

    def _forget(self, turn: LiveTurn) -> None:
        """Drop an ended (or refused) turn from the book, and stop following its session."""
        if self.live.pop(turn.turn_id, None) is not None:
            self._by_reply.pop((turn.session_id, turn.reply_id), None)
            self._unfollow(turn.session_id)

    def _on_stream(self, frame: f.StreamFrame) -> None:
        turn = self._by_reply.get((frame.session_id, frame.message_id))
        if turn is None:
            return
        if frame.action == "start" and turn.remote is not None and not turn.started:
            turn.started = True  # another node's responder started it
            turn.changed.set()
        self._note_state(turn, frame)
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
                self._finish(turn, TurnOutcome("failed", TOO_LARGE))
            else:
                self._finish(turn, TurnOutcome("failed", turn.error or "the responder aborted the reply"))

    def _note_state(self, turn: LiveTurn, frame: f.StreamFrame) -> None:
        """Log the turn's state as the original's channels name it (docs/engine.md, "Turn
        states"): ``turn.running`` when its reply starts, ``turn.awaiting``
        (``awaiting-input``) when the reply waits for the user (an ``await`` delta), and
        ``turn.running`` again when it goes on. The posting node logs them, once each."""
        if frame.action == "start":
            self._spawn(self._log(turn, "turn.running", {"state": "running"}))
            return
        if frame.action != "delta" or not frame.deltas:
            return
        awaiting = frame.deltas[-1].get("kind") == "await"
        if awaiting != turn.awaiting:
            turn.awaiting = awaiting
            if awaiting:
                self._spawn(self._log(turn, "turn.awaiting", {"state": "awaiting-input"}))
            else:
                self._spawn(self._log(turn, "turn.running", {"state": "running"}))

    def fail(self, turn: LiveTurn, error: str) -> None:
        if turn.outcome is None:
            self._finish(turn, TurnOutcome("failed", error))

    def _finish(self, turn: LiveTurn, outcome: TurnOutcome) -> None:
        turn.outcome = outcome
        turn.changed.set()
        self._release(turn)
        self._forget(turn)
        data: dict[str, Any] = {"status": outcome.status, **settled(outcome.status)}
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
