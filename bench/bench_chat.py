"""Chat turns through the hub: latency to the first chunk, and many turns streaming at once.

Prints figures, asserts nothing. Run from the repository root:

    .venv/bin/python bench/bench_chat.py [--latency-turns 200] [--turns 200] [--deltas 50] [--json]

A hub (``sessionhub serve``) runs as its own process on a fresh temporary SQLite file.
Responders are worker processes (``HubClient.turns()``), one per 50 concurrent turns; each
reply's first text delta carries the worker's clock (``CLOCK_MONOTONIC``, shared by every
process on the machine) at the moment it sent it.

1. Latency: ``--latency-turns`` turns one after another, each a ``POST /api/chat`` read as
   SSE. Reported at p50/p95: POST to the first ``text-delta`` chunk, and the part the hub
   adds after the worker's first delta (the worker's send to the chunk at the client).
   Target: <= 5 ms added at p50.
2. Concurrency: ``--turns`` POSTs at once (from two client processes), each answered with
   ``--deltas`` text deltas 20 ms apart, so every reply streams for about a second at the
   same time. Reported: how many were streaming at once at the peak, and whether every
   chunk of every reply arrived, in order, ending with ``finish``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TARGET_ADDED_MS = 5.0
TURNS_PER_WORKER = 50


def _now() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


# -- responders ----------------------------------------------------------------------------


async def _respond(url: str, deltas: int, gap: float, ready: Any) -> None:
    sys.path.insert(0, str(ROOT))
    from clients import HubClient, Turn

    async def answer(turn: Turn) -> None:
        async with turn.reply() as st:
            await st.text(f"{_now():.6f}|")
            for i in range(deltas - 1):
                if gap:
                    await asyncio.sleep(gap)
                await st.text(f"{i},")

    tasks: set[asyncio.Task[None]] = set()
    async with HubClient(url, name="bench-worker", role="worker") as hub:
        turns = hub.turns()
        first = asyncio.ensure_future(anext(turns))
        await asyncio.sleep(0.2)
        ready.set()
        turn = await first
        while True:
            task = asyncio.create_task(answer(turn))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            turn = await anext(turns)


def _worker_proc(url: str, deltas: int, gap: float, ready: Any) -> None:
    asyncio.run(_respond(url, deltas, gap, ready))


# -- chat clients --------------------------------------------------------------------------


async def _post(http: Any, base: str, session_id: str) -> dict[str, Any]:
    body = {
        "id": session_id,
        "messages": [{"id": uuid.uuid4().hex, "role": "user", "parts": [{"type": "text", "text": "go"}]}],
    }
    sent = _now()
    first: float | None = None
    worker_sent: float | None = None
    chunks: list[dict[str, Any]] = []
    streaming_from = streaming_to = 0.0
    async with http.stream("POST", f"{base}/api/chat", json=body) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            chunks.append(chunk)
            if chunk["type"] == "text-delta" and first is None:
                first = _now()
                worker_sent = float(chunk["delta"].split("|", 1)[0])
                streaming_from = first
    streaming_to = _now()
    text = "".join(c["delta"] for c in chunks if c["type"] == "text-delta")
    return {
        "post_to_first_ms": None if first is None else (first - sent) * 1000,
        "added_ms": None if first is None or worker_sent is None else (first - worker_sent) * 1000,
        "text": text.split("|", 1)[-1],
        "finished": bool(chunks) and chunks[-1]["type"] == "finish",
        "streaming": (streaming_from, streaming_to),
    }


async def _clients(base: str, count: int, start_at: float) -> list[dict[str, Any]]:
    sys.path.insert(0, str(ROOT))
    import httpx2

    limits = httpx2.Limits(max_connections=count + 10, max_keepalive_connections=count + 10)
    async with httpx2.AsyncClient(timeout=120, limits=limits) as http:
        delay = start_at - _now()
        if delay > 0:
            await asyncio.sleep(delay)
        return list(await asyncio.gather(*(_post(http, base, uuid.uuid4().hex) for _ in range(count))))


def _client_proc(base: str, count: int, start_at: float, out: Any) -> None:
    out.put(asyncio.run(_clients(base, count, start_at)))


# -- the hub -------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start_hub(db: Path, port: int) -> subprocess.Popen[bytes]:
    # `-m hub.apps.cli` from the checkout: this tree's hub, whatever `sessionhub` is installed.
    command = [sys.executable, "-m", "hub.apps.cli", "serve", "--db", str(db), "--port", str(port)]
    command += ["--log-level", "warning"]
    proc = subprocess.Popen(command, cwd=ROOT)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return proc
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the hub did not start")


def _workers(url: str, count: int, deltas: int, gap: float) -> list[BaseProcess]:
    ctx = multiprocessing.get_context("spawn")
    procs: list[BaseProcess] = []
    for _ in range(count):
        ready = ctx.Event()
        proc = ctx.Process(target=_worker_proc, args=(url, deltas, gap, ready), daemon=True)
        proc.start()
        if not ready.wait(30):
            raise RuntimeError("a worker did not start")
        procs.append(proc)
    return procs


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--latency-turns", type=int, default=200)
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--deltas", type=int, default=50)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        port = _free_port()
        hub = _start_hub(Path(tmp) / "bench.db", port)
        base, url = f"http://127.0.0.1:{port}", f"ws://127.0.0.1:{port}/ws"
        workers: list[BaseProcess] = []
        try:
            # 1. latency, one turn at a time, one worker answering at once.
            workers = _workers(url, 1, 3, 0.0)
            sequential = asyncio.run(_clients_one_by_one(base, args.latency_turns))
            for proc in workers:
                proc.kill()
            firsts = [r["post_to_first_ms"] for r in sequential if r["post_to_first_ms"] is not None]
            added = [r["added_ms"] for r in sequential if r["added_ms"] is not None]
            results["latency"] = {
                "turns": len(sequential),
                "post_to_first_chunk_ms": {"p50": _pct(firsts, 0.5), "p95": _pct(firsts, 0.95)},
                "added_after_worker_delta_ms": {
                    "p50": _pct(added, 0.5),
                    "p95": _pct(added, 0.95),
                    "mean": statistics.fmean(added),
                },
                "target_p50_ms": TARGET_ADDED_MS,
            }
            # 2. concurrency: --turns at once, one worker process per 50.
            n_workers = max(1, -(-args.turns // TURNS_PER_WORKER))
            workers = _workers(url, n_workers, args.deltas, 0.02)
            ctx = multiprocessing.get_context("spawn")
            out = ctx.Queue()
            start_at = _now() + 2.0
            halves = [args.turns // 2, args.turns - args.turns // 2]
            clients = [ctx.Process(target=_client_proc, args=(base, n, start_at, out)) for n in halves]
            started = time.monotonic()
            for proc in clients:
                proc.start()
            concurrent: list[dict[str, Any]] = []
            for _ in clients:
                concurrent += out.get(timeout=300)
            for proc in clients:
                proc.join(10)
            elapsed = time.monotonic() - started - 2.0
            expected = "".join(f"{i}," for i in range(args.deltas - 1))
            complete = sum(1 for r in concurrent if r["finished"] and r["text"] == expected)
            edges = sorted(
                [(r["streaming"][0], 1) for r in concurrent] + [(r["streaming"][1], -1) for r in concurrent]
            )
            peak = level = 0
            for _, step in edges:
                level += step
                peak = max(peak, level)
            results["concurrency"] = {
                "turns": len(concurrent),
                "worker_processes": n_workers,
                "deltas_per_reply": args.deltas,
                "complete_and_in_order": complete,
                "peak_streaming_at_once": peak,
                "seconds": round(elapsed, 2),
            }
        finally:
            for proc in workers:
                proc.kill()
            hub.terminate()
            hub.wait(20)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    lat, conc = results["latency"], results["concurrency"]
    print(f"machine: {os.cpu_count()} cores; hub: sessionhub serve on SQLite; figures taken under load")
    print(
        f"latency ({lat['turns']} turns one at a time): POST -> first text chunk "
        f"p50 {lat['post_to_first_chunk_ms']['p50']:.2f} ms, "
        f"p95 {lat['post_to_first_chunk_ms']['p95']:.2f} ms; "
        f"added after the worker's first delta p50 {lat['added_after_worker_delta_ms']['p50']:.2f} ms, "
        f"p95 {lat['added_after_worker_delta_ms']['p95']:.2f} ms (target <= {TARGET_ADDED_MS:g} ms at p50)"
    )
    print(
        f"concurrency: {conc['turns']} turns, {conc['worker_processes']} worker processes, "
        f"{conc['deltas_per_reply']} deltas each: {conc['complete_and_in_order']} complete and in order, "
        f"peak {conc['peak_streaming_at_once']} streaming at once, {conc['seconds']} s"
    )


async def _clients_one_by_one(base: str, count: int) -> list[dict[str, Any]]:
    sys.path.insert(0, str(ROOT))
    import httpx2

    async with httpx2.AsyncClient(timeout=60) as http:
        await _post(http, base, uuid.uuid4().hex)  # warm-up: connections, caches
        return [await _post(http, base, uuid.uuid4().hex) for _ in range(count)]


if __name__ == "__main__":
    main()
