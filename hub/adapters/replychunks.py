"""A turn's reply as UI message stream chunks, rendered once per node for every door
that streams it chunk by chunk and numbered from the turn's first chunk.

``/api/chat/ws`` (:mod:`.aisdk_ws`) sends these chunks as they are; AG-UI (:mod:`.agui`)
turns each into its events. Both continue a reader after a chunk it names, which needs the
chunks from the turn's start: :attr:`TurnChunks.whole` says whether this node has them (it
saw the turn begin, and they stayed within twice ``max_stream_bytes``). Kept while the turn
runs, dropped when it ends.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any, Protocol

from protocol import frames as f

from ..server.turnframes import TurnOutcome
from .port import ChatHost, ChatTurn
from .uistream import UIMessageEncoder, render

__all__ = ["Listener", "TurnChunks", "turn_chunks"]

log = logging.getLogger("sessionhub.chat")


class Listener(Protocol):
    def deliver(self, first: int, last: bool) -> None:
        """Chunks from index ``first`` on are new; ``last``: the turn has ended."""
        ...


class TurnChunks:
    """One turn's chunks on this node: rendered once for every request that streams it, and
    numbered from the turn's first chunk (``start``), kept while the turn runs so that a
    request can continue after any of them. ``whole`` says whether they begin at the turn's
    start (the node saw it begin) and are all still held."""

    def __init__(self, hub: ChatHost, turn: ChatTurn, primed: bool = False) -> None:
        self.hub, self.turn = hub, turn
        # AI SDK 7's chunks: /api/chat/ws speaks 7, and AG-UI skips the chunks it has no event for.
        self.encoder = UIMessageEncoder(turn.reply_id, v7=True)
        chunks = self.encoder.start()
        current = hub.streams.current(turn.session_id, turn.reply_id)
        #: A continuation (the page answered a tool and holds the reply up to now): its
        #: chunks begin here, so a replay renders the whole message afresh.
        self.primed = primed and current is not None
        # Seen from its start only if nothing of it had streamed when the node began to watch.
        self.whole = current is None or self.primed
        paused = False
        if current is not None and self.primed:
            self.encoder.prime(*current)
        elif current is not None:
            chunks += self.encoder.message(*current)
            paused = hub.streams.awaiting(turn.session_id, turn.reply_id)
        if paused:
            # The reply waits for the user: a reader gets it up to the question, and its end.
            chunks += [*self.encoder.close(), {"type": "finish", "finishReason": "tool-calls"}]
        self.texts: list[str] = []  # each chunk's JSON
        self.items: list[dict[str, Any]] = []  # and the chunk itself, for other renderings
        self.bytes = 0
        self.limit = hub.config.max_stream_bytes * 2
        self.done = paused
        self.listeners: list[Listener] = []
        self._keep(chunks)
        self.unwatch: Callable[[], None] = _nothing if paused else turn.watch(self.on_item)

    def _keep(self, chunks: list[dict[str, Any]]) -> None:
        for chunk in chunks:
            text = json.dumps(chunk, separators=(",", ":"))
            self.items.append(chunk)
            self.texts.append(text)
            self.bytes += len(text)
        if self.bytes > self.limit and self.whole:
            # Past the bound a continuation could not be served exactly any more: say so
            # (``resume`` without lastSequence still works: it replays the message).
            self.whole = False

    def on_item(self, item: f.StreamFrame | TurnOutcome) -> None:
        # Called by the turn among its other watchers: a failure here must not reach it.
        try:
            chunks, last = render(self.encoder, item)
        except Exception:
            log.exception("a chunk of the reply %s could not be rendered", self.turn.reply_id)
            chunks = [{"type": "error", "errorText": "the hub could not render the reply; resume it"}]
            last = True
        first = len(self.texts)
        self._keep(chunks)
        if last:
            self.done = True
            self.unwatch()
            if _TURNS.get(id(self.turn)) is self:
                del _TURNS[id(self.turn)]
        for listener in list(self.listeners):
            listener.deliver(first, last)

    def replay_items(self) -> tuple[list[dict[str, Any]], int]:
        """As :meth:`replay`, the chunks themselves."""
        if (self.whole and not self.primed) or not self.items:
            return list(self.items), len(self.items)
        fresh = UIMessageEncoder(self.turn.reply_id, v7=True)
        return fresh.start() + fresh.message(self.encoder.snapshot(), self.encoder.index), len(self.items)

    def replay(self) -> tuple[list[str], int]:
        """Chunks that take a new reader to where the reply is now, and the index of the next
        kept chunk it must be given after them."""
        if (self.whole and not self.primed) or not self.texts:
            return list(self.texts), len(self.texts)
        fresh = UIMessageEncoder(self.turn.reply_id, v7=True)
        chunks = fresh.start() + fresh.message(self.encoder.snapshot(), self.encoder.index)
        return [json.dumps(c, separators=(",", ":")) for c in chunks], len(self.texts)


def _nothing() -> None:
    pass


#: id(turn) -> its chunks on this node (the entry holds the turn, so the id is not reused).
_TURNS: dict[int, TurnChunks] = {}


def turn_chunks(hub: ChatHost, turn: ChatTurn, primed: bool = False) -> TurnChunks:
    """The turn's chunks on this node; ``primed``: a new rendering that starts from the
    reply as it stands (the page answered a tool of it), for this and later readers."""
    chunks = _TURNS.get(id(turn))
    if primed or chunks is None or chunks.turn is not turn or chunks.done:
        if chunks is not None and chunks.turn is turn and not chunks.done:
            chunks.unwatch()
            chunks.done = True
        chunks = _TURNS[id(turn)] = TurnChunks(hub, turn, primed)
        if chunks.done:
            del _TURNS[id(turn)]  # paused: the next reader renders afresh
    return chunks
