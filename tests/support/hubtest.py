"""The tests' one helpers module: polling with a deadline, the message builder, a real
uvicorn on 127.0.0.1:0, and raw ``websockets`` clients.

- :func:`eventually` waits for a condition (sync or async) with a generous deadline: use it
  wherever a test waits for something to happen, instead of a fixed sleep.
- :func:`text_message` builds a UIMessage dict (``tests.conftest`` re-exports it as the
  suites' ``T``); :func:`text` is the same with the wire tests' argument order.
- :func:`served` runs an app (a hub, or any ASGI app) on a real uvicorn; :class:`Served`
  can also be stopped and started again on the same port.
- :class:`Client` is one raw connection. Nothing here uses ``clients/``: frames are plain
  JSON objects, sent and read by hand, so the tests see exactly what goes over the wire.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import json
import os
import random
import sqlite3
import string
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, overload

import uvicorn
from starlette.applications import Starlette
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from hub.apps.serve import ws_protocol
from hub.server import Hub, HubConfig, create_app

__all__ = [
    "DEADLINE",
    "WAIT",
    "Client",
    "Frame",
    "HubError",
    "Served",
    "eventually",
    "is_event",
    "prune",
    "seqs",
    "served",
    "set_epoch",
    "text",
    "text_message",
]

#: How long any single wait in these tests may take before it counts as a hang.
WAIT = 5.0

#: How long :func:`eventually` polls by default. Generous on purpose: the machine running
#: the suite may be loaded, and a deadline says "this hangs", not "this is slow".
DEADLINE = 10.0

Frame = dict[str, Any]
ASGIApp = Callable[[Any, Any, Any], Awaitable[None]]
T = TypeVar("T")


# -- waiting -------------------------------------------------------------------------------


# A condition may return None for "not yet": the value returned is never None.
@overload
async def eventually(
    condition: Callable[[], Awaitable[T | None]], timeout: float = ..., interval: float = ...
) -> T: ...
@overload
async def eventually(condition: Callable[[], T | None], timeout: float = ..., interval: float = ...) -> T: ...
async def eventually(condition: Callable[[], Any], timeout: float = DEADLINE, interval: float = 0.01) -> Any:
    """Call ``condition`` (a function, or a coroutine function) every ``interval`` seconds
    until it returns something truthy, and return that. Past ``timeout`` it fails the test
    with an ``AssertionError`` naming the condition (its source line) and its last value."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if loop.time() >= deadline:
            raise AssertionError(
                f"not true within {timeout:g}s: {_describe(condition)} (last value: {value!r})"
            )
        await asyncio.sleep(interval)


def _describe(condition: Callable[[], Any]) -> str:
    try:
        return inspect.getsource(condition).strip()
    except (OSError, TypeError):
        return repr(condition)


# -- messages ------------------------------------------------------------------------------


#: 92 symbols, 6.5 bits a character: deflate saves less than the fifth the SQLite store
#: deflates long messages for (``"`` and ``\\`` left out, so the JSON is as long as the text).
_NOISE = "".join(c for c in string.ascii_letters + string.digits + string.punctuation if c not in '"\\')


def noise(chars: int, seed: int = 0) -> str:
    """``chars`` random printable characters: text the store keeps as it is, for tests
    about how big rows and logs grow."""
    return "".join(random.Random(seed).choices(_NOISE, k=chars))


def text_message(message_id: str, role: str, text: str) -> dict[str, Any]:
    """A UIMessage dict with one text part."""
    return {"id": message_id, "role": role, "parts": [{"type": "text", "text": text}]}


def text(message_id: str, body: str, role: str = "user") -> dict[str, Any]:
    """:func:`text_message` with the role last (a user's, unless said)."""
    return text_message(message_id, role, body)


# -- a served app --------------------------------------------------------------------------


