"""AG-UI's shared state as the session's context blocks, without HTTP.

The state is ``{"contextBlocks": {label: content}}`` over the session's plain blocks (skills
and searchable blocks are keyed stores, not one text: left out). It goes out as
``STATE_SNAPSHOT`` (:func:`blocks_state`) and, for a block changed while a run streams (by a
tool, a WebSocket client, another run's input), as ``STATE_DELTA``: a JSON Patch (RFC 6902)
made from the ``context.*`` event the change logged (:class:`StateTracker`).

AG-UI gives a client no event to send a delta with: a run's input is its whole ``state``.
The hub reads it as a patch against the current snapshot (:func:`state_patch`: the blocks
whose text differs), and applies the patch to the blocks all or none (:func:`apply_patch`):
each operation is checked against a copy of the state first, then every block it changes
is checked writable and within its ``max_tokens``, so a refused patch writes nothing (no
reader sees a block change and change back); a write that still fails (the store) puts back
the ones before it. A bad
patch or a read-only block is :class:`~protocol.InvalidInput`, which the door answers as
``RUN_ERROR`` with ``code: "invalid"``.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any

from protocol import InvalidInput, SessionHubError
from protocol.records import ContextBlock, Event

from ..tokens import estimate_string_tokens
from .port import Sessions

__all__ = [
    "StateTracker",
    "apply_patch",
    "apply_state",
    "blocks_state",
    "patch_document",
    "pointer",
    "state_patch",
    "undo_state",
]

KEY = "contextBlocks"


def _plain(block: ContextBlock) -> bool:
    return not block.is_skill and not block.is_searchable


async def blocks_state(hub: Sessions, session_id: str) -> dict[str, Any]:
    """The run's AG-UI state: ``{"contextBlocks": {label: content}}`` of the plain blocks."""
    blocks = await hub.manager.get_session(session_id).get_context_blocks()
    return {KEY: {b.label: b.content for b in blocks if _plain(b)}}


def pointer(label: str) -> str:
    """The JSON Pointer (RFC 6901) of a block's text in the state."""
    return f"/{KEY}/" + label.replace("~", "~0").replace("/", "~1")


# -- RFC 6902 over a JSON document -----------------------------------------------------------


def _tokens(path: Any) -> list[str]:
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise InvalidInput(f"a JSON Pointer must be a string starting with '/': {path!r}")
    if path == "":
        return []
    return [t.replace("~1", "/").replace("~0", "~") for t in path[1:].split("/")]


def _parent(doc: Any, tokens: list[str], path: str) -> tuple[Any, str]:
    node = doc
    for token in tokens[:-1]:
        node = _child(node, token, path)
    return node, tokens[-1]


def _child(node: Any, token: str, path: str) -> Any:
    if isinstance(node, dict) and token in node:
        return node[token]
    if isinstance(node, list) and token.isdigit() and int(token) < len(node):
        return node[int(token)]
    raise InvalidInput(f"JSON Patch: no value at {path!r}")


def _get(doc: Any, path: Any) -> Any:
    node = doc
    for token in _tokens(path):
        node = _child(node, token, path)
    return node


def _add(doc: Any, path: Any, value: Any) -> Any:
    tokens = _tokens(path)
    if not tokens:
        return value
    parent, key = _parent(doc, tokens, path)
    if isinstance(parent, dict):
        parent[key] = value
    elif isinstance(parent, list) and (key == "-" or (key.isdigit() and int(key) <= len(parent))):
        parent.insert(len(parent) if key == "-" else int(key), value)
    else:
        raise InvalidInput(f"JSON Patch: cannot add at {path!r}")
    return doc


def _remove(doc: Any, path: Any) -> Any:
    tokens = _tokens(path)
    if not tokens:
        raise InvalidInput("JSON Patch: cannot remove the whole document")
    parent, key = _parent(doc, tokens, path)
    _child(parent, key, path)
    if isinstance(parent, dict):
        del parent[key]
    else:
        del parent[int(key)]
    return doc


def patch_document(doc: Any, patch: Any) -> Any:
    """``doc`` with the JSON Patch ``patch`` applied (a copy; ``doc`` is left as it was).
    Every operation of RFC 6902 (add, remove, replace, move, copy, test); a bad one raises
    :class:`~protocol.InvalidInput` and nothing is applied."""
    if not isinstance(patch, list):
        raise InvalidInput("a JSON Patch is a list of operations")
    doc = copy.deepcopy(doc)
    for op in patch:
        if not isinstance(op, dict) or not isinstance(op.get("op"), str):
            raise InvalidInput(f"JSON Patch: not an operation: {op!r}")
        kind, path = op["op"], op.get("path")
        if kind in ("add", "replace", "test") and "value" not in op:
            raise InvalidInput(f"JSON Patch: {kind} needs a value")
        if kind == "add":
            doc = _add(doc, path, copy.deepcopy(op["value"]))
        elif kind == "remove":
            doc = _remove(doc, path)
        elif kind == "replace":
            _get(doc, path)
            doc = _add(_remove(doc, path), path, copy.deepcopy(op["value"])) if path else op["value"]
        elif kind in ("move", "copy"):
            source = op.get("from")
            value = copy.deepcopy(_get(doc, source))
            if kind == "move":
                if isinstance(path, str) and isinstance(source, str) and path.startswith(source + "/"):
                    raise InvalidInput("JSON Patch: cannot move a value into itself")
                doc = _remove(doc, source)
            doc = _add(doc, path, value)
        elif kind == "test":
            if _get(doc, path) != op["value"]:
                raise InvalidInput(f"JSON Patch: test failed at {path!r}")
        else:
            raise InvalidInput(f"JSON Patch: unknown op {kind!r}")
    return doc


