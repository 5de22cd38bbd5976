"""`GraphThreads`: LangGraph threads as sessions (``clients.langgraph.HubCheckpointSaver``
is the saver over it, in process or through the hub).

A thread id is the session id itself, so ``sessionhub tail <thread_id>``, the inspector
and search find a thread under the id the graph was run with. Checkpoints are stored by
the store (protocol/graphstate.py), each with its event; the messages the saver projects
out of a checkpoint's ``messages`` channel (as ``UIMessage`` dicts) go into the session's
tree: what the tree holds already is kept (updated if its parts changed, as a tool's result
arriving), the new ones are appended after the last one it holds, so resuming from an
earlier checkpoint (time travel) appends under an earlier message: a branch. They follow
the file rules of every write (hub/store/attachments.py): a reference to a file the writer
may not read is refused, nothing of the put written.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from protocol import InvalidInput, Message, ParentArg, coerce_message
from protocol.graphstate import CheckpointRecord, CheckpointWrite

from .session import Session
from .store.attachments import attach_files
from .store.base import Store, check_session_id

__all__ = ["GraphThreads", "thread_name"]

#: How many messages a put may project (a longer ``messages`` channel projects its tail).
MAX_PROJECTED = 10_000


def thread_name(thread_id: str) -> str:
    """The name a thread's session is registered with on its first put."""
    return f"LangGraph thread {thread_id}"[:200]


def _check_ns(ns: object) -> str:
    if not isinstance(ns, str):
        raise InvalidInput(f"checkpoint_ns must be a string, got {type(ns).__name__}")
    return ns


class _Manager(Protocol):
    # What of SessionManager this needs (the manager constructs it: no import cycle).
    store: Store

    def get_session(self, session_id: str) -> Session: ...

    async def append_all(
        self, session_id: str, messages: Sequence[Message], parent_id: ParentArg = ...
    ) -> str | None: ...


class GraphThreads:
    """The checkpoint operations of a :class:`~hub.manager.SessionManager`'s store
    (``manager.threads``)."""

    def __init__(self, manager: _Manager) -> None:
        self._manager = manager
        self._store = manager.store

    async def put(
        self,
        record: CheckpointRecord,
        messages: Sequence[Message | Mapping[str, Any]] | None = None,
        *,
        partial: bool = False,
    ) -> None:
        """Store the checkpoint (with its event), then project ``messages`` (the root
        namespace's conversation, oldest first) into the thread's session."""
        if not isinstance(record, CheckpointRecord):
            raise InvalidInput("checkpoint must be a checkpoint record")
        check_session_id(record.thread_id)
        if messages is not None and (isinstance(messages, Mapping) or not isinstance(messages, Sequence)):
            raise InvalidInput("messages must be a list of messages")
        projected: Sequence[Message | Mapping[str, Any]] = messages[-MAX_PROJECTED:] if messages else ()
        if projected:
            # The file rules of every write (docs/files.md): inline files stored, and a
            # reference the writer may not read refused, before anything is written.
            projected = await attach_files(self._store, [coerce_message(m) for m in projected])
        name = thread_name(record.thread_id)
        if await self._store.put_checkpoint(record, name=name, messages=projected, partial=partial):
            await self._manager.get_session(record.thread_id).after_append()

    async def put_writes(
        self,
        thread_id: str,
        ns: str,
        checkpoint_id: str,
        writes: Sequence[CheckpointWrite],
        *,
        replace: bool = False,
    ) -> None:
        check_session_id(thread_id)
        if not writes:
            return
        await self._store.put_checkpoint_writes(
            thread_id, _check_ns(ns), checkpoint_id, writes, replace=replace
        )

    async def get(
        self, thread_id: str, ns: str = "", checkpoint_id: str | None = None
    ) -> CheckpointRecord | None:
        check_session_id(thread_id)
        return await self._store.get_checkpoint(thread_id, _check_ns(ns), checkpoint_id)

    async def list(
        self,
        thread_id: str | None,
        *,
        ns: str | None = None,
        before: str | None = None,
        limit: int | None = None,
        filter: Mapping[str, Any] | None = None,
    ) -> builtins.list[CheckpointRecord]:
        if thread_id is not None:
            check_session_id(thread_id)
        if limit is not None and (not isinstance(limit, int) or limit < 0):
            raise InvalidInput(f"limit must be a non-negative integer, got {limit!r}")
        if filter is not None and not isinstance(filter, Mapping):
            raise InvalidInput("filter must be an object")
        return await self._store.list_checkpoints(thread_id, ns=ns, before=before, limit=limit, filter=filter)

    async def delete_thread(self, thread_id: str) -> int:
        """Delete the thread's checkpoints and writes; its session and messages stay (a
        chat UI may still show them; ``SessionManager.delete`` removes all of it)."""
        check_session_id(thread_id)
        return await self._store.delete_checkpoints(thread_id)

    async def prune(self, thread_id: str, *, keep_latest: bool) -> int:
        check_session_id(thread_id)
        return await self._store.delete_checkpoints(thread_id, keep_latest=keep_latest)

    async def delete_for_runs(self, run_ids: Sequence[str]) -> int:
        if isinstance(run_ids, str) or not all(isinstance(r, str) for r in run_ids):
            raise InvalidInput("run_ids must be a list of strings")
        return await self._store.delete_checkpoint_runs(run_ids)

    async def copy_thread(self, source: str, target: str) -> int:
        check_session_id(source)
        check_session_id(target)
        return await self._store.copy_checkpoints(source, target, name=thread_name(target))
