"""How fast a write reaches an MCP listener, on both revisions, beside a WebSocket subscriber.

Prints figures, asserts nothing. Run from the repository root:

    .venv/bin/python bench/bench_mcp.py [--writes 200] [--listeners 100] [--procs 4] [--json]

One ``sessionhub serve`` on a fresh SQLite file. A ``HubClient`` appends messages to one
session over the WebSocket, one at a time; the time from just before the append to the
moment each follower hears of it:

- ``ws_subscribe``: a second ``HubClient`` subscribed to the session (the event itself; the
  baseline);
- ``mcp_listen``: the official ``mcp`` client on 2026-07-28, ``subscriptions/listen`` on the
  session's ``sessionhub://sessions/{id}/history``;
- ``mcp_subscribe``: the ``mcp`` client on 2025-11-25 with ``resources/subscribe`` on
  ``/mcp/stateful``.

Then fan-out: ``--listeners`` 2026-07-28 listen streams on the same history, spread over
``--procs`` client processes; p50/p95 of the time until the first and the last of them
heard of each write (``CLOCK_MONOTONIC``, shared by the processes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import sys
import tempfile
import warnings
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from bench_chat import _free_port, _now, _pct, _start_hub  # noqa: E402


def _message(i: int) -> dict[str, Any]:
    return {"id": f"m{i}", "role": "user", "parts": [{"type": "text", "text": f"write {i}"}]}


def _summary(values: list[float]) -> dict[str, float]:
    ms = [v * 1000 for v in values]
    return {"p50": round(statistics.median(ms), 3), "p95": round(_pct(ms, 0.95), 3), "n": len(ms)}


async def _listen(base: str, uri: str, count: int, rounds: int, ready: Any, reports: Any) -> None:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    async with AsyncExitStack() as stack:
        streams = []
        for _ in range(count):
            http = await stack.enter_async_context(httpx2.AsyncClient(timeout=60))
            transport = streamable_http_client(f"{base}/mcp", http_client=http)
            client = await stack.enter_async_context(Client(transport, cache=None))
            streams.append(
                aiter(await stack.enter_async_context(client.listen(resource_subscriptions=[uri])))
            )
        ready.set()

        async def at(waited: Any) -> float:
            await waited
            return _now()

        for _ in range(rounds):
            heard_at = await asyncio.gather(*(at(anext(s)) for s in streams))
            reports.put((min(heard_at), max(heard_at)))


def _listen_proc(base: str, uri: str, count: int, rounds: int, ready: Any, reports: Any) -> None:
    sys.path.insert(0, str(HERE.parent))
    asyncio.run(_listen(base, uri, count, rounds, ready, reports))


async def _run(port: int, writes: int, listeners: int, procs: int) -> dict[str, Any]:
    import httpx2
    import mcp_types as types
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.exceptions import MCPDeprecationWarning

    from clients import HubClient

    base, url = f"http://127.0.0.1:{port}", f"ws://127.0.0.1:{port}/ws"
    results: dict[str, Any] = {}
    async with AsyncExitStack() as stack:
        writer = await stack.enter_async_context(HubClient(url))
        watcher = await stack.enter_async_context(HubClient(url))
        info = await writer.sessions.create("bench")
        uri = f"sessionhub://sessions/{info.id}/history"

        async def client(path: str, mode: str, handler: Any = None) -> Client:
            http = await stack.enter_async_context(httpx2.AsyncClient(timeout=30))
            transport = streamable_http_client(f"{base}{path}", http_client=http)
            return await stack.enter_async_context(
                Client(transport, mode=mode, message_handler=handler, cache=None)
            )

        heard: asyncio.Queue[float] = asyncio.Queue()

        async def on_message(message: Any) -> None:
            if isinstance(message, types.ResourceUpdatedNotification):
                heard.put_nowait(_now())

        modern = await client("/mcp", "auto")
        legacy = await client("/mcp/stateful", "legacy", on_message)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            await legacy.subscribe_resource(uri)
        sub = await stack.enter_async_context(modern.listen(resource_subscriptions=[uri]))
        events = watcher.subscribe(info.id, after_seq=0)
        await anext(events)  # session.created

        times: dict[str, list[float]] = {"ws_subscribe": [], "mcp_listen": [], "mcp_subscribe": []}
        changes = aiter(sub)

        async def at(waited: Any) -> float:
            await waited
            return _now()

        for i in range(writes):
            start = _now()
            await writer.sessions.append(info.id, _message(i))
            # Each follower's own arrival time, awaited side by side.
            ws, listened, subscribed = await asyncio.gather(
                at(anext(events)), at(anext(changes)), heard.get()
            )
            times["ws_subscribe"].append(ws - start)
            times["mcp_listen"].append(listened - start)
            times["mcp_subscribe"].append(subscribed - start)
        results["latency_ms"] = {name: _summary(values) for name, values in times.items()}

        # Fan-out: the listen streams in --procs processes of their own, so that the clients'
        # parsing is not all in this one (each reports when its first and last stream heard).
        rounds = max(20, writes // 4)
        ctx = multiprocessing.get_context("spawn")
        reports: Any = ctx.Queue()
        ready = [ctx.Event() for _ in range(procs)]
        share = [listeners // procs + (1 if k < listeners % procs else 0) for k in range(procs)]
        children = [
            ctx.Process(target=_listen_proc, args=(base, uri, n, rounds, ready[k], reports), daemon=True)
            for k, n in enumerate(share)
        ]
        for child in children:
            child.start()
        for event in ready:
            await asyncio.to_thread(event.wait, 60)
        first: list[float] = []
        last: list[float] = []
        for i in range(writes, writes + rounds):
            start = _now()
            await writer.sessions.append(info.id, _message(i))
            heard_at = [await asyncio.to_thread(reports.get, True, 30) for _ in children]
            first.append(min(h[0] for h in heard_at) - start)
            last.append(max(h[1] for h in heard_at) - start)
            await asyncio.gather(anext(events), anext(changes), heard.get())
        for child in children:
            child.join(30)
        results["fan_out_ms"] = {
            "listeners": listeners,
            "procs": procs,
            "first": _summary(first),
            "last": _summary(last),
        }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--writes", type=int, default=200)
    parser.add_argument("--listeners", type=int, default=100)
    parser.add_argument("--procs", type=int, default=4, help="processes the listen streams run in")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        port = _free_port()
        hub = _start_hub(Path(tmp) / "bench.db", port)
        try:
            results = asyncio.run(_run(port, args.writes, args.listeners, args.procs))
        finally:
            hub.terminate()
            hub.wait(20)
    if args.json:
        print(json.dumps(results))
        return
    for name, row in results["latency_ms"].items():
        print(f"{name:14} p50 {row['p50']:7.3f} ms  p95 {row['p95']:7.3f} ms  ({row['n']} writes)")
    fan = results["fan_out_ms"]
    for end in ("first", "last"):
        row = fan[end]
        where = f"fan-out to {fan['listeners']} in {fan['procs']} processes, {end} heard"
        print(f"{where}: p50 {row['p50']:7.3f} ms  p95 {row['p95']:7.3f} ms")


if __name__ == "__main__":
    main()
