"""The op table: what each request runs."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from protocol import frames as f

from ..session import Session
from ..tools import Tool
from .wire import parent_arg

if TYPE_CHECKING:
    from .hub import Hub


def operations(hub: Hub) -> dict[str, Callable[[Any], Awaitable[Any]]]:
    m = hub.manager

    async def session_op(request: Any) -> Session:
        return await hub.session(request.session_id)

    async def tools(r: f.Tools) -> list[Tool]:
        return m.tools() if r.session_id is None else await (await hub.session(r.session_id)).tools()

    async def run_tool(r: f.RunTool) -> str:
        from ..tools import dispatch

        available = m.tools() if r.session_id is None else await (await hub.session(r.session_id)).tools()
        return await dispatch(available, r.name, r.arguments)

    async def ping(r: f.Ping) -> str:
        return "pong"

    ops: dict[str, Callable[[Any], Awaitable[Any]]] = {
        "create": lambda r: m.create(r.name, r.parent_session_id, r.model, r.source),
        "get": lambda r: m.get(r.session_id),
        "list": lambda r: m.list(),
        "rename": lambda r: m.rename(r.session_id, r.name),
        "delete": lambda r: m.delete(r.session_id),
        "append": lambda r: m.append(r.session_id, r.message, parent_arg(r.parent_id)),
        "upsert": lambda r: m.upsert(r.session_id, r.message, parent_arg(r.parent_id)),
        "append_all": lambda r: m.append_all(r.session_id, r.messages, parent_arg(r.parent_id)),
        "get_history": lambda r: m.get_history(r.session_id, r.leaf_id),
        "get_branches": lambda r: m.get_branches(r.session_id, r.message_id),
        "get_message_count": lambda r: m.get_message_count(r.session_id),
        "clear_messages": lambda r: m.clear_messages(r.session_id),
        "delete_messages": lambda r: m.delete_messages(r.session_id, r.ids),
        "fork": lambda r: m.fork(r.session_id, r.at_message_id, r.name),
        "add_compaction": lambda r: m.add_compaction(r.session_id, r.summary, r.from_id, r.to_id),
        "get_compactions": lambda r: m.get_compactions(r.session_id),
        "compact_and_split": lambda r: m.compact_and_split(r.session_id, r.summary, r.name),
        "add_usage": lambda r: m.add_usage(r.session_id, r.input_tokens, r.output_tokens, r.cost),
        "search": lambda r: m.search(r.query, r.limit),
        "tools": tools,
        "run_tool": run_tool,
        "ping": ping,
    }

    def on_session(name: str, call: Callable[[Session, Any], Awaitable[Any]]) -> None:
        async def run(r: Any) -> Any:
            return await call(await session_op(r), r)

        ops[name] = run

    on_session("get_message", lambda s, r: s.get_message(r.message_id))
    on_session("get_latest_leaf", lambda s, r: s.get_latest_leaf())
    on_session("get_path_length", lambda s, r: s.get_path_length(r.leaf_id))
    on_session("update_message", lambda s, r: s.update_message(r.message))
    on_session("session_search", lambda s, r: s.search(r.query, r.limit))
    on_session("get_context_blocks", lambda s, r: s.get_context_blocks())
    on_session("get_context_block", lambda s, r: s.get_context_block(r.label))
    on_session("replace_context_block", lambda s, r: s.replace_context_block(r.label, r.content))
    on_session("append_context_block", lambda s, r: s.append_context_block(r.label, r.content))
    on_session("freeze_system_prompt", lambda s, r: s.freeze_system_prompt())
    on_session("refresh_system_prompt", lambda s, r: s.refresh_system_prompt())
    on_session("compact", lambda s, r: s.compact(r.leaf_id))
    missing = (
        set(f.REQUEST_TYPES) - set(ops) - {"subscribe", "unsubscribe", "hello", "presence", "summary", "auth"}
    )
    missing -= {"stream_start", "stream_delta", "stream_end"}
    assert not missing, f"ops without a handler: {missing}"
    return ops
