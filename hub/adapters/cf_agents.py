"""Cloudflare's agent chat protocol (``cf_agent_*`` frames) at ``/agents/{agent}/{name}``.

A page built on ``useAgentChat`` (``agents/react`` with ``@cloudflare/ai-chat``) or on
``AgentClient`` and ``agents/chat``'s ``WebSocketChatTransport`` talks to a Durable Object
named by agent and name. Here the pair names a session, ``"<agent>:<name>"`` (created on
the first chat request, with ``admin``), and the hub answers as ``AIChatAgent`` does:

- on connect: ``cf_agent_identity``, ``cf_agent_state`` (``{}``: the hub keeps no agent
  state beside the session), ``cf_agent_mcp_servers`` (none), ``cf_agent_chat_messages``
  with the session's history (``connect: true``), and ``cf_agent_stream_resuming`` when a
  reply is in flight;
- ``cf_agent_use_chat_request {id, init: {body}}``: the body's messages are appended where
  the hub lacks them, a turn starts, and its reply goes to every socket of the session on
  this node as ``cf_agent_use_chat_response {id, body: <UI chunk JSON>, done, seq}``, ending
  with ``done: true`` and an ``outcome`` (``completed``, ``aborted``, ``error``); then every
  socket gets the transcript (``cf_agent_chat_messages``);
- ``cf_agent_stream_resume_request`` is answered ``cf_agent_stream_resuming {id}`` or
  ``cf_agent_stream_resume_none {reason: "idle"}``; its ``cf_agent_stream_resume_ack`` gets
  every chunk so far (``replay: true``, with their ``seq``), a ``replayComplete`` marker, then
  the live ones;
- ``cf_agent_chat_request_cancel {id}`` stops the turn; ``cf_agent_chat_clear`` empties the
  session and tells the other sockets; ``cf_agent_chat_messages`` from a client appends what
  is new and tells the others; ``cf_agent_tool_result`` sets a tool part's output in the
  stored message and sends ``cf_agent_message_updated`` to every socket; for a reply in
  flight that waits on it (a client-side tool), and ``cf_agent_tool_approval
  {toolCallId, approved}`` for one that asks an approval, the answer goes to the turn's
  responder (:mod:`.answers`) and the reply goes on to every socket as a stream of the same
  message (``id``: the reply's).

``GET /agents/{agent}/{name}/get-messages`` is the history as JSON (what ``useAgentChat``
loads first). Tokens: ``?token=``, ``Authorization: Bearer`` or the ``bearer.<token>``
subprotocol, checked on every frame with the op's scope (a read token sees the chat, it
cannot post, clear or cancel); at the token's ``exp`` the tab is closed with 4001, as the
hub's own socket is (a room sends a tab the chat without its asking). Frames are bounded
by ``max_body_bytes``, each socket's outbox by ``outbox_bytes``/``send_timeout``
(:class:`~hub.adapters.aisdk_ws.Socket`'s rules); a frame that is not understood is answered
``cf_agent_use_chat_response`` with ``error`` when it names a request, else ignored, as the
Agents SDK does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from protocol import Conflict, Forbidden, InvalidInput, SessionHubError, SessionNotFound, coerce_message
from protocol import frames as f

from ..server.handshake import origin_allowed, token_of
from .aisdk_ws import CLOSE_GOING_AWAY, Socket
from .caller import caller, cors_headers
from .cf_rooms import Room, enter, leave, relay_of
from .cf_rooms import frame as _frame
from .chats import ChatBody, ensure_session, error_code, json_error, refused
from .port import Adapter, ChatHost, ChatTurn, host_of

__all__ = ["adapter", "session_of"]

log = logging.getLogger("sessionhub.chat")


def session_of(agent: str, name: str) -> str:
    """The session an agent instance's chat is: ``"<agent>:<name>"``."""
    return f"{agent}:{name}"


