"""One AG-UI run on this node: a turn's events, numbered, rendered once for all its readers.

A run's events are ``RUN_STARTED``, ``STATE_SNAPSHOT`` (the blocks as the run began), the
reply's events (:class:`~.aguievents.AguiEncoder` over :mod:`.replychunks`), a ``STATE_DELTA``
for each block change the session logs while the run streams (by anyone: a tool, a
WebSocket client; :class:`~.aguistate.StateTracker`), then ``STATE_SNAPSHOT`` again and
``RUN_FINISHED`` or ``RUN_ERROR``.

Event ids are ``<seq>:<n>:<tag>``: ``seq`` is the run's ``turn.started`` in the session's
log (so a thread's runs are ordered by it), ``n`` the event's place in the run, ``tag`` this
node's rendering of it. A reader that names one continues after it exactly where the
rendering is the same (this node's: its chunks begin where this node began to watch the
reply, from the message so far); anywhere else the tag differs and it is told the thread
afresh (``MESSAGES_SNAPSHOT``), never given an event twice. Ended runs stay held a while
(:data:`KEEP_ENDED`), so a reader that comes back just after a run ended still gets its end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any, Protocol

from protocol import PositionLost

from ..events import follow
from ..store.base import session_stream
from .aguievents import AguiEncoder, Event, to_agui_messages
from .aguistate import StateTracker, blocks_state
from .port import ChatHost, ChatTurn
from .replychunks import TurnChunks, turn_chunks

__all__ = [
    "AguiRun",
    "Sink",
    "agui_run",
    "event_id",
    "held_run",
    "parse_id",
    "posting",
    "sse_event",
    "started_seq",
]

log = logging.getLogger("sessionhub.agui")

#: Ended runs held per node for a reader that comes back after the end (count, bytes).
KEEP_ENDED = 32
KEEP_ENDED_BYTES = 8 << 20


def dumps(event: Event) -> str:
    return json.dumps(event, separators=(",", ":"))


def sse_event(event: Event, event_id: str | None = None) -> str:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}data: {dumps(event)}\n\n"


def event_id(seq: int, n: int, tag: str) -> str:
    return f"{seq}:{n}:{tag}"


def parse_id(value: str | None) -> tuple[int, int, str] | None:
    """``(seq, n, tag)`` of an event id the hub gave, else None."""
    parts = (value or "").split(":")
    if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit() or not parts[2]:
        return None
    return int(parts[0]), int(parts[1]), parts[2]


async def started_seq(hub: ChatHost, session_id: str, reply_id: str) -> int:
    """The seq of the ``turn.started`` of the turn whose reply is ``reply_id`` (it was just
    logged: the newest events are looked at); the log's end if it is not found there."""
    store, stream = hub.store, session_stream(session_id)
    position = await store.stream_position(stream)
    low = max(position.first_seq - 1, position.last_seq - 256)
    with contextlib.suppress(PositionLost):
        for event in reversed(await store.read_events(stream, low, position.last_seq - low)):
            if event.type == "turn.started" and event.data.get("reply_id") == reply_id:
                return event.seq
    return position.last_seq


class Sink(Protocol):
    """Where a run's SSE text goes: a reader's :class:`~.sse.SseFeed`, or a follower's."""

    def push(self, text: str, *, last: bool = False) -> None: ...


