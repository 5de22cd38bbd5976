"""A chat request that answers the reply in flight instead of asking for a new one.

The AI SDK's human in the loop: the reply asks for a tool approval (or a client-side tool's
result) and its request ends there; the user answers in the page
(``addToolApprovalResponse``, ``addToolOutput``) and the chat sends the messages again,
the last one being that very reply with the answered tool parts. :func:`answers_of` finds
what the message answers against the reply as the hub holds it (only a part the hub has
pending: an approval asked and not answered, a client tool without a result), and
:func:`pending_answers` checks them before the request streams anything, and
:func:`answer_all` passes each to the turn (``answer_tool``: checked again where the turn
runs, once each). The reply then goes on as the same message, and the request streams
what comes after what the page has. Every chat door (``/api/chat``, ``/api/chat/ws``, the
Cloudflare agent chat) answers this way.
"""

from __future__ import annotations

from typing import Any

from protocol import Conflict
from protocol import frames as f

from .caller import Caller
from .port import ChatHost, ChatTurn

__all__ = ["answer_all", "answers_of", "continued_turn", "pending_answers"]


async def continued_turn(hub: ChatHost, session_id: str, message: dict[str, Any]) -> ChatTurn | None:
    """The turn in flight whose reply ``message`` is (an assistant message of its id), else
    None; ``conflict`` for an answered approval with no such turn (the turn it answered
    has ended: posting it again must not start another reply)."""
    if message.get("role") != "assistant":
        return None
    turn = await hub.turns.find(session_id)
    if turn is not None and turn.reply_id == message.get("id"):
        return turn
    if any(
        isinstance(p, dict) and p.get("state") == "approval-responded" for p in message.get("parts") or []
    ):
        raise Conflict(
            f"no turn in flight in session {session_id!r} waits for this answer (answered already, or ended)"
        )
    return None


def answers_of(hub: ChatHost, turn: ChatTurn, message: dict[str, Any]) -> list[f.AnswerTool]:
    """The answers ``message`` (the page's copy of the reply) carries for tools the hub's
    reply still has pending."""
    current = hub.streams.current(turn.session_id, turn.reply_id)
    held = [] if current is None else current[0].get("parts") or []
    approvals = {
        str(p["approval"]["id"]): p
        for p in held
        if p.get("state") == "approval-requested"
        and isinstance(p.get("approval"), dict)
        and "id" in p["approval"]
    }
    calls = {
        p.get("toolCallId"): p
        for p in held
        if p.get("state") == "input-available" and not p.get("providerExecuted") and p.get("toolCallId")
    }
    found: list[f.AnswerTool] = []
    for part in message.get("parts") or []:
        if not isinstance(part, dict):
            continue
        state, approval = part.get("state"), part.get("approval")
        if state in ("approval-responded", "output-denied") and isinstance(approval, dict):
            approval_id = str(approval.get("id"))
            if approval_id in approvals and isinstance(approval.get("approved"), bool):
                reason = approval.get("reason")
                found.append(
                    f.AnswerTool(
                        id=0,
                        session_id=turn.session_id,
                        approval_id=approval_id,
                        approved=approval["approved"],
                        reason=reason if isinstance(reason, str) else None,
                    )
                )
        elif state in ("output-available", "output-error") and part.get("toolCallId") in calls:
            error = part.get("errorText") if state == "output-error" else None
            found.append(
                f.AnswerTool(
                    id=0,
                    session_id=turn.session_id,
                    tool_call_id=str(part["toolCallId"]),
                    output=part.get("output") if state == "output-available" else None,
                    error_text=str(error or "the tool failed") if state == "output-error" else None,
                )
            )
    return found


def pending_answers(
    hub: ChatHost, who: Caller, turn: ChatTurn, message: dict[str, Any]
) -> list[f.AnswerTool]:
    """The answers in ``message`` (``write`` on the session needed), checked before the
    request streams anything: ``conflict`` when it answers nothing the reply has pending."""
    who.check("answer_tool", turn.session_id)
    answers = answers_of(hub, turn, message)
    if not answers:
        raise Conflict(
            f"a reply is in flight in session {turn.session_id!r} and this message answers none of its tools"
            " (no approval asked, or every one answered already)"
        )
    return answers


async def answer_all(hub: ChatHost, answers: list[f.AnswerTool]) -> None:
    """Pass each answer to the turn (checked again where it runs, once each)."""
    for answer in answers:
        await hub.turns.answer_tool(answer)