class CfSocket(Socket):
    """One ``/agents/{agent}/{name}`` connection."""

    def __init__(self, hub: ChatHost, websocket: WebSocket, session_id: str, agent: str, name: str) -> None:
        super().__init__(hub, websocket)
        self.agent, self.name = agent, name
        self._session_id = session_id
        self.room: Room | None = None
        #: The transcript this tab shows, as far as the hub knows (see :mod:`.cf_rooms`).
        self.transcript: str | None = None

    @property
    def session_id(self) -> str:
        return self._session_id

    @property
    def joined(self) -> Room:
        assert self.room is not None, "a socket serves frames only once in its room"
        return self.room

    async def history(self) -> list[dict[str, Any]]:
        return await self.joined.history()

    async def _tell_others(self) -> None:
        """The transcript to the other tabs, which (and this one) now show it."""
        room = self.joined
        async with room.telling:
            messages = await self.history()
            text = _frame("cf_agent_chat_messages", messages=messages)
            for socket in list(room.sockets):
                if socket is not self:
                    socket.push(text)
            room.shown(messages)

    async def greet(self) -> None:
        self.push(_frame("cf_agent_identity", name=self.name, agent=self.agent))
        self.push(_frame("cf_agent_state", state={}))
        self.push(
            _frame("cf_agent_mcp_servers", mcp={"servers": {}, "tools": [], "prompts": [], "resources": []})
        )
        if not self._allowed("get_history", self.session_id):
            self._denied(None)
            return
        messages = await self.history()
        self.push(_frame("cf_agent_chat_messages", messages=messages, connect=True))
        self.joined.shown(messages, [self])
        turn = await self._turn()
        if turn is not None:
            relay = relay_of(self.joined, self.hub, turn, None, [])
            self.push(_frame("cf_agent_stream_resuming", id=relay.request_id))

    async def _turn(self) -> ChatTurn | None:
        try:
            return await self.hub.turns.find(self.session_id)
        except SessionHubError:
            return None

    def _denied(self, request_id: str | None) -> None:
        text = (
            "forbidden" if self.token is not None else "unauthorized: this hub needs a token (?token=<token>)"
        )
        if request_id is not None:
            self.push(_frame("cf_agent_use_chat_response", id=request_id, body=text, done=True, error=True))
        else:
            self.push(_frame("cf_agent_state_error", error=text))

    async def handle(self, text: str) -> None:
        if len(text) > self.hub.config.max_body_bytes:
            self._badframe(text, f"the frame is over max_body_bytes ({self.hub.config.max_body_bytes})")
            return
        try:
            frame = json.loads(text)
        except ValueError:
            return  # not JSON: the Agents SDK ignores it too
        if not isinstance(frame, dict):
            return
        kind = frame.get("type")
        try:
            match kind:
                case "cf_agent_use_chat_request":
                    await self._chat_request(frame)
                case "cf_agent_stream_resume_request":
                    await self._resume_request(frame)
                case "cf_agent_stream_resume_ack":
                    await self._resume_ack(frame)
                case "cf_agent_chat_request_cancel":
                    await self._cancel(frame)
                case "cf_agent_chat_clear":
                    await self._clear()
                case "cf_agent_chat_messages":
                    await self._messages(frame)
                case "cf_agent_tool_result":
                    if not await self._answer(frame, approval=False):
                        await self._tool_result(frame)
                case "cf_agent_tool_approval":
                    if not await self._answer(frame, approval=True):
                        raise Conflict(f"no approval of tool call {frame.get('toolCallId')!r} is pending")
                case _:
                    return  # RPC, state and other Agent frames the hub has no use for
        except Forbidden:
            self._denied(frame.get("id") if isinstance(frame.get("id"), str) else None)
        except SessionHubError as exc:
            request_id = frame.get("id")
            if isinstance(request_id, str):
                self.push(
                    _frame(
                        "cf_agent_use_chat_response",
                        id=request_id,
                        body=f"{error_code(exc)}: {exc}",
                        done=True,
                        error=True,
                    )
                )
            else:
                log.info("a cf_agent frame was refused: %s", exc)

    def _badframe(self, text: str, why: str) -> None:
        try:
            request_id = json.loads(text).get("id")
        except (ValueError, AttributeError):
            request_id = None
        if isinstance(request_id, str):
            self.push(_frame("cf_agent_use_chat_response", id=request_id, body=why, done=True, error=True))

    def _need(self, op: str) -> None:
        if not self._allowed(op, self.session_id):
            raise Forbidden("forbidden")

    async def _chat_request(self, frame: dict[str, Any]) -> None:
        request_id = frame.get("id")
        init = frame.get("init")
        if not isinstance(request_id, str) or not isinstance(init, dict):
            raise InvalidInput("a chat request needs a string `id` and an object `init`")
        self._need("append_all")
        try:
            body = json.loads(init.get("body") or "{}")
        except (TypeError, ValueError):
            body = None
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
            self.push(
                _frame(
                    "cf_agent_use_chat_response",
                    id=request_id,
                    body="invalid: the request body needs `messages`",
                    done=True,
                    error=True,
                )
            )
            return
        messages = [coerce_message(m) for m in body["messages"]]
        await ensure_session(
            self.hub, self.caller(), ChatBody(id=self.session_id, messages=body["messages"]), source="agents"
        )
        await self.hub.manager.append_all(self.session_id, messages, None)
        trigger = (
            body.get("trigger") if body.get("trigger") in ("submit-message", "regenerate-message") else None
        )
        turn = await self.hub.turns.start(self.session_id, messages[-1].id, trigger)
        user_ids = [m.id for m in messages if m.role == "user"][-1:]
        await self._tell_others()
        relay_of(self.joined, self.hub, turn, request_id, user_ids).deliver(0, False)

    async def _resume_request(self, frame: dict[str, Any]) -> None:
        self._need("get_history")
        probe = frame.get("probeId")
        extra = {"probeId": probe} if isinstance(probe, str) else {}
        turn = await self._turn()
        if turn is None:
            self.push(_frame("cf_agent_stream_resume_none", reason="idle", **extra))
            return
        relay = relay_of(self.joined, self.hub, turn, None, [])
        self.push(_frame("cf_agent_stream_resuming", id=relay.request_id, **extra))

    async def _resume_ack(self, frame: dict[str, Any]) -> None:
        self._need("get_history")
        for relay in list(self.joined.relays.values()):
            if relay.request_id == frame.get("id"):
                relay.live.discard(self)
                relay.resume(self)
                return
        self.push(_frame("cf_agent_stream_resume_none", reason="idle"))

    async def _cancel(self, frame: dict[str, Any]) -> None:
        self._need("stop_turn")
        for relay in list(self.joined.relays.values()):
            if relay.request_id == frame.get("id"):
                with contextlib.suppress(SessionHubError):  # ended meanwhile
                    await self.hub.turns.stop(self.session_id, None, "stopped by the user")
                return

    async def _clear(self) -> None:
        self._need("clear_messages")
        room = self.joined
        async with room.telling:  # no transcript read runs across the clear (cf_rooms.Room)
            # Marked before the write: the room's log follower may see the clear before this
            # goes on, and must not tell these tabs again.
            others = [socket for socket in room.sockets if socket is not self]
            room.shown([])
            try:
                with contextlib.suppress(SessionNotFound):
                    await self.hub.manager.clear_messages(self.session_id)
            except BaseException:
                room.shown(None)
                raise
            for socket in others:
                socket.push(_frame("cf_agent_chat_clear"))

    async def _messages(self, frame: dict[str, Any]) -> None:
        messages = frame.get("messages")
        if not isinstance(messages, list):
            return
        self._need("append_all")
        coerced = [coerce_message(m) for m in messages]
        if not coerced:
            return
        await ensure_session(
            self.hub, self.caller(), ChatBody(id=self.session_id, messages=messages), source="agents"
        )
        await self.hub.manager.append_all(self.session_id, coerced, None)
        await self._tell_others()

    async def _answer(self, frame: dict[str, Any], *, approval: bool) -> bool:
        """A tool result or approval for the reply in flight (answers.py): the responder
        waiting on it gets it, and the reply goes on to every socket as a new stream of
        the same message. False when no turn in flight has that tool call pending."""
        call = frame.get("toolCallId")
        turn = await self.hub.turns.find(self.session_id)
        current = None if turn is None else self.hub.streams.current(self.session_id, turn.reply_id)
        if turn is None or current is None or not isinstance(call, str):
            return False
        part = next((p for p in current[0].get("parts") or [] if p.get("toolCallId") == call), None)
        if part is None:
            return False
        self._need("answer_tool")
        if approval:
            asked = part.get("approval")
            if part.get("state") != "approval-requested" or not isinstance(asked, dict):
                return False
            answer = f.AnswerTool(
                id=0,
                session_id=self.session_id,
                approval_id=str(asked.get("id")),
                approved=bool(frame.get("approved")),
            )
        elif part.get("state") == "input-available":
            failed = frame.get("state") == "output-error"
            answer = f.AnswerTool(
                id=0,
                session_id=self.session_id,
                tool_call_id=call,
                output=None if failed else frame.get("output"),
                error_text=str(frame.get("errorText") or "the tool failed") if failed else None,
            )
        else:
            return False
        relay = relay_of(self.joined, self.hub, turn, None, [], primed=True)
        await self.hub.turns.answer_tool(answer)
        relay.deliver(0, False)
        return True

    async def _tool_result(self, frame: dict[str, Any]) -> None:
        self._need("update_message")
        call = frame.get("toolCallId")
        for message in reversed(await self.history()):
            for part in message.get("parts", []):
                if part.get("toolCallId") == call:
                    if frame.get("state") == "output-error":
                        part.update(state="output-error", errorText=str(frame.get("errorText", "")))
                    else:
                        part.update(state="output-available", output=frame.get("output"))
                    await self.hub.manager.get_session(self.session_id).update_message(
                        coerce_message(message)
                    )
                    updated = _frame("cf_agent_message_updated", message=message)
                    for socket in list(self.joined.sockets):
                        socket.push(updated)
                    self.joined.shown(await self.history())
                    return

    def close(self) -> None:
        if self.room is not None:
            leave(self.room, self)


