"""Import from the OpenAI Agents SDK (``sessionhub import --from openai-agents FILE``).

A composition root, like :mod:`hub.apps.cli`: it maps the SDK's items with the client-side
mapping of :class:`clients.openai_agents.HubAgentSession`, so it may import the clients,
which the engine (:mod:`hub.dump` included) may not.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from protocol import InvalidInput

from ..dump import _utc
from ..store.base import SessionDump

__all__ = ["from_openai_agents"]


async def from_openai_agents(path: str | Path) -> list[SessionDump]:
    """The sessions of an OpenAI Agents SDK ``SQLiteSession`` database file (tables
    ``agent_sessions`` and ``agent_messages``), mapped to messages exactly as
    :class:`clients.openai_agents.HubAgentSession` maps the items it saves (so the SDK reads
    them back unchanged). Needs the ``openai-agents`` package."""
    import json
    import sqlite3

    from clients.openai_agents import HubAgentSession

    from ..manager import SessionManager
    from ..store.sqlite import SqliteStore

    file = Path(path)
    if not file.is_file():  # noqa: ASYNC240 - one stat of a local file
        raise InvalidInput(f"{str(path)!r} is not a file")
    try:
        uri = f"file:{file.absolute()}?mode=ro"  # noqa: ASYNC240
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
            sessions = conn.execute(
                "SELECT session_id, created_at, updated_at FROM agent_sessions "
                "ORDER BY created_at, session_id"
            ).fetchall()
            items = {
                sid: [
                    row[0]
                    for row in conn.execute(
                        "SELECT message_data FROM agent_messages WHERE session_id = ? ORDER BY id", (sid,)
                    )
                ]
                for sid, _, _ in sessions
            }
    except sqlite3.Error as exc:
        raise InvalidInput(f"{str(path)!r} is not an OpenAI Agents SQLiteSession database: {exc}") from None
    scratch = await SqliteStore.open(":memory:")
    try:
        manager = SessionManager(scratch)
        out = []
        for sid, created, updated in sessions:
            if not isinstance(sid, str) or not sid:
                raise InvalidInput(f"{str(path)!r}: a session id that is not a string: {sid!r}")
            await scratch.create_session(sid, session_id=sid, source="openai-agents")
            decoded = []
            for i, data in enumerate(items[sid]):
                try:
                    decoded.append(json.loads(data))
                except (TypeError, ValueError):
                    raise InvalidInput(f"session {sid!r}: item {i + 1} is not JSON") from None
            await HubAgentSession(sid, sessions=manager).add_items(decoded)
            dump = await scratch.dump_session(sid)
            dump.info.created_at = _utc(created)
            dump.info.updated_at = _utc(updated)
            out.append(dump)
        return out
    finally:
        await scratch.close()
