"""What the chat adapters share: the body a chat UI posts, a new chat's session, and the
hub's JSON error form for an HTTP door.

The AI SDK's chat over HTTP (:mod:`.aisdk_chat`) uses these, and so will the chat
transports that come next (the AI SDK 7 WebSocket transport, Cloudflare's agent chat,
AG-UI): each maps its own request onto :class:`ChatBody`'s fields, creates the session the
same way (:func:`ensure_session`: ``admin`` to create, ``write`` to append) and answers a
refusal that is not in its own protocol's form as :func:`json_error` does.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

import msgspec
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from protocol import (
    Conflict,
    Forbidden,
    InvalidInput,
    NotFound,
    SessionHubError,
    SessionNotFound,
    SummarizerError,
)

from .body import BodyError, parse_body, read_body
from .caller import Caller, caller
from .port import ChatHost, ChatTurn

__all__ = ["ChatBody", "body_of", "ensure_session", "error_code", "in_flight", "json_error", "refused"]

B = TypeVar("B")


class ChatBody(msgspec.Struct, kw_only=True):
    """What ``DefaultChatTransport`` posts (other fields, a page's own ``body``, are ignored)."""

    id: str
    messages: list[dict[str, Any]]
    trigger: Literal["submit-message", "regenerate-message"] = "submit-message"
    messageId: str | None = None  # the SDK's name


_STATUS = {
    "too_large": 413,
    "invalid": 400,
    "forbidden": 403,
    "not_found": 404,
    "conflict": 409,
    "unavailable": 503,
}


def json_error(
    code: str, message: str, headers: dict[str, str] | None = None, status: int | None = None
) -> JSONResponse:
    """``{"error": {"code", "message"}}`` with the code's HTTP status (``unauthorized``:
    401, ``forbidden``: 403, ``too_large``: 413, ...; an unknown code 500)."""
    if status is None:
        status = 401 if code == "unauthorized" else _STATUS.get(code, 500)
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status, headers=headers)


def error_code(exc: SessionHubError) -> str:
    """The hub's error code of an engine error, as the HTTP doors name it."""
    if isinstance(exc, Forbidden):
        return "forbidden"
    if isinstance(exc, NotFound):
        return "not_found"
    if isinstance(exc, InvalidInput):
        return "invalid"
    if isinstance(exc, Conflict):
        return "conflict"
    if isinstance(exc, SummarizerError):
        return "upstream"
    return str(getattr(exc, "code", "internal"))


def _title(messages: list[dict[str, Any]]) -> str:
    for message in messages:
        for part in message.get("parts") or []:
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                return " ".join(part["text"].split())[:60] or "chat"
    return "chat"


async def ensure_session(hub: ChatHost, who: Caller, body: ChatBody, source: str = "api/chat") -> None:
    """Create the chat's session if it is new. Several first POSTs of one chat race here:
    the one whose create loses finds the session made and goes on to the turn, where all
    but one are told ``conflict`` (a turn is in flight), not that the session exists."""
    if await hub.manager.get(body.id) is not None:
        return
    if not who.allows("create", body.id):
        raise SessionNotFound(body.id)  # creating one needs admin
    try:
        await hub.store.create_session(_title(body.messages), source=source, session_id=body.id)
    except InvalidInput:
        if await hub.manager.get(body.id) is None:
            raise  # not the race: the create itself was refused


async def body_of(request: Request, hub: ChatHost, cors: dict[str, str], kind: type[B]) -> B | JSONResponse:
    """The request's JSON body as ``kind``, read within ``max_body_bytes`` (its declared
    length checked first); else the JSON error to answer. Check the token before this."""
    try:
        data = await read_body(request.receive, request.headers, hub.config.max_body_bytes)
        parsed: B = parse_body(data, kind)
    except BodyError as exc:
        return json_error(exc.code, str(exc), cors, exc.status)
    return parsed


def refused(headers: Headers, cors: dict[str, str]) -> JSONResponse:
    """A refused token: without one at all the page learns what to send (401); with a
    wrong one, or one without the scope, only no (403)."""
    if headers.get("authorization") is None:
        return json_error("unauthorized", "this hub needs a token: send Authorization: Bearer <token>", cors)
    return json_error("forbidden", "forbidden", cors)


async def in_flight(
    request: Request, hub: ChatHost, cors: dict[str, str], session_id: str
) -> ChatTurn | Response:
    """The turn a reader may re-attach to, or what to answer instead: 401/403 without a
    ``read`` token on the session, a typed error, or 204 when nothing is in flight on any
    node (a chat that does not exist yet included: a new chat's page resumes on load)."""
    try:
        caller(request.headers, hub.config).check("get_history", session_id)
    except Forbidden:
        return refused(request.headers, cors)
    try:
        turn = await hub.turns.find(session_id)
    except SessionNotFound:
        turn = None
    except SessionHubError as exc:
        return json_error(error_code(exc), str(exc), cors)
    return Response(status_code=204, headers=cors) if turn is None else turn
