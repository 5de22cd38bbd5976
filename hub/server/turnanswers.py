"""The user's word to a turn while it runs: a tool's answer (``answer_tool``) and a
steering message (``steer_turn``).

Both are checked on the node that takes the request, against the reply as it streams (on
this node or mirrored here): an approval must be asked by a part of the reply in state
``approval-requested`` and not answered yet, a client tool's result must be for a part in
state ``input-available``. The node that holds the turn's responder (and so its stream)
then writes the answered part, or the ``steering-message`` part, into the reply itself, so
the tree stores it whatever library the responder uses, and sends the responder a
``tool_answer`` or ``steering`` frame. Another node's turn is reached through the relay
(:class:`~hub.server.turnframes.TurnStatus` ``answer`` / ``steer``), along the path a stop
takes: the posting node, then the node answering it.
"""

from __future__ import annotations

import contextlib
from typing import Any, Literal

from protocol import Conflict, InvalidInput, NotFound, coerce_message
from protocol import frames as f

from .outbox import Evicted
from .remoteturns import RemoteTurn
from .turnbook import LiveTurn
from .turnframes import TurnStatus
from .turnnodes import TurnNodes

__all__ = ["TurnAnswers"]

#: The user's two words to a running turn, as the relay names them.
Word = Literal["answer", "steer"]


def _find_part(
    parts: list[dict[str, Any]], approval_id: str | None, call_id: str | None
) -> dict[str, Any] | None:
    for part in parts:
        approval = part.get("approval")
        if approval_id is not None:
            if isinstance(approval, dict) and approval.get("id") == approval_id:
                return part
        elif part.get("toolCallId") == call_id and call_id is not None:
            return part
    return None


