"""The hub's Model Context Protocol endpoint: streamable HTTP at ``/mcp``, built on the
official ``mcp`` SDK (an optional extra: ``pip install "sessionhub[mcp]"``).

Tools: the context tools of the hub's sessions (``set_context``, ``load_context``,
``unload_context``, ``search_context``) and the manager's ``session_search``, with the
original's names, descriptions and results, each taking a ``session_id``; plus
``list_sessions``, ``get_history``, ``append_message`` and ``search``. Resources: each
session's frozen system prompt and its context blocks.

Everything runs through the hub's own :class:`~hub.SessionManager`, so a write made here is
an event for every WebSocket subscriber. With an auth secret, the bearer token of each HTTP
request is verified as the WebSocket's is, and each call needs the scope that the
equivalent WebSocket operation needs (:data:`hub.auth.OP_LEVELS`).

The server is stateless (a fresh MCP transport per HTTP request): every request is
authorized on its own token, and no per-client state outlives a request.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

from protocol import Forbidden, InvalidInput, Message, SessionHubError

from ..auth import Grant, verify_token
from ..store.base import LATEST
from ..tools import Tool, dispatch
from .httpbody import BodyError, parse_body, read_body

if TYPE_CHECKING:
    import mcp_types as types
    from mcp.server.context import ServerRequestContext
    from mcp.server.lowlevel import Server
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
    from starlette.responses import Response
    from starlette.routing import Route
    from starlette.types import Message as AsgiMessage
    from starlette.types import Receive, Scope, Send

    from .ports import Served

__all__ = ["URI_PREFIX", "McpEndpoint", "create_endpoint"]

log = logging.getLogger("sessionhub.mcp")

URI_PREFIX = "sessionhub://sessions/"
#: A session id that is never registered (registered ids are UUIDs): the context tools'
#: names and descriptions come from the manager's templates, which every session shares,
#: read through this one.
_PROBE = "_sessionhub_mcp_probe"
#: How many sessions (most recently updated first) ``resources/list`` names.
RESOURCE_SESSIONS = 100

_SESSION_ID = {"type": "string", "description": "The id of the hub session to act on."}


@dataclass(frozen=True)
class _Access:
    """Who is calling: ``grant`` is None for a missing or bad token (refused) when auth is on."""

    auth: bool
    grant: Grant | None

    def check(self, op: str, session_id: str | None) -> None:
        if self.auth and (self.grant is None or not self.grant.allows(op, session_id)):
            raise Forbidden("forbidden")


_ACCESS: contextvars.ContextVar[_Access] = contextvars.ContextVar("sessionhub_mcp_access")


def create_endpoint() -> McpEndpoint | None:
    """The endpoint, or None (with one log line) when the ``mcp`` package is missing."""
    try:
        import mcp.server.lowlevel  # noqa: F401
    except ImportError:
        log.warning('no /mcp endpoint: the mcp package is not installed (pip install "sessionhub[mcp]")')
        return None
    return McpEndpoint()


def _bearer(scope: Scope) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == b"authorization":
            header = value.decode("latin-1")
            return header[7:].strip() if header[:7].lower() == "bearer " else None
    return None


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return str(value.decode("latin-1"))
    return None


def _text_of(message: Message) -> str:
    pieces: list[str] = []
    for part in message.parts:
        kind = part.get("type")
        if kind in ("text", "reasoning") and isinstance(part.get("text"), str):
            pieces.append(part["text"] if kind == "text" else f"(reasoning) {part['text']}")
        elif isinstance(kind, str) and (kind.startswith("tool-") or kind == "dynamic-tool"):
            name = part.get("toolName") if kind == "dynamic-tool" else kind[len("tool-") :]
            call = f"[tool {name}] input: {json.dumps(part.get('input'), ensure_ascii=False)}"
            if "output" in part:
                output = part["output"]
                shown = output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)
                call += f" output: {shown}"
            pieces.append(call)
    return "\n".join(pieces)


def _history_text(messages: list[Message]) -> str:
    if not messages:
        return "No messages."
    return "\n\n".join(f"[{m.role}] ({m.id}) {_text_of(m)}" for m in messages)


def _string(arguments: dict[str, Any], name: str, *, required: bool = True) -> str | None:
    value = arguments.get(name)
    if value is None:
        if required:
            raise InvalidInput(f'missing required argument "{name}"')
        return None
    if not isinstance(value, str):
        raise InvalidInput(f'argument "{name}" must be a string')
    return value


#: JSON-RPC's codes for a body that is not JSON, and for one refused as a request.
_PARSE_ERROR, _INVALID_REQUEST = -32700, -32600


async def _bounded(scope: Scope, receive: Receive, limit: int) -> Receive:
    """Read the body within ``limit`` (:mod:`.httpbody`), parse it by the socket's rules
    (the SDK's own parser would meet what the socket refuses), and hand the SDK a
    ``receive`` that replays it."""
    from starlette.datastructures import Headers

    # A content type required: the SDK would refuse its absence in plain text.
    data = await read_body(receive, Headers(scope=scope), limit, type_required=True)
    parse_body(data)
    replayed = False

    async def replay() -> AsgiMessage:
        nonlocal replayed
        if replayed:
            return await receive()
        replayed = True
        return {"type": "http.request", "body": data, "more_body": False}

    return replay


def _rpc_error(exc: BodyError) -> Response:
    """A refused request in JSON-RPC's form, the hub's code in ``data``."""
    from starlette.responses import JSONResponse

    rpc = _PARSE_ERROR if exc.status == 400 else _INVALID_REQUEST
    error = {"code": rpc, "message": str(exc), "data": {"code": exc.code}}
    headers = {"www-authenticate": "Bearer"} if exc.status == 401 else None
    return JSONResponse({"jsonrpc": "2.0", "id": None, "error": error}, exc.status, headers=headers)


class _AsgiApp:
    def __init__(self, endpoint: McpEndpoint) -> None:
        self.endpoint = endpoint

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.endpoint._asgi(scope, receive, send)


class McpEndpoint:
    """The MCP server of one hub app. ``run(hub)`` is entered in the app's lifespan (the
    SDK's session manager runs once per lifespan); ``route()`` is mounted at ``/mcp``."""

    def __init__(self) -> None:
        self._hub: Served | None = None
        self._manager: StreamableHTTPSessionManager | None = None
        self._server: Server[Any] = self._build_server()

    # -- wiring --------------------------------------------------------------------------
    def route(self) -> Route:
        from starlette.routing import Route

        # An object, not a method: Starlette then hands it the raw ASGI call, every method.
        return Route("/mcp", endpoint=_AsgiApp(self), name="mcp")

    @contextlib.asynccontextmanager
    async def run(self, hub: Served) -> AsyncIterator[None]:
        from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

        manager = StreamableHTTPSessionManager(
            app=self._server,
            stateless=True,
            json_response=True,
            max_request_body_size=hub.config.max_body_bytes,
        )
        async with manager.run():
            self._hub, self._manager = hub, manager
            try:
                yield
            finally:
                self._hub = self._manager = None

    async def _asgi(self, scope: Scope, receive: Receive, send: Send) -> None:
        from starlette.responses import PlainTextResponse

        hub, manager = self._hub, self._manager
        if hub is None or manager is None or hub.closing:
            await PlainTextResponse("server shutting down", status_code=503)(scope, receive, send)
            return
        origin = _header(scope, b"origin")
        allowed = hub.config.allowed_origins
        # A browser page from elsewhere must not drive the hub (the WebSocket's rule).
        if (
            origin is not None
            and origin not in allowed
            and "*" not in allowed
            and origin.split("://", 1)[-1] != _header(scope, b"host")
        ):
            await PlainTextResponse("origin not allowed", status_code=403)(scope, receive, send)
            return
        secret = hub.config.auth_secret
        grant: Grant | None = None
        try:
            if secret is not None:
                # A missing or bad token is refused before its body is read (the MCP
                # authorization spec's 401); a good one is checked per call below.
                try:
                    grant = verify_token(secret, _bearer(scope))
                except Forbidden:
                    raise BodyError(
                        401, "unauthorized", "this hub needs a token: Authorization: Bearer <token>"
                    ) from None
            if scope.get("method") == "POST":
                receive = await _bounded(scope, receive, hub.config.max_body_bytes)
        except BodyError as exc:
            await _rpc_error(exc)(scope, receive, send)
            return
        # The SDK serves the request in tasks started from here, which inherit this context.
        reset = _ACCESS.set(_Access(secret is not None, grant))
        try:
            await manager.handle_request(scope, receive, send)
        finally:
            _ACCESS.reset(reset)

    def _hub_or_fail(self) -> Served:
        if self._hub is None:
            raise SessionHubError("the hub is not running")
        return self._hub

    # -- the MCP server ------------------------------------------------------------------
    def _build_server(self) -> Server[Any]:
        from mcp.server.lowlevel import Server

        return Server(
            "sessionhub",
            instructions=(
                "Memory and history of sessionhub sessions: call list_sessions to find a session, "
                "then pass its id as session_id."
            ),
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            on_list_resources=self._list_resources,
            on_list_resource_templates=self._list_templates,
            on_read_resource=self._read_resource,
        )

    async def _context_tools(self) -> list[Tool]:
        hub = self._hub_or_fail()
        return await hub.manager.get_session(_PROBE).tools()

    def _own_tools(self) -> dict[str, tuple[str, dict[str, Any], Callable[[dict[str, Any]], Awaitable[str]]]]:
        return {
            "list_sessions": (
                "List the hub's sessions, most recently updated first (JSON: id, name, model, "
                "token counts, timestamps).",
                {"type": "object", "properties": {}},
                self._list_sessions,
            ),
            "get_history": (
                "Read a session's conversation: the active branch, root to newest, with "
                "compaction summaries in place of the spans they cover.",
                {"type": "object", "properties": {"session_id": _SESSION_ID}, "required": ["session_id"]},
                self._get_history,
            ),
            "append_message": (
                "Append a text message to a session, on its active branch (or after parent_id).",
                {
                    "type": "object",
                    "properties": {
                        "session_id": _SESSION_ID,
                        "text": {"type": "string", "description": "The message text."},
                        "role": {
                            "type": "string",
                            "enum": ["user", "assistant", "system"],
                            "description": "user (default), assistant or system",
                        },
                        "message_id": {
                            "type": "string",
                            "description": "An id for the message (default: random).",
                        },
                        "parent_id": {
                            "type": "string",
                            "description": "The message to answer (default: the newest).",
                        },
                    },
                    "required": ["session_id", "text"],
                },
                self._append_message,
            ),
            "search": (
                "Full-text search across every session's messages (every word must match); JSON hits "
                "with session_id, id, role, content.",
                {
                    "type": "object",
                    "properties": {
                        "query": {"type": "string", "description": "Search query"},
                        "limit": {"type": "integer", "description": "At most this many hits (default 20)."},
                    },
                    "required": ["query"],
                },
                self._search,
            ),
        }

    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        import mcp_types as types

        hub = self._hub_or_fail()
        listed: list[types.Tool] = []
        for tool in [*await self._context_tools(), *hub.manager.tools()]:
            schema = json.loads(json.dumps(tool.input_schema))
            schema.setdefault("properties", {})
            if tool.name == "session_search":
                # It searches every session; the id only says who asks (not required).
                schema["properties"]["session_id"] = {
                    **_SESSION_ID,
                    "description": "The calling session (optional: the search covers every session).",
                }
            else:
                schema["properties"]["session_id"] = _SESSION_ID
                schema["required"] = ["session_id", *schema.get("required", [])]
            listed.append(types.Tool(name=tool.name, description=tool.description, input_schema=schema))
        for name, (description, schema, _run) in self._own_tools().items():
            listed.append(types.Tool(name=name, description=description, input_schema=schema))
        return types.ListToolsResult(tools=listed)

    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        import mcp_types as types

        arguments = dict(params.arguments or {})
        try:
            text = await self._run_tool(params.name, arguments)
            failed = text.startswith("Error:")
        except SessionHubError as exc:
            text, failed = f"{exc.code}: {exc}", True
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=failed)

    async def _run_tool(self, name: str, arguments: dict[str, Any]) -> str:
        hub = self._hub_or_fail()
        access = _ACCESS.get(_Access(False, None))
        own = self._own_tools().get(name)
        if own is not None:
            return await own[2](arguments)
        if name == "session_search":
            arguments.pop("session_id", None)
            access.check("run_tool", None)  # the manager's tool: as run_tool without a session
            return await dispatch(hub.manager.tools(), name, arguments)
        session_id = _string(arguments, "session_id")
        assert session_id is not None
        del arguments["session_id"]
        access.check("run_tool", session_id)
        session = await hub.session(session_id)
        return await dispatch(await session.tools(), name, arguments)

    async def _list_sessions(self, arguments: dict[str, Any]) -> str:
        _ACCESS.get(_Access(False, None)).check("list", None)
        sessions = await self._hub_or_fail().manager.list()
        return json.dumps(
            [
                {
                    "id": s.id,
                    "name": s.name,
                    "parent_session_id": s.parent_session_id,
                    "model": s.model,
                    "input_tokens": s.input_tokens,
                    "output_tokens": s.output_tokens,
                    "end_reason": s.end_reason,
                    "created_at": s.created_at.isoformat(),
                    "updated_at": s.updated_at.isoformat(),
                }
                for s in sessions
            ],
            ensure_ascii=False,
        )

    async def _get_history(self, arguments: dict[str, Any]) -> str:
        session_id = _string(arguments, "session_id")
        assert session_id is not None
        _ACCESS.get(_Access(False, None)).check("get_history", session_id)
        return _history_text(await self._hub_or_fail().manager.get_history(session_id))

    async def _append_message(self, arguments: dict[str, Any]) -> str:
        session_id = _string(arguments, "session_id")
        text = _string(arguments, "text")
        role = _string(arguments, "role", required=False) or "user"
        message_id = _string(arguments, "message_id", required=False)
        parent_id = _string(arguments, "parent_id", required=False)
        assert session_id is not None and text is not None
        if role not in ("user", "assistant", "system"):
            raise InvalidInput(f"role must be user, assistant or system; got {role!r}")
        _ACCESS.get(_Access(False, None)).check("append", session_id)
        import uuid

        message = {
            "id": message_id or uuid.uuid4().hex,
            "role": role,
            "parts": [{"type": "text", "text": text}],
        }
        appended = await self._hub_or_fail().manager.append(
            session_id, message, LATEST if parent_id is None else parent_id
        )
        return f"Appended message {appended}."

    async def _search(self, arguments: dict[str, Any]) -> str:
        query = _string(arguments, "query")
        assert query is not None
        limit = arguments.get("limit", 20)
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise InvalidInput('argument "limit" must be a positive integer')
        _ACCESS.get(_Access(False, None)).check("search", None)
        results = await self._hub_or_fail().manager.search(query, limit)
        return json.dumps(
            [
                {
                    "session_id": r.session_id,
                    "id": r.id,
                    "role": r.role,
                    "content": r.content,
                    "created_at": None if r.created_at is None else str(r.created_at),
                }
                for r in results
            ],
            ensure_ascii=False,
        )

    # -- resources -----------------------------------------------------------------------
    async def _labels(self) -> list[str]:
        blocks = await self._hub_or_fail().manager.get_session(_PROBE).get_context_blocks()
        return [b.label for b in blocks]

    async def _list_resources(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        import mcp_types as types

        access = _ACCESS.get(_Access(False, None))
        hub = self._hub_or_fail()
        labels = await self._labels()
        resources: list[types.Resource] = []

        def allowed(op: str, session_id: str) -> bool:
            return not access.auth or (access.grant is not None and access.grant.allows(op, session_id))

        for info in (await hub.manager.list())[:RESOURCE_SESSIONS]:
            base = URI_PREFIX + quote(info.id, safe="")
            if allowed("freeze_system_prompt", info.id):
                resources.append(
                    types.Resource(
                        name=f"{info.name} · system prompt",
                        uri=f"{base}/prompt",
                        description=f"The frozen system prompt of session {info.id}",
                        mime_type="text/plain",
                    )
                )
            if not allowed("get_context_block", info.id):
                continue
            for label in labels:
                resources.append(
                    types.Resource(
                        name=f"{info.name} · {label}",
                        uri=f"{base}/blocks/{quote(label, safe='')}",
                        description=f'Context block "{label}" of session {info.id}',
                        mime_type="text/plain",
                    )
                )
        return types.ListResourcesResult(resources=resources)

    async def _list_templates(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        import mcp_types as types

        return types.ListResourceTemplatesResult(
            resource_templates=[
                types.ResourceTemplate(
                    name="system prompt",
                    uri_template=URI_PREFIX + "{session_id}/prompt",
                    description="A session's frozen system prompt",
                    mime_type="text/plain",
                ),
                types.ResourceTemplate(
                    name="context block",
                    uri_template=URI_PREFIX + "{session_id}/blocks/{label}",
                    description="One context block of a session",
                    mime_type="text/plain",
                ),
            ]
        )

    async def _read_resource(
        self, ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        import mcp_types as types
        from mcp.shared.exceptions import MCPError

        uri = str(params.uri)
        access = _ACCESS.get(_Access(False, None))
        rest = uri[len(URI_PREFIX) :].split("/") if uri.startswith(URI_PREFIX) else []
        try:
            if len(rest) == 2 and rest[1] == "prompt":
                session_id = unquote(rest[0])
                # Reading it freezes it (and stores it, with a cached prompt): the WebSocket's
                # freeze_system_prompt, with its scope.
                access.check("freeze_system_prompt", session_id)
                text = await (await self._hub_or_fail().session(session_id)).freeze_system_prompt()
            elif len(rest) == 3 and rest[1] == "blocks":
                session_id, label = unquote(rest[0]), unquote(rest[2])
                access.check("get_context_block", session_id)
                block = await (await self._hub_or_fail().session(session_id)).get_context_block(label)
                if block is None:
                    raise InvalidInput(f'session {session_id} has no context block "{label}"')
                text = block.content
            else:
                raise InvalidInput(
                    f"unknown resource {uri!r}; expected {URI_PREFIX}<id>/prompt or .../blocks/<label>"
                )
        except SessionHubError as exc:
            raise MCPError(
                code=-32602 if isinstance(exc, InvalidInput) else -32603, message=f"{exc.code}: {exc}"
            ) from None
        return types.ReadResourceResult(
            contents=[types.TextResourceContents(uri=uri, mime_type="text/plain", text=text)]
        )
