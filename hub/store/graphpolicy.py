"""The rules both stores follow for LangGraph checkpoints (protocol/graphstate.py): what a
record may hold, how ``list`` filters, and the events a change logs.

The projection of a put's messages (a path, oldest first: the root namespace's
conversation) runs in the put's transaction, the same walk on both stores: from the newest
back, the messages the tree lacks are collected until one it holds; that one is updated if
it changed, the missing ones are appended after it (a new root if it holds none). So a put
adds what is new, a retry adds nothing twice, and resuming from an earlier checkpoint
appends under an earlier message: a branch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from protocol import Conflict, InvalidInput, Message
from protocol.graphstate import CheckpointRecord, CheckpointWrite

__all__ = [
    "CHECKPOINTS_DELETED",
    "CHECKPOINT_PUT",
    "CHECKPOINT_WRITES",
    "MAX_LIST",
    "check_record",
    "check_writes",
    "metadata_matches",
    "put_event",
    "same_message",
    "tail_unknown",
    "writes_event",
]

#: The events a checkpoint change logs on its session's stream, so a subscriber sees a
#: LangGraph thread advance live (the bytes stay in the store: an event says what changed).
CHECKPOINT_PUT: Final = "checkpoint.put"
CHECKPOINT_WRITES: Final = "checkpoint.writes"
CHECKPOINTS_DELETED: Final = "checkpoints.deleted"
#: An id, a namespace, a type tag: labels, bounded like names (a namespace nests subgraph
#: names, ``a:<uuid>|b:<uuid>``, hence longer).
_MAX_LABEL: Final = 1000
#: A list without a limit returns at most this many checkpoints per call (the client pages).
MAX_LIST: Final = 10_000


def _label(value: object, name: str, *, empty: bool = False) -> str:
    if not isinstance(value, str):
        raise InvalidInput(f"{name} must be a string, got {type(value).__name__}")
    if not value and not empty:
        raise InvalidInput(f"{name} must not be empty")
    if len(value) > _MAX_LABEL:
        raise InvalidInput(f"{name} must be at most {_MAX_LABEL} characters, got {len(value)}")
    return value


def check_record(record: CheckpointRecord) -> CheckpointRecord:
    _label(record.thread_id, "thread_id")
    _label(record.ns, "checkpoint_ns", empty=True)
    _label(record.checkpoint_id, "checkpoint_id")
    if record.parent_id is not None:
        _label(record.parent_id, "parent checkpoint_id")
    _label(record.type, "checkpoint type")
    if not isinstance(record.data, bytes):
        raise InvalidInput("checkpoint data must be bytes")
    if not isinstance(record.metadata, dict):
        raise InvalidInput("checkpoint metadata must be an object")
    return record


def check_writes(writes: Sequence[CheckpointWrite]) -> Sequence[CheckpointWrite]:
    for w in writes:
        _label(w.task_id, "task_id")
        _label(w.channel, "channel")
        _label(w.type, "write type")
        _label(w.task_path, "task_path", empty=True)
        if not isinstance(w.value, bytes) or not isinstance(w.idx, int):
            raise InvalidInput("a write's value must be bytes and its idx an integer")
    return writes


def metadata_matches(metadata: Mapping[str, Any], wanted: Mapping[str, Any] | None) -> bool:
    """``list(filter=...)``: every key of the filter present with an equal value (what
    LangGraph's own savers do with ``metadata @> filter`` / ``json_extract``)."""
    if not wanted:
        return True
    return all(k in metadata and metadata[k] == v for k, v in wanted.items())


def put_event(record: CheckpointRecord) -> dict[str, Any]:
    meta = record.metadata
    return {
        "checkpoint_ns": record.ns,
        "checkpoint_id": record.checkpoint_id,
        "parent_checkpoint_id": record.parent_id,
        "source": meta.get("source"),
        "step": meta.get("step"),
        "run_id": meta.get("run_id"),
    }


def writes_event(ns: str, checkpoint_id: str, writes: Sequence[CheckpointWrite]) -> dict[str, Any]:
    return {
        "checkpoint_ns": ns,
        "checkpoint_id": checkpoint_id,
        "tasks": sorted({w.task_id for w in writes}),
        "channels": sorted({w.channel for w in writes}),
    }


def same_message(stored: Message, given: Message) -> bool:
    """A projected message the tree holds already is updated only when it changed (a tool
    call's result arriving, an edited text)."""
    return stored.role == given.role and stored.parts == given.parts and stored.metadata == given.metadata


def tail_unknown(session_id: str) -> Conflict:
    """A partial projection (the conversation's tail) continues no message the tree holds:
    the put is refused whole, and the saver sends the whole conversation."""
    return Conflict(f"thread {session_id!r} holds none of the messages sent: send the whole conversation")
