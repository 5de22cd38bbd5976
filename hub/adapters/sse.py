"""One reader's server-sent-event stream, bounded as a WebSocket's outbox is: what every
adapter that answers with SSE streams through (the AI SDK chat today, AG-UI next).

A reply is written to every reader as it grows, whether the reader reads or not. A reader
that stops reading must not make the hub hold the reply again for it, so what is queued
for one reader sits in an :class:`~hub.server.outbox.Outbox` bounded by ``outbox_bytes``
(and counted in ``sessionhub_sse_bytes``), and a send that
the reader does not take within ``send_timeout`` ends it. Either way the reader is
*dropped*: its TCP connection is cut (an SSE stream has no close frame to offer), the
``sessionhub_sse_dropped`` counter goes up, and nothing else changes: the turn goes on, and
every other reader and the stored message get all of it. A frame cannot wait for room, as
the turn does not wait for its readers: past the bound the reader is dropped at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from starlette.types import Receive, Scope, Send

from ..server.asgiscope import TRANSPORT, Cuttable
from ..server.outbox import Held, Outbox

__all__ = ["SseFeed"]

log = logging.getLogger("sessionhub.chat")

#: An SSE comment: every parser skips it (the AI SDK's included).
KEEPALIVE = b": keep-alive\n\n"


class SseFeed:
    """An ASGI response streaming what :meth:`push` queues, ``last=True`` ending it.

    ``on_drop(reason)`` is called once if the reader is dropped (``"behind"``: more than
    ``max_bytes`` unsent; ``"timeout"``: a send not taken for ``send_timeout`` s);
    ``on_close()`` once when the response ends for any reason (stop feeding it)."""

    def __init__(
        self,
        *,
        headers: dict[str, str],
        max_bytes: int,
        send_timeout: float,
        keepalive: float,
        held: Held,
        on_drop: Callable[[str], None],
        on_close: Callable[[], None],
        farewell: str | None = None,
    ) -> None:
        self.headers = headers
        #: Sent instead of cutting a reader dropped as ``behind`` (it still reads, only too
        #: slowly): a last event that says why, within ``send_timeout``, or the cut after all.
        self.farewell = farewell
        self.send_timeout = send_timeout
        self.keepalive = keepalive
        self.on_drop = on_drop
        self.on_close = on_close
        self.outbox = Outbox(1, max_bytes, held)
        self.dropped: str | None = None
        self._gone = False
        self._last = False
        self._ready = asyncio.Event()
        self._sending: asyncio.Timeout | None = None

    def push(self, text: str, *, last: bool = False) -> None:
        """Queue ``text`` (ASCII SSE lines) for the reader; never waits."""
        if self.dropped is not None or self._gone or self._last:
            return
        try:
            self.outbox.put_nowait(text, count_frames=False)
        except asyncio.QueueFull:
            self.drop("behind")
            return
        self._last = last
        self._ready.set()

    def drop(self, reason: str) -> None:
        """Give up on the reader: its queue goes at once, and a send it is not taking ends."""
        if self.dropped is not None or self._gone:
            return
        self.dropped = reason
        self.outbox.close()
        self._end_send()
        self.on_drop(reason)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        listener = asyncio.create_task(self._listen(receive))
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self._raw_headers()})
            while await self._send_next(send):
                pass
            if self.dropped is not None and not await self._say_farewell(send):
                await _cut(scope)
        finally:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener
            self.outbox.close()
            self.on_close()

    async def _send_next(self, send: Send) -> bool:
        """Send what is queued (or a keep-alive); False once the response is over."""
        if not self.outbox.qsize() and self.dropped is None and not self._gone:
            self._ready.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ready.wait(), self.keepalive)
        if self.dropped is not None or self._gone:
            return False
        if self.outbox.qsize():
            text = self.outbox.get_nowait() or ""
            body, more = text.encode("ascii"), not (self._last and not self.outbox.qsize())
        else:
            # Nothing said for a while: a comment keeps idle-cutting proxies from closing it.
            body, more = KEEPALIVE, True
        try:
            async with asyncio.timeout(self.send_timeout) as sending:
                self._sending = sending
                await send({"type": "http.response.body", "body": body, "more_body": more})
        except TimeoutError:
            self.drop("timeout")
            return False
        finally:
            self._sending = None
        return more

    async def _say_farewell(self, send: Send) -> bool:
        if self.farewell is None or self.dropped != "behind" or self._gone:
            return False
        try:
            async with asyncio.timeout(self.send_timeout):
                await send(
                    {"type": "http.response.body", "body": self.farewell.encode("ascii"), "more_body": False}
                )
        except (TimeoutError, OSError):
            return False
        return True

    async def _listen(self, receive: Receive) -> None:
        # A reader that hangs up is done with, not dropped: nothing more is queued for it.
        while (await receive())["type"] != "http.disconnect":
            pass
        self._gone = True
        self.outbox.close()
        self._end_send()

    def _end_send(self) -> None:
        """Wake the sender: from its wait for a frame, or from a send the reader is not taking."""
        self._ready.set()
        if self._sending is not None and not self._sending.expired():
            self._sending.reschedule(asyncio.get_running_loop().time())

    def _raw_headers(self) -> list[tuple[bytes, bytes]]:
        return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in self.headers.items()]


async def _cut(scope: Scope) -> None:
    """Cut a dropped reader's TCP connection: an unfinished response must not be left to
    the server, which would wait on the reader's window to close it gracefully."""
    transport = scope.get(TRANSPORT)
    if isinstance(transport, Cuttable):
        transport.abort()
        # The server learns of the abort (connection_lost) before the app returns, so it
        # does not log "returned without completing response".
        await asyncio.sleep(0)
        await asyncio.sleep(0)
