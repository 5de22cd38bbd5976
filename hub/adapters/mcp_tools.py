"""What the hub's MCP server offers: its tools and resources, over the port's
:class:`~hub.adapters.port.Served` (the door, HTTP and tokens, is :mod:`.mcp`).

Tools: the context tools of the hub's sessions (``set_context``, ``load_context``,
``unload_context``, ``search_context``) and the manager's ``session_search``, with the
original's names, descriptions and results, each taking a ``session_id``; plus
``list_sessions``, ``get_history``, ``append_message`` and ``search``. Resources: each
session's frozen system prompt and its context blocks. Each call needs the scope that the
equivalent WebSocket op needs, checked against the request's caller (:data:`CALLER`, a
:class:`~hub.adapters.caller.Caller` the door sets for the tasks that serve the request).
"""

from __future__ import annotations

import contextvars
import json
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

from protocol import InvalidInput, Message, SessionHubError

from ..store.base import LATEST
from ..tools import Tool, dispatch
from .caller import ANYONE, Caller

if TYPE_CHECKING:
    import mcp_types as types
    from mcp.server.context import ServerRequestContext
    from mcp.server.lowlevel import Server

    from .port import Served

__all__ = ["CALLER", "RESOURCE_SESSIONS", "URI_PREFIX", "McpServer"]

URI_PREFIX = "sessionhub://sessions/"
#: A session id that is never registered (registered ids are UUIDs): the context tools'
#: names and descriptions come from the manager's templates, which every session shares,
#: read through this one.
_PROBE = "_sessionhub_mcp_probe"
#: How many sessions (most recently updated first) ``resources/list`` names.
RESOURCE_SESSIONS = 100

_SESSION_ID = {"type": "string", "description": "The id of the hub session to act on."}

#: Who calls, for the request being served (:mod:`.mcp` sets it before the SDK runs it).
CALLER: contextvars.ContextVar[Caller] = contextvars.ContextVar("sessionhub_mcp_caller")


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


class McpServer:
    """The SDK's low-level MCP server (:attr:`server`) over the hub in :attr:`hub` (set by
    the door for the app's lifespan)."""

    def __init__(self) -> None:
        self.hub: Served | None = None
        self.server: Server[Any] = self._build_server()

    def served(self) -> Served:
        """The running hub; :class:`~protocol.SessionHubError` outside the app's lifespan."""
        if self.hub is None:
            raise SessionHubError("the hub is not running")
        return self.hub

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
        hub = self.served()
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
            text = await self._run_tool(params.name, arguments)
            failed = text.startswith("Error:")
        except SessionHubError as exc:
            text, failed = f"{exc.code}: {exc}", True
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=failed)

    async def _run_tool(self, name: str, arguments: dict[str, Any]) -> str:
        hub = self.served()
        access = CALLER.get(ANYONE)
        own = self._own_tools().get(name)
        if own is not None:
            return await own[2](arguments)
        if name == "session_search":
            arguments.pop("session_id", None)
            access.check("run_tool", None)  # the manager's tool: as run_tool without a session
            return await dispatch(hub.manager.tools(), name, arguments)
        listed = [t.name for t in [*await self._context_tools(), *hub.manager.tools()]]

        def unknown(more: list[str]) -> str:
            known = ", ".join(sorted({*listed, *more, *self._own_tools()}))
            return f"Error: unknown tool {name!r}; this hub's tools: {known}"

        if name not in listed and not isinstance(arguments.get("session_id"), str):
            return unknown([])  # an unknown tool is not a missing session_id
        session_id = _string(arguments, "session_id")
        assert session_id is not None
        del arguments["session_id"]
        access.check("run_tool", session_id)
        session = await hub.session(session_id)
        tools = await session.tools()  # a session's template may give it tools the list has not
        if name not in {t.name for t in tools}:
            return unknown([t.name for t in tools])
        return await dispatch(tools, name, arguments)

    async def _list_sessions(self, arguments: dict[str, Any]) -> str:
        CALLER.get(ANYONE).check("list", None)
        sessions = await self.served().manager.list()
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
        CALLER.get(ANYONE).check("get_history", session_id)
        return _history_text(await self.served().manager.get_history(session_id))

    async def _append_message(self, arguments: dict[str, Any]) -> str:
        session_id = _string(arguments, "session_id")
        text = _string(arguments, "text")
        role = _string(arguments, "role", required=False) or "user"
        message_id = _string(arguments, "message_id", required=False)
        parent_id = _string(arguments, "parent_id", required=False)
        assert session_id is not None and text is not None
        if role not in ("user", "assistant", "system"):
            raise InvalidInput(f"role must be user, assistant or system; got {role!r}")
        CALLER.get(ANYONE).check("append", session_id)
        message = {
            "id": message_id or uuid.uuid4().hex,
            "role": role,
            "parts": [{"type": "text", "text": text}],
        }
        appended = await self.served().manager.append(
            session_id, message, LATEST if parent_id is None else parent_id
        )
        return f"Appended message {appended}."

    async def _search(self, arguments: dict[str, Any]) -> str:
        query = _string(arguments, "query")
        assert query is not None
        limit = arguments.get("limit", 20)
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise InvalidInput('argument "limit" must be a positive integer')
        CALLER.get(ANYONE).check("search", None)
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

    # -- resources -----------------------------------------------------------------------
    async def _labels(self) -> list[str]:
        blocks = await self.served().manager.get_session(_PROBE).get_context_blocks()
        return [b.label for b in blocks]

    async def _list_resources(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        import mcp_types as types

        access = CALLER.get(ANYONE)
        hub = self.served()
        labels = await self._labels()
        resources: list[types.Resource] = []

        for info in (await hub.manager.list())[:RESOURCE_SESSIONS]:
            base = URI_PREFIX + quote(info.id, safe="")
            if access.allows("freeze_system_prompt", info.id):
                resources.append(
                    types.Resource(
                        name=f"{info.name} · system prompt",
                        uri=f"{base}/prompt",
                        description=f"The frozen system prompt of session {info.id}",
                        mime_type="text/plain",
                    )
                )
            if not access.allows("get_context_block", info.id):
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
        access = CALLER.get(ANYONE)
        rest = uri[len(URI_PREFIX) :].split("/") if uri.startswith(URI_PREFIX) else []
        try:
            if len(rest) == 2 and rest[1] == "prompt":
                session_id = unquote(rest[0])
                # Reading it freezes it (and stores it, with a cached prompt): the WebSocket's
                # freeze_system_prompt, with its scope.
                access.check("freeze_system_prompt", session_id)
                text = await (await self.served().session(session_id)).freeze_system_prompt()
            elif len(rest) == 3 and rest[1] == "blocks":
                session_id, label = unquote(rest[0]), unquote(rest[2])
                access.check("get_context_block", session_id)
                block = await (await self.served().session(session_id)).get_context_block(label)
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
