"""`Session`: one conversation tree, with the original Session API's message semantics."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, Self

import msgspec

from protocol import (
    Compaction,
    Conflict,
    ContextBlock,
    Event,
    InvalidInput,
    Message,
    SearchResult,
    coerce_message,
)

from .builder import SessionBuilder, SessionConfig
from .compaction import CompactContext, CompactResult
from .context import ContextBlocks, ContextConfig, call, is_skill_provider
from .events import follow
from .providers import StoreContextProvider
from .store.base import LATEST, LogEntry, Parent, ParentArg, Store, session_stream
from .store.overlays import COMPACTION_PREFIX
from .tokens import estimate_message_tokens, estimate_string_tokens
from .tools import Tool

__all__ = ["MessageInput", "Session", "check_parent"]

_UNLOADED_PREFIX = "[skill unloaded:"

log = logging.getLogger("sessionhub.session")

MessageInput = Message | Mapping[str, Any]


def check_parent(parent_id: object) -> ParentArg:
    if parent_id is None or parent_id is LATEST or isinstance(parent_id, str):
        return parent_id
    raise InvalidInput(f"parent_id must be a message id, None or LATEST, got {type(parent_id).__name__}")


def check_ids(ids: object) -> list[str]:
    if isinstance(ids, str) or not isinstance(ids, Sequence):
        raise InvalidInput("ids must be a list of message ids")
    out = list(ids)
    for i, value in enumerate(out):
        if not isinstance(value, str):
            raise InvalidInput(f"ids[{i}] must be a string, got {type(value).__name__}")
    return out


def _check_id(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise InvalidInput(f"{name} must be a string, got {type(value).__name__}")
    return value


class Session(SessionBuilder):
    """A conversation stored as a tree of messages.

    Builder methods return the session and touch nothing; the store is used from the first
    awaited call. ``session_id`` namespaces everything the session stores (default ``""``,
    single-session mode); it need not be in the sessions registry.
    """

    def __init__(self, store: Store, *, session_id: str = "") -> None:
        self.store = store
        self.session_id = _check_id(session_id, "session_id")
        self._config = SessionConfig()
        self._context: ContextBlocks | None = None
        self._ready = asyncio.Lock()
        self._compacting = asyncio.Lock()
        self._warned_null = False
        #: Set by a manager with templates: the config, read from the store on first use.
        self._resolve_config: Callable[[], Awaitable[SessionConfig]] | None = None

    @classmethod
    def create(cls, store: Store) -> Session:
        return cls(store)

    # -- builder -------------------------------------------------------------------------
    def for_session(self, session_id: str) -> Self:
        """Namespace everything this session stores, context rows included."""
        self._check_unbuilt()
        self.session_id = _check_id(session_id, "session_id")
        return self

    def _check_unbuilt(self) -> None:
        if self._context is not None:
            raise InvalidInput("the session is already in use; configure it before the first call")

    def _key(self, label: str) -> str:
        return f"{label}_{self.session_id}" if self.session_id else label

    def _store_provider(self, label: str, event_type: str = "context.updated") -> StoreContextProvider:
        return StoreContextProvider(
            self.store, self._key(label), session_id=self.session_id, event_type=event_type
        )

    async def _blocks(self) -> ContextBlocks:
        if self._context is not None:
            return self._context
        async with self._ready:
            if self._context is None:
                if self._resolve_config is not None:
                    self._config = await self._resolve_config()
                    self._resolve_config = None
                prompt_store = None
                if self._config.cached_prompt:
                    prompt_store = self._config.prompt_provider or self._store_provider(
                        "_system_prompt", "prompt.updated"
                    )
                configs = [
                    c
                    if c.provider is not None
                    else dataclasses.replace(c, provider=self._store_provider(c.label))
                    for c in self._config.contexts
                ]
                blocks = ContextBlocks(
                    configs,
                    prompt_store,
                    default_provider=self._store_provider,
                    on_change=self._log_change,
                    on_unload=self._reclaim_loaded_skill,
                )
                if any(is_skill_provider(c.provider) for c in configs):
                    restored = await self._scan_loaded_skills()
                    if restored:
                        blocks.restore_loaded_skills(restored)
                self._context = blocks
        return self._context

    def _has_context(self) -> bool:
        return bool(
            self._config.contexts
            or self._config.cached_prompt
            or self._context is not None
            or self._resolve_config is not None
        )

    async def _log_change(self, type_: str, data: dict[str, Any]) -> None:
        await self.store.log_event(LogEntry(session_id=self.session_id, type=type_, data=data))

    # -- messages ------------------------------------------------------------------------
    async def append_message(self, message: MessageInput, parent_id: ParentArg | Parent = LATEST) -> bool:
        """Attach ``message`` to the latest leaf (``LATEST``), to ``parent_id``, or as a new
        root (``None``; also when ``parent_id`` is not in this session). Returns False when
        the id was already stored: the first content wins and nothing is written."""
        result = await self.store.append_messages(
            self.session_id, [coerce_message(message)], check_parent(parent_id)
        )
        await self.after_append()
        return bool(result.inserted)

    async def update_message(self, message: MessageInput) -> bool:
        """Replace a stored message; an unknown id changes nothing (returns False)."""
        updated = await self.store.update_message(self.session_id, coerce_message(message))
        await self.after_change()
        return updated

    async def delete_messages(self, ids: Sequence[str]) -> list[str]:
        """Delete messages. Departure: children move to the deleted message's parent
        instead of being cut off. Returns the ids that existed and were deleted."""
        deleted = await self.store.delete_messages(self.session_id, check_ids(ids))
        await self.after_change()
        return deleted

    async def clear_messages(self) -> None:
        """Delete every message and compaction overlay of this session; loaded skills are
        forgotten and the frozen prompt is re-rendered (when the session has context)."""
        await self.store.clear_messages(self.session_id)
        await self.after_clear()

    async def after_clear(self) -> None:
        """What follows clearing the messages (also when the manager cleared them): loaded
        skills are forgotten and the frozen prompt re-rendered, if the session has context;
        then the ``status`` of :meth:`after_change`."""
        if self._has_context():
            blocks = await self._blocks()
            blocks.clear_skill_state()
            await blocks.refresh_system_prompt()
        await self.after_change()

    async def get_history(self, leaf_id: str | None = None) -> list[Message]:
        """Root → ``leaf_id`` (default: the latest leaf), overlays applied; unknown → []."""
        if leaf_id is not None:
            _check_id(leaf_id, "leaf_id")
        return await self.store.get_history(self.session_id, leaf_id)

    async def get_message(self, message_id: str) -> Message | None:
        return await self.store.get_message(self.session_id, _check_id(message_id, "message_id"))

    async def get_latest_leaf(self) -> Message | None:
        """The newest message that has no children."""
        return await self.store.get_latest_leaf(self.session_id)

    async def get_path_length(self, leaf_id: str | None = None) -> int:
        """Messages on the path root → leaf, counting compacted ones (overlays ignored)."""
        if leaf_id is not None:
            _check_id(leaf_id, "leaf_id")
        return await self.store.get_path_length(self.session_id, leaf_id)

    async def get_branches(self, message_id: str) -> list[Message]:
        """The direct children of ``message_id``, oldest first."""
        return await self.store.get_branches(self.session_id, _check_id(message_id, "message_id"))

    async def search(self, query: str, limit: int = 20) -> list[SearchResult]:
        """Phrase search over this session's text parts, best match first. The query is one
        quoted phrase, so FTS operators in it are plain words; blank → []."""
        return await self.store.search_messages(
            query, session_id=self.session_id, limit=limit, match="phrase"
        )

    # -- compaction overlays -------------------------------------------------------------
    async def add_compaction(self, summary: str, from_id: str, to_id: str) -> Compaction:
        """Lay ``summary`` over ``from_id``..``to_id``; the messages stay stored."""
        return await self.store.add_compaction(self.session_id, summary, from_id, to_id)

    async def get_compactions(self) -> list[Compaction]:
        """All overlays of this session, oldest first."""
        return await self.store.get_compactions(self.session_id)

    # -- compaction ----------------------------------------------------------------------
    async def estimate_tokens(self, leaf_id: str | None = None) -> int:
        """The token estimate compaction decisions use: the branch's history (overlays
        applied) plus the system prompt, or the session's own counter. Never freezes or
        persists a prompt."""
        history = await self.get_history(leaf_id)
        blocks = await self._blocks()
        prompt = await blocks.prompt_for_estimate()
        if self._config.token_counter is None:
            return estimate_message_tokens(history) + estimate_string_tokens(prompt)
        await blocks.ensure_loaded()  # the counter sees the blocks' current content
        value = await call(
            self._config.token_counter,
            {"messages": history, "system_prompt": prompt, "context_blocks": blocks.get_blocks()},
        )
        try:
            number = float(value)
        except (TypeError, ValueError):
            return 0
        return max(0, math.ceil(number)) if math.isfinite(number) else 0

    async def _status(self, phase: str, estimate: int, **extra: Any) -> None:
        threshold = self._config.threshold
        data = {"phase": phase, "token_estimate": estimate, "token_threshold": threshold, **extra}
        await self._log_change("status", data)

    async def compact(self, leaf_id: str | None = None) -> CompactResult | None:
        """Summarize the middle of the branch ending at ``leaf_id`` (default: the latest
        leaf) into an overlay. Iterative and branch-local: the overlay grows from the
        earliest overlay visible on this branch; a sibling branch's overlays are untouched.

        Appends may go on while the summarizer works: the overlay ends at the message the
        summary covers, and it is written only if that span is still one path of the
        session (else ``None``, with an ``error`` event). Returns the stored span, or
        ``None`` when nothing was compacted."""
        if self._config.compact_fn is None:
            raise InvalidInput("No compaction function registered. Call on_compaction() first.")
        async with self._compacting:
            if leaf_id is None:
                # Fix the branch now: a sibling appended while the summarizer works must not
                # change which branch the estimates describe.
                leaf = await self.get_latest_leaf()
                leaf_id = None if leaf is None else leaf.id
            before = await self.estimate_tokens(leaf_id)
            await self._status("compacting", before)
            history = await self.get_history(leaf_id)
            try:
                raw = await call(
                    self._config.compact_fn,
                    history,
                    CompactContext(self._config.token_counter, self.session_id),
                )
                result = CompactResult.coerce(raw)
            except Exception as exc:
                await self._log_change("error", {"error": str(exc)})
                return None
            ids = {m.id for m in history}
            if result is None or result.to_message_id not in ids:
                await self._status("idle", await self.estimate_tokens(leaf_id))
                return None
            if not result.summary.strip():
                # An empty summary would silently erase the span it covers.
                await self._log_change("error", {"error": "compaction produced an empty summary"})
                return None
            existing = [
                c
                for c in await self.get_compactions()
                if COMPACTION_PREFIX + c.id in ids or (c.from_message_id in ids and c.to_message_id in ids)
            ]
            start = existing[0].from_message_id if existing else result.from_message_id
            positions = {m.id: i for i, m in enumerate(history)}
            first = positions.get(start, positions.get(result.from_message_id, 0))
            covered = [
                m.id
                for m in history[first : positions[result.to_message_id] + 1]
                if not m.id.startswith(COMPACTION_PREFIX)
            ]
            try:
                await self.store.add_compaction(
                    self.session_id,
                    result.summary,
                    start,
                    result.to_message_id,
                    verify_path=True,
                    covered=covered,
                )
            except Conflict as exc:
                await self._log_change("error", {"error": str(exc)})
                return None
            if self._has_context():
                await (await self._blocks()).refresh_system_prompt()
            after = await self.estimate_tokens(leaf_id)
            await self._status("idle", after, compacted={"tokens_before": before})
            return CompactResult(start, result.to_message_id, result.summary)

    async def after_append(self) -> None:
        """Auto-compaction's check, run after every append (by the manager too): with a
        threshold (``compact_after``), a ``status`` idle event, then a compaction if the
        estimate is over it and there is a function. Never raises: failures go to
        ``on_compaction_error`` and the log."""
        if self._config.threshold is not None:
            await self._maybe_auto_compact()

    async def after_change(self) -> None:
        """The ``status`` idle event after an update, a delete or a clear (by the manager
        too), as the original sends one after every write, so that a fill level drawn from
        the log is never stale. Only with a threshold (``compact_after``): a session that
        does not compact has no fill level to show. Never raises."""
        if self._config.threshold is None:
            return
        try:
            await self._status("idle", await self.estimate_tokens())
        except Exception as exc:  # the write is done: a failed estimate must not undo it
            log.warning("Session status estimate failed: %s", exc)
            try:
                await self._log_change("error", {"error": str(exc)})
            except Exception as log_exc:  # the store itself may be what failed
                log.warning("could not log the estimate error: %s", log_exc)

    async def _maybe_auto_compact(self) -> None:
        if self._compacting.locked():
            # A compaction is already running: this append must not wait for its LLM call.
            # The next append after it re-checks the estimate.
            return
        try:
            estimate = await self.estimate_tokens()
            await self._status("idle", estimate)
            if (
                self._config.threshold is None
                or estimate <= self._config.threshold
                or self._config.compact_fn is None
            ):
                return
            result = await self.compact()
            if result is not None:
                self._warned_null = False
            elif not self._warned_null:
                self._warned_null = True
                hint = (
                    "Check that the token counter reflects what the compaction function measures."
                    if self._config.token_counter is not None
                    else "The heuristic estimate may under-count tool-heavy histories; "
                    "pass token_counter= to compact_after() for exact accounting."
                )
                log.warning(
                    "[Session] Auto-compaction fired (~%s tokens > %s) but the compaction function "
                    "returned null, so history was not shortened. %s",
                    estimate,
                    self._config.threshold,
                    hint,
                )
        except Exception as exc:
            await self._handle_auto_compaction_error(exc)

    async def _handle_auto_compaction_error(self, exc: Exception) -> None:
        if self._config.compaction_error_handler is not None:
            try:
                await call(self._config.compaction_error_handler, exc)
            except Exception as handler_exc:
                log.warning("Session auto-compaction error handler failed: %s", handler_exc)
        else:
            log.warning("Session auto-compaction failed: %s", exc)
        try:
            await self._log_change("error", {"error": str(exc)})
        except Exception as log_exc:  # the store itself may be what failed
            log.warning("could not log the compaction error: %s", log_exc)

    # -- context blocks, the frozen prompt, tools ----------------------------------------
    async def get_context_block(self, label: str) -> ContextBlock | None:
        blocks = await self._blocks()
        await blocks.ensure_loaded()
        return blocks.get_block(label)

    async def get_context_blocks(self) -> list[ContextBlock]:
        blocks = await self._blocks()
        await blocks.ensure_loaded()
        return blocks.get_blocks()

    async def replace_context_block(self, label: str, content: str) -> ContextBlock:
        """Replace a writable block (``max_tokens`` enforced); the frozen prompt stays."""
        return await (await self._blocks()).set_block(label, content)

    async def append_context_block(self, label: str, content: str) -> ContextBlock:
        """Append a line to a writable block (``max_tokens`` checked on the total)."""
        return await (await self._blocks()).append_to_block(label, content)

    async def add_context(
        self,
        label: str,
        description: str | None = None,
        max_tokens: int | None = None,
        provider: Any = None,
    ) -> ContextBlock:
        """Add a block at run time (store-backed without a provider)."""
        blocks = await self._blocks()
        config = ContextConfig(
            label,
            description,
            max_tokens,
            provider if provider is not None else self._store_provider(label),
        )
        block = await blocks.add_block(config)
        if is_skill_provider(config.provider):
            restored = await self._scan_loaded_skills()
            if restored:
                blocks.restore_loaded_skills([*blocks.get_loaded_skill_keys(), *restored])
        return block

    async def remove_context(self, label: str) -> bool:
        """Remove a block; history is not rewritten."""
        return await (await self._blocks()).remove_block(label)

    async def freeze_system_prompt(self) -> str:
        """Render the system prompt once and keep returning that exact string."""
        return await (await self._blocks()).freeze_system_prompt()

    async def refresh_system_prompt(self) -> str:
        """Reload every block, re-render and persist the frozen prompt."""
        return await (await self._blocks()).refresh_system_prompt()

    async def reminder(self) -> str | None:
        """What the ``when_changed="remind"`` blocks say now that the frozen prompt does not,
        for the host to send after the cached prefix (None: nothing changed);
        :meth:`~hub.context.ContextBlocks.reminder`, docs/context.md."""
        return await (await self._blocks()).reminder()

    async def tools(self) -> list[Tool]:
        """``set_context`` / ``load_context`` / ``unload_context`` / ``search_context``, as the
        blocks call for; none when every block is read-only."""
        return await (await self._blocks()).tools()

    async def unload_skill(self, label: str, key: str) -> bool:
        return await (await self._blocks()).unload_skill(label, key)

    async def get_loaded_skill_keys(self) -> set[str]:
        return (await self._blocks()).get_loaded_skill_keys()

    async def _scan_loaded_skills(self) -> dict[str, None]:
        """Which skills the transcript shows as loaded and not unloaded (raw path, root →
        leaf, so skills hidden under an overlay still count)."""
        loaded: dict[str, None] = {}  # ordered like the transcript
        for message in await self.store.get_path(self.session_id):
            if message.role != "assistant":
                continue
            for part in message.parts:
                if part.get("state") != "output-available":
                    continue
                name = _tool_name(part)
                args = part.get("input")
                if name == "load_context" and isinstance(args, Mapping):
                    label, key = args.get("label"), args.get("key")
                    if not label or not key:
                        continue
                    output = part.get("output")
                    if isinstance(output, str) and output.startswith(_UNLOADED_PREFIX):
                        loaded.pop(f"{label}:{key}", None)
                    else:
                        loaded[f"{label}:{key}"] = None
                elif name == "unload_context" and isinstance(args, Mapping):
                    loaded.pop(f"{args.get('label')}:{args.get('key')}", None)
        return loaded

    async def _reclaim_loaded_skill(self, label: str, key: str) -> None:
        """Replace the newest recorded load of this skill with a short marker, so the
        unloaded text stops costing context on every later turn."""
        for message in reversed(await self.get_history()):
            if message.role != "assistant":
                continue
            hit = False
            parts = []
            for part in message.parts:
                args = part.get("input")
                if (
                    _tool_name(part) == "load_context"
                    and part.get("state") == "output-available"
                    and isinstance(args, Mapping)
                    and args.get("label") == label
                    and args.get("key") == key
                ):
                    part = {**part, "output": f"[skill unloaded: {key}]"}
                    hit = True
                parts.append(part)
            if hit:
                # The original's internal rewrite: no status event, unlike update_message.
                await self.store.update_message(
                    self.session_id, msgspec.structs.replace(message, parts=parts)
                )
                return

    # -- events --------------------------------------------------------------------------
    async def read_events(self, after_seq: int = 0, limit: int = 1000) -> list[Event]:
        """This session's logged changes after ``after_seq``."""
        return await self.store.read_events(session_stream(self.session_id), after_seq, limit)

    def events(self, after_seq: int = 0, *, epoch: str | None = None) -> AsyncIterator[Event]:
        """Every change after ``after_seq``: the backlog, then live, in ``seq`` order."""
        return follow(self.store, session_stream(self.session_id), after_seq, epoch=epoch)


def _tool_name(part: Mapping[str, Any]) -> str | None:
    """The tool a part records: ``toolName`` (dynamic tools) or the ``tool-<name>`` type.

    Departure: the original matched ``toolName`` only, so the AI SDK's typed parts
    (``tool-load_context``, which carry no ``toolName``) were neither restored nor reclaimed.
    """
    name = part.get("toolName")
    if isinstance(name, str):
        return name
    kind = part.get("type")
    if isinstance(kind, str) and kind.startswith("tool-"):
        return kind[5:]
    return None
