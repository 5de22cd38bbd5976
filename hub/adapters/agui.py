"""AG-UI 1.0 at ``POST /agui``, ``GET /agui/{thread_id}/stream`` and ``POST
/agui/{thread_id}/stop``.

``new HttpAgent({ url: "http://hub/agui" })`` (``@ag-ui/client``, and so CopilotKit) posts a
``RunAgentInput``: its ``threadId`` is the session (created if new, with ``admin``), its
messages are appended where the hub does not hold them yet (idempotent by id), its
``state`` is applied to the session's context blocks (:mod:`.aguistate`: a patch against
the snapshot, all or none; a bad one is a ``RUN_ERROR`` with ``code: "invalid"`` and nothing
is written), and the run is a turn: a connected responder answers it. The answer is
AG-UI's events over SSE, each with an ``id:`` (:mod:`.aguirun`: ``<seq>:<n>:<tag>``),
derived from the reply's UI message chunks (:mod:`.replychunks`), so AG-UI, the AI SDK and
the hub's own socket all see one reply:

- ``RUN_STARTED``, ``STATE_SNAPSHOT``; the reply's text as ``TEXT_MESSAGE_START``/
  ``CONTENT``/``END`` (message id: the reply's), reasoning as ``REASONING_*``, tool calls as
  ``TOOL_CALL_START``/``ARGS``/``END`` and ``TOOL_CALL_RESULT``, steps as
  ``STEP_STARTED``/``FINISHED``, block changes as ``STATE_DELTA``; what AG-UI has no event
  for (metadata, files, sources, data parts) as ``CUSTOM`` events named ``ai-sdk:<chunk
  type>`` carrying the chunk;
- ``STATE_SNAPSHOT``, then ``RUN_FINISHED`` (``outcome`` ``success``, or ``cancelled`` when
  the turn was stopped) or ``RUN_ERROR``.

Closing the POST's response (``HttpAgent.abortRun()``, a reload) does not stop the run: the
reply goes on and is stored, and the reader can come back. ``POST /agui/{thread_id}/stop``
stops it (``write`` on the thread), as ``/api/chat/{id}/stop`` does; the run ends
``RUN_FINISHED`` with ``outcome: {type: "cancelled"}``.

AG-UI 1.0 has no way back into a run once its response is gone. ``GET
/agui/{thread_id}/stream`` is one: with the ``Last-Event-ID`` of a run this node renders it
continues after that event, nothing doubled (it opens with ``RUN_STARTED`` and re-opens the
messages and tool calls that were open then, without ids, so that a client checking the
event order accepts the stream); without one, or where this node cannot continue exactly,
it sends ``RUN_STARTED``, a ``MESSAGES_SNAPSHOT`` of the thread before the reply, then the
reply from its start. ``204`` when no run is in flight. With ``?follow=1`` the stream stays
and carries the thread's later runs too (:mod:`.aguifollow`).

The token (``Authorization: Bearer``) and the declared size are checked before the body is
read, the body is read within ``max_body_bytes``; a run and a stop need ``write`` on the
thread, a re-attach ``read``. Each reader's stream is bounded as a WebSocket's outbox is
(:mod:`.sse`). Errors before the stream are typed JSON (``{"error": {"code",
"message"}}``), as ``/api/chat``'s.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from protocol import Forbidden, InvalidInput, SessionHubError, coerce_message

from .aguievents import to_ui_messages
from .aguifollow import SLOW, Follower, run_error
from .aguirun import AguiRun, agui_run, parse_id, posting
from .aguistate import apply_state, blocks_state, undo_state
from .body import BodyError, parse_body, read_body
from .caller import Caller, caller, cors_headers
from .chats import ChatBody, ensure_session, error_code, in_flight, json_error, refused
from .port import Adapter, ChatHost, host_of
from .sse import SseFeed

__all__ = ["PATHS", "RunAgentInput", "adapter"]

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


# -- HTTP --------------------------------------------------------------------------------------


def _cors(request: Request, hub: ChatHost) -> dict[str, str] | None:
    return cors_headers(request.headers, hub.config)


def _feed(
    hub: ChatHost, cors: dict[str, str], on_close: Callable[[], None], farewell: str | None = None
) -> SseFeed:
    config = hub.config
    return SseFeed(
        headers={**sse_headers, **cors},
        max_bytes=config.outbox_bytes,
        send_timeout=config.send_timeout,
        keepalive=config.chat_keepalive,
        held=hub.sse_held,
        on_drop=lambda reason: hub.metrics.sse_dropped.labels(reason).inc(),
        on_close=on_close,
        farewell=farewell,
    )


def _reader(
    hub: ChatHost, run: AguiRun, cors: dict[str, str], after: int | None, history: list[dict[str, Any]] | None
) -> SseFeed:
    feed = _feed(hub, cors, lambda: run.leave(feed))
    run.attach(feed, after, history)
    return feed


def _refused_run(hub: ChatHost, cors: dict[str, str], exc: SessionHubError) -> SseFeed:
    """A run refused once its stream could begin (its state): AG-UI's own ``RUN_ERROR``."""
    feed = _feed(hub, cors, lambda: None)
    feed.push(run_error(error_code(exc), str(exc)), last=True)
    return feed


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
    except Forbidden:
        return refused(request.headers, cors)
    except SessionHubError as exc:
        return json_error(error_code(exc), str(exc), cors)
    try:
        before = await blocks_state(hub, body.threadId)
        applied = await apply_state(hub, body.threadId, body.state, before)
    except SessionHubError as exc:
        return _refused_run(hub, cors, exc)
    try:
        await hub.manager.append_all(body.threadId, messages, None)
        with posting(hub, body.threadId, body.runId):
            turn = await hub.turns.start(body.threadId, messages[-1].id, "submit-message")
            run = await agui_run(hub, turn, body.runId)
    except SessionHubError as exc:
        await undo_state(hub, body.threadId, before, applied)  # a refused run writes no state
        return json_error(error_code(exc), str(exc), cors)
    return _reader(hub, run, cors, None, None)


