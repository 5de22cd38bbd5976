"""Benchmark of many live subscribers (issue 28): one hub process up to its descriptor
limit beside a bare ``websockets`` broadcast server, and several hub processes on one port.

Prints figures, never asserts. Run from the repository root:

    .venv/bin/python bench/bench_scale.py [--one 10000,19000] [--workers-subs 50000]
                                          [--workers 4] [--procs 4] [--events 10]
                                          [--runs 1] [--sections one,workers]
                                          [--before DIR] [--json]

Section ``one``: for each count of ``--one``, a fresh bare ``websockets`` broadcast server
(bench/bench_hub.py's baseline) and a fresh ``sessionhub serve`` (SQLite, its defaults, so
its connection limit comes from the descriptor limit), one after the other in the same run.
``--procs`` client processes (this script in ``--worker sub`` mode), each bound to its own
source address 127.0.0.(11+i) so that no address runs out of ephemeral ports, open their
share of raw ``websockets`` connections, 64 at a time each, and subscribe each to one
session. Figures: server RSS per connection (after all are subscribed and quiet, minus the
idle RSS), connect + subscribe rate (connections / the wall time from the first connect to
the last subscribe reply), the server's CPU per connect (the server process's user + system
CPU time over that span, divided by the connections: what the connect path costs the
server, which the rate hides when the clients share its cores), then ``--events``
appends 0.5 s apart and their delivery
latency p50/p99 over every delivery, and completeness (every subscriber got every event
exactly once, in order).

Section ``workers``: ``sessionhub serve --workers N`` on a scratch Postgres database (the
Postgres bus), ``--workers-subs`` subscribers of one session, the same figures; the RSS is
the sum over the worker processes.

``--before DIR``: another checkout (e.g. ``git archive`` of an older commit) served the same
way as a third server of section ``one``, right after this checkout's hub in every run, so a
change is measured against what it changes under the same load; the medians print both
and their ratio.

Each client process holds up to 20,000 descriptors (the hard limit here), so a count needs
enough ``--procs``. Every process it starts is stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import msgspec
from bench_hub import (
    REPO,
    Client,
    Server,
    _Frame,
    _stamp,
    free_port,
    machine_info,
    message,
    pct,
    proc_cpu_s,
    proc_rss_kib,
    raise_nofile,
)
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

SCRIPT = Path(__file__).resolve()
#: ``serve --loop`` for the hubs started (``--hub-loop``), and the checkout they run from
#: (``--hub-repo``: another tree's code, e.g. an older commit's, against this one).
LOOP = ["auto"]
HUB_REPO = [REPO]
POSTGRES = os.environ.get("SESSIONHUB_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")


# -- the subscriber processes ----------------------------------------------------------------


async def subscriber_worker(args: argparse.Namespace) -> int:
    raise_nofile()
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    decoder = msgspec.json.Decoder(_Frame)
    gate = asyncio.Semaphore(64)
    subscribe = json.dumps({"op": "subscribe", "id": 1, "session_id": args.session, "after_seq": 0})
    errors: list[str] = []
    latencies: list[float] = []
    counts: list[int] = []
    bad: list[int] = [0]

    async def open_one() -> ClientConnection | None:
        async with gate:
            try:
                ws = await connect(
                    args.url,
                    compression=None,
                    ping_interval=None,
                    open_timeout=120,
                    close_timeout=2,
                    max_size=1 << 24,
                    local_addr=(args.src, 0),
                )
                await ws.send(subscribe)
                while True:
                    frame = decoder.decode(await asyncio.wait_for(ws.recv(), 120))
                    if frame.frame == "reply" and frame.id == 1:
                        return ws
                    if frame.frame in ("error", "event", "reset"):
                        raise RuntimeError(f"{frame.frame} before the subscribe reply: {frame}")
            except Exception as exc:
                errors.append(repr(exc)[:200])
                return None

    async def read(ws: ClientConnection, slot: int) -> None:
        prev = 0
        try:
            async for raw in ws:
                now = time.time()
                frame = decoder.decode(raw)
                if frame.frame != "event":
                    continue
                stamp = _stamp(frame)
                if stamp is None:
                    continue
                if stamp[1] != counts[slot]:
                    bad[0] += 1
                if prev and frame.seq != prev + 1:
                    bad[0] += 1
                prev = frame.seq
                counts[slot] += 1
                latencies.append(now - stamp[0])
        except ConnectionClosed:
            pass

    started = time.time()
    opened = await asyncio.gather(*(open_one() for _ in range(args.conns)))
    subs = [ws for ws in opened if ws is not None]
    ready_at = time.time()
    counts.extend([0] * len(subs))
    readers = [loop.create_task(read(ws, i)) for i, ws in enumerate(subs)]
    print(
        json.dumps(
            {
                "ready": len(subs),
                "failed": args.conns - len(subs),
                "errors": errors[:3],
                "t0": started,
                "t1": ready_at,
            }
        ),
        flush=True,
    )
    await stdin.readline()  # the orchestrator says: the events are all sent, and given time
    print(
        json.dumps(
            {
                "conns": len(subs),
                "complete": sum(1 for c in counts if c == args.expect),
                "events": sum(counts),
                "bad": bad[0],
                "latencies_ms": [round(x * 1000.0, 2) for x in sorted(latencies)],
            }
        ),
        flush=True,
    )
    for task in readers:
        task.cancel()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.gather(*(ws.close() for ws in subs), return_exceptions=True), 30)
    return 0


# -- the orchestrator ------------------------------------------------------------------------


def tree_rss_kib(pid: int) -> int:
    """RSS of ``pid`` and all its descendants (the workers of ``serve --workers``)."""
    total = proc_rss_kib(pid)
    with contextlib.suppress(OSError):
        for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
            total += tree_rss_kib(int(child))
    return total


def tree_cpu_s(pid: int) -> float:
    total = proc_cpu_s(pid)
    with contextlib.suppress(OSError):
        for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
            total += tree_cpu_s(int(child))
    return total


async def start_hub(tmp: Path, workers: int, db: str | None, repo: Path | None = None) -> Server:
    repo = repo or HUB_REPO[0]
    port = free_port()
    cmd = [sys.executable, "-m", "hub.apps.cli", "serve", "--port", str(port), "--log-level", "warning"]
    cmd += ["--db", db or str(tmp / f"hub-{uuid.uuid4().hex[:6]}.db")]
    if LOOP[0] != "auto":
        cmd += ["--loop", LOOP[0]]
    if workers > 1:
        cmd += ["--workers", str(workers)]
    # PYTHONPATH as well as the working directory: the checkout's own packages, not the
    # venv's editable install of another one.
    env = {**os.environ, "PYTHONPATH": str(repo)}
    proc = await asyncio.create_subprocess_exec(
        *cmd, cwd=repo, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    server = Server("hub", proc, port)
    await server.wait_ready(60)
    if workers > 1:  # every worker up: each answers on its own
        await asyncio.sleep(3)
    return server


async def settle(server: Server, seconds: float = 1.0) -> int:
    """RSS once two readings ``seconds`` apart agree within 1 %."""
    before = tree_rss_kib(server.proc.pid)
    for _ in range(20):
        await asyncio.sleep(seconds)
        now = tree_rss_kib(server.proc.pid)
        if abs(now - before) <= 0.01 * before:
            return now
        before = now
    return before


async def measure(server: Server, subs: int, procs: int, events: int) -> dict[str, Any]:
    control = await Client.open(server.url)
    clients: list[asyncio.subprocess.Process] = []
    try:
        sid = (await control.call("create", name="scale"))["id"]
        idle = await settle(server, 0.5)
        cpu_before = tree_cpu_s(server.proc.pid)
        share = [subs // procs + (1 if i < subs % procs else 0) for i in range(procs)]
        for i, n in enumerate(share):
            clients.append(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    str(SCRIPT),
                    "--worker",
                    "sub",
                    "--url",
                    server.url,
                    "--session",
                    sid,
                    "--conns",
                    str(n),
                    "--expect",
                    str(events),
                    "--src",
                    f"127.0.0.{11 + i}",
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    cwd=REPO,
                    limit=1 << 28,  # the result line carries every latency
                )
            )
        readies = []
        for c in clients:
            assert c.stdout is not None
            readies.append(json.loads(await asyncio.wait_for(c.stdout.readline(), 900)))
        connected = sum(r["ready"] for r in readies)
        span = max(r["t1"] for r in readies) - min(r["t0"] for r in readies)
        # From before the first client process started to after the last reply: the
        # server is idle outside the span, so this is the connects' CPU (and the clock
        # tick's resolution, 10 ms, is small beside it).
        connect_cpu = tree_cpu_s(server.proc.pid) - cpu_before
        rss = await settle(server)
        for i in range(events):
            await control.call("append", session_id=sid, message=message(i))
            await asyncio.sleep(0.5)
        # Deliveries finish: wait until the server's CPU goes quiet, at most 120 s.
        cpu = tree_cpu_s(server.proc.pid)
        for _ in range(240):
            await asyncio.sleep(0.5)
            now = tree_cpu_s(server.proc.pid)
            if now - cpu < 0.02:
                break
            cpu = now
        await asyncio.sleep(2)
        results = []
        for c in clients:
            assert c.stdin is not None and c.stdout is not None
            c.stdin.write(b"stop\n")
            await c.stdin.drain()
            results.append(json.loads(await asyncio.wait_for(c.stdout.readline(), 300)))
        latencies = sorted(x for r in results for x in r["latencies_ms"])
        return {
            "subscribers": subs,
            "connected": connected,
            "failed": sum(r["failed"] for r in readies),
            "errors": [e for r in readies for e in r["errors"]][:3],
            "connect_s": round(span, 2),
            "connect_per_s": round(connected / span, 1) if span else None,
            "cpu_us_per_connect": round(connect_cpu / max(1, connected) * 1e6),
            "rss_idle_mib": round(idle / 1024, 1),
            "rss_mib": round(rss / 1024, 1),
            "kib_per_conn": round((rss - idle) / max(1, connected), 2),
            "p50_ms": round(pct(latencies, 0.5), 1) if latencies else None,
            "p99_ms": round(pct(latencies, 0.99), 1) if latencies else None,
            "deliveries": len(latencies),
            "complete": sum(r["complete"] for r in results),
            "bad": sum(r["bad"] for r in results),
            "every_one_once": sum(r["complete"] for r in results) == subs
            and not sum(r["bad"] for r in results),
        }
    finally:
        for c in clients:
            if c.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    c.kill()
                await c.wait()
        await control.close()


def show(label: str, r: dict[str, Any]) -> None:
    print(
        f"  {label:<22} {r['connected']:>6,}/{r['subscribers']:,} connected ({r['failed']} failed) "
        f"in {r['connect_s']} s = {r['connect_per_s']} conn/s, "
        f"server CPU {r['cpu_us_per_connect']} µs/connect; RSS {r['rss_idle_mib']} -> {r['rss_mib']} MiB "
        f"= {r['kib_per_conn']} KiB/conn; delivery p50 {r['p50_ms']} ms p99 {r['p99_ms']} ms; "
        f"every one once: {r['every_one_once']} ({r['complete']:,} complete, {r['bad']} out of order)",
        flush=True,
    )
    if r["errors"]:
        print(f"    errors: {r['errors']}", flush=True)


@contextlib.asynccontextmanager
async def scratch_postgres() -> Any:
    sys.path.insert(0, str(REPO))
    from tests.support.nodes import scratch_database

    async with scratch_database(POSTGRES, prefix="sessionhub_scale") as dsn:
        yield dsn


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"one": [], "workers": []}
    with tempfile.TemporaryDirectory(prefix="sessionhub-scale-") as tmpdir:
        tmp = Path(tmpdir)
        for run in range(args.runs):
            if "one" in args.sections:
                for n in args.one:
                    print(f"== run {run + 1}: {n:,} subscribers, one process", flush=True)
                    for name in args.servers:
                        if name == "baseline":
                            server = await Server.start_baseline()
                        else:
                            server = await start_hub(tmp, 1, None, args.before if name == "before" else None)
                        try:
                            r = await measure(server, n, args.procs, args.events)
                        finally:
                            await server.stop()
                        r.update(server=name, run=run)
                        out["one"].append(r)
                        show(name, r)
            if "workers" in args.sections:
                print(f"== run {run + 1}: {args.workers_subs:,} subscribers, serve --workers {args.workers}")
                async with scratch_postgres() as dsn:
                    server = await start_hub(tmp, args.workers, dsn)
                    try:
                        r = await measure(server, args.workers_subs, args.procs, args.events)
                    finally:
                        await server.stop()
                r.update(server=f"hub --workers {args.workers}", run=run)
                out["workers"].append(r)
                show(f"hub --workers {args.workers}", r)
    return out


def summary(out: dict[str, Any]) -> None:
    print("\n== medians over the runs")
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in out["one"] + out["workers"]:
        groups.setdefault((r["server"], r["subscribers"]), []).append(r)
    for (server, subs), rs in groups.items():

        def med(key: str, rs: list[dict[str, Any]] = rs) -> Any:
            values = [r[key] for r in rs if r[key] is not None]
            return round(statistics.median(values), 2) if values else None

        print(
            f"  {server:<18} {subs:>6,}: {med('kib_per_conn')} KiB/conn, {med('connect_per_s')} conn/s, "
            f"{med('cpu_us_per_connect')} µs server CPU/connect, "
            f"p50 {med('p50_ms')} ms, p99 {med('p99_ms')} ms, every one once in "
            f"{sum(r['every_one_once'] for r in rs)}/{len(rs)} runs"
        )
    for subs in sorted({subs for server, subs in groups if server == "before"}):
        before, after = groups[("before", subs)], groups.get(("hub", subs), [])
        if not after:
            continue

        def median(rs: list[dict[str, Any]], key: str) -> float:
            return float(statistics.median(r[key] for r in rs if r[key] is not None))

        rate = median(after, "connect_per_s") / median(before, "connect_per_s")
        cpu = median(after, "cpu_us_per_connect") / median(before, "cpu_us_per_connect")
        print(
            f"  this checkout against --before at {subs:,}: connect rate {rate:.2f}x, "
            f"server CPU per connect {cpu:.2f}x"
        )


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--one", default="10000,19000", help="subscriber counts on one process (default %(default)s)"
    )
    p.add_argument(
        "--workers-subs", type=int, default=50_000, help="subscribers with --workers (default 50000)"
    )
    p.add_argument("--workers", type=int, default=4, help="hub processes (default 4)")
    p.add_argument("--procs", type=int, default=4, help="client processes (default 4)")
    p.add_argument("--events", type=int, default=10, help="appends delivered to everyone (default 10)")
    p.add_argument("--runs", type=int, default=1, help="runs (default 1); medians printed at the end")
    p.add_argument("--sections", default="one,workers", help="one, workers (default both)")
    p.add_argument(
        "--servers", default="baseline,hub", help="of baseline, hub, before (default baseline,hub)"
    )
    p.add_argument("--hub-repo", default=None, help="run the hub from this checkout (default this one)")
    p.add_argument(
        "--before", type=Path, default=None, help="another checkout, served as a third server of section one"
    )
    p.add_argument("--hub-loop", default="auto", help="serve --loop: auto, asyncio, uvloop (default auto)")
    p.add_argument("--json", action="store_true", help="print one JSON line at the end")
    p.add_argument("--worker", choices=["sub"], help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    p.add_argument("--session", help=argparse.SUPPRESS)
    p.add_argument("--conns", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--expect", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--src", default="127.0.0.1", help=argparse.SUPPRESS)
    args = p.parse_args()
    args.one = [int(x) for x in args.one.split(",") if x.strip()]
    args.sections = [x.strip() for x in args.sections.split(",") if x.strip()]
    args.servers = [x.strip() for x in args.servers.split(",") if x.strip()]
    if "before" in args.servers and args.before is None:
        p.error("--servers before needs --before DIR")
    if args.before is not None:
        args.before = args.before.resolve()
        if "before" not in args.servers:
            # Right after this checkout's hub: the two hubs meet the same load and heat.
            at = args.servers.index("hub") + 1 if "hub" in args.servers else len(args.servers)
            args.servers.insert(at, "before")
    return args


def main() -> int:
    args = parse_args()
    if args.worker == "sub":
        return asyncio.run(subscriber_worker(args))
    raise_nofile()
    LOOP[0] = args.hub_loop
    if args.hub_repo:
        HUB_REPO[0] = Path(args.hub_repo).resolve()
    machine = machine_info()
    print(
        f"machine: {machine['nproc']} CPU, {machine['mem_gib']} GiB, Python {machine['python']}, "
        f"packages {machine['packages']}; load average {machine['loadavg_start']}",
        flush=True,
    )
    out = asyncio.run(bench(args))
    summary(out)
    if args.json:
        print(json.dumps({"machine": machine, **out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
