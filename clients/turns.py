"""Responders: ``async for turn in hub.turns()`` — the turns the hub gives this client.

``HubClient.turns()`` tells the hub this connection answers turns (op ``take_turns``, sent
again on every reconnect) and yields a :class:`Turn` for each ``turn`` frame. Answer with
``async with turn.reply() as st`` (a :class:`~clients.streaming.MessageStream` on the turn's
reply id and parent; a block that raises tells the hub why, then aborts the reply), or
decline with :meth:`Turn.fail`. The hub hands a turn this client never starts to another
responder if this one disconnects.

Human in the loop: a reply asks for a tool approval with the AI SDK's own tool part
(``await st.tool_part({..., "state": "approval-requested", "approval": {"id": ...}})``), then
``answer = await st.approval(approval_id)`` waits for the user (the chat's request ends there
and the turn stays open; the user's answer comes back through ``answer_tool``, checked by the
hub, already written into the reply). ``await st.tool_output(tool_call_id)`` waits the same
way for a client-side tool's result. A user message sent to the turn while it runs
(``steer_turn``) arrives in ``async for message in turn.steering()``.

A turn can be stopped (op ``stop_turn``, from a chat's Stop): the hub ends the reply as it
stands and sends a ``turn_stopped`` frame. The task inside ``turn.reply()`` is then
cancelled where it waits (a model request in flight is closed with it) and the block is
left quietly: code after it runs, with :attr:`Turn.stopped` set.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from protocol import Message, SessionHubError
from protocol.frames import SteeringFrame, ToolAnswerFrame, TurnFrame, TurnStoppedFrame

from .api import RemoteSession, RemoteSessions
from .streaming import MessageStream, SessionCalls

__all__ = [
    "Approval",
    "ClientToolError",
    "ReplyStream",
    "Turn",
    "TurnClient",
    "TurnQueue",
    "TurnStoppedError",
    "iterate_turns",
]


class TurnStoppedError(SessionHubError):
    """:meth:`Turn.reply` on a turn stopped before it was answered."""

    code = "conflict"


class ClientToolError(SessionHubError):
    """:meth:`ReplyStream.tool_output`: the client-side tool failed (``error_text``)."""

    code = "invalid"


@dataclass(frozen=True)
class Approval:
    """The user's answer to a tool approval: ``approved``, and why (``reason``), if said."""

    approved: bool
    reason: str | None = None


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

    def news(self, frame: ToolAnswerFrame | SteeringFrame) -> None:
        turn = self.open.get(frame.turn_id)
        if turn is not None:
            turn._news(frame)

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
        #: Answers to this reply's tools, by ``approval:<id>`` / ``call:<id>``, as they come.
        self._answers: dict[str, asyncio.Future[ToolAnswerFrame]] = {}
        self._steering: asyncio.Queue[Message] = asyncio.Queue()

    def _answer(self, key: str) -> asyncio.Future[ToolAnswerFrame]:
        future = self._answers.get(key)
        if future is None:
            future = self._answers[key] = asyncio.get_running_loop().create_future()
        return future

    def _news(self, frame: ToolAnswerFrame | SteeringFrame) -> None:
        if isinstance(frame, SteeringFrame):
            self._steering.put_nowait(Message.from_dict(frame.message))
            return
        key = (
            f"approval:{frame.approval_id}" if frame.approval_id is not None else f"call:{frame.tool_call_id}"
        )
        future = self._answer(key)
        if not future.done():
            future.set_result(frame)

    async def steering(self) -> AsyncIterator[Message]:
        """The user messages sent to this turn while it runs (``steer_turn``), in order;
        ends when the turn is stopped. Each is stored in the reply as a
        ``steering-message`` part already."""
        while not self.stopped.is_set():
            getting = asyncio.ensure_future(self._steering.get())
            stopping = asyncio.ensure_future(self.stopped.wait())
            try:
                done, _ = await asyncio.wait({getting, stopping}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopping.cancel()
                if not getting.done():
                    getting.cancel()
            if getting not in done or getting.cancelled():
                return
            yield getting.result()

    def steered(self) -> list[Message]:
        """The steering messages that came and were not iterated yet (without waiting)."""
        taken: list[Message] = []
        while not self._steering.empty():
            taken.append(self._steering.get_nowait())
        return taken

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
    async def reply(self, metadata: Any = None) -> AsyncIterator[ReplyStream]:
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
        stream = ReplyStream(session, self.reply_id, self)
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
                # The hub's own errors say what failed (their code is in the chat's error);
                # anything else is named by its type, which is what there is to go on.
                reason = str(exc) if isinstance(exc, SessionHubError) else f"{type(exc).__name__}: {exc}"
                with contextlib.suppress(SessionHubError):
                    await self.fail(reason)
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


class ReplyStream(MessageStream):
    """A turn's reply: a :class:`~clients.streaming.MessageStream` that can also wait for
    the user's answer to one of its tools."""

    def __init__(self, session: SessionCalls, message_id: str, turn: Turn) -> None:
        super().__init__(session, message_id)
        self.turn = turn

    async def _wait(self, key: str) -> ToolAnswerFrame:
        future = self.turn._answer(key)
        if not future.done():
            # Tells every reader the reply now waits for the user: a chat request ends here
            # (its UI shows the approval), the turn does not.
            await self._delta(kind="await")
        return await future

    async def approval(self, approval_id: str) -> Approval:
        """Wait for the user's answer to the approval ``approval_id`` (asked by a tool part
        in state ``approval-requested`` with ``approval: {"id": approval_id}``). The hub has
        written the answered part into the reply by the time this returns."""
        frame = await self._wait(f"approval:{approval_id}")
        return Approval(bool(frame.approved), frame.reason)

    async def tool_output(self, tool_call_id: str) -> Any:
        """Wait for the output of a client-side tool (a tool part of ``tool_call_id`` in
        state ``input-available``); its failure raises :class:`ClientToolError`."""
        frame = await self._wait(f"call:{tool_call_id}")
        if frame.error_text is not None:
            raise ClientToolError(frame.error_text)
        return frame.output


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