def _follows(request: Request) -> bool:
    return request.query_params.get("follow", "").lower() in ("1", "true", "yes")


async def _stream(request: Request) -> Response | SseFeed:
    hub = host_of(request)
    cors = _cors(request, hub)
    if cors is None:
        return json_error("forbidden", "origin not allowed")
    thread = request.path_params["thread_id"]
    last = request.headers.get("last-event-id")
    if _follows(request):
        return _follow(request, hub, cors, thread, last)
    turn = await in_flight(request, hub, cors, thread)
    if isinstance(turn, Response):
        return turn
    try:
        run = await agui_run(hub, turn)
        named = parse_id(last)
        if named is not None and run.continues(*named):
            return _reader(hub, run, cors, named[1], None)
        history = [m.to_dict() for m in await hub.manager.get_history(thread) if m.id != turn.reply_id]
    except SessionHubError as exc:
        return json_error(error_code(exc), str(exc), cors)
    return _reader(hub, run, cors, None, history)


def _follow(
    request: Request, hub: ChatHost, cors: dict[str, str], thread: str, last: str | None
) -> Response | SseFeed:
    try:
        who = caller(request.headers, hub.config)
        who.check("get_history", thread)
    except Forbidden:
        return refused(request.headers, cors)
    if hub.closing:
        return json_error("unavailable", "the hub is shutting down", cors)

    def close() -> None:
        follower.leave()
        if follower.task is not None:
            follower.task.cancel()

    feed = _feed(hub, cors, close, farewell=SLOW)
    follower = Follower(hub, thread, feed, None if who.grant is None else who.grant.expires_at)
    follower.start(last)
    return feed


async def _stop(request: Request) -> Response:
    """``POST /agui/{thread_id}/stop``: stop the run in flight (closing its stream does not)."""
    hub = host_of(request)
    cors = _cors(request, hub)
    if cors is None:
        return json_error("forbidden", "origin not allowed")
    thread = request.path_params["thread_id"]
    try:
        caller(request.headers, hub.config).check("stop_turn", thread)
        await hub.session(thread)
        stopped = await hub.turns.stop(thread, None, "stopped by the user")
    except Forbidden:
        return refused(request.headers, cors)
    except SessionHubError as exc:
        return json_error(error_code(exc), str(exc), cors)
    return JSONResponse(stopped, headers=cors)


async def _preflight(request: Request) -> Response:
    cors = _cors(request, host_of(request))
    if cors is None:
        return json_error("forbidden", "origin not allowed")
    return Response(
        status_code=204,
        headers={**cors, "access-control-allow-headers": "authorization, content-type, last-event-id"},
    )


#: The adapter's paths (a typed 405 answers any other method on them).
PATHS = ["/agui", "/agui/{thread_id}/stream", "/agui/{thread_id}/stop"]


def adapter() -> Adapter:
    """AG-UI 1.0 over HTTP, as ``create_app`` mounts it."""
    run, stream, stop = PATHS
    routes: list[BaseRoute] = [
        Route(run, _post, methods=["POST"]),
        Route(stream, _stream, methods=["GET"]),
        Route(stop, _stop, methods=["POST"]),
    ]
    routes += [Route(path, _preflight, methods=["OPTIONS"]) for path in PATHS]
    return Adapter("agui", routes, PATHS)
