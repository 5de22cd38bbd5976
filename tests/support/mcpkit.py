"""The MCP tests' helpers: a real ``sessionhub serve`` process, and the official ``mcp``
client on either revision, with a bearer token.

- :func:`serve_process` runs ``python -m hub.apps.cli serve --port 0`` and yields its port.
- :func:`mcp_client` is a ``ClientSession`` after the 2025-11-25 ``initialize`` handshake
  (the stateless ``/mcp``, or ``/mcp/stateful`` for ``resources/subscribe``).
- :func:`mcp_modern` is the SDK's ``Client``, negotiated (``mode="auto"``: its
  ``server/discover`` probe picks 2026-07-28) or forced to the handshake (``"legacy"``).
- :func:`body` is a tool result's one text.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.session import ClientSession, MessageHandlerFnT
from mcp.client.streamable_http import streamable_http_client

__all__ = ["ROOT", "body", "mcp_client", "mcp_modern", "serve_process"]

ROOT = Path(__file__).resolve().parents[2]


def _headers(token: str | None) -> dict[str, str]:
    return {} if token is None else {"Authorization": f"Bearer {token}"}


@contextlib.asynccontextmanager
async def mcp_client(url: str, token: str | None = None) -> AsyncIterator[ClientSession]:
    async with (
        httpx2.AsyncClient(headers=_headers(token), timeout=10) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


@contextlib.asynccontextmanager
async def mcp_modern(
    url: str,
    token: str | None = None,
    *,
    mode: str = "auto",
    message_handler: MessageHandlerFnT | None = None,
) -> AsyncIterator[Client]:
    async with (
        httpx2.AsyncClient(headers=_headers(token), timeout=10) as http,
        Client(
            streamable_http_client(url, http_client=http),
            mode=mode,
            message_handler=message_handler,
            cache=None,  # every read reaches the hub: the tests read after each write
        ) as client,
    ):
        yield client


def body(result: types.CallToolResult) -> str:
    assert len(result.content) == 1
    first = result.content[0]
    assert isinstance(first, types.TextContent)
    return first.text


@contextlib.asynccontextmanager
async def serve_process(db: Path, *extra: str) -> AsyncIterator[int]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hub.apps.cli", "serve", "--db", str(db), "--port", "0", *extra,
        stderr=subprocess.PIPE, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    assert proc.stderr is not None
    try:
        async with asyncio.timeout(20):
            while True:
                line = (await proc.stderr.readline()).decode()
                assert line, "server exited before listening"
                found = re.search(r"http://127\.0\.0\.1:(\d+)", line)
                if found:
                    port = int(found.group(1))
                    break
        # Keep reading its log, so a chatty server never blocks on a full pipe.
        drain = asyncio.create_task(proc.stderr.read())
        yield port
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGINT)
        async with asyncio.timeout(20):
            await proc.wait()
        if "drain" in locals():
            await drain
