"""Responders: ``async for turn in hub.turns()`` — the turns the hub gives this client.

``HubClient.turns()`` tells the hub this connection answers turns (op ``take_turns``, sent
again on every reconnect) and yields a :class:`Turn` for each ``turn`` frame. Answer with
``async with turn.reply() as st`` (a :class:`~clients.streaming.MessageStream` on the turn's
reply id and parent; a block that raises tells the hub why, then aborts the reply), or
decline with :meth:`Turn.fail`. The hub hands a turn this client never starts to another
responder if this one disconnects.

A turn can be stopped (op ``stop_turn``, from a chat's Stop): the hub ends the reply as it
stands and sends a ``turn_stopped`` frame. The task inside ``turn.reply()`` is then
cancelled where it waits (a model request in flight is closed with it) and the block is
left quietly: code after it runs, with :attr:`Turn.stopped` set.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any, Protocol

from protocol import Message, SessionHubError
from protocol.frames import TurnFrame, TurnStoppedFrame

from .api import RemoteSession, RemoteSessions
from .streaming import MessageStream

__all__ = ["Turn", "TurnClient", "TurnQueue", "TurnStoppedError", "iterate_turns"]


class TurnStoppedError(SessionHubError):
    """:meth:`Turn.reply` on a turn stopped before it was answered."""

    code = "conflict"


class _End:
    pass


class TurnQueue:
    """The turns given to one client, waiting to be iterated."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[TurnFrame | _End] = asyncio.Queue()
        #: The turns handed out and not yet answered, by turn id (a stop finds them here).
        self.open: dict[str, Turn] = {}
        #: Stops that came before their turn was handed out.
        self.early: dict[str, str] = {}

    def given(self, frame: TurnFrame) -> None:
        self.queue.put_nowait(frame)

    def stopped(self, frame: TurnStoppedFrame) -> None:
        turn = self.open.get(frame.turn_id)
        if turn is None:
            self.early[frame.turn_id] = frame.reason
        else:
            turn._stop(frame.reason)

    def end(self) -> None:
        self.queue.put_nowait(_End())


class TurnClient(Protocol):
    """What turns need of the client (:class:`clients.client.HubClient`), so that this
    module does not import it back."""

    _turns: TurnQueue | None

    @property
    def sessions(self) -> RemoteSessions: ...

    async def request(self, op: str, **fields: Any) -> Any: ...

    def session(self, session_id: str) -> RemoteSession: ...


class Turn:
    """One turn: reply to ``message_id`` (the user message) in ``session_id``.

    ``history`` is the branch up to ``parent_id`` (overlays applied), oldest first;
    ``trigger`` is ``submit-message`` or ``regenerate-message`` (then ``regenerates`` is
    the assistant message the reply is a sibling of); ``reply_id`` is the id the reply
    gets."""

    def __init__(self, client: TurnClient, frame: TurnFrame) -> None:
        self.client = client
        self.turn_id = frame.turn_id
        self.session_id = frame.session_id
        self.message_id = frame.message_id
        self.parent_id = frame.parent_id
        self.reply_id = frame.reply_id
        self.trigger = frame.trigger
        self.regenerates = frame.regenerates
        self.history = [Message.from_dict(m) for m in frame.history]
        #: Set when the turn was stopped (``stop_turn``); :attr:`stop_reason` says why.
        self.stopped = asyncio.Event()
        self.stop_reason: str | None = None
        self._replying: asyncio.Task[Any] | None = None
        #: Called once the turn is answered or declined (the queue forgets it).
        self._done: Callable[[], object] = lambda: None

    def _stop(self, reason: str) -> None:
        if self.stopped.is_set():
            return
        self.stop_reason = reason
        self.stopped.set()
        if self._replying is not None:
            self._replying.cancel("turn stopped")

    @property
    def session(self) -> RemoteSession:
        return self.client.session(self.session_id)

    @contextlib.asynccontextmanager
    async def reply(self, metadata: Any = None) -> AsyncIterator[MessageStream]:
        """Stream the reply; leaving the block finishes it, an exception aborts it."""
        session = self.session
        if self.stopped.is_set():
            raise TurnStoppedError(f"turn {self.turn_id} was stopped: {self.stop_reason}")
        await session._call(
            "stream_start",
            message_id=self.reply_id,
            parent_id=self.parent_id,
            role="assistant",
            metadata=metadata,
            turn_id=self.turn_id,
        )
        stream = MessageStream(session, self.reply_id)
        self._replying = asyncio.current_task()
        try:
            yield stream
        except BaseException as exc:
            if self.stopped.is_set() and isinstance(exc, asyncio.CancelledError | SessionHubError):
                # The hub ended the reply already: the stop is this block's end, not an error.
                if isinstance(exc, asyncio.CancelledError) and self._replying is not None:
                    self._replying.uncancel()
                await asyncio.gather(*stream._in_flight, return_exceptions=True)  # refused now
                return
            if isinstance(exc, Exception):
                # Said first, so the chat's error chunk carries the reason, not "aborted".
                with contextlib.suppress(SessionHubError):
                    await self.fail(f"{type(exc).__name__}: {exc}")
            with contextlib.suppress(SessionHubError):
                await stream.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        finally:
            self._replying = None
            self._done()
        if self.stopped.is_set():
            await asyncio.gather(*stream._in_flight, return_exceptions=True)
            return
        try:
            await stream.__aexit__(None, None, None)
        except SessionHubError:
            if not self.stopped.is_set():  # stopped meanwhile: the hub ended it
                raise

    async def fail(self, error: str) -> None:
        """This responder cannot answer: the turn ends with ``error`` (shown to the chat)."""
        self._done()
        await self.client.request("turn_failed", turn_id=self.turn_id, error=error)

    def __repr__(self) -> str:
        return f"Turn({self.session_id!r}, message_id={self.message_id!r}, trigger={self.trigger!r})"


async def iterate_turns(client: TurnClient) -> AsyncGenerator[Turn, None]:
    """See :meth:`clients.client.HubClient.turns`."""
    if client._turns is not None:
        raise RuntimeError("this client already iterates its turns")
    queue = client._turns = TurnQueue()
    try:
        await client.request("take_turns")
        while True:
            item = await queue.queue.get()
            if isinstance(item, _End):
                return
            turn = Turn(client, item)
            queue.open[turn.turn_id] = turn
            early = queue.early.pop(turn.turn_id, None)
            if early is not None:
                turn._stop(early)
            turn._done = lambda t=turn: queue.open.pop(t.turn_id, None)  # type: ignore[misc]
            yield turn
    finally:
        client._turns = None
