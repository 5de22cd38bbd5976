"""`SessionManager`: the sessions registry and the operations that span sessions."""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Self

from protocol import (
    Compaction,
    Event,
    InvalidInput,
    Message,
    SearchResult,
    SessionInfo,
    SessionNotFound,
    coerce_message,
)

from .builder import SessionBuilder, SessionConfig
from .context import ContextConfig
from .events import follow
from .graphthreads import GraphThreads
from .retention import prune_cutoff
from .session import MessageInput, Session, check_ids, check_parent
from .store.base import LATEST, REGISTRY, Parent, ParentArg, PruneResult, Store, check_session_id
from .templates import Template, Templates, template_key
from .tools import Tool

__all__ = ["SessionManager"]


def _opt_str(value: object, name: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise InvalidInput(f"{name} must be a string or None, got {type(value).__name__}")
    return value


class SessionManager(SessionBuilder):
    """Many sessions in one store.

    Every method that takes a session id raises :class:`~protocol.errors.SessionNotFound`
    for an id that is not in the registry (``get`` returns None instead); writes check and
    touch ``updated_at`` in the same transaction as the change.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self._sessions: dict[str, Session] = {}
        self._config = SessionConfig()
        self._history_label: str | None = None
        self._templates: Templates | None = None
        self._threads: GraphThreads | None = None

    # -- builder (propagated to every session; the shared methods are SessionBuilder's) ----
    def with_searchable_history(self, label: str) -> Self:
        """Give every session a searchable block over all sessions' conversations."""
        self._history_label = label
        return self

    def with_templates(self, templates: Iterable[Template], default: str | None = None) -> Self:
        """Sessions get the blocks of the template ``create`` names (``default`` when it
        names none), after the blocks every session has (``with_context``)."""
        self._templates = Templates(templates, default)
        return self

    @property
    def templates(self) -> Templates | None:
        return self._templates

    @property
    def threads(self) -> GraphThreads:
        """LangGraph threads (sessions) and their checkpoints (``clients.langgraph``)."""
        if self._threads is None:
            self._threads = GraphThreads(self)
        return self._threads

    async def _require(self, session_id: str) -> SessionInfo:
        check_session_id(session_id)
        info = await self.store.get_session(session_id)
        if info is None:
            raise SessionNotFound(session_id)
        return info

    # -- registry ------------------------------------------------------------------------
    async def create(
        self,
        name: str,
        parent_session_id: str | None = None,
        model: str | None = None,
        source: str | None = None,
        template: str | None = None,
    ) -> SessionInfo:
        """Register a new session with a random UUID id, built from ``template`` (one of
        :meth:`with_templates`'; None: the default). An unknown template is
        :class:`~protocol.errors.InvalidInput` and creates nothing."""
        if self._templates is None:
            if template is not None:
                raise InvalidInput(f"unknown template {template!r}: this hub has no templates")
            chosen = None
        else:
            chosen = self._templates.pick(template)
        info = await self.store.create_session(
            name,
            parent_session_id=_opt_str(parent_session_id, "parent_session_id"),
            model=_opt_str(model, "model"),
            source=_opt_str(source, "source"),
        )
        if chosen is not None:
            await self._start_template(info.id, chosen)
        return info

    async def _start_template(self, session_id: str, template: Template) -> None:
        await self.store.set_context_value(template_key(session_id), template.name)
        session = self.get_session(session_id)
        for block in template.blocks:
            if block.content is not None and block.provider is None:
                await session.replace_context_block(block.label, block.content)

    async def _copy_template(self, source_id: str, info: SessionInfo) -> SessionInfo:
        """A fork or a continuation keeps the template of the session it came from."""
        if self._templates is not None:
            name = await self.store.get_context_value(template_key(source_id))
            if name is not None:
                await self.store.set_context_value(template_key(info.id), name)
        return info

    async def get(self, session_id: str) -> SessionInfo | None:
        check_session_id(session_id)
        return await self.store.get_session(session_id)

    async def list(self) -> builtins.list[SessionInfo]:
        """Every session, most recently updated first."""
        return await self.store.list_sessions()

    async def rename(self, session_id: str, name: str) -> SessionInfo:
        check_session_id(session_id)
        return await self.store.rename_session(session_id, name)

    async def end(self, session_id: str, reason: str = "ended") -> SessionInfo:
        """Mark the session ended with ``reason`` (non-empty, at most 200 characters) and
        log ``session.ended``, as a compaction's split does with ``"compaction"``; returns
        the ended session. Its messages stay. Ending it twice is
        :class:`~protocol.errors.Conflict`."""
        check_session_id(session_id)
        return await self.store.end_session(session_id, reason)

    async def delete(self, session_id: str) -> None:
        """Delete the session with its messages, overlays, event log and the context rows
        its store-backed blocks and cached prompt kept (departure: the original left them)."""
        check_session_id(session_id)
        labels = {c.label for c in self._config.contexts if c.provider is None}
        if self._templates is not None:
            labels |= self._templates.store_labels()
        keys = [f"{label}_{session_id}" for label in sorted(labels)]
        keys += [f"_system_prompt_{session_id}", template_key(session_id)]
        await self.store.delete_session(session_id, context_keys=keys)
        self._sessions.pop(session_id, None)

    def get_session(self, session_id: str) -> Session:
        """The :class:`Session` for ``session_id``, configured with the manager's templates
        (cached; the registry is not checked)."""
        check_session_id(session_id)
        session = self._sessions.get(session_id)
        if session is None:
            session = Session(self.store, session_id=session_id)
            history = (
                ()
                if self._history_label is None
                else (
                    ContextConfig(
                        self._history_label,
                        "Cross-session conversation history",
                        provider=_HistoryProvider(self),
                    ),
                )
            )
            # The session's own copy: configuring it further changes no other session.
            session._config = self._config.copy(*history)
            if self._templates is not None:
                templates = self._templates

                async def resolve() -> SessionConfig:
                    # The template's blocks sit between the manager's and the history's.
                    name = await self.store.get_context_value(template_key(session_id))
                    template = templates.recorded(name)
                    if template is None:
                        return self._config.copy(*history)
                    config = self._config.copy(*template.contexts(), *history)
                    config.cached_prompt = config.cached_prompt or template.cached_prompt
                    return config

                session._resolve_config = resolve
            self._sessions[session_id] = session
        return session

    # -- messages ------------------------------------------------------------------------
    async def append(
        self, session_id: str, message: MessageInput, parent_id: ParentArg | Parent = LATEST
    ) -> str:
        """Append one message (idempotent on its id); returns the message id."""
        check_session_id(session_id)
        m = coerce_message(message)
        await self.store.append_messages(session_id, [m], check_parent(parent_id), managed=True)
        await self.get_session(session_id).after_append()
        return m.id

    async def upsert(
        self, session_id: str, message: MessageInput, parent_id: ParentArg | Parent = LATEST
    ) -> str:
        """Update the message if its id is stored in the session, else append it."""
        check_session_id(session_id)
        m = coerce_message(message)
        if await self.store.upsert_message(session_id, m, check_parent(parent_id), managed=True):
            await self.get_session(session_id).after_append()
        return m.id

    async def append_all(
        self,
        session_id: str,
        messages: Sequence[MessageInput],
        parent_id: ParentArg | Parent = LATEST,
    ) -> str | None:
        """Append a chain in one transaction; returns the last message's id.

        Departure: without ``parent_id`` the chain continues from the latest leaf (the
        original started a new root)."""
        check_session_id(session_id)
        if isinstance(messages, Mapping) or not isinstance(messages, Sequence):
            raise InvalidInput("messages must be a list of messages")
        batch = [coerce_message(m) for m in messages]
        result = await self.store.append_messages(session_id, batch, check_parent(parent_id), managed=True)
        if result.inserted:
            await self.get_session(session_id).after_append()
        if batch:
            return result.last_id
        if isinstance(parent_id, str) or parent_id is None:
            return parent_id
        leaf = await self.store.get_latest_leaf(session_id)
        return None if leaf is None else leaf.id

    async def get_history(self, session_id: str, leaf_id: str | None = None) -> builtins.list[Message]:
        await self._require(session_id)
        return await self.get_session(session_id).get_history(leaf_id)

    async def get_branches(self, session_id: str, message_id: str) -> builtins.list[Message]:
        await self._require(session_id)
        return await self.get_session(session_id).get_branches(message_id)

    async def get_message_count(self, session_id: str) -> int:
        """Messages on the active branch (the path to the latest leaf)."""
        await self._require(session_id)
        return await self.store.get_path_length(session_id)

    async def clear_messages(self, session_id: str) -> None:
        check_session_id(session_id)
        await self.store.clear_messages(session_id, managed=True)
        await self.get_session(session_id).after_clear()

    async def delete_messages(self, session_id: str, ids: Sequence[str]) -> builtins.list[str]:
        check_session_id(session_id)
        deleted = await self.store.delete_messages(session_id, check_ids(ids), managed=True)
        await self.get_session(session_id).after_change()
        return deleted

    # -- forks, overlays, usage ----------------------------------------------------------
    async def fork(self, session_id: str, at_message_id: str, name: str) -> SessionInfo:
        """A new session holding the path root → ``at_message_id`` of ``session_id``.

        Departure: message ids are kept (they are unique per session) and the overlays
        lying on the forked path come along, so the fork reads exactly like the source."""
        check_session_id(session_id)
        if not isinstance(at_message_id, str):
            raise InvalidInput("at_message_id must be a string")
        return await self._copy_template(
            session_id, await self.store.fork_session(session_id, at_message_id, name)
        )

    async def add_compaction(self, session_id: str, summary: str, from_id: str, to_id: str) -> Compaction:
        check_session_id(session_id)
        return await self.store.add_compaction(session_id, summary, from_id, to_id, managed=True)

    async def get_compactions(self, session_id: str) -> builtins.list[Compaction]:
        await self._require(session_id)
        return await self.store.get_compactions(session_id)

    async def compact_and_split(self, session_id: str, summary: str, name: str | None = None) -> SessionInfo:
        """End ``session_id`` (``end_reason='compaction'``) and continue in a new session
        whose first message carries ``summary``; returns the new session. A session that
        has ended already is :class:`~protocol.errors.Conflict` (nothing is written)."""
        check_session_id(session_id)
        info = await self.store.split_session(session_id, summary, _opt_str(name, "name"))
        return await self._copy_template(session_id, info)

    async def add_usage(
        self, session_id: str, input_tokens: int, output_tokens: int, cost: float
    ) -> SessionInfo:
        """Add token counts and cost to the session's totals."""
        check_session_id(session_id)
        return await self.store.add_usage(session_id, input_tokens, output_tokens, cost)

    async def search(self, query: str, limit: int = 20) -> builtins.list[SearchResult]:
        """Every word must match (each is quoted, so FTS operators are plain words); hits
        from all registered sessions, best first, each naming its ``session_id``."""
        return await self.store.search_messages(query, session_id=None, limit=limit, match="words")

    def tools(self) -> builtins.list[Tool]:
        """``session_search``: the model searches every session's conversations."""

        async def run(args: dict[str, Any]) -> str:
            results = await self.search(args["query"], limit=10)
            if not results:
                return "No results found."
            return "\n---\n".join(f"[{r.role}] {r.content}" for r in results)

        schema = {
            "type": "object",
            "properties": {"query": {"type": "string", "description": "Search query"}},
            "required": ["query"],
            "additionalProperties": {},
        }
        description = "Search past conversations for relevant context. Searches across all sessions."
        return [Tool("session_search", description, schema, run)]

    # -- events --------------------------------------------------------------------------
    # -- retention (docs/operations.md) ----------------------------------------------------
    async def prune_events(
        self,
        *,
        older_than: datetime | timedelta | None = None,
        keep_per_session: int | None = None,
        batch: int = 1000,
    ) -> PruneResult:
        """Prune the event logs of every session and the registry: events stored before
        ``older_than`` (a time, or an age such as ``timedelta(days=30)``) and those beyond
        the newest ``keep_per_session`` of each log. Messages, overlays and context stay; a
        subscriber resuming from a pruned position gets ``reset`` with the new first seq."""
        return await self.store.prune_events(
            older_than=prune_cutoff(older_than), keep_per_session=keep_per_session, batch=batch
        )

    async def read_registry_events(self, after_seq: int = 0, limit: int = 1000) -> builtins.list[Event]:
        return await self.store.read_events(REGISTRY, after_seq, limit)

    def registry_events(self, after_seq: int = 0, *, epoch: str | None = None) -> AsyncIterator[Event]:
        """Registry changes (created, renamed, forked, ended, deleted, usage): the backlog,
        then live."""
        return follow(self.store, REGISTRY, after_seq, epoch=epoch)


class _HistoryProvider:
    """The searchable block ``with_searchable_history`` adds: a count, and manager search."""

    def __init__(self, manager: SessionManager) -> None:
        self.manager = manager

    async def get(self) -> str | None:
        count = len(await self.manager.list())
        if count == 0:
            return None
        return (
            f"{count} session available for search."
            if count == 1
            else f"{count} sessions available for search."
        )

    async def search(self, query: str) -> str | None:
        results = await self.manager.search(query)
        if not results:
            return None
        return "\n---\n".join(f"[{r.role}] {r.content}" for r in results)
