"""Streamed messages through the hub: deltas/s on one stream with many subscribers.

Prints figures, asserts nothing. Run from the repository root:

    .venv/bin/python bench/bench_stream.py [--subscribers 100] [--deltas 20000] [--procs 4] [--json]

A hub (``sessionhub serve``) runs as its own process on a fresh temporary database.
Subscribers run in ``--procs`` worker processes, each holding its share of raw ``websockets``
connections subscribed to the session; they count every ``stream`` delta frame and check
that indexes arrive once each, in order. One writer (the Python client's
``stream_message``) sends ``--deltas`` text deltas as fast as the hub acknowledges them.
Reported: the writer's deltas/s (send to last acknowledgement), the subscribers' delivery
rate, and whether every subscriber saw every delta. Target: >= 5,000 deltas/s with 100
subscribers.

One huge message (issue 24, item 9):

    .venv/bin/python bench/bench_stream.py --huge-mib 48 [--delta-kib 64] [--tree DIR]

streams ``--huge-mib`` MiB into one message in ``--delta-kib`` KiB text deltas (each sent
when the previous one is acknowledged) with one subscriber draining the session, while a
bystander connection pings the hub every 20 ms. Reported: deltas/s over the first and the
last tenth of the deltas, the total time, the hub's RSS growth (VmHWM - RSS before), and
the bystander's ping round trips (p50, max). ``--tree`` runs the hub from another checkout
(e.g. ``git archive`` of an older commit) to compare; the hub's stream limit is raised to
fit the message (``--max-stream-bytes``) when that checkout has the option.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TARGET_DELTAS_PER_S = 5000.0


async def _subscriber_proc(url: str, session_id: str, count: int, expected: int, out: Any) -> None:
    from websockets.asyncio.client import connect

    results: list[tuple[int, bool, float]] = []

    async def one(i: int) -> None:
        async with connect(url, max_size=16 << 20) as ws:
            await ws.send(json.dumps({"op": "subscribe", "id": 1, "session_id": session_id}))
            seen = 0
            ordered = True
            last = 0.0
            async for raw in ws:
                frame = json.loads(raw)
                if frame.get("frame") != "stream":
                    continue
                if frame["action"] == "delta":
                    for delta in frame["deltas"]:
                        ordered = ordered and delta["index"] == seen + 1
                        seen = delta["index"]
                    last = time.time()
                elif frame["action"] == "end":
                    break
            results.append((seen, ordered and seen == expected, last))

    await asyncio.gather(*(one(i) for i in range(count)))
    out.put(results)


def _subscriber_main(url: str, session_id: str, count: int, expected: int, out: Any) -> None:
    asyncio.run(_subscriber_proc(url, session_id, count, expected, out))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start_hub(db: Path, tree: Path = HERE.parent, *extra: str) -> tuple[subprocess.Popen[bytes], int]:
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hub.apps.cli",
            "serve",
            "--db",
            str(db),
            "--port",
            str(port),
            "--log-level",
            "warning",
            *extra,
        ],
        env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(tree)},
        cwd=tree,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the hub did not start")


async def run(args: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, str(HERE.parent))
    from clients import HubClient

    tmp = Path(tempfile.mkdtemp(prefix="sessionhub-bench-stream-"))
    hub, port = _start_hub(tmp / "hub.db")
    url = f"ws://127.0.0.1:{port}/ws"
    procs: list[multiprocessing.Process] = []
    try:
        async with HubClient(url, name="bench-writer", role="worker") as writer:
            info = await writer.sessions.create("stream bench")
            queue: Any = multiprocessing.Queue()
            per = [
                args.subscribers // args.procs + (1 if i < args.subscribers % args.procs else 0)
                for i in range(args.procs)
            ]
            for count in per:
                if count:
                    p = multiprocessing.Process(
                        target=_subscriber_main, args=(url, info.id, count, args.deltas, queue), daemon=True
                    )
                    p.start()
                    procs.append(p)
            # Wait until every subscriber is present on the session.
            deadline = time.monotonic() + 30
            while len(await writer.presence(info.id)) < args.subscribers and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            present = len(await writer.presence(info.id))
            started = time.time()
            async with writer.session(info.id).stream_message("a1") as st:
                for i in range(args.deltas):
                    await st.text(f"t{i} ")
            acked = time.time()
            results: list[tuple[int, bool, float]] = []
            for _ in procs:
                results.extend(queue.get(timeout=120))
            last_delivery = max(r[2] for r in results)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
        hub.terminate()
        hub.wait(timeout=20)
        shutil.rmtree(tmp, ignore_errors=True)
    writer_rate = args.deltas / (acked - started)
    delivery_rate = args.deltas * len(results) / (last_delivery - started)
    return {
        "subscribers": len(results),
        "present_before_start": present,
        "deltas": args.deltas,
        "writer_deltas_per_s": round(writer_rate),
        "per_subscriber_deltas_per_s": round(args.deltas / (last_delivery - started)),
        "deliveries_per_s": round(delivery_rate),
        "all_delivered_in_order": all(r[1] for r in results),
    }


def _kib(path: str, field: str) -> int:
    for line in Path(path).read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


async def run_huge(args: argparse.Namespace) -> dict[str, Any]:
    from websockets.asyncio.client import connect

    tree: Path = args.tree
    size = args.huge_mib << 20
    delta = "x" * (args.delta_kib << 10)
    count = size // len(delta)
    extra = ("--max-stream-bytes", str(size + (1 << 20))) if args.has_limit else ()
    tmp = Path(tempfile.mkdtemp(prefix="sessionhub-bench-huge-"))
    hub, port = _start_hub(tmp / "hub.db", tree, *extra)
    url = f"ws://127.0.0.1:{port}/ws"
    status = f"/proc/{hub.pid}/status"
    pings: list[float] = []
    rss: list[int] = []  # sampled while the deltas flow, before the stream's end
    try:
        async with (
            connect(url, max_size=None) as writer,
            connect(url, max_size=None) as watcher,
            connect(url) as bystander,
        ):

            async def call(ws: Any, op: str, **fields: Any) -> Any:
                await ws.send(json.dumps({"op": op, "id": 1, **fields}))
                while True:
                    frame = json.loads(await ws.recv())
                    if frame.get("frame") in ("reply", "error") and frame.get("id") == 1:
                        return frame

            sid = (await call(writer, "create", name="huge"))["result"]["id"]
            await call(watcher, "subscribe", session_id=sid)

            async def drain() -> None:
                async for raw in watcher:
                    if '"action":"end"' in str(raw):
                        return

            async def ping() -> None:
                while True:
                    sent = time.perf_counter()
                    await call(bystander, "ping")
                    pings.append(time.perf_counter() - sent)
                    rss.append(_kib(status, "VmRSS"))
                    await asyncio.sleep(0.02)

            rss_before = _kib(status, "VmRSS")
            draining = asyncio.ensure_future(drain())
            pinging = asyncio.ensure_future(ping())
            fields = {"session_id": sid, "message_id": "huge"}
            started = time.perf_counter()
            await call(writer, "stream_start", **fields)
            stamps = []
            for _ in range(count):
                answer = await call(writer, "stream_delta", **fields, kind="text", text=delta)
                if answer["frame"] != "reply":
                    raise RuntimeError(f"a delta was refused: {answer}")
                stamps.append(time.perf_counter())
            streamed_rss = max(rss, default=0)
            await call(writer, "stream_end", **fields)
            total = time.perf_counter() - started
            pinging.cancel()
            await asyncio.wait_for(draining, 60)
            peak = _kib(status, "VmHWM")
    finally:
        hub.terminate()
        hub.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)
    tenth = max(1, count // 10)
    first = tenth / (stamps[tenth - 1] - started)
    last = tenth / (stamps[-1] - stamps[-tenth - 1]) if count > tenth else first
    pings.sort()
    return {
        "mib": args.huge_mib,
        "deltas": count,
        "delta_kib": args.delta_kib,
        "deltas_per_s_first_tenth": round(first, 1),
        "deltas_per_s_last_tenth": round(last, 1),
        "total_s": round(total, 2),
        "rss_growth_mib": round((peak - rss_before) / 1024, 1),
        "rss_growth_while_streaming_mib": round((streamed_rss - rss_before) / 1024, 1),
        "ping_p50_ms": round(pings[len(pings) // 2] * 1000, 1) if pings else None,
        "ping_max_ms": round(pings[-1] * 1000, 1) if pings else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--subscribers", type=int, default=100)
    parser.add_argument("--deltas", type=int, default=20_000)
    parser.add_argument("--procs", type=int, default=4)
    parser.add_argument("--huge-mib", type=int, default=0, help="stream one message of this many MiB")
    parser.add_argument("--delta-kib", type=int, default=64)
    parser.add_argument("--tree", help="run the hub from this checkout (default: this one)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.huge_mib:
        args.tree = Path(args.tree).resolve() if args.tree else HERE.parent
        args.has_limit = "max-stream-bytes" in (args.tree / "hub" / "cli.py").read_text()
        huge = asyncio.run(run_huge(args))
        print(
            f"one message of {huge['mib']} MiB in {huge['deltas']:,} deltas of {huge['delta_kib']} KiB: "
            f"{huge['deltas_per_s_first_tenth']} deltas/s (first tenth) -> "
            f"{huge['deltas_per_s_last_tenth']} (last tenth), {huge['total_s']} s, "
            f"RSS +{huge['rss_growth_mib']} MiB at peak "
            f"(+{huge['rss_growth_while_streaming_mib']} before the end), "
            f"bystander ping p50 {huge['ping_p50_ms']} ms, max {huge['ping_max_ms']} ms"
        )
        if args.json:
            print(json.dumps(huge))
        return 0
    figures = asyncio.run(run(args))
    verdict = "meets" if figures["writer_deltas_per_s"] >= TARGET_DELTAS_PER_S else "MISSES"
    print(f"stream of {figures['deltas']:,} text deltas, {figures['subscribers']} subscribers:")
    print(f"  writer: {figures['writer_deltas_per_s']:,} deltas/s [target >= 5,000: {verdict}]")
    print(f"  each subscriber: {figures['per_subscriber_deltas_per_s']:,} deltas/s")
    print(f"  deltas delivered, all subscribers: {figures['deliveries_per_s']:,}/s")
    ok = "yes" if figures["all_delivered_in_order"] else "NO"
    print(f"  every subscriber got every delta once, in order: {ok}")
    if args.json:
        print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