class AguiRun:
    """One turn's AG-UI events on this node (see the module)."""

    def __init__(self, hub: ChatHost, turn: ChatTurn, run_id: str, seq: int, state: dict[str, Any]) -> None:
        self.hub, self.turn, self.run_id, self.seq = hub, turn, run_id, seq
        self.session_id, self.reply_id = turn.session_id, turn.reply_id
        self.tag = secrets.token_hex(4)
        self.chunks: TurnChunks | None = turn_chunks(hub, turn)
        self.encoder = AguiEncoder(turn.session_id, run_id, turn.reply_id)
        self.events: list[str] = [dumps(self.encoder.started())]
        self.reopen: list[list[Event]] = [[]]  # per event: what is open after it
        self.bytes = 0
        self._add({"type": "STATE_SNAPSHOT", "snapshot": state}, [])
        self.tracker = StateTracker(state)
        self.ending: asyncio.Task[None] | None = None
        self.consumed = 0  # UI chunks rendered so far
        self.sinks: list[Sink] = []
        self.done = False
        self.finished = asyncio.Event()
        loop = asyncio.get_running_loop()
        self.deltas: asyncio.Task[None] | None = loop.create_task(self._deltas(), name=f"agui state {seq}")
        self.chunks.listeners.append(self)
        self.deliver(0, self.chunks.done)

    def id(self, n: int) -> str:
        return event_id(self.seq, n, self.tag)

    def _add(self, event: Event, reopen: list[Event]) -> None:
        text = dumps(event)
        self.events.append(text)
        self.reopen.append(reopen)
        self.bytes += len(text)

    async def _deltas(self) -> None:
        """Block changes logged while the run streams, as ``STATE_DELTA``."""
        try:
            async for event in follow(self.hub.store, session_stream(self.session_id), self.seq):
                if not event.type.startswith("context.") or self.ending is not None:
                    continue
                patch = self.tracker.delta(event)
                if patch:
                    start = len(self.events)
                    self._add({"type": "STATE_DELTA", "delta": patch}, self.encoder.reopen())
                    self._push(start)
        except PositionLost:
            log.info("the AG-UI run %s lost its place in the log: no more STATE_DELTA", self.run_id)
        except Exception:  # the store went: the final STATE_SNAPSHOT still says where it is
            log.info("following the blocks of the AG-UI run %s failed", self.run_id, exc_info=True)

    def deliver(self, first: int, last: bool) -> None:
        chunks = self.chunks
        if self.ending is not None or chunks is None:
            return
        start = len(self.events)
        final: list[Event] = []
        for index in range(self.consumed, len(chunks.items)):
            for event in self.encoder.chunk(chunks.items[index]):
                if event["type"] in ("RUN_FINISHED", "RUN_ERROR"):
                    final.append(event)  # after the state, below
                else:
                    self._add(event, self.encoder.reopen())
        self.consumed = len(chunks.items)
        if last and not final:  # a turn that ended with no final chunk
            final = self.encoder.chunk({"type": "error", "errorText": "the run ended"})
        self._push(start)
        if last or final:
            # The blocks as the run left them, then its end: read from the store, so a task.
            self.ending = asyncio.get_running_loop().create_task(self._end(final))

    async def _end(self, final: list[Event]) -> None:
        if self.deltas is not None:
            self.deltas.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.deltas
            self.deltas = None
        start = len(self.events)
        try:
            self._add(
                {"type": "STATE_SNAPSHOT", "snapshot": await blocks_state(self.hub, self.session_id)}, []
            )
        except Exception:  # the store or the session went: the run still ends
            log.info("the AG-UI run %s ended without its state", self.run_id, exc_info=True)
        for event in final:
            self._add(event, [])
        self.done = True
        chunks, self.chunks = self.chunks, None  # its UI chunks are not needed any more
        if chunks is not None:
            with contextlib.suppress(ValueError):
                chunks.listeners.remove(self)
        if _RUNS.get(id(self.turn)) is self:
            del _RUNS[id(self.turn)]
        _hold(self)
        self._push(start)
        self.sinks.clear()
        self.finished.set()

    def _push(self, start: int) -> None:
        if len(self.events) > start or self.done:
            text = self.sse(start, len(self.events))
            for sink in list(self.sinks):
                sink.push(text, last=self.done)

    def sse(self, first: int, end: int) -> str:
        return "".join(f"id: {self.id(n)}\ndata: {self.events[n]}\n\n" for n in range(first, end))

    def attach(self, sink: Sink, after: int | None, history: list[dict[str, Any]] | None) -> None:
        """A new reader: after event ``after`` (a continuation: RUN_STARTED and what was open
        then are sent again, without ids, so that AG-UI's order checks accept the stream),
        or from the start with the thread's ``history`` as a ``MESSAGES_SNAPSHOT`` first."""
        if after is None:
            text = self.sse(0, 1)
            if history is not None:
                text += sse_event({"type": "MESSAGES_SNAPSHOT", "messages": to_agui_messages(history)})
            text += self.sse(1, len(self.events))
        elif self.done and after >= len(self.events) - 1:
            text = ""  # it has the whole run: a run opened again would never end
        else:
            text = f"data: {self.events[0]}\n\n"
            for event in self.reopen[after]:
                text += sse_event(event)
            text += self.sse(after + 1, len(self.events))
        sink.push(text, last=self.done)
        if not self.done:
            self.sinks.append(sink)

    def leave(self, sink: Sink) -> None:
        if sink in self.sinks:
            self.sinks.remove(sink)

    def continues(self, seq: int, n: int, tag: str) -> bool:
        """Whether this rendering can continue exactly after the reader's event ``seq:n:tag``."""
        return seq == self.seq and tag == self.tag and n < len(self.events)


