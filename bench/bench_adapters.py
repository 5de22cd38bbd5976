"""Each chat door side by side: what it adds to the first chunk, and chunks/s at 100 turns.

Prints figures, asserts nothing. Run from the repository root:

    .venv/bin/python bench/bench_adapters.py [--latency-turns 100] [--turns 100] [--deltas 50] [--json]

One ``sessionhub serve`` on a fresh SQLite file and responder processes, as
``bench/bench_chat.py`` starts them: each reply's first text delta carries the worker's
clock (``CLOCK_MONOTONIC``, shared by every process on the machine) when it sent it. For
each door, the same turns:

- ``api_chat``: ``POST /api/chat``, the AI SDK UI message stream over SSE (the baseline);
- ``aisdk_ws``: ``/api/chat/ws``, the AI SDK 7 ``WebSocketChatTransport`` frames;
- ``agui``: ``POST /agui``, AG-UI events over SSE;
- ``cf_agents``: ``/agents/bench/{name}``, Cloudflare's ``cf_agent_use_chat_response`` frames;
- ``agui_follow``: the same ``POST /agui`` run, read by a second reader that follows the
  thread (``GET /agui/{thread}/stream?follow=1``, attached before the run): what a
  follower gets, found in the session's log.

1. Latency: ``--latency-turns`` turns one after another; p50/p95 of the time from the
   worker's first delta to its text at the client (target: <= 2 ms added at p50 over
   ``api_chat``).
2. Throughput: ``--turns`` turns at once (one client process, one worker process per 50),
   each ``--deltas`` deltas 20 ms apart; reported: text chunks per second received over the
   whole run, and how many replies arrived whole and in order.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from bench_chat import TURNS_PER_WORKER, _free_port, _now, _pct, _start_hub, _workers  # noqa: E402

DOORS = ("api_chat", "aisdk_ws", "agui", "cf_agents", "agui_follow")


def _user() -> dict[str, Any]:
    return {"id": uuid.uuid4().hex, "role": "user", "parts": [{"type": "text", "text": "go"}]}


class Reply:
    """What one turn's client saw: when the first text arrived and the worker's clock in it,
    the text, and whether the reply ended as finished."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.worker_sent: float | None = None
        self.parts: list[str] = []
        self.finished = False

    def text(self, delta: str) -> None:
        if self.first is None:
            self.first = _now()
            head, _, rest = delta.partition("|")
            self.worker_sent = float(head)
            delta = rest
        self.parts.append(delta)

    def added_ms(self) -> float | None:
        if self.first is None or self.worker_sent is None:
            return None
        return (self.first - self.worker_sent) * 1000


async def _api_chat(http: Any, base: str, _ws: Any) -> Reply:
    reply = Reply()
    body = {"id": uuid.uuid4().hex, "messages": [_user()]}
    async with http.stream("POST", f"{base}/api/chat", json=body) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk["type"] == "text-delta":
                reply.text(chunk["delta"])
            reply.finished = chunk["type"] == "finish"
    return reply


async def _agui(http: Any, base: str, _ws: Any) -> Reply:
    reply = Reply()
    body = {
        "threadId": uuid.uuid4().hex,
        "runId": uuid.uuid4().hex,
        "messages": [{"id": uuid.uuid4().hex, "role": "user", "content": "go"}],
    }
    async with http.stream("POST", f"{base}/agui", json=body) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if event["type"] == "TEXT_MESSAGE_CONTENT":
                reply.text(event["delta"])
            reply.finished = event["type"] == "RUN_FINISHED"
    return reply


async def _agui_follow(http: Any, base: str, _ws: Any) -> Reply:
    reply = Reply()
    thread = uuid.uuid4().hex
    body = {
        "threadId": thread,
        "runId": uuid.uuid4().hex,
        "messages": [{"id": uuid.uuid4().hex, "role": "user", "content": "go"}],
    }

    async def run() -> None:
        async with http.stream("POST", f"{base}/agui", json=body) as response:
            await response.aread()

    posted: asyncio.Task[None] | None = None
    async with http.stream("GET", f"{base}/agui/{thread}/stream?follow=1") as response:
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if posted is None:
                if event["type"] == "RUN_FINISHED":  # the attach's sync run: now the run
                    posted = asyncio.create_task(run())
                continue
            if event["type"] == "TEXT_MESSAGE_CONTENT":
                reply.text(event["delta"])
            if event["type"] == "RUN_FINISHED":
                reply.finished = True
                break
    if posted is not None:
        await posted
    return reply


async def _aisdk_ws(_http: Any, base: str, ws: Any) -> Reply:
    from websockets.asyncio.client import connect

    reply = Reply()
    request_id = uuid.uuid4().hex
    frame = {
        "type": "send",
        "requestId": request_id,
        "id": uuid.uuid4().hex,
        "messages": [_user()],
        "trigger": "submit-message",
    }
    async with connect(base.replace("http", "ws") + "/api/chat/ws", max_size=None) as socket:
        await socket.send(json.dumps(frame))
        async for raw in socket:
            data = json.loads(raw)
            if data["type"] == "chunk":
                chunk = data["chunk"]
                if chunk["type"] == "text-delta":
                    reply.text(chunk["delta"])
                reply.finished = chunk["type"] == "finish"
            elif data["type"] in ("end", "error"):
                break
    return reply


