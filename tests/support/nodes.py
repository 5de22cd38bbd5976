"""Hub nodes as real ``sessionhub serve`` processes, and throwaway Postgres databases,
for the multi-node tests and the cross-node benchmark."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import sys
import uuid
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import asyncpg

__all__ = ["Node", "free_port", "scratch_database"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.asynccontextmanager
async def scratch_database(dsn: str, prefix: str = "sessionhub_node") -> AsyncIterator[str]:
    """A new empty database on the server of ``dsn``; yields its DSN, drops it at the end."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        parts = urlsplit(dsn)
        try:
            yield urlunsplit(parts._replace(path="/" + name))
        finally:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


class Node:
    """One ``sessionhub serve`` process on a fixed port (so a restart comes back at the
    same address, as behind a load balancer)."""

    def __init__(self, db: str, bus: str | None = None, port: int | None = None, *extra: str) -> None:
        self.db = db
        self.bus = bus
        self.extra = list(extra)
        self.port = port or free_port()
        self.proc: asyncio.subprocess.Process | None = None
        self.log: list[str] = []
        self._reader: asyncio.Task[None] | None = None

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws"

    async def start(self, timeout: float = 30.0) -> None:
        args = [sys.executable, "-m", "hub.apps.cli", "serve", "--db", self.db, "--port", str(self.port)]
        if self.bus:
            args += ["--bus", self.bus]
        args += self.extra
        self.proc = await asyncio.create_subprocess_exec(
            *args,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        stderr = self.proc.stderr
        assert stderr is not None
        async with asyncio.timeout(timeout):
            while True:
                line = (await stderr.readline()).decode()
                if not line:
                    raise RuntimeError("node exited before listening:\n" + "".join(self.log))
                self.log.append(line)
                if re.search(r"Uvicorn running on http://127\.0\.0\.1:\d+", line):
                    break
        self._reader = asyncio.create_task(self._drain(stderr))

    async def _drain(self, stderr: asyncio.StreamReader) -> None:
        while line := await stderr.readline():
            self.log.append(line.decode())

    async def stop(self, sig: int = signal.SIGINT, timeout: float = 20.0) -> int:
        proc, self.proc = self.proc, None
        if proc is None:
            return 0
        if proc.returncode is None:
            proc.send_signal(sig)
        async with asyncio.timeout(timeout):
            code = await proc.wait()
        if self._reader is not None:
            await self._reader
        return code

    async def __aenter__(self) -> Node:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
