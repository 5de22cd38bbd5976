"""The protocol adapters: every protocol the hub speaks beyond its own WebSocket protocol,
one module each (docs/architecture.md, "Where to add a protocol adapter").

- :mod:`.aisdk_chat`: the Vercel AI SDK's chat over HTTP (``POST /api/chat``, ``GET
  /api/chat/{id}/stream``, ``POST /api/chat/{id}/stop``), rendered by :mod:`.uistream`;
- :mod:`.aisdk_ws`: the AI SDK 7 ``WebSocketChatTransport`` at ``/api/chat/ws``;
- :mod:`.cf_agents`: Cloudflare's ``cf_agent_*`` chat at ``/agents/{agent}/{name}``;
- :mod:`.agui`: AG-UI 1.0 at ``/agui`` (the last three share :mod:`.replychunks`: a
  turn's chunks numbered once per node);
- :mod:`.files_http`: files in messages over HTTP (``POST /files``, ``GET /files/{sha256}``);
- :mod:`.mcp`: the Model Context Protocol at ``/mcp`` (its tools and resources:
  :mod:`.mcp_tools`), when the optional ``mcp`` package is installed.

What they share: :mod:`.port` (all an adapter may use of the hub, and the
:class:`~hub.adapters.port.Adapter` it registers as), :mod:`.caller` (origin, token,
scope), :mod:`.body` (a bounded, strictly parsed body), :mod:`.sse` (bounded SSE) and
:mod:`.chats` (what the chat adapters share).
Framework backends that run in the user's process are not adapters: they are ``clients/``
modules named after their framework (``clients/openai_agents.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .port import Adapter

__all__ = ["adapters"]


def adapters() -> list[Adapter]:
    """The adapters ``create_app`` mounts, in route order; an adapter whose optional package
    is missing is left out. A new protocol is one more line here."""
    # Imported on call: the adapters import the server's value modules (hub.server.config,
    # ...), and hub.server's package imports create_app, which calls this; imported at the
    # top, `import hub.adapters.mcp` before `import hub.server` would meet a half-made module.
    from . import agui, aisdk_chat, aisdk_ws, cf_agents, files_http, mcp

    found = [
        aisdk_chat.adapter(),
        aisdk_ws.adapter(),
        cf_agents.adapter(),
        agui.adapter(),
        files_http.adapter(),
        mcp.adapter(),
    ]
    return [a for a in found if a is not None]
