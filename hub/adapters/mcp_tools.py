"""What the hub's MCP server offers: its tools, its resources (:mod:`.mcp_resources`) and
following them live (:mod:`.mcp_listen`), over the port's :class:`~hub.adapters.port.Served`
(the door, HTTP and tokens, is :mod:`.mcp`).

Tools: the context tools of the hub's sessions (``set_context``, ``load_context``,
``unload_context``, ``search_context``) and the manager's ``session_search``, with the
original's names, descriptions and results, each taking a ``session_id``; plus
``list_sessions``, ``get_history``, ``append_message`` and ``search``. Each call needs the
scope that the equivalent WebSocket op needs, checked against the caller of the request
it serves (:func:`~.mcp_resources.access_of`); a refusal names that scope.

Two SDK servers share these handlers: :attr:`McpServer.server` (``/mcp``, stateless on
2025-11-25) and :attr:`McpServer.stateful_server` (``/mcp/stateful``), which also serves
``resources/subscribe`` and announces resource list changes in its ``initialize``.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from protocol import InvalidInput, Message, SessionHubError, SessionNotFound

from ..store.base import LATEST
from ..tools import Tool, dispatch
from .caller import Caller
from .mcp_listen import Listening, rpc_error
from .mcp_resources import PROBE, access_of, list_resources, need, read_resource, session_json, templates

if TYPE_CHECKING:
    import mcp_types as types
    from mcp.server.context import ServerRequestContext
    from mcp.server.lowlevel import Server

    from .port import Served

__all__ = ["McpServer"]

_SESSION_ID = {"type": "string", "description": "The id of the hub session to act on."}


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


_Run = Callable[[Caller, dict[str, Any]], Awaitable[str]]


class McpServer:
    """The SDK's low-level MCP servers (:attr:`server`, :attr:`stateful_server`) over the
    hub in :attr:`hub` and following it through :attr:`listening` (both set by the door
    for the app's lifespan)."""

    def __init__(self) -> None:
        self.hub: Served | None = None
        self.listening: Listening | None = None
        self.server: Server[Any] = self._build_server(stateful=False)
        self.stateful_server: Server[Any] = self._build_server(stateful=True)

    def served(self) -> Served:
        """The running hub; :class:`~protocol.SessionHubError` outside the app's lifespan."""
        if self.hub is None:
            raise SessionHubError("the hub is not running")
        return self.hub

    def _listen(self) -> Listening:
        if self.listening is None:
            raise SessionHubError("the hub is not running")
        return self.listening

    def _build_server(self, *, stateful: bool) -> Server[Any]:
        from mcp.server.lowlevel import NotificationOptions, Server
        from mcp_types.version import MODERN_PROTOCOL_VERSIONS

        class HubServer(Server[Any]):
            """What ``initialize`` (2025-11-25) announces: a stateful session is sent the
            resource list's changes too (the SDK's default announces none); a stateless
            one cannot subscribe (its handler answers so, naming /mcp/stateful)."""

            def create_initialization_options(self, notification_options: Any = None, *args: Any) -> Any:
                announced = notification_options or NotificationOptions(resources_changed=stateful)
                return super().create_initialization_options(announced, *args)

            def get_capabilities(self, *args: Any, **kwargs: Any) -> types.ServerCapabilities:
                capabilities = super().get_capabilities(*args, **kwargs)
                modern = kwargs.get("protocol_version") in MODERN_PROTOCOL_VERSIONS
                if not stateful and not modern and capabilities.resources is not None:
                    capabilities.resources.subscribe = False
                return capabilities

        return HubServer(
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
            on_subscriptions_listen=self._subscriptions_listen,
            on_subscribe_resource=self._subscribe,
            on_unsubscribe_resource=self._unsubscribe,
        )

    async def _context_tools(self) -> list[Tool]:
        hub = self.served()
        return await hub.manager.get_session(PROBE).tools()

    def _own_tools(self) -> dict[str, tuple[str, dict[str, Any], _Run]]:
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

        hub = self.served()
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
            text = await self._run_tool(access_of(ctx), params.name, arguments)
            failed = text.startswith("Error:")
        except SessionHubError as exc:
            text, failed = f"{exc.code}: {exc}", True
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=failed)

    async def _run_tool(self, access: Caller, name: str, arguments: dict[str, Any]) -> str:
        hub = self.served()
        own = self._own_tools().get(name)
        if own is not None:
            return await own[2](access, arguments)
        context = {t.name for t in await self._context_tools()}
        if name == "session_search":
            arguments.pop("session_id", None)
            # The manager's tool: as run_tool without a session.
            need(access, "run_tool", None, "tool session_search")
            return await dispatch(hub.manager.tools(), name, arguments)
        session_id = arguments.pop("session_id", None)
        if session_id is not None and not isinstance(session_id, str):
            raise InvalidInput('argument "session_id" must be a string')
        if session_id is not None:
            need(access, "run_tool", session_id, f"tool {name}")
        if name in context:
            if session_id is None:
                raise InvalidInput('missing required argument "session_id"')
            return await dispatch(await (await hub.session(session_id)).tools(), name, arguments)
        # A block configured on one session alone adds tools only it has.
        tools: list[Tool] = []
        if session_id is not None:
            with contextlib.suppress(SessionNotFound):
                tools = await (await hub.session(session_id)).tools()
        if name in {t.name for t in tools}:
            return await dispatch(tools, name, arguments)
        known = [*sorted(context | {t.name for t in tools}), "session_search", *self._own_tools()]
        return f'Error: unknown tool "{name}". The tools are: {", ".join(known)}'

    async def _list_sessions(self, access: Caller, arguments: dict[str, Any]) -> str:
        need(access, "list", None, "tool list_sessions")
        sessions = await self.served().manager.list()
        return json.dumps([session_json(s) for s in sessions], ensure_ascii=False)

    async def _get_history(self, access: Caller, arguments: dict[str, Any]) -> str:
        session_id = _string(arguments, "session_id")
        assert session_id is not None
        need(access, "get_history", session_id, "tool get_history")
        return _history_text(await self.served().manager.get_history(session_id))

    async def _append_message(self, access: Caller, arguments: dict[str, Any]) -> str:
        session_id = _string(arguments, "session_id")
        text = _string(arguments, "text")
        role = _string(arguments, "role", required=False) or "user"
        message_id = _string(arguments, "message_id", required=False)
        parent_id = _string(arguments, "parent_id", required=False)
        assert session_id is not None and text is not None
        if role not in ("user", "assistant", "system"):
            raise InvalidInput(f"role must be user, assistant or system; got {role!r}")
        need(access, "append", session_id, "tool append_message")
        message = {
            "id": message_id or uuid.uuid4().hex,
            "role": role,
            "parts": [{"type": "text", "text": text}],
        }
        appended = await self.served().manager.append(
            session_id, message, LATEST if parent_id is None else parent_id
        )
        return f"Appended message {appended}."

    async def _search(self, access: Caller, arguments: dict[str, Any]) -> str:
        query = _string(arguments, "query")
        assert query is not None
        limit = arguments.get("limit", 20)
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise InvalidInput('argument "limit" must be a positive integer')
        need(access, "search", None, "tool search")
        results = await self.served().manager.search(query, limit)
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

    # -- resources, and following them --------------------------------------------------
    async def _list_resources(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        return await list_resources(self.served(), access_of(ctx))

    async def _list_templates(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        return templates()

    async def _read_resource(
        self, ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        import mcp_types as types

        uri = str(params.uri)
        try:
            mime, text = await read_resource(self.served(), access_of(ctx), uri)
        except SessionHubError as exc:
            raise rpc_error(exc) from None
        content = types.TextResourceContents(uri=uri, mime_type=mime, text=text)
        return types.ReadResourceResult(contents=[content])

    async def _subscriptions_listen(
        self, ctx: ServerRequestContext[Any], params: types.SubscriptionsListenRequestParams
    ) -> types.SubscriptionsListenResult:
        return await self._listen().listen(ctx, params)

    async def _subscribe(
        self, ctx: ServerRequestContext[Any], params: types.SubscribeRequestParams
    ) -> types.EmptyResult:
        return await self._listen().subscribe(ctx, params)

    async def _unsubscribe(
        self, ctx: ServerRequestContext[Any], params: types.UnsubscribeRequestParams
    ) -> types.EmptyResult:
        return await self._listen().unsubscribe(ctx, params)
