"""The ceilings under the buses, without the hub: what Postgres and Redis allow at most.

Prints figures, never asserts timings. Run from the repository root (Postgres and Redis
running)::

    .venv/bin/python bench/bench_bus_ceilings.py [--sections postgres,redis] [--runs 3]
        [--seconds 5] [--conns 1,4,16,32] [--messages 20000] [--subscribers 0,1,2,4,8,16] [--json]

**Postgres: commits/s, plain against with a NOTIFY.** On a scratch database (created and
dropped here), ``--conns`` connections commit as fast as they can for ``--seconds``: each
commit one INSERT of a ~100-byte event row (``plain``), or the same INSERT and a
``pg_notify`` of a doorbell-sized payload in the same transaction (``notify``), which is
what a write on the Postgres bus commits (``hub/store/postgres/sql.py``). Each is one
statement, so one round trip, either way. One connection LISTENs meanwhile and counts the
notifications (every committed one must arrive). A committing NOTIFY takes a lock that is
global to the database cluster and holds it until its commit record is flushed, so commits
that notify cannot share a WAL flush: plain commits scale with connections (group commit),
notifying ones stay near one commit per flush.

**Redis: PUBLISH per message and per subscriber.** PUBLISHes of a doorbell-sized payload from one
connection, one at a time (``--messages`` / 5, each awaited) and pipelined 500 at a time
(``--messages``), with 0, 1, 2, ...
subscribing connections (``--subscribers``; in a second process that reads raw sockets and
checks every subscriber got every byte of every message). The cost is the Redis server's
own CPU (``INFO cpu``, user + system; its rate over an idle second just before is
subtracted, as the server may be shared) divided by the messages; a least-squares line
through the points gives the cost of a PUBLISH and of each subscribing connection, which on
the hub's Redis bus is one per node.

Each figure is the median of ``--runs``; the load average is printed beside.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import selectors
import socket
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import asyncpg
import redis.asyncio as aioredis

from tests.support.nodes import scratch_database

SCRIPT = Path(__file__).resolve()
CHANNEL = "sessionhub_bench_ceiling"
#: A doorbell as the buses send it: "<seq> <stream>" (hub/bus/doorbell.py), a uuid4 hex id.
PAYLOAD = "123456 " + "0123456789abcdef0123456789abcdef"
BODY = "x" * 100
PIPELINE = 500
perf = time.perf_counter

INSERT = "INSERT INTO ceiling_events (stream, body) VALUES ($1, $2)"
INSERT_NOTIFY = (
    "WITH i AS (INSERT INTO ceiling_events (stream, body) VALUES ($1, $2) RETURNING id) "
    f"SELECT pg_notify('{CHANNEL}', $3) FROM i"
)


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


# ---------------------------------------------------------------------------------------
# Postgres
# ---------------------------------------------------------------------------------------


async def commit_loop(conn: asyncpg.Connection, notify: bool, until: float, n: int) -> int:
    """Commits until ``until``; each its own transaction (one statement, autocommit)."""
    count = 0
    stream = f"s{n}"
    while perf() < until:
        if notify:
            await conn.execute(INSERT_NOTIFY, stream, BODY, PAYLOAD)
        else:
            await conn.execute(INSERT, stream, BODY)
        count += 1
    return count


async def pg_point(dsn: str, conns: int, notify: bool, seconds: float) -> dict[str, Any]:
    heard = 0

    def on_notify(*_: object) -> None:
        nonlocal heard
        heard += 1

    listener = await asyncpg.connect(dsn)
    pool = [await asyncpg.connect(dsn) for _ in range(conns)]
    try:
        await listener.add_listener(CHANNEL, on_notify)
        # Warm-up: the table's first pages, the statements prepared on every connection;
        # its notifications all heard before the count starts.
        warm = sum(
            await asyncio.gather(*(commit_loop(c, notify, perf() + 0.3, i) for i, c in enumerate(pool)))
        )
        deadline = perf() + 10
        while notify and heard < warm and perf() < deadline:
            await asyncio.sleep(0.05)
        heard = 0
        cpu0 = time.process_time()
        t0 = perf()
        counts = await asyncio.gather(*(commit_loop(c, notify, t0 + seconds, i) for i, c in enumerate(pool)))
        elapsed = perf() - t0
        cpu = time.process_time() - cpu0
        commits = sum(counts)
        deadline = perf() + 10
        while notify and heard < commits and perf() < deadline:
            await asyncio.sleep(0.05)
    finally:
        for c in pool:
            await c.close()
        await listener.close()
    return {
        "conns": conns,
        "mode": "notify" if notify else "plain",
        "commits": commits,
        "commits_per_s": round(commits / elapsed),
        "mean_commit_ms": round(elapsed * conns / max(1, commits) * 1000, 3),
        "client_cpu_share": round(cpu / elapsed, 2),
        "notifications_heard": heard if notify else None,
        "every_notification_heard": heard == commits if notify else None,
    }


async def postgres_section(args: argparse.Namespace) -> dict[str, Any]:
    async with scratch_database(args.dsn, "sessionhub_bench_ceiling") as dsn:
        conn = await asyncpg.connect(dsn)
        try:
            settings = {
                k: await conn.fetchval(f"SHOW {k}")
                for k in ("server_version", "synchronous_commit", "fsync", "wal_sync_method", "commit_delay")
            }
            await conn.execute(
                "CREATE TABLE ceiling_events (id bigserial PRIMARY KEY, stream text NOT NULL, "
                "body text NOT NULL, created_at timestamptz NOT NULL DEFAULT now())"
            )
        finally:
            await conn.close()
        print(
            "== Postgres "
            + ", ".join(f"{k} {v}" for k, v in settings.items())
            + f": commits/s, median of {args.runs} runs of {args.seconds:g} s",
            flush=True,
        )
        points: list[dict[str, Any]] = []
        for conns in args.conns:
            for notify in (False, True):
                runs = [await pg_point(dsn, conns, notify, args.seconds) for _ in range(args.runs)]
                rates = [r["commits_per_s"] for r in runs]
                point = {
                    "conns": conns,
                    "mode": runs[0]["mode"],
                    "commits_per_s": round(median(rates)),
                    "min": min(rates),
                    "max": max(rates),
                    "mean_commit_ms": median([r["mean_commit_ms"] for r in runs]),
                    "client_cpu_share": median([r["client_cpu_share"] for r in runs]),
                    "every_notification_heard": all(r["every_notification_heard"] for r in runs)
                    if notify
                    else None,
                    "runs": runs,
                    "loadavg": loadavg(),
                }
                points.append(point)
                heard = (
                    f"; every notification heard: {'yes' if point['every_notification_heard'] else 'NO'}"
                    if notify
                    else ""
                )
                print(
                    f"   {conns:3} conns {point['mode']:6} {point['commits_per_s']:7,} commits/s "
                    f"[{point['min']:,}–{point['max']:,}], {point['mean_commit_ms']:.2f} ms a commit, "
                    f"client CPU {point['client_cpu_share']:.0%}{heard}; load {point['loadavg']}",
                    flush=True,
                )
    return {"settings": settings, "points": points}


# ---------------------------------------------------------------------------------------
# Redis
# ---------------------------------------------------------------------------------------


def push_frame_size(channel: str, payload: str) -> int:
    """Bytes of one pub/sub message as Redis pushes it (RESP2: a 3-element array)."""

    def bulk(s: str) -> int:
        n = len(s.encode())
        return len(f"${n}\r\n") + n + 2

    return len("*3\r\n") + bulk("message") + bulk(channel) + bulk(payload)


def redis_subscriber_worker(args: argparse.Namespace) -> int:
    """``--worker redis-sub``: ``--sub-conns`` raw sockets SUBSCRIBEd to the channel; prints a
    ready line, reads and discards until each has ``--expect-bytes`` more (or stdin closes,
    or a timeout), then prints how many bytes each got."""
    parts = urlsplit(args.redis)
    host, port = parts.hostname or "127.0.0.1", parts.port or 6379
    sel = selectors.DefaultSelector()
    socks: list[socket.socket] = []
    command = f"*2\r\n$9\r\nSUBSCRIBE\r\n${len(CHANNEL)}\r\n{CHANNEL}\r\n".encode()
    confirm = f"*3\r\n$9\r\nsubscribe\r\n${len(CHANNEL)}\r\n{CHANNEL}\r\n:1\r\n".encode()
    for _ in range(args.sub_conns):
        s = socket.create_connection((host, port))
        s.sendall(command)
        got = b""
        while len(got) < len(confirm):
            got += s.recv(len(confirm) - len(got))
        if got != confirm:
            raise RuntimeError(f"unexpected SUBSCRIBE reply {got!r}")
        s.setblocking(False)
        socks.append(s)
    received = [0] * len(socks)
    for i, s in enumerate(socks):
        sel.register(s, selectors.EVENT_READ, i)
    print(json.dumps({"ready": len(socks)}), flush=True)
    deadline = time.monotonic() + args.timeout
    while min(received, default=args.expect_bytes) < args.expect_bytes and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=0.5):
            sock: socket.socket = key.fileobj  # type: ignore[assignment]
            with contextlib.suppress(BlockingIOError):
                data = sock.recv(1 << 20)
                received[key.data] += len(data)
    print(json.dumps({"received": received}), flush=True)
    for s in socks:
        s.close()
    return 0


async def redis_cpu(client: aioredis.Redis) -> float:
    info = await client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def redis_point(args: argparse.Namespace, subscribers: int, batch: int) -> dict[str, Any]:
    """``batch`` PUBLISHes a round trip: 1 is one command per read and one write per
    subscriber per message (a bus ringing once per commit at a low rate); 500 lets Redis
    read many commands at once and write each subscriber many messages a syscall."""
    messages = args.messages if batch > 1 else max(1, args.messages // 5)
    frame = push_frame_size(CHANNEL, PAYLOAD)
    proc = None
    if subscribers:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(SCRIPT),
            "--worker",
            "redis-sub",
            "--redis",
            args.redis,
            "--sub-conns",
            str(subscribers),
            "--expect-bytes",
            str(frame * messages),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        assert proc.stdout is not None
        ready = json.loads(await asyncio.wait_for(proc.stdout.readline(), 60))
        assert ready["ready"] == subscribers, ready
    client = aioredis.Redis.from_url(args.redis)
    try:
        # The server's own rate while this bench does nothing (another user's load).
        idle0 = await redis_cpu(client)
        t_idle = perf()
        await asyncio.sleep(1.0)
        idle_rate = (await redis_cpu(client) - idle0) / (perf() - t_idle)
        cpu0 = await redis_cpu(client)
        t0 = perf()
        sent = 0
        while sent < messages:
            if batch == 1:
                await client.publish(CHANNEL, PAYLOAD)
                sent += 1
                continue
            pipe = client.pipeline(transaction=False)
            n = min(batch, messages - sent)
            for _ in range(n):
                pipe.publish(CHANNEL, PAYLOAD)
            await pipe.execute()
            sent += n
        elapsed = perf() - t0
        received: list[int] = []
        if proc is not None:
            assert proc.stdout is not None
            received = json.loads(await asyncio.wait_for(proc.stdout.readline(), 120))["received"]
        span = perf() - t0
        cpu = await redis_cpu(client) - cpu0 - idle_rate * span
    finally:
        await client.aclose()
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
    return {
        "subscribers": subscribers,
        "batch": batch,
        "messages": messages,
        "server_cpu_us_per_publish": round(cpu * 1e6 / messages, 2),
        "idle_cpu_share": round(idle_rate, 3),
        "publishes_per_s": round(messages / elapsed),
        "every_message_to_every_subscriber": all(r == frame * messages for r in received),
    }


def fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares line y = a + b x."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    return my - b * mx, b


async def redis_section(args: argparse.Namespace) -> dict[str, Any]:
    client = aioredis.Redis.from_url(args.redis)
    try:
        version = (await client.info("server"))["redis_version"]
    finally:
        await client.aclose()
    print(
        f"== Redis {version}: PUBLISH of a {len(PAYLOAD)}-byte payload, one at a time "
        f"({max(1, args.messages // 5):,} a run) and pipelined {PIPELINE} at a time "
        f"({args.messages:,} a run), median of {args.runs} runs",
        flush=True,
    )
    out: dict[str, Any] = {"version": version}
    for batch in (1, PIPELINE):
        points: list[dict[str, Any]] = []
        say_batch = "one at a time" if batch == 1 else f"pipelined {batch} at a time"
        print(f"   {say_batch}", flush=True)
        for subs in args.subscribers:
            runs = [await redis_point(args, subs, batch) for _ in range(args.runs)]
            costs = [r["server_cpu_us_per_publish"] for r in runs]
            point = {
                "subscribers": subs,
                "server_cpu_us_per_publish": round(median(costs), 2),
                "min": min(costs),
                "max": max(costs),
                "publishes_per_s": round(median([r["publishes_per_s"] for r in runs])),
                "all_received": all(r["every_message_to_every_subscriber"] for r in runs),
                "runs": runs,
                "loadavg": loadavg(),
            }
            points.append(point)
            print(
                f"   {subs:5} subscribers: Redis CPU {point['server_cpu_us_per_publish']:.2f} µs/PUBLISH "
                f"[{point['min']:.2f}–{point['max']:.2f}], {point['publishes_per_s']:,} PUBLISH/s from one "
                f"client; every message to every subscriber: "
                f"{'yes' if point['all_received'] else 'NO'}; load {point['loadavg']}",
                flush=True,
            )
        a, b = fit([p["subscribers"] for p in points], [p["server_cpu_us_per_publish"] for p in points])
        print(
            f"   fit, {say_batch}: {a:.2f} µs a PUBLISH + {b:.2f} µs per subscribing connection", flush=True
        )
        out["one_at_a_time" if batch == 1 else "pipelined"] = {
            "batch": batch,
            "points": points,
            "us_per_publish": round(a, 2),
            "us_per_subscriber": round(b, 2),
        }
    return out


# ---------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sections", default="postgres,redis", help="of postgres, redis (default both)")
    p.add_argument("--runs", type=int, default=3, help="runs per figure, the median reported (default 3)")
    p.add_argument("--seconds", type=float, default=5.0, help="Postgres: seconds per run (default 5)")
    p.add_argument("--conns", type=ints, default=[1, 4, 16, 32], help="Postgres: committing connections")
    p.add_argument(
        "--messages", type=int, default=20_000, help="Redis: pipelined PUBLISHes per run (default 20,000)"
    )
    p.add_argument("--subscribers", type=ints, default=[0, 1, 2, 4, 8, 16], help="Redis: subscriber counts")
    p.add_argument(
        "--dsn",
        default=os.environ.get("SESSIONHUB_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres"),
    )
    p.add_argument("--redis", default=os.environ.get("SESSIONHUB_TEST_REDIS", "redis://127.0.0.1:6379/0"))
    p.add_argument("--json", action="store_true", help="print one JSON line at the end")
    p.add_argument("--worker", choices=["redis-sub"], help=argparse.SUPPRESS)
    p.add_argument("--sub-conns", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--expect-bytes", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--timeout", type=float, default=120.0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.sections = [x.strip() for x in args.sections.split(",") if x.strip()]
    if any(x not in ("postgres", "redis") for x in args.sections) or args.runs < 1:
        p.error("--sections: of postgres, redis; --runs >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker == "redis-sub":
        return redis_subscriber_worker(args)
    print(f"machine: {os.cpu_count()} CPU; load average {loadavg()}", flush=True)
    result: dict[str, Any] = {"bench": "sessionhub-bus-ceilings", "loadavg_start": loadavg()}
    if "postgres" in args.sections:
        result["postgres"] = asyncio.run(postgres_section(args))
    if "redis" in args.sections:
        result["redis"] = asyncio.run(redis_section(args))
    result["loadavg_end"] = loadavg()
    print(f"load average at the end {result['loadavg_end']}", flush=True)
    if args.json:
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
