"""Redis pub/sub as the doorbell between hub nodes (``--bus redis://...``).

Unlike NOTIFY, a Redis PUBLISH cannot ride inside the store's transaction: the store
rings this bus after each commit, and a sender task publishes to Redis. Doorbells that
could not be sent are kept (the newest seq per stream) and retried at least once a
``poll_interval`` until Redis is back, so a node whose publishing connection broke still
rings the others soon afterwards. Listening follows :class:`~hub.bus.remote.RemoteBus`'
rules for gaps.

redis-py retries and re-subscribes silently by default; a silent reconnect would hide
exactly the gap the bus must see, so its retries are off and this module reconnects.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from . import doorbell
from .remote import RemoteBus, stop

__all__ = ["RedisBus"]

log = logging.getLogger("sessionhub.bus")


class RedisBus(RemoteBus):
    """``RedisBus("redis://127.0.0.1:6379/0")``; pass it as any store's ``bus``."""

    def __init__(
        self,
        url: str,
        *,
        channel: str = doorbell.CHANNEL,
        poll_interval: float = 1.0,
        health_interval: float = 5.0,
    ) -> None:
        super().__init__(poll_interval=poll_interval)
        self.url = url
        self.channel = channel
        self.relay_channel = channel + "_relay"
        self.health_interval = health_interval
        self._client: aioredis.Redis | None = None
        self._pubsub: Any = None
        self._outbox: dict[str, int] = {}
        self._outbox_ready = asyncio.Event()
        self._flushed = asyncio.Event()
        self._flushed.set()
        self._sender: asyncio.Task[None] | None = None
        self._send_client: aioredis.Redis | None = None
        self._relay_client: aioredis.Redis | None = None

    def _new_client(self) -> aioredis.Redis:
        return aioredis.Redis.from_url(
            self.url,
            retry=Retry(NoBackoff(), 0),
            socket_connect_timeout=5.0,
            health_check_interval=self.health_interval,
        )

    def publish(self, stream: str, seq: int) -> None:
        before = self.last_seq(stream)
        super().publish(stream, seq)
        if seq > before:
            self._outbox[stream] = max(seq, self._outbox.get(stream, 0))
            self._outbox_ready.set()
            self._flushed.clear()

    async def start(self, timeout: float = 10.0) -> None:
        await super().start(timeout)
        self._sender = asyncio.get_running_loop().create_task(self._send(), name="RedisBus sender")

    async def close(self) -> None:
        if self._sender is not None:
            # Give doorbells still queued a moment to leave: other nodes are waiting on them.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._drain(), 1.0)
            await stop(self._sender)
        await super().close()
        if self._relay_client is not None:
            await self._relay_client.aclose()
            self._relay_client = None

    async def _send_relay(self, payloads: list[str]) -> None:
        if self._relay_client is None:
            self._relay_client = self._new_client()
        pipe = self._relay_client.pipeline(transaction=False)
        for payload in payloads:
            pipe.publish(self.relay_channel, payload)
        try:
            await pipe.execute()
        except BaseException:
            client, self._relay_client = self._relay_client, None
            with contextlib.suppress(Exception):
                await client.aclose()
            raise

    async def _drain(self) -> None:
        await self._flushed.wait()

    async def _send(self) -> None:
        try:
            await self._send_loop()
        finally:
            if self._send_client is not None:
                await self._send_client.aclose()

    async def _send_loop(self) -> None:
        delay = 0.05
        while True:
            await self._outbox_ready.wait()
            self._outbox_ready.clear()
            batch, self._outbox = self._outbox, {}
            try:
                if self._send_client is None:
                    self._send_client = self._new_client()
                pipe = self._send_client.pipeline(transaction=False)
                for stream, seq in batch.items():
                    pipe.publish(self.channel, doorbell.encode(stream, seq))
                await pipe.execute()
                delay = 0.05
                if not self._outbox:
                    self._flushed.set()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("RedisBus: publishing failed (%s); keeping %d doorbells", exc, len(batch))
                for stream, seq in batch.items():
                    self._outbox[stream] = max(seq, self._outbox.get(stream, 0))
                if self._send_client is not None:
                    with contextlib.suppress(Exception):
                        await self._send_client.aclose()
                    self._send_client = None
                await asyncio.sleep(delay)
                # Capped at the poll interval, not the listener's max_backoff: the other
                # nodes' listeners may be back before this one, and a listening node does not
                # poll, so a kept doorbell waits for this retry. Within a poll interval of Redis
                # being back is the lag they had while it was down (after a Redis restart it
                # was up to max_backoff, 5 s).
                delay = min(delay * 2, self.poll_interval)
                self._outbox_ready.set()

    async def _connect(self) -> None:
        client = self._new_client()
        self._client = client
        pubsub = client.pubsub()
        self._pubsub = pubsub
        await pubsub.subscribe(self.channel, self.relay_channel)
        # subscribe() only sends; wait for the confirmations so "started" means "listening".
        confirmed = 0
        while confirmed < 2:
            message = await pubsub.get_message(ignore_subscribe_messages=False, timeout=5.0)
            if message is None:
                raise ConnectionError("no subscribe confirmation from Redis")
            if message["type"] == "subscribe":
                confirmed += 1

    async def _listen(self) -> None:
        pubsub = self._pubsub
        assert pubsub is not None
        while not self._closing:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=self.health_interval)
            if message is None:
                # Quiet channel: prove the connection is alive (a dead one raises here).
                await asyncio.wait_for(pubsub.ping(), self.health_interval)
                continue
            if message["type"] != "message":
                continue
            data = message["data"]
            channel = message["channel"]
            if (channel.decode() if isinstance(channel, bytes) else channel) == self.relay_channel:
                self.relayed(data.decode() if isinstance(data, bytes) else str(data))
                continue
            try:
                stream, seq = doorbell.decode(data.decode() if isinstance(data, bytes) else str(data))
            except ValueError:
                log.warning("ignoring a foreign payload on channel %s", self.channel)
                continue
            self.heard(stream, seq)

    async def _disconnect(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        client, self._client = self._client, None
        if pubsub is not None:
            with contextlib.suppress(Exception):
                await pubsub.aclose()
        if client is not None:
            with contextlib.suppress(Exception):
                await client.aclose()