def answered_part(part: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    """``part`` as the answer leaves it (the AI SDK's states)."""
    if answer.get("approval_id") is not None:
        approval = {
            **(part.get("approval") or {}),
            "id": answer["approval_id"],
            "approved": bool(answer.get("approved")),
        }
        if answer.get("reason") is not None:
            approval["reason"] = answer["reason"]
        return {**part, "state": "approval-responded", "approval": approval}
    if answer.get("error_text") is not None:
        return {**part, "state": "output-error", "errorText": str(answer["error_text"])}
    return {**part, "state": "output-available", "output": answer.get("output")}


def check_pending(parts: list[dict[str, Any]], answer: dict[str, Any], session_id: str) -> dict[str, Any]:
    """The part ``answer`` answers, if it is pending; else the error that says why not."""
    approval_id, call_id = answer.get("approval_id"), answer.get("tool_call_id")
    part = _find_part(parts, approval_id, call_id)
    what = f"approval {approval_id!r}" if approval_id is not None else f"tool call {call_id!r}"
    if part is None:
        raise NotFound(f"no {what} is pending in the reply in flight in session {session_id!r}")
    state = part.get("state")
    if approval_id is not None:
        if state != "approval-requested":
            raise Conflict(f"{what} was answered already (the tool part is {state!r})")
    elif state != "input-available" or part.get("providerExecuted"):
        if state in ("output-available", "output-error", "output-denied"):
            raise Conflict(f"{what} has its result already (the tool part is {state!r})")
        raise Conflict(f"{what} does not wait for a client's result (the tool part is {state!r})")
    return part


class TurnAnswers(TurnNodes):
    """The tool answers and steering messages of the turns (see the module)."""

    def _turn_here(self, session_id: str, turn_id: str | None) -> LiveTurn | None:
        """The session's turn in flight held by this node (posted here, or answered here for
        another node); with ``turn_id``, only that one."""
        turn = self.in_flight(session_id)
        if turn is None:
            turn = next(
                (t for _, t in self.foreign.values() if t.session_id == session_id and t.outcome is None),
                None,
            )
        if turn is not None and turn_id is not None and turn.turn_id != turn_id:
            return None
        return turn

    async def _target(self, session_id: str, turn_id: str | None) -> LiveTurn | RemoteTurn:
        turn = self._turn_here(session_id, turn_id)
        if turn is not None:
            if not turn.started:
                raise Conflict(f"turn {turn.turn_id!r} has not started its reply yet")
            return turn
        remote = await self.find(session_id)
        if (
            remote is None
            or isinstance(remote, LiveTurn)
            or (turn_id is not None and remote.turn_id != turn_id)
        ):
            what = "no turn" if turn_id is None else f"turn {turn_id!r} is not"
            raise NotFound(f"{what} in flight in session {session_id!r}")
        return remote

    async def answer_tool(self, request: f.AnswerTool) -> dict[str, Any]:
        """``answer_tool`` (and the chat doors' approvals and client tool results)."""
        if request.approval_id is None and request.tool_call_id is None:
            raise InvalidInput(
                "answer_tool needs `approval_id` (an approval) or `tool_call_id` (a tool's result)"
            )
        if request.approval_id is not None and request.approved is None:
            raise InvalidInput("an approval's answer needs `approved` (true or false)")
        answer = {
            "approval_id": request.approval_id,
            "approved": request.approved,
            "reason": request.reason,
            "tool_call_id": request.tool_call_id,
            "output": request.output,
            "error_text": request.error_text,
        }
        turn = await self._target(request.session_id, None)
        current = self.host.streams.current(request.session_id, turn.reply_id)
        if current is None:
            raise NotFound(f"the reply of turn {turn.turn_id!r} is not streaming")
        part = check_pending(current[0].get("parts") or [], answer, request.session_id)
        answer["tool_call_id"] = part.get("toolCallId")
        key = f"a:{request.approval_id}" if request.approval_id is not None else f"c:{answer['tool_call_id']}"
        if isinstance(turn, LiveTurn):
            if key in turn.answered:
                raise Conflict("that tool was answered already")
            await self._answer_once(turn, key, answer, by=None)
        else:
            await self._deliver(turn, "answer", answer, by=None)
        return {"turn_id": turn.turn_id, "reply_id": turn.reply_id, "tool_call_id": answer["tool_call_id"]}

    async def steer(self, request: f.SteerTurn) -> dict[str, Any]:
        """``steer_turn``: a user message for the turn in flight."""
        message = coerce_message(request.message)
        if message.role != "user":
            raise InvalidInput(f"a steering message is a user message, not {message.role!r}")
        turn = await self._target(request.session_id, request.turn_id)
        await self._deliver(turn, "steer", message.to_dict(), by=None)
        return {"turn_id": turn.turn_id, "reply_id": turn.reply_id}

    async def _answer_once(self, turn: LiveTurn, key: str, answer: dict[str, Any], by: str | None) -> None:
        """Deliver a tool's answer, which then counts as given: held while it is delivered
        (a second answer meanwhile is refused), let go if the delivery fails (the reply
        refused the answered part, it stopped streaming), so the user may answer again."""
        turn.answered.add(key)
        try:
            await self._deliver(turn, "answer", answer, by)
        except BaseException:
            turn.answered.discard(key)
            raise

    async def _deliver(
        self, turn: LiveTurn | RemoteTurn, kind: Word, data: dict[str, Any], by: str | None
    ) -> None:
        """Write the user's word into the reply and tell the responder, where the responder
        is; else pass it on toward that node."""
        if isinstance(turn, RemoteTurn):
            self._relay(self._word(turn.node, turn.turn_id, kind, data))
            return
        responder = turn.responder
        if responder is None:
            if turn.remote is not None and turn.remote != by:
                self._relay(self._word(turn.remote, turn.turn_id, kind, data))
            return
        if kind == "answer":
            current = self.host.streams.current(turn.session_id, turn.reply_id)
            parts = [] if current is None else current[0].get("parts") or []
            part = _find_part(parts, data.get("approval_id"), data.get("tool_call_id"))
            if part is None:
                return  # the reply moved on meanwhile (stopped, reset): nothing to answer
            await self._write(turn, {"kind": "tool", "part": answered_part(part, data)})
            frame: f.ToolAnswerFrame | f.SteeringFrame = f.ToolAnswerFrame(
                turn_id=turn.turn_id, session_id=turn.session_id, reply_id=turn.reply_id, **data
            )
        else:
            steering = {"type": "steering-message", "id": data.get("id"), "parts": data.get("parts") or []}
            await self._write(turn, {"kind": "part", "part": steering})
            frame = f.SteeringFrame(
                turn_id=turn.turn_id, session_id=turn.session_id, reply_id=turn.reply_id, message=data
            )
        if not responder.closed:
            with contextlib.suppress(Evicted):
                await responder.send(frame)

    async def _write(self, turn: LiveTurn, delta: dict[str, Any]) -> None:
        """A delta into the reply, as the hub writes it (the stream is on this node)."""
        if not await self.host.streams.write(turn.session_id, turn.reply_id, delta):
            raise NotFound(f"the reply of turn {turn.turn_id!r} is not streaming")

    def _word(self, to: str, turn_id: str, kind: Word, data: dict[str, Any]) -> TurnStatus:
        return TurnStatus(origin=self._node_id(), to=to, turn_id=turn_id, status=kind, word=data)

    def _relayed_word(self, node: str, message: TurnStatus) -> None:
        """An ``answer`` or ``steer`` from another node, for a turn held here."""
        held = self.foreign.get(message.turn_id)
        turn = self.live.get(message.turn_id) or (held[1] if held is not None else None)
        if turn is None or message.word is None:
            return
        key = (
            f"a:{message.word.get('approval_id')}"
            if message.word.get("approval_id") is not None
            else f"c:{message.word.get('tool_call_id')}"
        )
        if message.status == "steer":
            self._spawn(self._deliver(turn, "steer", message.word, by=node))
        elif key not in turn.answered:
            self._spawn(self._answer_once(turn, key, message.word, by=node))
