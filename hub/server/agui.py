"""AG-UI 1.0 at ``POST /agui`` and ``GET /agui/{thread_id}/stream``.

``new HttpAgent({ url: "http://hub/agui" })`` (``@ag-ui/client``, and so CopilotKit) posts a
``RunAgentInput``: its ``threadId`` is the session (created if new, with ``admin``), its
messages are appended where the hub does not hold them yet (idempotent by id), and the run
is a turn: a connected responder answers it. The answer is AG-UI's events over SSE, each
with an ``id:`` (``<runId>:<n>``), derived from the reply's UI message chunks
(:mod:`.replychunks`), so AG-UI, the AI SDK and the hub's own socket all see one reply:

- ``RUN_STARTED``; the reply's text as ``TEXT_MESSAGE_START``/``CONTENT``/``END`` (message
  id: the reply's), reasoning as ``REASONING_*``, tool calls as ``TOOL_CALL_START``/
  ``ARGS``/``END`` and ``TOOL_CALL_RESULT``, steps as ``STEP_STARTED``/``FINISHED``; what
  AG-UI has no event for (metadata, files, sources, data parts) as ``CUSTOM`` events named
  ``ai-sdk:<chunk type>`` carrying the chunk;
- ``RUN_FINISHED`` (``outcome`` ``success``, or ``cancelled`` when the turn was stopped)
  or ``RUN_ERROR``.

AG-UI 1.0 has no way back into a run once its response is gone. ``GET /agui/{thread_id}/stream``
is one: with ``Last-Event-ID: <runId>:<n>`` of the run in flight it continues after event n,
nothing doubled (it opens with ``RUN_STARTED`` and re-opens the messages and tool calls that
were open at n, without ids, so that a client checking the event order accepts the stream);
without one, or where this node cannot continue exactly (it did not see the run begin, or
the id names another run), it sends ``RUN_STARTED``, a ``MESSAGES_SNAPSHOT`` of the thread
before the reply, then the reply from its start. ``204`` when no run is in flight.

The token (``Authorization: Bearer``) and the declared size are checked before the body is
read, the body is read within ``max_body_bytes``; a run needs ``write`` on the thread, a
re-attach ``read``. Each reader's stream is bounded as a WebSocket's outbox is
(:mod:`.ssefeed`). Errors before the stream are typed JSON (``{"error": {"code",
"message"}}``), as ``/api/chat``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from protocol import Forbidden, InvalidInput, SessionHubError, SessionNotFound, coerce_message
from protocol.records import ContextBlock

from .chat_http import ChatBody, _code, _cors, _ensure_session, _error, _grant, _refused
from .httpbody import BodyError, parse_body, read_body
from .ports import ChatHost, ChatTurn
from .replychunks import TurnChunks, turn_chunks
from .ssefeed import SseFeed

__all__ = ["AguiEncoder", "RunAgentInput", "agui_routes", "to_ui_messages"]

log = logging.getLogger("sessionhub.agui")

Event = dict[str, Any]

sse_headers = {
    "content-type": "text/event-stream",
    "cache-control": "no-cache",
    "connection": "keep-alive",
    "x-accel-buffering": "no",
}


class RunAgentInput(msgspec.Struct, kw_only=True):
    """What ``HttpAgent`` posts (AG-UI's ``RunAgentInput``); the fields the hub has no use
    for yet (``tools``, ``context``, ``forwardedProps``, ``resume``) are accepted and left."""

    threadId: str
    runId: str
    messages: list[dict[str, Any]]
    state: Any = None
    parentRunId: str | None = None
    tools: list[Any] | None = None
    context: list[Any] | None = None
    forwardedProps: Any = None
    resume: list[Any] | None = None


# -- AG-UI messages in ---------------------------------------------------------------------


def _content_parts(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if not isinstance(content, list):
        raise InvalidInput("a message's content must be a string or a list of parts")
    parts: list[dict[str, Any]] = []
    for part in content:
        if not isinstance(part, dict):
            raise InvalidInput("a content part must be an object")
        if part.get("type") == "text" and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        else:
            parts.append({"type": "data-agui-content", "data": part})  # kept as sent
    return parts


def to_ui_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """AG-UI messages as the hub's UI messages, in order. Tool results (``role: tool``) join
    the tool call of the assistant message before them; reasoning and activity messages are
    renderings of a reply the hub holds, and are not stored again."""
    out: list[dict[str, Any]] = []
    calls: dict[str, dict[str, Any]] = {}
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("id"), str):
            raise InvalidInput("every message needs a string id")
        role = m.get("role")
        if role in ("user", "system", "developer"):
            ui_role = "user" if role == "user" else "system"
            out.append({"id": m["id"], "role": ui_role, "parts": _content_parts(m.get("content", ""))})
        elif role == "assistant":
            parts = _content_parts(m.get("content") or "")
            for call in m.get("toolCalls") or []:
                function = call.get("function") if isinstance(call, dict) else None
                if not isinstance(function, dict) or not isinstance(call.get("id"), str):
                    raise InvalidInput("a tool call needs an id and a function")
                try:
                    args = json.loads(function.get("arguments") or "{}")
                except ValueError:
                    args = function.get("arguments")
                part = {
                    "type": f"tool-{function.get('name', 'tool')}",
                    "toolCallId": call["id"],
                    "state": "input-available",
                    "input": args,
                }
                calls[call["id"]] = part
                parts.append(part)
            out.append({"id": m["id"], "role": "assistant", "parts": parts})
        elif role == "tool":
            call_part = calls.get(str(m.get("toolCallId")))
            if call_part is not None:
                if m.get("error"):
                    call_part.update(state="output-error", errorText=str(m["error"]))
                else:
                    content = m.get("content")
                    try:
                        output = json.loads(content) if isinstance(content, str) else content
                    except ValueError:
                        output = content
                    call_part.update(state="output-available", output=output)
        elif role in ("reasoning", "activity"):
            continue
        else:
            raise InvalidInput(f"unknown message role {role!r}")
    return out


def to_agui_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The thread's stored UI messages as AG-UI messages (for ``MESSAGES_SNAPSHOT``)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        text = "".join(p.get("text", "") for p in m.get("parts", []) if p.get("type") == "text")
        role = m.get("role")
        if role == "assistant":
            message: dict[str, Any] = {"id": m["id"], "role": "assistant", "content": text}
            calls, results = [], []
            for p in m.get("parts", []):
                name = _tool_name(p)
                if name is None:
                    continue
                calls.append(
                    {
                        "id": p.get("toolCallId", ""),
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps(p.get("input"))},
                    }
                )
                if p.get("state") in ("output-available", "output-error"):
                    results.append(
                        {
                            "id": f"{p.get('toolCallId')}-result",
                            "role": "tool",
                            "toolCallId": p.get("toolCallId", ""),
                            "content": _result_content(p),
                        }
                    )
            if calls:
                message["toolCalls"] = calls
            out.append(message)
            out += results
        elif role == "system":
            out.append({"id": m["id"], "role": "system", "content": text})
        else:
            out.append({"id": m["id"], "role": "user", "content": text})
    return out


def _tool_name(part: dict[str, Any]) -> str | None:
    kind = str(part.get("type", ""))
    if kind == "dynamic-tool":
        return str(part.get("toolName", "tool"))
    return kind[len("tool-") :] if kind.startswith("tool-") else None


def _result_content(part: dict[str, Any]) -> str:
    if part.get("state") == "output-error":
        return str(part.get("errorText", ""))
    output = part.get("output")
    return output if isinstance(output, str) else json.dumps(output)


# -- state: the session's context blocks ------------------------------------------------------


def _plain(block: ContextBlock) -> bool:
    return not block.is_skill and not block.is_searchable


async def blocks_state(hub: ChatHost, session_id: str) -> dict[str, Any]:
    """The run's AG-UI state: ``{"contextBlocks": {label: content}}`` of the session's plain
    blocks (skills and searchable blocks are keyed stores, not one text: left out)."""
    blocks = await hub.manager.get_session(session_id).get_context_blocks()
    return {"contextBlocks": {b.label: b.content for b in blocks if _plain(b)}}


async def apply_state(hub: ChatHost, session_id: str, state: Any) -> None:
    """A run's input ``state``: the ``contextBlocks`` it changes are written, all or none
    (each is checked first; a write the engine refuses puts back the ones before it)."""
    if state is None:
        return
    wanted = state.get("contextBlocks") if isinstance(state, dict) else None
    if wanted is None:
        return
    if not isinstance(wanted, dict) or not all(isinstance(v, str) for v in wanted.values()):
        raise InvalidInput("state.contextBlocks must map block labels to their text")
    session = hub.manager.get_session(session_id)
    blocks = {b.label: b for b in await session.get_context_blocks()}
    changes: dict[str, str] = {}
    for label, content in wanted.items():
        block = blocks.get(label)
        if block is None:
            raise InvalidInput(f"state.contextBlocks: no block {label!r} in this session")
        if block.content == content:
            continue
        if not block.writable or not _plain(block):
            raise InvalidInput(f"state.contextBlocks: block {label!r} is not writable text")
        changes[label] = content
    done: list[str] = []
    try:
        for label, content in changes.items():
            await session.replace_context_block(label, content)
            done.append(label)
    except SessionHubError:
        for label in done:
            with contextlib.suppress(SessionHubError):
                await session.replace_context_block(label, blocks[label].content)
        raise


# -- UI chunks out as AG-UI events -----------------------------------------------------------


class AguiEncoder:
    """UI message stream chunks (one reply's, in order) as AG-UI events. It tracks what is
    open (text, reasoning, tool calls, steps) so that the run never finishes with anything
    open, and so that a continuation can re-open what was open at any event."""

    def __init__(self, thread_id: str, run_id: str, reply_id: str) -> None:
        self.thread_id, self.run_id, self.reply_id = thread_id, run_id, reply_id
        self.text = False  # the reply's text message is open
        self.reasoning: str | None = None  # the open reasoning message's id
        self.tools: dict[str, str] = {}  # open tool calls: id -> name
        self.step: str | None = None
        self.steps = 0
        self.ended = False

    def started(self) -> Event:
        return {"type": "RUN_STARTED", "threadId": self.thread_id, "runId": self.run_id}

    def reopen(self) -> list[Event]:
        """Events that open again what is open now (for a stream that continues here)."""
        events: list[Event] = []
        if self.step is not None:
            events.append({"type": "STEP_STARTED", "stepName": self.step})
        if self.text:
            events.append({"type": "TEXT_MESSAGE_START", "messageId": self.reply_id, "role": "assistant"})
        if self.reasoning is not None:
            events.append({"type": "REASONING_START", "messageId": self.reasoning})
            events.append(
                {"type": "REASONING_MESSAGE_START", "messageId": self.reasoning, "role": "reasoning"}
            )
        for call, name in self.tools.items():
            events.append(
                {
                    "type": "TOOL_CALL_START",
                    "toolCallId": call,
                    "toolCallName": name,
                    "parentMessageId": self.reply_id,
                }
            )
        return events

    def _close(self) -> list[Event]:
        events: list[Event] = []
        if self.text:
            self.text = False
            events.append({"type": "TEXT_MESSAGE_END", "messageId": self.reply_id})
        if self.reasoning is not None:
            events.append({"type": "REASONING_MESSAGE_END", "messageId": self.reasoning})
            events.append({"type": "REASONING_END", "messageId": self.reasoning})
            self.reasoning = None
        for call in list(self.tools):
            events.append({"type": "TOOL_CALL_END", "toolCallId": call})
        self.tools.clear()
        if self.step is not None:
            events.append({"type": "STEP_FINISHED", "stepName": self.step})
            self.step = None
        return events

    def chunk(self, chunk: dict[str, Any]) -> list[Event]:
        if self.ended:
            return []
        kind = chunk.get("type")
        match kind:
            case "start":
                return []
            case "text-start":
                if self.text:
                    return []
                self.text = True
                return [{"type": "TEXT_MESSAGE_START", "messageId": self.reply_id, "role": "assistant"}]
            case "text-delta":
                delta = chunk.get("delta") or ""
                if not delta:
                    return []
                opened = self.chunk({"type": "text-start"}) if not self.text else []
                return [*opened, {"type": "TEXT_MESSAGE_CONTENT", "messageId": self.reply_id, "delta": delta}]
            case "text-end":
                if not self.text:
                    return []
                self.text = False
                return [{"type": "TEXT_MESSAGE_END", "messageId": self.reply_id}]
            case "reasoning-start":
                if self.reasoning is not None:
                    return []
                self.reasoning = f"{self.reply_id}-{chunk.get('id', 'reasoning')}"
                return [
                    {"type": "REASONING_START", "messageId": self.reasoning},
                    {"type": "REASONING_MESSAGE_START", "messageId": self.reasoning, "role": "reasoning"},
                ]
            case "reasoning-delta":
                delta = chunk.get("delta") or ""
                if not delta or self.reasoning is None:
                    return []
                return [{"type": "REASONING_MESSAGE_CONTENT", "messageId": self.reasoning, "delta": delta}]
            case "reasoning-end":
                if self.reasoning is None:
                    return []
                rid, self.reasoning = self.reasoning, None
                return [
                    {"type": "REASONING_MESSAGE_END", "messageId": rid},
                    {"type": "REASONING_END", "messageId": rid},
                ]
            case "tool-input-start":
                call = str(chunk.get("toolCallId", ""))
                self.tools[call] = str(chunk.get("toolName", "tool"))
                return [
                    {
                        "type": "TOOL_CALL_START",
                        "toolCallId": call,
                        "toolCallName": self.tools[call],
                        "parentMessageId": self.reply_id,
                    }
                ]
            case "tool-input-available":
                call = str(chunk.get("toolCallId", ""))
                events = [] if call in self.tools else self.chunk({**chunk, "type": "tool-input-start"})
                self.tools.pop(call, None)
                return [
                    *events,
                    {"type": "TOOL_CALL_ARGS", "toolCallId": call, "delta": json.dumps(chunk.get("input"))},
                    {"type": "TOOL_CALL_END", "toolCallId": call},
                ]
            case "tool-output-available" | "tool-output-error":
                call = str(chunk.get("toolCallId", ""))
                content = (
                    str(chunk.get("errorText", ""))
                    if kind == "tool-output-error"
                    else _result_content({"output": chunk.get("output")})
                )
                return [
                    {
                        "type": "TOOL_CALL_RESULT",
                        "messageId": f"{call}-result",
                        "toolCallId": call,
                        "content": content,
                        "role": "tool",
                    }
                ]
            case "start-step":
                events = [{"type": "STEP_FINISHED", "stepName": self.step}] if self.step else []
                self.steps += 1
                self.step = f"step-{self.steps}"
                return [*events, {"type": "STEP_STARTED", "stepName": self.step}]
            case "finish-step":
                if self.step is None:
                    return []
                step, self.step = self.step, None
                return [{"type": "STEP_FINISHED", "stepName": step}]
            case "finish" | "abort":
                self.ended = True
                outcome = {"type": "success"} if kind == "finish" else {"type": "cancelled"}
                return [
                    *self._close(),
                    {
                        "type": "RUN_FINISHED",
                        "threadId": self.thread_id,
                        "runId": self.run_id,
                        "outcome": outcome,
                    },
                ]
            case "error":
                self.ended = True
                return [{"type": "RUN_ERROR", "message": str(chunk.get("errorText") or "the run failed")}]
            case _:
                # AG-UI has no event for it: carried whole, so nothing of the reply is lost.
                return [{"type": "CUSTOM", "name": f"ai-sdk:{kind}", "value": chunk}]


# -- a run's events on this node -------------------------------------------------------------


class AguiRun:
    """One turn's AG-UI events on this node, numbered from the run's first, rendered once
    for all its readers (each reader's stream is its own :class:`SseFeed`)."""

    def __init__(self, hub: ChatHost, turn: ChatTurn, run_id: str, state: dict[str, Any] | None) -> None:
        self.hub, self.turn, self.run_id = hub, turn, run_id
        self.chunks: TurnChunks = turn_chunks(hub, turn)
        self.encoder = AguiEncoder(turn.session_id, run_id, turn.reply_id)
        self.events: list[str] = [json.dumps(self.encoder.started(), separators=(",", ":"))]
        self.reopen: list[list[Event]] = [[]]  # per event: what is open after it
        if state is not None:
            self._add({"type": "STATE_SNAPSHOT", "snapshot": state}, [])
        self.ending: asyncio.Task[None] | None = None
        self.consumed = 0  # UI chunks rendered so far
        self.feeds: list[SseFeed] = []
        self.done = False
        self.chunks.listeners.append(self)
        self.deliver(0, self.chunks.done)

    def _add(self, event: Event, reopen: list[Event]) -> None:
        self.events.append(json.dumps(event, separators=(",", ":")))
        self.reopen.append(reopen)

    def deliver(self, first: int, last: bool) -> None:
        if self.ending is not None:
            return
        start = len(self.events)
        items = self.chunks.items
        final: list[Event] = []
        for index in range(self.consumed, len(items)):
            for event in self.encoder.chunk(items[index]):
                if event["type"] in ("RUN_FINISHED", "RUN_ERROR"):
                    final.append(event)  # after the state, below
                else:
                    self._add(event, self.encoder.reopen())
        self.consumed = len(items)
        if last and not final:  # a turn that ended with no final chunk
            final = [e for e in self.encoder.chunk({"type": "error", "errorText": "the run ended"}) if e]
        self._push(start)
        if last or final:
            # The blocks as the run left them, then its end: read from the store, so a task.
            self.ending = asyncio.get_running_loop().create_task(self._end(final))

    async def _end(self, final: list[Event]) -> None:
        start = len(self.events)
        try:
            self._add(
                {"type": "STATE_SNAPSHOT", "snapshot": await blocks_state(self.hub, self.turn.session_id)}, []
            )
        except Exception:  # the store or the session went: the run still ends
            log.info("the AG-UI run %s ended without its state", self.run_id, exc_info=True)
        for event in final:
            self._add(event, [])
        self.done = True
        with contextlib.suppress(ValueError):
            self.chunks.listeners.remove(self)
        if _RUNS.get(id(self.turn)) is self:
            del _RUNS[id(self.turn)]
        self._push(start)

    def _push(self, start: int) -> None:
        if len(self.events) > start or self.done:
            text = self.sse(start, len(self.events))
            for feed in list(self.feeds):
                feed.push(text, last=self.done)

    def sse(self, first: int, end: int) -> str:
        return "".join(f"id: {self.run_id}:{n}\ndata: {self.events[n]}\n\n" for n in range(first, end))

    def join(
        self, headers: dict[str, str], after: int | None, history: list[dict[str, Any]] | None
    ) -> SseFeed:
        """A new reader: after event ``after`` (a continuation), or from the start with the
        thread's ``history`` as a ``MESSAGES_SNAPSHOT`` first."""
        config = self.hub.config
        feed = SseFeed(
            headers={**sse_headers, **headers},
            max_bytes=config.outbox_bytes,
            send_timeout=config.send_timeout,
            keepalive=config.chat_keepalive,
            held=self.hub.sse_held,
            on_drop=lambda reason: self.hub.metrics.sse_dropped.labels(reason).inc(),
            on_close=lambda: self.leave(feed),
        )
        if after is None:
            text = self.sse(0, 1)
            if history is not None:
                snapshot = {"type": "MESSAGES_SNAPSHOT", "messages": to_agui_messages(history)}
                text += f"data: {json.dumps(snapshot, separators=(',', ':'))}\n\n"
            if self.chunks.whole:
                text += self.sse(1, len(self.events))
            else:
                # Not seen from its start here: the reply so far, rendered afresh, then live.
                fresh = AguiEncoder(self.turn.session_id, self.run_id, self.turn.reply_id)
                replay, _ = self.chunks.replay_items()
                for item in replay:
                    for event in fresh.chunk(item):
                        text += f"data: {json.dumps(event, separators=(',', ':'))}\n\n"
        else:
            text = f"data: {self.events[0]}\n\n"  # the verifier wants the run opened first
            for event in self.reopen[after]:
                text += f"data: {json.dumps(event, separators=(',', ':'))}\n\n"
            text += self.sse(after + 1, len(self.events))
        feed.push(text, last=self.done)
        if not self.done:
            self.feeds.append(feed)
        return feed

    def leave(self, feed: SseFeed) -> None:
        if feed in self.feeds:
            self.feeds.remove(feed)


#: id(turn) -> its run on this node (the entry holds the turn, so the id is not reused).
_RUNS: dict[int, AguiRun] = {}


def agui_run(
    hub: ChatHost, turn: ChatTurn, run_id: str | None = None, state: dict[str, Any] | None = None
) -> AguiRun:
    run = _RUNS.get(id(turn))
    if run is None or run.turn is not turn:
        run = _RUNS[id(turn)] = AguiRun(hub, turn, run_id or turn.reply_id, state)
    return run


# -- HTTP --------------------------------------------------------------------------------------


def _check(grant: Any, hub: ChatHost, op: str, session_id: str) -> None:
    if hub.config.auth_secret is not None and (grant is None or not grant.allows(op, session_id)):
        raise Forbidden("forbidden")


async def _post(request: Request) -> Response | SseFeed:
    hub: ChatHost = request.app.state.hub
    cors = _cors(request, hub)
    if cors is None:
        return _error("forbidden", "origin not allowed")
    if hub.closing:
        return _error("unavailable", "the hub is shutting down", cors)
    try:
        grant = _grant(request, hub)
    except Forbidden:
        return _refused(request, cors)
    try:
        data = await read_body(request.receive, request.headers, hub.config.max_body_bytes)
        body: RunAgentInput = parse_body(data, RunAgentInput)
    except BodyError as exc:
        return _error(exc.code, str(exc), cors, exc.status)
    try:
        _check(grant, hub, "append_all", body.threadId)
        messages = [coerce_message(m) for m in to_ui_messages(body.messages)]
        if not messages:
            raise InvalidInput("`messages` is empty: nothing to answer")
        chat = ChatBody(id=body.threadId, messages=[{"parts": m.parts} for m in messages])
        await _ensure_session(hub, grant, chat)
        await apply_state(hub, body.threadId, body.state)
        await hub.manager.append_all(body.threadId, messages, None)
        turn = await hub.turns.start(body.threadId, messages[-1].id, "submit-message")
        state = await blocks_state(hub, body.threadId)
    except Forbidden:
        return _refused(request, cors)
    except SessionHubError as exc:
        return _error(_code(exc), str(exc), cors)
    return agui_run(hub, turn, body.runId, state).join(cors, None, None)


def _last_event(request: Request, run: AguiRun) -> int | None:
    """The event of this run the reader has, if this node can continue after it exactly."""
    value = request.headers.get("last-event-id", "")
    run_id, _, n = value.rpartition(":")
    if run_id != run.run_id or not n.isdigit() or not run.chunks.whole:
        return None
    index = int(n)
    return index if index < len(run.events) else None


async def _stream(request: Request) -> Response | SseFeed:
    hub: ChatHost = request.app.state.hub
    cors = _cors(request, hub)
    if cors is None:
        return _error("forbidden", "origin not allowed")
    thread = request.path_params["thread_id"]
    try:
        _check(_grant(request, hub), hub, "get_history", thread)
    except Forbidden:
        return _refused(request, cors)
    try:
        turn = await hub.turns.find(thread)
    except SessionNotFound:
        turn = None
    except SessionHubError as exc:
        return _error(_code(exc), str(exc), cors)
    if turn is None:
        return Response(status_code=204, headers=cors)
    try:
        state = await blocks_state(hub, thread)
    except SessionHubError as exc:
        return _error(_code(exc), str(exc), cors)
    run = agui_run(hub, turn, None, state)
    after = _last_event(request, run)
    if after is not None:
        return run.join(cors, after, None)
    try:
        history = [m.to_dict() for m in await hub.manager.get_history(thread) if m.id != turn.reply_id]
    except SessionHubError as exc:
        return _error(_code(exc), str(exc), cors)
    return run.join(cors, None, history)


async def _preflight(request: Request) -> Response:
    hub: ChatHost = request.app.state.hub
    cors = _cors(request, hub)
    if cors is None:
        return _error("forbidden", "origin not allowed")
    return Response(
        status_code=204,
        headers={**cors, "access-control-allow-headers": "authorization, content-type, last-event-id"},
    )


def agui_routes() -> list[BaseRoute]:
    return [
        Route("/agui", _post, methods=["POST"]),
        Route("/agui", _preflight, methods=["OPTIONS"]),
        Route("/agui/{thread_id}/stream", _stream, methods=["GET"]),
        Route("/agui/{thread_id}/stream", _preflight, methods=["OPTIONS"]),
    ]
