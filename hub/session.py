"""`Session`: one conversation tree, with the original Session API's message semantics."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Self

from protocol import Compaction, Event, InvalidInput, Message, SearchResult, coerce_message

from .events import follow
from .store.base import LATEST, Parent, ParentArg, Store, session_stream

__all__ = ["MessageInput", "Session", "check_parent"]

MessageInput = Message | Mapping[str, Any]


def check_parent(parent_id: object) -> ParentArg:
    if parent_id is None or parent_id is LATEST or isinstance(parent_id, str):
        return parent_id
    raise InvalidInput(
        f"parent_id must be a message id, None or LATEST, got {type(parent_id).__name__}"
    )


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


class Session:
    """A conversation stored as a tree of messages.

    Builder methods return the session and touch nothing; the store is used from the first
    awaited call. ``session_id`` namespaces everything the session stores (default ``""``,
    single-session mode); it need not be in the sessions registry.
    """

    def __init__(self, store: Store, *, session_id: str = "") -> None:
        self.store = store
        self.session_id = _check_id(session_id, "session_id")

    @classmethod
    def create(cls, store: Store) -> Session:
        return cls(store)

    def for_session(self, session_id: str) -> Self:
        self.session_id = _check_id(session_id, "session_id")
        return self

    # -- messages ------------------------------------------------------------------------
    async def append_message(
        self, message: MessageInput, parent_id: ParentArg | Parent = LATEST
    ) -> bool:
        """Attach ``message`` to the latest leaf (``LATEST``), to ``parent_id``, or as a new
        root (``None``; also when ``parent_id`` is not in this session). Returns False when
        the id was already stored: the first content wins and nothing is written."""
        result = await self.store.append_messages(
            self.session_id, [coerce_message(message)], check_parent(parent_id)
        )
        return bool(result.inserted)

    async def update_message(self, message: MessageInput) -> bool:
        """Replace a stored message; an unknown id changes nothing (returns False)."""
        return await self.store.update_message(self.session_id, coerce_message(message))

    async def delete_messages(self, ids: Sequence[str]) -> list[str]:
        """Delete messages. Departure: children move to the deleted message's parent
        instead of being cut off. Returns the ids that existed and were deleted."""
        return await self.store.delete_messages(self.session_id, check_ids(ids))

    async def clear_messages(self) -> None:
        """Delete every message and compaction overlay of this session."""
        await self.store.clear_messages(self.session_id)

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

    # -- events --------------------------------------------------------------------------
    async def read_events(self, after_seq: int = 0, limit: int = 1000) -> list[Event]:
        """This session's logged changes after ``after_seq``."""
        return await self.store.read_events(session_stream(self.session_id), after_seq, limit)

    def events(self, after_seq: int = 0, *, epoch: str | None = None) -> AsyncIterator[Event]:
        """Every change after ``after_seq``: the backlog, then live, in ``seq`` order."""
        return follow(self.store, session_stream(self.session_id), after_seq, epoch=epoch)