class Served:
    """An ASGI app on a real uvicorn in this event loop, on 127.0.0.1.

    ``port`` 0 takes any free port; the first :meth:`start` keeps it, so :meth:`stop` then
    :meth:`start` brings the app back where its clients left it. ``options`` go to
    ``uvicorn.Config`` (``ws_ping_interval=...``)."""

    def __init__(self, app: ASGIApp, port: int = 0, **options: Any) -> None:
        self.app = app
        self.port = port
        self.options: dict[str, Any] = {
            "log_level": "warning",
            "lifespan": "on",  # a hub that cannot start fails the test, not its first request
            "timeout_graceful_shutdown": 3,
            # What `sessionhub serve` runs by default (--ws hub); SESSIONHUB_TEST_WS names
            # another of its choices to run the suite on (websockets-sansio).
            "ws": ws_protocol(os.environ.get("SESSIONHUB_TEST_WS", "hub")),
            **options,
        }
        self.server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Serve, and return once uvicorn listens (its ``started`` flag)."""
        server = self.server = uvicorn.Server(
            uvicorn.Config(self.app, host="127.0.0.1", port=self.port, **self.options)
        )
        task = self._task = asyncio.create_task(server.serve())

        def listening() -> bool:
            if task.done():
                task.result()  # uvicorn's own error, if it has one
                raise RuntimeError("uvicorn exited before it started")
            return server.started

        try:
            await eventually(listening, timeout=WAIT, interval=0.005)
        except BaseException:
            await self.stop()
            raise
        self.port = int(server.servers[0].sockets[0].getsockname()[1])

    async def stop(self) -> None:
        """Shut down (gracefully: the app's lifespan ends) and wait for it."""
        server, task, self.server, self._task = self.server, self._task, None, None
        if server is None or task is None:
            return
        server.should_exit = True
        async with asyncio.timeout(15):
            await task

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws"

    @property
    def hub(self) -> Hub:
        assert isinstance(self.app, Starlette), "not an app made by create_app"
        hub: Hub = self.app.state.hub
        return hub

    def client(self, **kwargs: Any) -> contextlib.AbstractAsyncContextManager[Client]:
        return Client.connect(self.ws_url, **kwargs)


@contextlib.asynccontextmanager
async def served(
    *,
    app: ASGIApp | None = None,
    config: HubConfig | None = None,
    port: int = 0,
    options: Mapping[str, Any] | None = None,
    **app_kwargs: Any,
) -> AsyncIterator[Served]:
    """Run ``app`` (or ``create_app(config=config, **app_kwargs)``) on a real uvicorn, on
    ``port`` (0: any free one; a given one to restart a hub where its clients left it).
    ``options`` go to ``uvicorn.Config``."""
    if app is None:
        app = create_app(config=config, **app_kwargs)
    running = Served(app, port, **(options or {}))
    await running.start()
    try:
        yield running
    finally:
        await running.stop()


class HubError(Exception):
    """An error frame answering a request."""

    def __init__(self, frame: Frame) -> None:
        super().__init__(f"{frame.get('code')}: {frame.get('message')}")
        self.frame = frame
        self.code: str = frame["code"]
        self.message: str = frame["message"]


class Client:
    """One raw WebSocket connection. A reader task files every incoming frame in
    ``inbox`` (arrival order); ``take`` removes the first frame matching a predicate."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.inbox: list[Frame] = []
        self.received: list[Frame] = []  # every frame ever read, in order
        self.sent_ops: set[str] = set()
        self._ids = itertools.count(1)
        self._changed = asyncio.Event()
        self.closed = asyncio.Event()
        self._reader = asyncio.create_task(self._read())

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(cls, url: str, **kwargs: Any) -> AsyncIterator[Client]:
        kwargs.setdefault("proxy", None)
        kwargs.setdefault("open_timeout", WAIT)
        kwargs.setdefault("close_timeout", 2)
        async with connect(url, **kwargs) as ws:
            client = cls(ws)
            try:
                yield client
            finally:
                await ws.close()
                client._reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await client._reader

    async def _read(self) -> None:
        try:
            async for message in self.ws:
                frame = json.loads(message)
                self.inbox.append(frame)
                self.received.append(frame)
                self._notify()
        except ConnectionClosed:
            pass
        finally:
            self.closed.set()
            self._notify()

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    @property
    def close_code(self) -> int | None:
        return self.ws.close_code

    @property
    def close_reason(self) -> str | None:
        return self.ws.close_reason

    # -- sending -----------------------------------------------------------------------
    def next_id(self) -> int:
        return next(self._ids)

    async def send_raw(self, data: str | bytes) -> None:
        await self.ws.send(data)

    async def send(self, op: str, *, id: str | int | None = None, **fields: Any) -> str | int:
        """Send one request; returns its id (without waiting for the answer)."""
        rid = self.next_id() if id is None else id
        self.sent_ops.add(op)
        await self.ws.send(json.dumps({"op": op, "id": rid, **fields}))
        return rid

    async def request(self, op: str, *, id: str | int | None = None, **fields: Any) -> Frame:
        """Send one request and return the reply or error frame that answers it."""
        rid = await self.send(op, id=id, **fields)
        return await self.answer(rid)

    async def call(self, op: str, **fields: Any) -> Any:
        """Send one request and return its result; an error frame raises :class:`HubError`."""
        frame = await self.request(op, **fields)
        if frame["frame"] == "error":
            raise HubError(frame)
        assert frame["frame"] == "reply", frame
        return frame["result"]

    async def subscribe(
        self, session_id: str | None, after_seq: int = 0, epoch: str | None = None, **extra: Any
    ) -> Frame:
        """Subscribe; returns the reply, the error or the reset frame that answers it."""
        fields: dict[str, Any] = {"session_id": session_id, "after_seq": after_seq, **extra}
        if epoch is not None:
            fields["epoch"] = epoch
        rid = await self.send("subscribe", **fields)
        return await self.take(
            lambda f: (
                (f["frame"] in ("reply", "error") and f.get("id") == rid)
                or (f["frame"] == "reset" and f["session_id"] == session_id)
            )
        )

    # -- receiving ---------------------------------------------------------------------
    async def answer(self, rid: str | int, timeout: float = WAIT) -> Frame:
        return await self.take(lambda f: f["frame"] in ("reply", "error") and f.get("id") == rid, timeout)

    async def take(self, match: Callable[[Frame], bool], timeout: float = WAIT) -> Frame:
        """Remove and return the first frame in the inbox that matches (waiting for it)."""
        try:
            async with asyncio.timeout(timeout):
                while True:
                    for i, frame in enumerate(self.inbox):
                        if match(frame):
                            return self.inbox.pop(i)
                    if self.closed.is_set():
                        raise ConnectionError(
                            f"connection closed ({self.close_code} {self.close_reason!r}) "
                            f"while waiting; inbox: {_brief(self.inbox)}"
                        )
                    await self._changed.wait()
        except TimeoutError:
            raise AssertionError(
                f"no matching frame within {timeout}s; inbox: {_brief(self.inbox)}"
            ) from None

    async def events(self, session_id: str | None, count: int, timeout: float = WAIT) -> list[Frame]:
        """The next ``count`` event frames of one stream (``None``: the registry)."""
        return [await self.take(_is_event_of(session_id), timeout) for _ in range(count)]

    async def until_seq(self, session_id: str | None, seq: int, timeout: float = WAIT) -> list[Frame]:
        """Event frames of one stream up to and including ``seq``."""
        got: list[Frame] = []
        async with asyncio.timeout(timeout):
            while not got or got[-1]["seq"] < seq:
                got.append(await self.take(_is_event_of(session_id), timeout))
        return got

    async def quiet(self, match: Callable[[Frame], bool] | None = None, period: float = 0.3) -> None:
        """Assert that no (matching) frame arrives for ``period`` seconds."""
        await asyncio.sleep(period)
        found = [f for f in self.inbox if match is None or match(f)]
        assert not found, f"unexpected frames: {found[:5]}"

    async def wait_closed(self, timeout: float = WAIT) -> tuple[int | None, str | None]:
        async with asyncio.timeout(timeout):
            await self.closed.wait()
        return self.close_code, self.close_reason


def _brief(frames: Sequence[Frame]) -> str:
    shown = [
        {k: v for k, v in f.items() if k != "data"} if f.get("frame") == "event" else f for f in frames[:10]
    ]
    more = f" (+{len(frames) - 10} more)" if len(frames) > 10 else ""
    return f"{shown}{more}"


def _is_event_of(session_id: str | None) -> Callable[[Frame], bool]:
    if session_id is None:
        return lambda f: f["frame"] == "event" and f["stream"] == "registry"
    return lambda f: f["frame"] == "event" and f["stream"] == "session" and f["session_id"] == session_id


def is_event(frame: Frame) -> bool:
    return bool(frame["frame"] == "event")


def seqs(frames: Sequence[Frame]) -> list[int]:
    return [int(f["seq"]) for f in frames]


# -- raw database surgery ------------------------------------------------------------------


def _execute(db: Path, statements: Sequence[tuple[str, tuple[Any, ...]]]) -> None:
    conn = sqlite3.connect(db, timeout=WAIT)
    try:
        with conn:
            for sql, params in statements:
                conn.execute(sql, params)
    finally:
        conn.close()


async def prune(db: Path, stream: str, through_seq: int) -> None:
    """Drop a stream's events up to ``through_seq``, as retention would."""
    await asyncio.to_thread(
        _execute,
        db,
        [
            (
                "DELETE FROM events WHERE sk = (SELECT sk FROM streams WHERE stream = ?) AND seq <= ?",
                (stream, through_seq),
            ),
            ("UPDATE streams SET first_seq = ? WHERE stream = ?", (through_seq + 1, stream)),
        ],
    )


async def set_epoch(db: Path, stream: str, epoch: str) -> None:
    """Give a stream a new epoch, as losing and rebuilding its log would."""
    await asyncio.to_thread(
        _execute, db, [("UPDATE streams SET epoch = ? WHERE stream = ?", (epoch, stream))]
    )