#: id(turn) -> its run on this node (the entry holds the turn, so the id is not reused).
_RUNS: dict[int, AguiRun] = {}
#: (session, seq) -> an ended run, held for readers that come back (see the module).
#: Keyed by hub too: two hubs of one process (tests run them) have their own logs and seqs.
_ENDED: OrderedDict[tuple[int, str, int], AguiRun] = OrderedDict()


def _hold(run: AguiRun) -> None:
    _ENDED[id(run.hub), run.session_id, run.seq] = run  # the run holds its hub: the id stays its
    total = sum(r.bytes for r in _ENDED.values())
    while len(_ENDED) > KEEP_ENDED or (total > KEEP_ENDED_BYTES and len(_ENDED) > 1):
        _, dropped = _ENDED.popitem(last=False)
        total -= dropped.bytes


def held_run(hub: ChatHost, session_id: str, seq: int) -> AguiRun | None:
    """The run of ``session_id`` whose ``turn.started`` is ``seq``, if this node holds it
    (in flight, or ended a moment ago) for this hub."""
    for run in list(_RUNS.values()):
        if run.hub is hub and run.session_id == session_id and run.seq == seq:
            return run
    ended = _ENDED.get((id(hub), session_id, seq))
    return ended if ended is not None and ended.hub is hub else None


#: thread -> the runId of the run its client is posting (a follower may see the turn first).
#: Keyed by hub: another hub of the process (tests run two) rendering its own turn of a
#: thread of the same name must not take this hub's client's runId. The entry lives while
#: the hub's POST is being served, so the hub's id is not reused meanwhile.
_POSTING: dict[tuple[int, str], str] = {}


@contextlib.contextmanager
def posting(hub: ChatHost, thread: str, run_id: str) -> Iterator[None]:
    """While a client's run of ``thread`` starts on ``hub``: its run is named ``run_id``
    wherever this hub renders it first (the POST, or a follower that saw the turn begin)."""
    key = (id(hub), thread)
    _POSTING[key] = run_id
    try:
        yield
    finally:
        if _POSTING.get(key) == run_id:
            del _POSTING[key]


async def agui_run(
    hub: ChatHost, turn: ChatTurn, run_id: str | None = None, seq: int | None = None
) -> AguiRun:
    """The turn's run on this node, made on first use (``run_id``: the AG-UI client's, when
    it posted the run; ``seq``: its ``turn.started``, when known)."""
    run_id = run_id or _POSTING.get((id(hub), turn.session_id))
    run = _RUNS.get(id(turn))
    if run is not None and run.turn is turn:
        return run
    if seq is None:
        seq = await started_seq(hub, turn.session_id, turn.reply_id)
    state = await blocks_state(hub, turn.session_id)
    run = _RUNS.get(id(turn))  # made meanwhile by another reader
    if run is None or run.turn is not turn:
        run = _RUNS[id(turn)] = AguiRun(hub, turn, run_id or turn.reply_id, seq, state)
    return run