async def _endpoint(websocket: WebSocket) -> None:
    hub = host_of(websocket)
    if not origin_allowed(websocket, hub.config):
        await websocket.close(1008, "origin not allowed")
        return
    agent, name = websocket.path_params["agent"], websocket.path_params["name"]
    token, subprotocol = token_of(websocket)
    await websocket.accept(subprotocol=subprotocol)
    if hub.closing:
        await websocket.close(CLOSE_GOING_AWAY, "server shutting down; resume elsewhere")
        return
    socket = CfSocket(hub, websocket, session_of(agent, name), agent, name)
    socket.token = token or websocket.query_params.get("token")
    drainer = asyncio.create_task(socket.drain())
    try:
        # Only a socket that may read the chat is in its room: the room tells it everything.
        if socket._allowed("get_history", socket.session_id):
            socket.room = await enter(hub, socket.session_id, socket)
        socket.close_at_expiry()
        await socket.greet()
        await socket.serve(drainer)
    except WebSocketDisconnect:
        pass
    finally:
        socket.stop_expiry()
        socket.close()
        drainer.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await drainer
        socket.outbox.close()


async def _get_messages(request: Request) -> Response:
    hub = host_of(request)
    cors = cors_headers(request.headers, hub.config)
    if cors is None:
        return json_error("forbidden", "origin not allowed")
    session_id = session_of(request.path_params["agent"], request.path_params["name"])
    try:
        caller(request.headers, hub.config).check("get_history", session_id)
    except Forbidden:
        return refused(request.headers, cors)
    try:
        messages = [m.to_dict() for m in await hub.manager.get_history(session_id)]
    except SessionNotFound:
        messages = []
    except SessionHubError as exc:
        return json_error(error_code(exc), str(exc), cors)
    return JSONResponse(messages, headers=cors)


#: The adapter's HTTP path (a typed 405 answers any other method on it).
PATHS = ["/agents/{agent}/{name}/get-messages"]


def adapter() -> Adapter:
    """Cloudflare's agent chat, as ``create_app`` mounts it."""
    return Adapter(
        "cf_agents",
        [
            Route(PATHS[0], _get_messages, methods=["GET"]),
            WebSocketRoute("/agents/{agent}/{name}", _endpoint),
        ],
        PATHS,
    )