# -- the input state, as a patch of the blocks -----------------------------------------------


def state_patch(current: dict[str, Any], state: Any) -> list[dict[str, Any]]:
    """A run's input ``state`` as a JSON Patch against the ``current`` snapshot: a
    ``replace`` for each block whose text it changes (a state without ``contextBlocks``,
    what ``HttpAgent`` sends by default, changes nothing)."""
    if state is None:
        return []
    if not isinstance(state, dict):
        raise InvalidInput("state must be an object")
    wanted = state.get(KEY)
    if wanted is None:
        return []
    if not isinstance(wanted, dict):
        raise InvalidInput("state.contextBlocks must map block labels to their text")
    blocks = current[KEY]
    ops: list[dict[str, Any]] = []
    for label, content in wanted.items():
        if blocks.get(label) != content:
            ops.append(
                {"op": "replace" if label in blocks else "add", "path": pointer(label), "value": content}
            )
    return ops


async def apply_patch(hub: Sessions, session_id: str, patch: Any) -> list[dict[str, Any]]:
    """Apply a JSON Patch to the session's blocks, all or none (see the module); the patch
    as applied (empty when it changed nothing)."""
    session = hub.manager.get_session(session_id)
    blocks = {b.label: b for b in await session.get_context_blocks()}
    current = {KEY: {b.label: b.content for b in blocks.values() if _plain(b)}}
    after = patch_document(current, patch)
    if not isinstance(after, dict) or set(after) != {KEY} or not isinstance(after[KEY], dict):
        raise InvalidInput("state: a patch may change contextBlocks only")
    wanted: dict[str, Any] = after[KEY]
    if set(wanted) != set(current[KEY]):
        extra = sorted(set(wanted) ^ set(current[KEY]))
        raise InvalidInput(f"state.contextBlocks: blocks cannot be added or removed here: {extra}")
    changes: dict[str, str] = {}
    for label, content in wanted.items():
        if content == current[KEY][label]:
            continue
        if not isinstance(content, str):
            raise InvalidInput(f"state.contextBlocks: block {label!r} must be text")
        if not blocks[label].writable:
            raise InvalidInput(f"state.contextBlocks: block {label!r} is read-only")
        # The engine's own bound, judged here for every block before any is written: a patch
        # it would refuse half way writes nothing, rather than a block then its undoing.
        limit, tokens = blocks[label].max_tokens, estimate_string_tokens(content)
        if limit and tokens > limit:
            raise InvalidInput(
                f"state.contextBlocks: block {label!r} exceeds its max_tokens: {tokens} > {limit}"
            )
        changes[label] = content
    done: list[str] = []
    try:
        for label, content in changes.items():
            await session.replace_context_block(label, content)
            done.append(label)
    except SessionHubError:
        for label in done:
            with contextlib.suppress(SessionHubError):
                await session.replace_context_block(label, blocks[label].content)
        raise
    return [op for op in patch if isinstance(op, dict) and op.get("op") != "test"] if changes else []


async def apply_state(
    hub: Sessions, session_id: str, state: Any, current: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """A run's input ``state``: its patch against the snapshot (``current``, if the caller
    has read it), applied all or none."""
    patch = state_patch(current or await blocks_state(hub, session_id), state)
    if not patch:
        return []
    unknown = [op["path"] for op in patch if op["op"] == "add"]
    if unknown:
        raise InvalidInput(f"state.contextBlocks: no such block in this session: {unknown}")
    return await apply_patch(hub, session_id, patch)


async def undo_state(
    hub: Sessions, session_id: str, before: dict[str, Any], patch: list[dict[str, Any]]
) -> None:
    """Put back the blocks ``patch`` (what :func:`apply_state` applied) changed, to their text in
    ``before`` (the snapshot it was applied to): a run refused after its state was written
    (a turn already in flight: 409) leaves the blocks as they were, all or nothing."""
    session = hub.manager.get_session(session_id)
    for op in patch:
        tokens = _tokens(op.get("path"))
        if len(tokens) == 2 and tokens[1] in before[KEY]:
            with contextlib.suppress(SessionHubError):  # each block it can, as apply_patch does
                await session.replace_context_block(tokens[1], before[KEY][tokens[1]])


# -- block changes during a run, as STATE_DELTA ----------------------------------------------


class StateTracker:
    """The state a run's readers hold, kept current by the session's ``context.*`` events:
    each change is the JSON Patch that takes them there (``None``: not a change of state)."""

    def __init__(self, snapshot: dict[str, Any]) -> None:
        self.blocks: dict[str, str] = dict(snapshot.get(KEY, {}))

    def delta(self, event: Event) -> list[dict[str, Any]] | None:
        data = event.data
        if event.type == "context.updated":
            label, content = data.get("label"), data.get("content")
            if (
                not isinstance(label, str)
                or not isinstance(content, str)
                or self.blocks.get(label) == content
            ):
                return None
            op = "replace" if label in self.blocks else "add"
            self.blocks[label] = content
            return [{"op": op, "path": pointer(label), "value": content}]
        if event.type == "context.added":
            block = data.get("block")
            if not isinstance(block, dict) or not isinstance(block.get("label"), str):
                return None
            if block.get("is_skill") or block.get("is_searchable"):
                return None
            label, content = block["label"], str(block.get("content", ""))
            op = "replace" if label in self.blocks else "add"
            self.blocks[label] = content
            return [{"op": op, "path": pointer(label), "value": content}]
        if event.type == "context.removed":
            label = data.get("label")
            if not isinstance(label, str) or label not in self.blocks:
                return None
            del self.blocks[label]
            return [{"op": "remove", "path": pointer(label)}]
        return None