async def _cf_agents(_http: Any, base: str, ws: Any) -> Reply:
    from websockets.asyncio.client import connect

    reply = Reply()
    body = json.dumps({"messages": [_user()], "trigger": "submit-message"})
    frame = {
        "type": "cf_agent_use_chat_request",
        "id": uuid.uuid4().hex,
        "init": {"method": "POST", "body": body},
    }
    async with connect(
        base.replace("http", "ws") + f"/agents/bench/{uuid.uuid4().hex}", max_size=None
    ) as socket:
        await socket.send(json.dumps(frame))
        async for raw in socket:
            data = json.loads(raw)
            if data["type"] != "cf_agent_use_chat_response" or data.get("id") != frame["id"]:
                continue
            if data.get("done"):
                reply.finished = reply.finished and data.get("outcome") == "completed"
                break
            chunk = json.loads(data["body"])
            if chunk["type"] == "text-delta":
                reply.text(chunk["delta"])
            reply.finished = chunk["type"] == "finish"
    return reply


CLIENTS: dict[str, Callable[[Any, str, Any], Awaitable[Reply]]] = {
    "api_chat": _api_chat,
    "aisdk_ws": _aisdk_ws,
    "agui": _agui,
    "cf_agents": _cf_agents,
    "agui_follow": _agui_follow,
}


async def _sequential(base: str, door: str, count: int) -> list[Reply]:
    import httpx2

    async with httpx2.AsyncClient(timeout=60) as http:
        await CLIENTS[door](http, base, None)  # warm-up
        return [await CLIENTS[door](http, base, None) for _ in range(count)]


async def _concurrent(base: str, door: str, count: int) -> tuple[list[Reply], float]:
    import httpx2

    limits = httpx2.Limits(max_connections=count + 10, max_keepalive_connections=count + 10)
    async with httpx2.AsyncClient(timeout=120, limits=limits) as http:
        started = time.monotonic()
        replies = list(await asyncio.gather(*(CLIENTS[door](http, base, None) for _ in range(count))))
        return replies, time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--latency-turns", type=int, default=100)
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--deltas", type=int, default=50)
    parser.add_argument("--doors", default=",".join(DOORS))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    doors = [d for d in args.doors.split(",") if d]
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        port = _free_port()
        hub = _start_hub(Path(tmp) / "bench.db", port)
        base, url = f"http://127.0.0.1:{port}", f"ws://127.0.0.1:{port}/ws"
        workers: list[BaseProcess] = []
        try:
            workers = _workers(url, 1, 3, 0.0)
            for door in doors:
                replies = asyncio.run(_sequential(base, door, args.latency_turns))
                added = [a for a in (r.added_ms() for r in replies) if a is not None]
                results[door] = {
                    "added_ms": {
                        "p50": _pct(added, 0.5),
                        "p95": _pct(added, 0.95),
                        "mean": statistics.fmean(added),
                    },
                    "latency_turns": len(added),
                }
            for proc in workers:
                proc.kill()
            workers = _workers(url, max(1, -(-args.turns // TURNS_PER_WORKER)), args.deltas, 0.02)
            expected = "".join(f"{i}," for i in range(args.deltas - 1))
            for door in doors:
                replies, seconds = asyncio.run(_concurrent(base, door, args.turns))
                chunks = sum(len(r.parts) for r in replies)
                results[door]["concurrent"] = {
                    "turns": len(replies),
                    "whole_and_in_order": sum(
                        1 for r in replies if r.finished and "".join(r.parts) == expected
                    ),
                    "text_chunks_per_s": chunks / seconds,
                    "seconds": round(seconds, 2),
                }
        finally:
            for proc in workers:
                proc.kill()
            hub.terminate()
            hub.wait(20)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"machine: {os.cpu_count()} cores; hub: sessionhub serve on SQLite; figures taken under load")
    base_p50 = results.get("api_chat", {}).get("added_ms", {}).get("p50")
    for door, r in results.items():
        over = (
            ""
            if base_p50 is None or door == "api_chat"
            else f" ({r['added_ms']['p50'] - base_p50:+.2f} ms vs api_chat)"
        )
        c = r["concurrent"]
        print(
            f"{door:10} added after the worker's first delta p50 {r['added_ms']['p50']:.2f} ms{over}, "
            f"p95 {r['added_ms']['p95']:.2f} ms; {c['turns']} at once: {c['whole_and_in_order']} whole, "
            f"{c['text_chunks_per_s']:.0f} text chunks/s over {c['seconds']} s"
        )


if __name__ == "__main__":
    main()
