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
cannot post, clear or cancel). Frames are bounded by ``max_body_bytes``, each socket's
outbox by ``outbox_bytes``/``send_timeout`` (:class:`~hub.adapters.aisdk_ws.Socket`'s rules);
a frame that is not understood is answered ``cf_agent_use_chat_response`` with ``error``
when it names a request, else ignored, as the Agents SDK does.
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

from protocol import Conflict, Forbidden, SessionHubError, SessionNotFound, coerce_message
from protocol import frames as f

from ..server.handshake import origin_allowed, token_of
from .aisdk_ws import CLOSE_GOING_AWAY, Socket
from .caller import caller, cors_headers
from .chats import ChatBody, ensure_session, error_code, json_error, refused
from .port import Adapter, ChatHost, ChatTurn, host_of
from .replychunks import TurnChunks, turn_chunks

__all__ = ["adapter", "session_of"]

log = logging.getLogger("sessionhub.chat")


def session_of(agent: str, name: str) -> str:
    """The session an agent instance's chat is: ``"<agent>:<name>"``."""
    return f"{agent}:{name}"


def _frame(kind: str, **fields: Any) -> str:
    return json.dumps({"type": kind, **fields}, separators=(",", ":"))


class Room:
    """The sockets of one session on this node, and the reply they are being sent."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.sockets: set[CfSocket] = set()
        self.relays: dict[int, Relay] = {}  # id(turn) -> its relay to this room


_ROOMS: dict[str, Room] = {}
#: The transcript sends in flight (see :meth:`Relay.done`).
_PENDING: set[asyncio.Task[None]] = set()


class Relay:
    """One turn's chunks to a room: live to every socket that is not replaying, and the
    chunks so far to one that asks to resume. ``request_id`` is what the frames carry: the
    id of the chat request that started it, or the reply's id for a turn from another door."""

    def __init__(self, room: Room, chunks: TurnChunks, request_id: str, message_ids: list[str]) -> None:
        self.room, self.chunks, self.request_id, self.message_ids = room, chunks, request_id, message_ids
        self.sent = 0  # chunks sent live so far
        self.live: set[CfSocket] = set(room.sockets)
        chunks.listeners.append(self)

    def _chunk(self, index: int, *, replay: bool = False) -> str:
        fields: dict[str, Any] = {
            "id": self.request_id,
            "body": self.chunks.texts[index],
            "done": False,
            "seq": index,
        }
        if replay:
            fields["replay"] = True
        return _frame("cf_agent_use_chat_response", **fields)

    def _end(self) -> str:
        items = self.chunks.items
        last = items[-1].get("type") if items else None
        outcome = {"finish": "completed", "abort": "aborted"}.get(str(last), "error")
        fields: dict[str, Any] = {"id": self.request_id, "body": "", "done": True, "outcome": outcome}
        if self.message_ids:
            fields["messageIds"] = self.message_ids
        if outcome == "error":
            fields["error"] = True
            fields["body"] = (
                str(items[-1].get("errorText", "the turn failed")) if items else "the turn failed"
            )
        return _frame("cf_agent_use_chat_response", **fields)

    def deliver(self, first: int, last: bool) -> None:
        texts = self.chunks.texts
        frames = [self._chunk(i) for i in range(self.sent, len(texts))]
        self.sent = len(texts)
        if last:
            frames.append(self._end())
        for socket in list(self.live):
            for frame in frames:
                socket.push(frame)
        if last:
            self.done()

    def resume(self, socket: CfSocket) -> None:
        """Everything so far as replay, the marker, then live with the others."""
        for i in range(self.sent):
            socket.push(self._chunk(i, replay=True))
        socket.push(
            _frame(
                "cf_agent_use_chat_response",
                id=self.request_id,
                body="",
                done=False,
                replay=True,
                replayComplete=True,
            )
        )
        self.live.add(socket)

    def done(self) -> None:
        with contextlib.suppress(ValueError):
            self.chunks.listeners.remove(self)
        turn = self.chunks.turn
        if self.room.relays.get(id(turn)) is self:
            del self.room.relays[id(turn)]
        # Held until done: the loop keeps only a weak reference to a task.
        task = asyncio.get_running_loop().create_task(self._transcript())
        _PENDING.add(task)
        task.add_done_callback(_PENDING.discard)

    async def _transcript(self) -> None:
        """The stored transcript to every socket once the reply is whole."""
        sockets = list(self.room.sockets)
        if not sockets:
            return
        try:
            messages = await sockets[0].history()
        except SessionHubError:
            return
        frame = _frame("cf_agent_chat_messages", messages=messages)
        for socket in sockets:
            socket.push(frame)


def relay_of(
    room: Room, hub: ChatHost, turn: ChatTurn, request_id: str | None, message_ids: list[str]
) -> Relay:
    relay = room.relays.get(id(turn))
    if relay is None or relay.chunks.turn is not turn:
        relay = room.relays[id(turn)] = Relay(
            room, turn_chunks(hub, turn), request_id or turn.reply_id, message_ids
        )
    return relay


class CfSocket(Socket):
    """One ``/agents/{agent}/{name}`` connection."""

    def __init__(self, hub: ChatHost, websocket: WebSocket, room: Room, agent: str, name: str) -> None:
        super().__init__(hub, websocket)
        self.room, self.agent, self.name = room, agent, name

    @property
    def session_id(self) -> str:
        return self.room.session_id

    async def history(self) -> list[dict[str, Any]]:
        try:
            return [m.to_dict() for m in await self.hub.manager.get_history(self.session_id)]
        except SessionNotFound:
            return []

    def _others(self, frame: str) -> None:
        for socket in list(self.room.sockets):
            if socket is not self:
                socket.push(frame)

    async def greet(self) -> None:
        self.push(_frame("cf_agent_identity", name=self.name, agent=self.agent))
        self.push(_frame("cf_agent_state", state={}))
        self.push(
            _frame("cf_agent_mcp_servers", mcp={"servers": {}, "tools": [], "prompts": [], "resources": []})
        )
        if not self._allowed("get_history", self.session_id):
            self._denied(None)
            return
        self.push(_frame("cf_agent_chat_messages", messages=await self.history(), connect=True))
        turn = await self._turn()
        if turn is not None:
            relay = relay_of(self.room, self.hub, turn, None, [])
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
            self._bad_frame(text, f"the frame is over max_body_bytes ({self.hub.config.max_body_bytes})")
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

    def _bad_frame(self, text: str, why: str) -> None:
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
            raise SessionHubError("invalid: a chat request needs an id and init")
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
        self._others(_frame("cf_agent_chat_messages", messages=await self.history()))
        relay_of(self.room, self.hub, turn, request_id, user_ids).deliver(0, False)

    async def _resume_request(self, frame: dict[str, Any]) -> None:
        self._need("get_history")
        probe = frame.get("probeId")
        extra = {"probeId": probe} if isinstance(probe, str) else {}
        turn = await self._turn()
        if turn is None:
            self.push(_frame("cf_agent_stream_resume_none", reason="idle", **extra))
            return
        relay = relay_of(self.room, self.hub, turn, None, [])
        self.push(_frame("cf_agent_stream_resuming", id=relay.request_id, **extra))

    async def _resume_ack(self, frame: dict[str, Any]) -> None:
        self._need("get_history")
        for relay in list(self.room.relays.values()):
            if relay.request_id == frame.get("id"):
                relay.live.discard(self)
                relay.resume(self)
                return
        self.push(_frame("cf_agent_stream_resume_none", reason="idle"))

    async def _cancel(self, frame: dict[str, Any]) -> None:
        self._need("stop_turn")
        for relay in list(self.room.relays.values()):
            if relay.request_id == frame.get("id"):
                with contextlib.suppress(SessionHubError):  # ended meanwhile
                    await self.hub.turns.stop(self.session_id, None, "stopped by the user")
                return

    async def _clear(self) -> None:
        self._need("clear_messages")
        with contextlib.suppress(SessionNotFound):
            await self.hub.manager.clear_messages(self.session_id)
        self._others(_frame("cf_agent_chat_clear"))

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
        self._others(_frame("cf_agent_chat_messages", messages=await self.history()))

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
        relay = self.room.relays[id(turn)] = Relay(
            self.room, turn_chunks(self.hub, turn, primed=True), turn.reply_id, []
        )
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
                    for socket in list(self.room.sockets):
                        socket.push(updated)
                    return

    def close(self) -> None:
        for relay in self.room.relays.values():
            relay.live.discard(self)
        self.room.sockets.discard(self)
        if not self.room.sockets and not self.room.relays:
            _ROOMS.pop(self.room.session_id, None)


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
    session_id = session_of(agent, name)
    room = _ROOMS.get(session_id) or _ROOMS.setdefault(session_id, Room(session_id))
    socket = CfSocket(hub, websocket, room, agent, name)
    socket.token = token or websocket.query_params.get("token")
    room.sockets.add(socket)
    drainer = asyncio.create_task(socket.drain())
    try:
        await socket.greet()
        await socket.serve(drainer)
    except WebSocketDisconnect:
        pass
    finally:
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
