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
(:mod:`.sse`). Errors before the stream are typed JSON (``{"error": {"code",
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

from protocol import Forbidden, InvalidInput, SessionHubError, coerce_message
from protocol.records import ContextBlock

from .aguievents import AguiEncoder, Event, to_agui_messages, to_ui_messages
from .body import BodyError, parse_body, read_body
from .caller import Caller, caller, cors_headers
from .chats import ChatBody, ensure_session, error_code, in_flight, json_error, refused
from .port import Adapter, ChatHost, ChatTurn, host_of
from .replychunks import TurnChunks, turn_chunks
from .sse import SseFeed

__all__ = ["AguiRun", "RunAgentInput", "adapter", "apply_state", "blocks_state"]

log = logging.getLogger("sessionhub.agui")

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


def _cors(request: Request, hub: ChatHost) -> dict[str, str] | None:
    return cors_headers(request.headers, hub.config)


async def _post(request: Request) -> Response | SseFeed:
    hub = host_of(request)
    cors = _cors(request, hub)
    if cors is None:
        return json_error("forbidden", "origin not allowed")
    if hub.closing:
        return json_error("unavailable", "the hub is shutting down", cors)
    # The token and the declared size first, as every HTTP door (docs/security.md).
    try:
        who: Caller = caller(request.headers, hub.config)
    except Forbidden:
        return refused(request.headers, cors)
    try:
        data = await read_body(request.receive, request.headers, hub.config.max_body_bytes)
        body: RunAgentInput = parse_body(data, RunAgentInput)
    except BodyError as exc:
        return json_error(exc.code, str(exc), cors, exc.status)
    try:
        who.check("append_all", body.threadId)
        messages = [coerce_message(m) for m in to_ui_messages(body.messages)]
        if not messages:
            raise InvalidInput("`messages` is empty: nothing to answer")
        chat = ChatBody(id=body.threadId, messages=[{"parts": m.parts} for m in messages])
        await ensure_session(hub, who, chat, source="agui")
        await apply_state(hub, body.threadId, body.state)
        await hub.manager.append_all(body.threadId, messages, None)
        turn = await hub.turns.start(body.threadId, messages[-1].id, "submit-message")
        state = await blocks_state(hub, body.threadId)
    except Forbidden:
        return refused(request.headers, cors)
    except SessionHubError as exc:
        return json_error(error_code(exc), str(exc), cors)
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
    hub = host_of(request)
    cors = _cors(request, hub)
    if cors is None:
        return json_error("forbidden", "origin not allowed")
    thread = request.path_params["thread_id"]
    turn = await in_flight(request, hub, cors, thread)
    if isinstance(turn, Response):
        return turn
    try:
        state = await blocks_state(hub, thread)
    except SessionHubError as exc:
        return json_error(error_code(exc), str(exc), cors)
    run = agui_run(hub, turn, None, state)
    after = _last_event(request, run)
    if after is not None:
        return run.join(cors, after, None)
    try:
        history = [m.to_dict() for m in await hub.manager.get_history(thread) if m.id != turn.reply_id]
    except SessionHubError as exc:
        return json_error(error_code(exc), str(exc), cors)
    return run.join(cors, None, history)


async def _preflight(request: Request) -> Response:
    cors = _cors(request, host_of(request))
    if cors is None:
        return json_error("forbidden", "origin not allowed")
    return Response(
        status_code=204,
        headers={**cors, "access-control-allow-headers": "authorization, content-type, last-event-id"},
    )


#: The adapter's paths (a typed 405 answers any other method on them).
PATHS = ["/agui", "/agui/{thread_id}/stream"]


def adapter() -> Adapter:
    """AG-UI 1.0 over HTTP, as ``create_app`` mounts it."""
    run, stream = PATHS
    routes: list[BaseRoute] = [Route(run, _post, methods=["POST"]), Route(stream, _stream, methods=["GET"])]
    routes += [Route(path, _preflight, methods=["OPTIONS"]) for path in PATHS]
    return Adapter("agui", routes, PATHS)
