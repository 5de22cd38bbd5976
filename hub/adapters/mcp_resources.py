"""The resources of the hub's MCP server, and who may read or follow each.

``sessionhub://sessions`` is the session list (JSON, most recently updated first);
``sessionhub://sessions/<id>/history`` a session's active branch (JSON messages, root to
newest, overlays applied); ``.../prompt`` its frozen system prompt and
``.../blocks/<label>`` one of its context blocks (text). Each read needs the scope of the
equivalent WebSocket op (``list``/``get``, ``get_history``, ``freeze_system_prompt``,
``get_context_block``); a token scoped to some sessions reads a list of just those. The
server's handlers are :mod:`.mcp_tools`; following a resource live is :mod:`.mcp_listen`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

import msgspec

from protocol import Forbidden, InvalidInput, SessionInfo

from ..auth import OP_LEVELS
from .caller import Caller

if TYPE_CHECKING:
    import mcp_types as types

    from .port import Served

__all__ = [
    "CALLER_KEY",
    "NOBODY",
    "RESOURCE_SESSIONS",
    "SESSIONS_URI",
    "URI_PREFIX",
    "Target",
    "access_of",
    "canonical",
    "history_uri",
    "list_resources",
    "need",
    "parse_uri",
    "read_resource",
    "session_json",
    "templates",
    "visible_sessions",
]

URI_PREFIX = "sessionhub://sessions/"
#: The session list.
SESSIONS_URI = "sessionhub://sessions"
#: How many sessions (most recently updated first) ``resources/list`` names.
RESOURCE_SESSIONS = 100
#: A session id that is never registered (registered ids are UUIDs): block labels come from
#: the manager's templates, which every session shares, read through this one.
PROBE = "_sessionhub_mcp_probe"


def need(access: Caller, op: str, session_id: str | None, what: str) -> None:
    """:class:`~protocol.Forbidden` naming the scope ``what`` needs, unless ``access``
    allows the WebSocket op ``op`` on ``session_id`` (None: every session, ``*``)."""
    if not access.allows(op, session_id):
        on = "every session (*)" if session_id is None else f"session {session_id}"
        raise Forbidden(f"{what} needs the {OP_LEVELS[op]} scope on {on}")


def history_uri(session_id: str) -> str:
    return f"{URI_PREFIX}{quote(session_id, safe='')}/history"


@dataclass(frozen=True)
class Target:
    """What a ``sessionhub://`` URI names: ``kind`` is ``sessions``, ``history``,
    ``prompt`` or ``block``."""

    kind: str
    session_id: str | None = None
    label: str | None = None

    def check(self, access: Caller, uri: str) -> None:
        """Forbidden unless ``access`` may read it (the list: anyone, it is filtered)."""
        if self.kind == "history":
            need(access, "get_history", self.session_id, f"reading {uri}")
        elif self.kind == "block":
            need(access, "get_context_block", self.session_id, f"reading {uri}")
        elif self.kind == "prompt":
            # Reading it freezes it (and stores it, with a cached prompt): a write.
            need(access, "freeze_system_prompt", self.session_id, f"reading {uri}")


def parse_uri(uri: str) -> Target:
    """The :class:`Target` of ``uri``; :class:`~protocol.InvalidInput` naming the forms."""
    if uri == SESSIONS_URI:
        return Target("sessions")
    rest = uri[len(URI_PREFIX) :].split("/") if uri.startswith(URI_PREFIX) else []
    if len(rest) == 2 and rest[0] and rest[1] in ("history", "prompt"):
        return Target(rest[1], unquote(rest[0]))
    if len(rest) == 3 and rest[0] and rest[1] == "blocks" and rest[2]:
        return Target("block", unquote(rest[0]), unquote(rest[2]))
    raise InvalidInput(
        f"unknown resource {uri!r}; the resources are {SESSIONS_URI}, {URI_PREFIX}<id>/history, "
        f"{URI_PREFIX}<id>/prompt and {URI_PREFIX}<id>/blocks/<label>"
    )


def session_json(s: SessionInfo) -> dict[str, Any]:
    return {
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


async def visible_sessions(hub: Served, access: Caller) -> list[SessionInfo]:
    """The sessions ``access`` may see: all of them with read on ``*``, else those it may
    ``get`` (a token scoped to one session sees only it)."""
    sessions = await hub.manager.list()
    if access.allows("list", None):
        return sessions
    return [s for s in sessions if access.allows("get", s.id)]


async def _labels(hub: Served) -> list[str]:
    return [b.label for b in await hub.manager.get_session(PROBE).get_context_blocks()]


async def list_resources(hub: Served, access: Caller) -> types.ListResourcesResult:
    import mcp_types as types

    resources = [
        types.Resource(
            name="sessions",
            uri=SESSIONS_URI,
            description="The hub's sessions, most recently updated first (those this token may read)",
            mime_type="application/json",
        )
    ]
    labels = await _labels(hub)
    for info in (await visible_sessions(hub, access))[:RESOURCE_SESSIONS]:
        base = URI_PREFIX + quote(info.id, safe="")
        if access.allows("get_history", info.id):
            resources.append(
                types.Resource(
                    name=f"{info.name} · history",
                    uri=f"{base}/history",
                    description=f"The active branch of session {info.id}, root to newest",
                    mime_type="application/json",
                )
            )
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


def templates() -> types.ListResourceTemplatesResult:
    import mcp_types as types

    return types.ListResourceTemplatesResult(
        resource_templates=[
            types.ResourceTemplate(
                name="history",
                uri_template=URI_PREFIX + "{session_id}/history",
                description="A session's active branch, root to newest (JSON messages)",
                mime_type="application/json",
            ),
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


async def read_resource(hub: Served, access: Caller, uri: str) -> tuple[str, str]:
    """``(mime type, text)`` of ``uri``; Forbidden, InvalidInput or SessionNotFound."""
    target = parse_uri(uri)
    target.check(access, uri)
    if target.kind == "sessions":
        listed = [session_json(s) for s in await visible_sessions(hub, access)]
        return "application/json", json.dumps(listed, ensure_ascii=False)
    assert target.session_id is not None
    session = await hub.session(target.session_id)
    if target.kind == "history":
        return "application/json", msgspec.json.encode(await session.get_history()).decode()
    if target.kind == "prompt":
        return "text/plain", await session.freeze_system_prompt()
    assert target.label is not None
    block = await session.get_context_block(target.label)
    if block is None:
        raise InvalidInput(f'session {target.session_id} has no context block "{target.label}"')
    return "text/plain", block.content


#: Where the door (:mod:`.mcp`) keeps a request's :class:`Caller` in its ASGI scope. The
#: handlers read it from the request they serve, never from the task they run in: a
#: stateful MCP session's requests are served by a task started by its first request.
CALLER_KEY = "sessionhub.mcp.caller"
#: The caller of a request that did not come through the door: allowed nothing.
NOBODY = Caller(True, None)


def access_of(ctx: Any) -> Caller:
    """The caller of the request ``ctx`` (an SDK ``ServerRequestContext``) serves."""
    scope = getattr(ctx.request, "scope", None)
    who = scope.get(CALLER_KEY) if isinstance(scope, dict) else None
    return who if isinstance(who, Caller) else NOBODY


def canonical(uri: str) -> str:
    """``uri`` as the feed names it (ids and labels percent-encoded alike)."""
    target = parse_uri(uri)
    if target.kind == "sessions":
        return SESSIONS_URI
    assert target.session_id is not None
    base = URI_PREFIX + quote(target.session_id, safe="")
    if target.kind == "block":
        assert target.label is not None
        return f"{base}/blocks/{quote(target.label, safe='')}"
    return f"{base}/{target.kind}"
