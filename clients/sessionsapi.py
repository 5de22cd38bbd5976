"""What a framework backend of ``clients/`` needs of the hub's sessions, in process or remote.

``HubClient.sessions`` (the hub, over its WebSocket) and an in-process ``hub.SessionManager``
have the same methods, so a backend (``clients.openai_agents``, ``clients.pydantic_ai``) is
written once against :class:`SessionsAPI` and works over either. :func:`sessions_of` takes
what a user has at hand (a manager, a connected ``HubClient`` or its ``sessions``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from protocol import InvalidInput, Message, SessionInfo

__all__ = ["SessionsAPI", "sessions_of"]


@runtime_checkable
class SessionsAPI(Protocol):
    """The session methods the framework backends use."""

    async def create(self, name: str) -> SessionInfo: ...

    async def upsert(self, session_id: str, message: Message | Mapping[str, Any]) -> str: ...

    async def append_all(
        self, session_id: str, messages: Sequence[Message | Mapping[str, Any]]
    ) -> str | None: ...

    async def get_history(self, session_id: str, leaf_id: str | None = None) -> list[Message]: ...

    async def delete_messages(self, session_id: str, ids: Sequence[str]) -> list[str]: ...

    async def clear_messages(self, session_id: str) -> None: ...

    async def add_usage(
        self, session_id: str, input_tokens: int, output_tokens: int, cost: float
    ) -> SessionInfo: ...


def sessions_of(manager_or_hub: object) -> SessionsAPI:
    """The sessions of a ``SessionManager`` (itself), or of a connected ``HubClient`` (its
    ``sessions``). Anything else is an :class:`~protocol.InvalidInput` naming what it got."""
    # A HubClient is not itself a SessionsAPI; its `sessions` property is.
    candidate = getattr(manager_or_hub, "sessions", manager_or_hub)
    if not isinstance(candidate, SessionsAPI):
        candidate = manager_or_hub
    if not isinstance(candidate, SessionsAPI):
        raise InvalidInput(
            "expected a hub.SessionManager or a connected clients.HubClient, "
            f"got {type(manager_or_hub).__name__}"
        )
    return candidate
