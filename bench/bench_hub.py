"""Benchmark of the hub over real sockets, next to two bare broadcast servers (its anchors).

Prints figures, never asserts timings. Run from the repository root:

    .venv/bin/python bench/bench_hub.py [--subscribers 100] [--rate 100] [--seconds 10]
                                        [--procs 4] [--burst-subscribers 1000]
                                        [--burst-appends 200] [--replay 50000]
                                        [--idle 1000] [--runs 5] [--sections live,burst,...]
                                        [--anchors baseline,picows]
                                        [--profile-hub FILE] [--json] [--quick]

Everything runs on 127.0.0.1. The hub is ``python -m hub.apps.cli serve`` (this checkout's) in a
subprocess on a fresh SQLite file (WAL, the defaults) in a temporary directory. The anchors
(bench/anchors.py) are this script in ``--worker baseline`` mode (``websockets``' server plus
``broadcast()``) and ``--worker picows`` mode (picows, a Cython WebSocket stack): no storage,
speaking just enough of the protocol (``create``, ``subscribe``, ``append``, ``ping``) that the
same writer and the same subscribers drive all three. Subscribers run in ``--procs`` separate
processes (this script in ``--worker sub`` mode), each holding many
``websockets.asyncio.client`` connections, one subscription per connection. No side
negotiates permessage-deflate (clients connect with ``compression=None``). Before any
clock starts, the bench waits until the server and the subscriber processes are idle:
subscribing sets off the hub's presence frames to the other subscribers, whose count and
cost (time, server CPU) are printed separately.

Sections, in order:

1. Live latency: ``--subscribers`` subscribers, one writer appending ``--rate`` messages/s
   for ``--seconds`` s, each append awaited (on the hub: committed). The writer puts
   ``time.time()`` in the message text; a subscriber computes ``time.time() - t`` when the
   event arrives. p50/p99 over every delivery, on each server; every subscriber must get
   every event exactly once (count, seq continuity, order).
2. Burst throughput: ``--burst-subscribers`` and then ``--subscribers`` subscribers, one
   writer appending as fast as it can (each append awaited). Delivered events/s = all
   deliveries / (last delivery - first send).
3. Resume replay (the hub only): one client subscribes from 0 to a session of ``--replay``
   events (built with ``append_all`` in batches of 1,000); events/s until the last one
   arrives, after one uncounted warm-up run. Twice: with a ``websockets`` client, whose own
   CPU is the limit on this machine, and with a minimal raw-socket reader (RFC 6455 framing
   only) that shows what the hub itself sends.
4. RSS per idle subscriber: server VmRSS before and after ``--idle`` connections with one
   idle subscription each, divided by ``--idle``; on a freshly started hub (and anchors).

Each scenario also reports the server's CPU per delivery: the server process's user + system
CPU time (/proc/<pid>/stat) over the scenario, divided by the deliveries. Sections 1 and 2 run
``--runs`` times (default 5), each run on a fresh hub and fresh anchors, the servers' order
rotated by one each run (so no server always goes first on a shared machine); each server's
figures are printed as the median [min-max] of the runs, and each hub/anchor ratio as the
median of the runs' ratios (each taken within one run).

Every process it starts is stopped, and the temporary directory deleted, at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import platform
import resource
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import anchors
import msgspec
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SCRIPT = Path(__file__).resolve()

# Targets of the hub against the bare `websockets` broadcast (issue 28). Printed next to the
# figures; never asserted. Against picows the figures are the measured gap, with no target.
TARGET_P50_RATIO = 1.15  # hub live p50 <= 1.15x websockets'
TARGET_P99_RATIO = 1.2  # hub live p99 <= 1.2x websockets'
TARGET_BURST_RATIO = 1.5  # hub delivered/s >= 1.5x websockets' at 1,000 subscribers
#: ratio key -> (bound, whether the ratio must be at most the bound)
TARGETS = {
    "p50_ratio": (TARGET_P50_RATIO, True),
    "p99_ratio": (TARGET_P99_RATIO, True),
    "fanout_ratio": (TARGET_BURST_RATIO, False),
}
#: The servers: the hub and the anchors of bench/anchors.py (``baseline`` is the
#: ``websockets`` one, its name since issue 18), as printed.
LABELS = {"hub": "hub", "baseline": "websockets", "picows": "picows"}
ANCHORS = ("baseline", "picows")
SECTIONS = ("live", "burst", "burst-small", "replay", "rss")
TARGET_REPLAY_PER_S = 50_000.0
TARGET_RSS_KIB = 30.0

#: Appended to every message text so frames have a realistic size (~330 bytes on the wire).
FILLER = "the quick brown fox jumps over the lazy dog; " * 2
REPLAY_BATCH = 1_000

perf = time.perf_counter


# ---------------------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------------------


def r3(x: float) -> float:
    return round(x, 3)


def say(line: str = "") -> None:
    print(line, flush=True)


def pct(ordered: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted sequence."""
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def verdict(ok: bool, text: str) -> str:
    return f"[target {text}: {'meets' if ok else 'MISSES'}]"


def raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 65_536
    if soft != resource.RLIM_INFINITY and soft < want:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def proc_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process, from /proc/<pid>/stat."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def machine_info() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem_gib = 0.0
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = round(int(line.split()[1]) / 1024 / 1024, 1)
                break
    versions: dict[str, str] = {}
    import importlib.metadata as md

    for pkg in (
        "websockets",
        "picows",
        "aiofastnet",
        "uvicorn",
        "starlette",
        "msgspec",
        "aiosqlite",
        "uvloop",
    ):
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            versions[pkg] = "?"
    try:
        commit = subprocess.run(
            ["git", "-C", str(REPO), "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            check=False,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = "?"
    return {
        "commit": commit or "?",
        "nproc": os.cpu_count(),
        "cpu": model or platform.processor(),
        "mem_gib": mem_gib,
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "os": platform.platform(),
        "packages": versions,
        "loadavg_start": loadavg(),
    }


def message(i: int) -> dict[str, Any]:
    """Message ``i``; its text starts with the wall-clock send time and the index."""
    return {
        "id": f"m{i}",
        "role": "assistant" if i % 2 else "user",
        "parts": [{"type": "text", "text": f"{time.time():.6f}|{i}|{FILLER}"}],
    }


# ---------------------------------------------------------------------------------------
# Reading frames (clients): only the fields the bench needs, with msgspec
# ---------------------------------------------------------------------------------------


class _Part(msgspec.Struct):
    text: str = ""


class _Msg(msgspec.Struct):
    parts: list[_Part] = msgspec.field(default_factory=list)


class _Data(msgspec.Struct):
    message: _Msg | None = None


class _Frame(msgspec.Struct):
    frame: str = ""
    id: int | str | None = None
    seq: int = 0
    type: str = ""
    data: _Data | None = None
    result: Any = None
    code: str = ""
    message: str = ""


def _stamp(frame: _Frame) -> tuple[float, int] | None:
    """(send time, index) of an appended bench message, else None."""
    if frame.type != "message.appended" or frame.data is None or frame.data.message is None:
        return None
    parts = frame.data.message.parts
    if not parts:
        return None
    t, i, _ = parts[0].text.split("|", 2)
    return float(t), int(i)


async def open_ws(url: str) -> ClientConnection:
    return await connect(
        url, compression=None, ping_interval=None, open_timeout=60, close_timeout=2, max_size=1 << 24
    )


class Client:
    """One request/reply connection (the writer, the replay builder)."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.next_id = 0

    @classmethod
    async def open(cls, url: str) -> Client:
        return cls(await open_ws(url))

    async def call(self, op: str, **fields: Any) -> Any:
        self.next_id += 1
        rid = self.next_id
        await self.ws.send(json.dumps({"op": op, "id": rid, **fields}))
        while True:
            frame = json.loads(await asyncio.wait_for(self.ws.recv(), 60))
            if frame.get("id") != rid:
                continue
            if frame.get("frame") == "error":
                raise RuntimeError(f"{op} failed: {frame.get('code')}: {frame.get('message')}")
            return frame.get("result")

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.ws.close(), 5)


# ---------------------------------------------------------------------------------------
# Worker mode: subscribers
# ---------------------------------------------------------------------------------------


class _Sub:
    __slots__ = ("bad_order", "bad_seq", "closed_early", "count", "last", "other", "prev", "ws")

    def __init__(self, ws: ClientConnection, other: int) -> None:
        self.ws = ws
        self.prev = 0  # subscribed after seq 0
        self.other = other  # frames that are neither events nor replies (presence...)
        self.count = 0
        self.bad_seq = 0
        self.bad_order = 0
        self.closed_early = False
        self.last = 0.0


async def subscriber_worker(args: argparse.Namespace) -> int:
    raise_nofile()
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    decoder = msgspec.json.Decoder(_Frame)
    url: str = args.url
    sid: str = args.session
    expect: int = args.expect
    errors: list[str] = []
    gate = asyncio.Semaphore(32)
    latencies: list[float] = []
    all_done = asyncio.Event()
    done = 0

    async def open_one() -> _Sub | None:
        async with gate:
            try:
                ws = await open_ws(url)
                await ws.send(json.dumps({"op": "subscribe", "id": 1, "session_id": sid, "after_seq": 0}))
                other = 0
                while True:
                    frame = decoder.decode(await asyncio.wait_for(ws.recv(), 60))
                    if frame.frame == "reply" and frame.id == 1:
                        return _Sub(ws, other)
                    if frame.frame in ("event", "error", "reset", "reply"):
                        raise RuntimeError(f"unexpected {frame.frame} before the subscribe reply: {frame}")
                    other += 1  # presence frames and the like: not part of the log
            except Exception as exc:
                errors.append(repr(exc))
                return None

    async def read(sub: _Sub) -> None:
        nonlocal done
        try:
            async for raw in sub.ws:
                now = time.time()
                frame = decoder.decode(raw)
                if frame.frame != "event":
                    sub.other += 1
                    continue
                if frame.seq != sub.prev + 1:
                    sub.bad_seq += 1
                sub.prev = frame.seq
                stamp = _stamp(frame)
                if stamp is None:
                    continue
                if stamp[1] != sub.count:
                    sub.bad_order += 1
                sub.count += 1
                sub.last = now
                latencies.append(now - stamp[0])
                if sub.count == expect:
                    done += 1
                    if done == len(subs):
                        all_done.set()
        except ConnectionClosed:
            sub.closed_early = True

    opened = await asyncio.gather(*(open_one() for _ in range(args.conns)))
    subs = [s for s in opened if s is not None]
    readers = [loop.create_task(read(s)) for s in subs]
    if not args.hold and (expect == 0 or not subs):
        all_done.set()
    print(
        json.dumps({"ready": len(subs), "failed": args.conns - len(subs), "errors": errors[:3]}), flush=True
    )

    waits: list[asyncio.Task[Any]] = [loop.create_task(stdin.readline())]
    if not args.hold:
        waits.append(loop.create_task(all_done.wait()))
    await asyncio.wait(waits, timeout=args.timeout, return_when=asyncio.FIRST_COMPLETED)
    if all_done.is_set():
        await asyncio.sleep(0.2)  # anything extra (a duplicate) would arrive now
    for task in waits:
        task.cancel()
    ordered = sorted(latencies)
    result = {
        "conns": len(subs),
        "failed": args.conns - len(subs),
        "errors": errors[:3],
        "events": sum(s.count for s in subs),
        "complete": sum(
            1 for s in subs if s.count == expect and not s.bad_seq and not s.bad_order and not s.closed_early
        ),
        "bad_seq": sum(s.bad_seq for s in subs),
        "bad_order": sum(s.bad_order for s in subs),
        "closed_early": sum(1 for s in subs if s.closed_early),
        "other_frames": sum(s.other for s in subs),
        "last_recv": max((s.last for s in subs), default=0.0),
        "latencies_ms": [round(x * 1000.0, 3) for x in ordered],
        "cpu_s": r3(own_cpu_s()),
    }
    print(json.dumps(result), flush=True)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(
            asyncio.gather(*(s.ws.close() for s in subs), return_exceptions=True), timeout=5
        )
    for task in readers:
        task.cancel()
    await asyncio.gather(*readers, return_exceptions=True)
    return 0


# ---------------------------------------------------------------------------------------
# Orchestrator: servers and workers as subprocesses
# ---------------------------------------------------------------------------------------


class Server:
    """A server subprocess: the hub (``sessionhub serve``) or the baseline."""

    def __init__(self, name: str, proc: asyncio.subprocess.Process, port: int) -> None:
        self.name = name
        self.proc = proc
        self.url = f"ws://127.0.0.1:{port}/ws"
        self.log: deque[str] = deque(maxlen=40)
        self._drain = asyncio.get_running_loop().create_task(self._read_log())

    async def _read_log(self) -> None:
        assert self.proc.stderr is not None
        while line := await self.proc.stderr.readline():
            self.log.append(line.decode(errors="replace").rstrip())

    @classmethod
    async def start_hub(cls, db: Path, *, profile: str | None = None) -> Server:
        """``python -m hub.apps.cli serve`` from this checkout (cwd first on sys.path), not an
        installed ``sessionhub`` script, which may import another checkout's code.
        ``profile``: run it under cProfile, the stats written to that file at exit."""
        port = free_port()
        cmd = [sys.executable]
        if profile:
            cmd += ["-m", "cProfile", "-o", profile]
        cmd += ["-m", "hub.apps.cli"]
        proc = await asyncio.create_subprocess_exec(
            *cmd,
            "serve",
            "--db",
            str(db),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
            cwd=REPO,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        server = cls("hub", proc, port)
        await server.wait_ready()
        return server

    @classmethod
    async def start_baseline(cls, kind: str = "baseline") -> Server:
        """A bare broadcast server of bench/anchors.py: ``baseline`` (websockets) or ``picows``."""
        port = free_port()
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(SCRIPT),
            "--worker",
            kind,
            "--port",
            str(port),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        server = cls(kind, proc, port)
        await server.wait_ready()
        return server

    async def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = perf() + timeout
        while True:
            if self.proc.returncode is not None:
                await asyncio.sleep(0.2)
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode}): " + "\n".join(self.log))
            try:
                client = await Client.open(self.url)
                try:
                    if await client.call("ping") == "pong":
                        return
                finally:
                    await client.close()
            except (OSError, ConnectionClosed, TimeoutError, RuntimeError):
                pass
            if perf() > deadline:
                raise RuntimeError(f"{self.name} did not start in {timeout:g}s: " + "\n".join(self.log))
            await asyncio.sleep(0.2)

    def rss_kib(self) -> int:
        return proc_rss_kib(self.proc.pid)

    def cpu_s(self) -> float:
        return proc_cpu_s(self.proc.pid)

    async def stop(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 20)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                await self.proc.wait()
        self._drain.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._drain


class Worker:
    """A subscriber process holding ``conns`` connections, one subscription each."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(
        cls, url: str, sid: str, conns: int, expect: int, *, hold: bool, timeout: float
    ) -> Worker:
        cmd = [
            sys.executable,
            str(SCRIPT),
            "--worker",
            "sub",
            "--url",
            url,
            "--session",
            sid,
            "--conns",
            str(conns),
            "--expect",
            str(expect),
            "--timeout",
            str(timeout),
        ]
        if hold:
            cmd.append("--hold")
        proc = await asyncio.create_subprocess_exec(
            *cmd, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, limit=1 << 27
        )
        return cls(proc)

    async def line(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        raw = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        if not raw:
            raise RuntimeError(f"subscriber worker exited ({await self.proc.wait()})")
        data: dict[str, Any] = json.loads(raw)
        return data

    async def send_stop(self) -> None:
        if self.proc.returncode is None and self.proc.stdin is not None:
            with contextlib.suppress(OSError, ConnectionError):
                self.proc.stdin.write(b"stop\n")
                await self.proc.stdin.drain()

    async def result(self, timeout: float) -> dict[str, Any]:
        try:
            return await self.line(timeout)
        except TimeoutError:
            await self.send_stop()
            return await self.line(30)

    async def finish(self) -> None:
        await self.send_stop()
        try:
            await asyncio.wait_for(self.proc.wait(), 15)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await self.proc.wait()


def split(total: int, parts: int) -> list[int]:
    parts = max(1, min(parts, total)) if total else 1
    return [n for n in (total // parts + (1 if k < total % parts else 0) for k in range(parts)) if n]


async def start_workers(
    server: Server, sid: str, subs: int, procs: int, expect: int, *, hold: bool, timeout: float
) -> tuple[list[Worker], list[dict[str, Any]]]:
    workers: list[Worker] = []
    try:
        for n in split(subs, procs):
            workers.append(await Worker.start(server.url, sid, n, expect, hold=hold, timeout=timeout))
        readies = await asyncio.gather(*(w.line(120) for w in workers))
    except BaseException:
        await asyncio.gather(*(w.finish() for w in workers), return_exceptions=True)
        raise
    return workers, readies


# ---------------------------------------------------------------------------------------
# Scenarios
# ---------------------------------------------------------------------------------------


async def write(client: Client, sid: str, count: int, rate: float | None) -> dict[str, Any]:
    """Append ``count`` messages, each awaited; paced at ``rate``/s, or as fast as it can."""
    rtts: list[float] = []
    start = perf()
    for i in range(count):
        if rate:
            delay = start + i / rate - perf()
            if delay > 0:
                await asyncio.sleep(delay)
        t0 = perf()
        await client.call("append", session_id=sid, message=message(i))
        rtts.append(perf() - t0)
    elapsed = perf() - start
    rtts.sort()
    return {
        "appends": count,
        "elapsed_s": r3(elapsed),
        "appends_per_s": round(count / elapsed, 1),
        "append_rtt_p50_ms": r3(pct(rtts, 0.5) * 1000),
        "append_rtt_p99_ms": r3(pct(rtts, 0.99) * 1000),
    }


async def settle(server: Server, workers: Sequence[Worker], limit: float = 180.0) -> float:
    """Wait until the server and the subscriber processes are quiet (under 10 % of a CPU
    each over half a second), at most ``limit`` s: whatever subscribing set off (the hub's
    presence frames to the other subscribers, a previous scenario's departures) is over
    before the clock starts. Returns the seconds it took."""
    pids = [server.proc.pid] + [w.proc.pid for w in workers if w.proc.returncode is None]
    t0 = perf()

    def cpu() -> list[float]:
        out: list[float] = []
        for pid in pids:
            try:
                out.append(proc_cpu_s(pid))
            except OSError:
                out.append(0.0)
        return out

    last = cpu()
    while perf() - t0 < limit:
        await asyncio.sleep(0.5)
        now = cpu()
        if all(b - a < 0.05 for a, b in zip(last, now, strict=True)):
            break
        last = now
    return perf() - t0


async def fanout(
    server: Server, *, subs: int, procs: int, appends: int, rate: float | None, timeout: float
) -> dict[str, Any]:
    client = await Client.open(server.url)
    try:
        sid = (await client.call("create", name="bench-fanout"))["id"]
        sub_t0, sub_cpu0 = perf(), server.cpu_s()
        workers, readies = await start_workers(
            server, sid, subs, procs, appends, hold=False, timeout=timeout + 60
        )
        try:
            settled = await settle(server, workers)
            cpu0 = server.cpu_s()
            subscribe_s, subscribe_cpu = perf() - sub_t0, cpu0 - sub_cpu0
            first_send = time.time()
            writer = await write(client, sid, appends, rate)
            results = await asyncio.gather(*(w.result(timeout) for w in workers))
            cpu = server.cpu_s() - cpu0
        finally:
            await asyncio.gather(*(w.finish() for w in workers), return_exceptions=True)
    finally:
        await client.close()
    latencies = sorted(x for r in results for x in r["latencies_ms"])
    events = sum(r["events"] for r in results)
    connected = sum(r["ready"] for r in readies)
    complete = sum(r["complete"] for r in results)
    last = max(r["last_recv"] for r in results)
    span = max(1e-9, last - first_send)
    return {
        "subscribers": subs,
        "procs": len(workers),
        "connected": connected,
        "connect_errors": [e for r in readies for e in r["errors"]][:3],
        "writer": writer,
        "expected": subs * appends,
        "delivered": events,
        "complete_subscribers": complete,
        "bad_seq": sum(r["bad_seq"] for r in results),
        "bad_order": sum(r["bad_order"] for r in results),
        "closed_early": sum(r["closed_early"] for r in results),
        "other_frames": sum(r["other_frames"] for r in results),
        "settle_s": r3(settled),
        "subscribe_s": r3(subscribe_s),
        "subscribe_server_cpu_s": r3(subscribe_cpu),
        "all_delivered": connected == subs and complete == subs and events == subs * appends,
        "p50_ms": r3(pct(latencies, 0.5)),
        "p99_ms": r3(pct(latencies, 0.99)),
        "max_ms": r3(latencies[-1]) if latencies else float("nan"),
        "span_s": r3(span),
        "delivered_per_s": round(events / span),
        "server_cpu_s": r3(cpu),
        "server_cpu_us_per_delivery": r3(cpu * 1e6 / max(1, events)),
        "subscriber_cpu_s": r3(sum(r["cpu_s"] for r in results)),
    }


def _yes(ok: bool) -> str:
    return "yes" if ok else "NO"


def print_fanout(label: str, res: dict[str, Any], *, latency: bool) -> None:
    w = res["writer"]
    head = (
        f"   {label:9} {res['subscribers']:,} subs in {res['procs']} procs: "
        f"{res['delivered']:,}/{res['expected']:,} delivered, all delivered: {_yes(res['all_delivered'])}"
    )
    if not res["all_delivered"]:
        head += (
            f" (connected {res['connected']}, complete {res['complete_subscribers']}, "
            f"bad seq {res['bad_seq']}, bad order {res['bad_order']}, closed {res['closed_early']}"
            f"{', ' + '; '.join(res['connect_errors']) if res['connect_errors'] else ''})"
        )
    say(head)
    say(
        f"             subscribing (not timed below): {res['subscribe_s']:.1f} s until all were "
        f"subscribed and quiet, server CPU {res['subscribe_server_cpu_s']:.2f} s; "
        f"{res['other_frames']:,} non-event frames (presence), "
        f"{res['other_frames'] / max(1, res['connected']):,.0f} per subscriber"
    )
    if latency:
        say(
            f"             latency p50 {res['p50_ms']:.2f} ms, p99 {res['p99_ms']:.2f} ms, "
            f"max {res['max_ms']:.1f} ms; writer {w['appends_per_s']:.1f} appends/s, "
            f"append round trip p50 {w['append_rtt_p50_ms']:.2f} ms p99 {w['append_rtt_p99_ms']:.2f} ms"
        )
    else:
        say(
            f"             {res['delivered_per_s']:,} delivered/s over {res['span_s']:.2f} s; "
            f"writer {w['appends_per_s']:,.0f} appends/s; latency p50 {res['p50_ms']:.1f} ms "
            f"p99 {res['p99_ms']:.1f} ms"
        )
    say(
        f"             server CPU {res['server_cpu_s']:.2f} s "
        f"({res['server_cpu_us_per_delivery']:.1f} µs/delivery), subscribers' CPU "
        f"{res['subscriber_cpu_s']:.2f} s"
    )


class _ReplayCheck:
    """Counts a replayed subscription's frames: every event once, in seq order, and every
    message in index order; done when the seq from the subscribe reply has arrived."""

    def __init__(self) -> None:
        self.last_seq = -1
        self.prev = 0
        self.events = 0
        self.appended = 0
        self.bad = 0
        self.other = 0

    def feed(self, frame: _Frame) -> bool:
        if frame.frame == "reply":
            self.last_seq = int(frame.result["last_seq"])
            return self.prev >= self.last_seq
        if frame.frame in ("error", "reset"):
            raise RuntimeError(f"replay: unexpected {frame.frame} frame: {frame}")
        if frame.frame != "event":
            self.other += 1  # presence frames and the like: not part of the log
            return False
        if frame.seq != self.prev + 1:
            self.bad += 1
        self.prev = frame.seq
        self.events += 1
        stamp = _stamp(frame)
        if stamp is not None:
            if stamp[1] != self.appended:
                self.bad += 1
            self.appended += 1
        return self.last_seq >= 0 and self.prev >= self.last_seq

    def ok(self, n: int) -> bool:
        return self.bad == 0 and self.appended == n and self.events == self.last_seq


def _subscribe_from_zero(sid: str) -> str:
    return json.dumps({"op": "subscribe", "id": 1, "session_id": sid, "after_seq": 0})


async def _replay_websockets(url: str, sid: str, check: _ReplayCheck) -> float:
    """Seconds from sending the subscribe to the last event, with a ``websockets`` client."""
    decoder = msgspec.json.Decoder(_Frame)
    ws = await open_ws(url)
    try:
        t0 = perf()
        await ws.send(_subscribe_from_zero(sid))
        while not check.feed(decoder.decode(await asyncio.wait_for(ws.recv(), 60))):
            pass
        return perf() - t0
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(ws.close(), 5)


async def _replay_lean(url: str, sid: str, check: _ReplayCheck) -> float:
    """The same with a minimal WebSocket reader on a bare asyncio stream (RFC 6455 framing,
    nothing else), so the client costs ~3 µs a frame and the figure is the hub's."""
    decoder = msgspec.json.Decoder(_Frame)
    hostport, _, path = url.removeprefix("ws://").partition("/")
    host, _, port = hostport.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        key = base64.b64encode(os.urandom(16)).decode()
        writer.write(
            f"GET /{path} HTTP/1.1\r\nHost: {hostport}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            raise RuntimeError(f"handshake refused: {head[:200]!r}")
        payload = _subscribe_from_zero(sid).encode()
        mask = os.urandom(4)
        size = len(payload)
        header = bytes([0x81, 0x80 | size]) if size < 126 else bytes([0x81, 0xFE]) + size.to_bytes(2, "big")
        t0 = perf()
        writer.write(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))
        buf = bytearray()
        done = False
        while not done:
            data = await asyncio.wait_for(reader.read(1 << 20), 60)
            if not data:
                raise RuntimeError("replay: the hub closed the connection")
            buf += data
            pos, end_of_data = 0, len(buf)
            while not done and end_of_data - pos >= 2:
                length, hdr = buf[pos + 1] & 0x7F, 2
                if length == 126:
                    if end_of_data - pos < 4:
                        break
                    length, hdr = int.from_bytes(buf[pos + 2 : pos + 4], "big"), 4
                elif length == 127:
                    if end_of_data - pos < 10:
                        break
                    length, hdr = int.from_bytes(buf[pos + 2 : pos + 10], "big"), 10
                end = pos + hdr + length
                if end > end_of_data:
                    break
                opcode = buf[pos] & 0x0F
                if not buf[pos] & 0x80 or opcode in (0, 8):
                    raise RuntimeError(f"replay: a fragmented or close frame (opcode {opcode})")
                if opcode == 1:
                    done = check.feed(decoder.decode(buf[pos + hdr : end]))
                pos = end
            del buf[:pos]
        return perf() - t0
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(writer.wait_closed(), 5)


async def replay(server: Server, n: int, reps: int) -> dict[str, Any]:
    builder = await Client.open(server.url)
    try:
        sid = (await builder.call("create", name="bench-replay"))["id"]
        t0 = perf()
        for start in range(0, n, REPLAY_BATCH):
            batch = [message(i) for i in range(start, min(n, start + REPLAY_BATCH))]
            await builder.call("append_all", session_id=sid, messages=batch)
        build_s = perf() - t0
    finally:
        await builder.close()
    out: dict[str, Any] = {"messages": n, "build_s": r3(build_s), "build_msgs_per_s": round(n / build_s)}
    clients: dict[str, Callable[[str, str, _ReplayCheck], Awaitable[float]]] = {
        "websockets": _replay_websockets,
        "lean": _replay_lean,
    }
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in clients}
    # One uncounted run first: the figures are for a warm hub (its SQLite page cache).
    await _replay_lean(server.url, sid, _ReplayCheck())
    for _ in range(reps):
        for name, run in clients.items():
            check = _ReplayCheck()
            cpu_server0, cpu_self0 = server.cpu_s(), own_cpu_s()
            elapsed = await run(server.url, sid, check)
            runs[name].append(
                {
                    "events": check.events,
                    "messages": check.appended,
                    "ok": check.ok(n),
                    "elapsed_s": r3(elapsed),
                    "events_per_s": round(check.events / elapsed),
                    "server_cpu_s": r3(server.cpu_s() - cpu_server0),
                    "client_cpu_s": r3(own_cpu_s() - cpu_self0),
                }
            )
    for name, got in runs.items():
        rates = [r["events_per_s"] for r in got]
        out[name] = {
            "runs": got,
            "median_events_per_s": round(statistics.median(rates)),
            "min_events_per_s": min(rates),
            "max_events_per_s": max(rates),
            "all_ok": all(r["ok"] for r in got),
        }
    return out


async def idle_rss(server: Server, subs: int, procs: int) -> dict[str, Any]:
    client = await Client.open(server.url)
    workers: list[Worker] = []
    try:
        sid = (await client.call("create", name="bench-idle"))["id"]
        # Warm-up: a few subscribers first, so code paths and caches are in memory already.
        warm, _ = await start_workers(server, sid, 10, 1, 0, hold=True, timeout=600)
        workers += warm
        await settle(server, workers)
        before = server.rss_kib()
        sub_t0, sub_cpu0 = perf(), server.cpu_s()
        more, readies = await start_workers(server, sid, subs, procs, 0, hold=True, timeout=600)
        workers += more
        connected = sum(r["ready"] for r in readies)
        settled = await settle(server, workers)
        subscribe_s, subscribe_cpu = perf() - sub_t0, server.cpu_s() - sub_cpu0
        # Then sample until two readings half a second apart agree within 1 %.
        after = server.rss_kib()
        for _ in range(10):
            await asyncio.sleep(0.5)
            now = server.rss_kib()
            if abs(now - after) <= 0.01 * after:
                after = now
                break
            after = now
        for w in more:
            await w.send_stop()
        results = await asyncio.gather(*(w.line(60) for w in more), return_exceptions=True)
        other = sum(r["other_frames"] for r in results if isinstance(r, dict))
    finally:
        await asyncio.gather(*(w.finish() for w in workers), return_exceptions=True)
        await client.close()
    return {
        "subscribers": subs,
        "connected": connected,
        "rss_before_kib": before,
        "rss_after_kib": after,
        "kib_per_subscriber": round((after - before) / max(1, connected), 2),
        "settle_s": r3(settled),
        "subscribe_s": r3(subscribe_s),
        "subscribe_server_cpu_s": r3(subscribe_cpu),
        "other_frames": other,
    }


# ---------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------


async def _section(title: str, fn: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any] | None:
    try:
        return await fn()
    except Exception as exc:  # a failed section is reported, the others still run
        say(f"   {title} FAILED: {exc!r}")
        return None


def run_order(run: int, names: Sequence[str]) -> list[str]:
    """The order of run ``run``: rotated by one each run, so that no server always goes
    first (on a shared machine each place in the order meets a different share of the
    others' load; with the order fixed, that share would be one server's every time)."""
    k = (run - 1) % len(names)
    return [*names[k:], *names[:k]]


async def side_by_side(args: argparse.Namespace, tmp: Path, run: int) -> dict[str, Any]:
    """One run of the live and burst scenarios on fresh servers (a hub on a new SQLite
    file, and each anchor), each scenario on every server in this run's order."""
    out: dict[str, Any] = {}
    names = ["hub", *args.anchors]
    servers: dict[str, Server] = {}
    try:
        for name in names:
            servers[name] = await (
                Server.start_hub(tmp / f"hub-{run}.db", profile=args.profile_hub)
                if name == "hub"
                else Server.start_baseline(name)
            )
        order = run_order(run, names)
        say(
            f"run {run}, in the order "
            + ", ".join(f"{LABELS[n]} (pid {servers[n].proc.pid})" for n in order)
            + f"; load average {loadavg()}"
        )

        # 1. Live latency.
        subs, rate, seconds, procs = args.subscribers, args.rate, args.seconds, args.procs
        appends = max(1, round(rate * seconds))
        if "live" in args.sections:
            say(
                f"1. live: {subs} subscribers, {rate:g} appends/s for {seconds:g} s "
                f"({appends} appends, each awaited)"
            )
            live: dict[str, Any] = {}
            for name in order:

                async def run_live(server: Server = servers[name]) -> dict[str, Any]:
                    return await fanout(
                        server, subs=subs, procs=procs, appends=appends, rate=rate, timeout=seconds + 60
                    )

                live[name] = await _section(LABELS[name], run_live)
                if live[name]:
                    print_fanout(LABELS[name], live[name], latency=True)
            live["vs"] = {}
            for anchor in args.anchors:
                if live.get("hub") and live.get(anchor):
                    r50 = live["hub"]["p50_ms"] / max(1e-9, live[anchor]["p50_ms"])
                    r99 = live["hub"]["p99_ms"] / max(1e-9, live[anchor]["p99_ms"])
                    live["vs"][anchor] = {"p50_ratio": r3(r50), "p99_ratio": r3(r99)}
                    say(f"   hub / {LABELS[anchor]}: p50 {r50:.2f}×, p99 {r99:.2f}×")
            out["live"] = live

        # 2. Bursts.
        out["burst"] = {}
        sizes = [args.burst_subscribers] + ([subs] if "burst-small" in args.sections else [])
        for bsubs in sizes if "burst" in args.sections else []:
            bappends = max(args.burst_appends, 100_000 // max(1, bsubs) if not args.quick else 0)
            say(
                f"2. burst: {bsubs:,} subscribers, {bappends:,} appends as fast as one writer can "
                f"(each awaited)"
            )
            burst: dict[str, Any] = {}
            for name in order:

                async def run_burst(
                    server: Server = servers[name], n: int = bsubs, k: int = bappends
                ) -> dict[str, Any]:
                    return await fanout(server, subs=n, procs=procs, appends=k, rate=None, timeout=180)

                burst[name] = await _section(LABELS[name], run_burst)
                if burst[name]:
                    print_fanout(LABELS[name], burst[name], latency=False)
            burst["vs"] = {}
            for anchor in args.anchors:
                if burst.get("hub") and burst.get(anchor):
                    ratio = burst["hub"]["delivered_per_s"] / max(1, burst[anchor]["delivered_per_s"])
                    burst["vs"][anchor] = {"fanout_ratio": r3(ratio)}
                    say(f"   hub / {LABELS[anchor]} delivered/s: {ratio:.2f}×")
            out["burst"][str(bsubs)] = burst
    finally:
        for server in servers.values():
            await server.stop()
    return out


def spread(values: Sequence[float]) -> dict[str, Any]:
    """Median, min and max of the runs' figures (runs that failed are left out)."""
    got = sorted(v for v in values if v == v)
    if not got:
        return {"median": None, "min": None, "max": None, "runs": []}
    return {"median": r3(statistics.median(got)), "min": r3(got[0]), "max": r3(got[-1]), "runs": list(values)}


#: The per-server figures whose median over the runs is reported, per section.
FIGURES = ("p50_ms", "p99_ms", "delivered_per_s", "server_cpu_us_per_delivery")


def _parts(run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A run's sections by name: ``live`` and ``burst@N``."""
    parts = {"live": run.get("live") or {}}
    parts.update({f"burst@{k}": v for k, v in (run.get("burst") or {}).items()})
    return parts


def summarize(runs: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """Per section: each server's figures as the median [min-max] of the runs, and each
    hub/anchor ratio as the median of the runs' ratios (a ratio is taken within one run,
    so both of its servers met the same machine)."""
    nan = float("nan")
    out: dict[str, Any] = {}
    for section in _parts(runs[0]) if runs else {}:
        got = [_parts(r).get(section) or {} for r in runs]
        figures: dict[str, Any] = {}
        for name in ["hub", *args.anchors]:
            figures[name] = {f: spread([(g.get(name) or {}).get(f, nan) for g in got]) for f in FIGURES}
            figures[name]["all_delivered"] = all((g.get(name) or {}).get("all_delivered", False) for g in got)
        keys = ("p50_ratio", "p99_ratio") if section == "live" else ("fanout_ratio",)
        figures["vs"] = {
            anchor: {k: spread([g.get("vs", {}).get(anchor, {}).get(k, nan) for g in got]) for k in keys}
            for anchor in args.anchors
        }
        out[section] = figures
    return out


def print_summary(summary: dict[str, Any], args: argparse.Namespace) -> None:
    say()
    say(f"== median of {args.runs} run(s) [min–max], the servers' order rotated each run")
    for section, figures in summary.items():
        say(f"   {section}")
        for name in ["hub", *args.anchors]:
            f = figures[name]
            if f["p50_ms"]["median"] is None:
                say(f"     {LABELS[name]:10} n/a")
                continue
            cpu = f["server_cpu_us_per_delivery"]
            say(
                f"     {LABELS[name]:10} p50 {f['p50_ms']['median']:.2f} ms, "
                f"p99 {f['p99_ms']['median']:.2f} ms, {f['delivered_per_s']['median']:,.0f} delivered/s, "
                f"server CPU {cpu['median']:.1f} µs/delivery [{cpu['min']:.1f}–{cpu['max']:.1f}]; "
                f"every event once in every run: {_yes(f['all_delivered'])}"
            )
        for anchor, ratios in figures["vs"].items():
            for key, s in ratios.items():
                if s["median"] is None:
                    continue
                bound, at_most = TARGETS[key]
                tail = ""
                if anchor == "baseline":
                    ok = s["median"] <= bound if at_most else s["median"] >= bound
                    tail = " " + verdict(ok, f"{'<=' if at_most else '>='} {bound:g}")
                each = ", ".join("n/a" if v != v else f"{v:.2f}" for v in s["runs"])
                say(
                    f"     hub / {LABELS[anchor]:10} {key.removesuffix('_ratio'):6} {s['median']:.2f}× "
                    f"[{s['min']:.2f}–{s['max']:.2f}]{tail}  runs: {each}"
                )


async def bench(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    servers: list[Server] = []
    runs: list[dict[str, Any]] = []
    if {"live", "burst"} & set(args.sections):
        for run in range(1, args.runs + 1):
            runs.append(await side_by_side(args, tmp, run))
        out["runs"] = runs
        out["summary"] = summarize(runs, args)
        print_summary(out["summary"], args)
    try:
        if "replay" in args.sections:
            hub = await Server.start_hub(tmp / "hub.db")
            servers.append(hub)
            # 3. Replay.
            reps = 1 if args.quick else 3
            say(f"3. replay: one client subscribes from 0 to a session of {args.replay:,} appended messages")

            async def run_replay() -> dict[str, Any]:
                return await replay(hub, args.replay, reps)

            rep = await _section("replay", run_replay)
            out["replay"] = rep
            if rep:
                say(
                    f"   built with append_all x {REPLAY_BATCH:,}: {rep['build_s']:.1f} s "
                    f"({rep['build_msgs_per_s']:,} msgs/s)"
                )
                for name, what in (("websockets", "websockets client"), ("lean", "lean raw-socket client")):
                    res = rep[name]
                    r0 = res["runs"][0]
                    say(
                        f"   {what:22} {r0['events']:,} events, median of {reps}: "
                        f"{res['median_events_per_s']:,} events/s "
                        f"[{res['min_events_per_s']:,}–{res['max_events_per_s']:,}] "
                        f"{verdict(res['median_events_per_s'] >= TARGET_REPLAY_PER_S, '>= 50,000')}"
                    )
                    say(
                        f"   {'':22} every event once, in order: {_yes(res['all_ok'])}; first run: "
                        f"hub CPU {r0['server_cpu_s']:.2f} s, client CPU {r0['client_cpu_s']:.2f} s "
                        f"in {r0['elapsed_s']:.2f} s"
                    )

            for server in servers:
                await server.stop()
            servers.clear()
        if "rss" in args.sections:
            # 4. RSS per idle subscriber, on fresh servers.
            say(
                f"4. RSS per idle subscriber: {args.idle:,} connections, one subscription each, fresh servers"
            )
            rss: dict[str, Any] = {}
            for name in ["hub", *args.anchors]:
                server = await (
                    Server.start_hub(tmp / "idle.db") if name == "hub" else Server.start_baseline(name)
                )
                servers.append(server)

                async def run_idle(server: Server = server) -> dict[str, Any]:
                    return await idle_rss(server, args.idle, args.procs)

                rss[name] = await _section(LABELS[name], run_idle)
                await server.stop()
                servers.remove(server)
                if rss[name]:
                    r = rss[name]
                    tail = (
                        verdict(r["kib_per_subscriber"] <= TARGET_RSS_KIB, "<= 30 KiB")
                        if name == "hub"
                        else ""
                    )
                    say(
                        f"   {LABELS[name]:10} {r['connected']:,} idle: RSS "
                        f"{r['rss_before_kib'] / 1024:.1f} → {r['rss_after_kib'] / 1024:.1f} MiB "
                        f"= {r['kib_per_subscriber']:.1f} KiB each {tail}"
                    )
                    say(
                        f"              subscribing: {r['subscribe_s']:.1f} s until all were subscribed and "
                        f"quiet, server CPU {r['subscribe_server_cpu_s']:.2f} s; "
                        f"{r['other_frames']:,} non-event frames (presence)"
                    )
            out["rss"] = rss
    finally:
        for server in servers:
            await server.stop()
    return out


def _median(summary: dict[str, Any], section: str, name: str, key: str, fmt: str) -> str:
    got = summary.get(section, {}).get(name, {}).get(key, {}).get("median")
    return "n/a" if got is None else format(got, fmt)


def _cell(d: dict[str, Any] | None, key: str, fmt: str) -> str:
    if not d or d.get(key) is None:
        return "n/a"
    return format(d[key], fmt)


def summary_rows(out: dict[str, Any], args: argparse.Namespace) -> list[list[str]]:
    """One row per figure: the figure, the hub, each anchor, the target (of the hub against
    the ``websockets`` anchor). Live and burst figures are medians of the runs."""
    names = ["hub", *args.anchors]
    summary = out.get("summary", {})
    big = f"burst@{args.burst_subscribers}"
    rows: list[list[str]] = []

    def add(label: str, section: str, key: str, fmt: str, target: str = "") -> None:
        rows.append([label, *(_median(summary, section, n, key, fmt) for n in names), target])

    add(
        f"live p50 @{args.subscribers} subs x {args.rate:g}/s, ms",
        "live",
        "p50_ms",
        ".2f",
        f"<= {TARGET_P50_RATIO:g}x websockets",
    )
    add("live p99, ms", "live", "p99_ms", ".2f", f"<= {TARGET_P99_RATIO:g}x websockets")
    add("live server CPU per delivery, µs", "live", "server_cpu_us_per_delivery", ".1f")
    for section in summary:
        if section.startswith("burst@"):
            n = int(section.removeprefix("burst@"))
            target = f">= {TARGET_BURST_RATIO:g}x websockets" if section == big else ""
            add(f"burst @{n:,} subs, delivered/s", section, "delivered_per_s", ",.0f", target)
            add(f"burst @{n:,} server CPU per delivery, µs", section, "server_cpu_us_per_delivery", ".1f")
    rows.append(
        [
            "every subscriber got every event once, every run",
            *(_yes(all(f.get(n, {}).get("all_delivered", False) for f in summary.values())) for n in names),
            "yes",
        ]
    )
    rep = out.get("replay") or {}
    for kind in ("websockets", "lean"):
        rows.append(
            [
                f"replay {args.replay:,} to one {kind} client, events/s",
                _cell(rep.get(kind), "median_events_per_s", ",d"),
                *("n/a" for _ in args.anchors),
                ">= 50,000",
            ]
        )
    rss = out.get("rss", {})
    rows.append(
        [
            "RSS per idle subscriber, KiB",
            *(_cell(rss.get(n), "kib_per_subscriber", ".1f") for n in names),
            "<= 30",
        ]
    )
    return rows


def print_table(rows: list[list[str]], args: argparse.Namespace) -> None:
    head = ["figure", *(LABELS[n] for n in ["hub", *args.anchors]), "target"]
    last = len(head) - 1
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    say()
    say("== summary")
    for row in [head, ["-" * w for w in widths], *rows]:
        say(
            "  ".join(c.ljust(widths[i]) if i in (0, last) else c.rjust(widths[i]) for i, c in enumerate(row))
        )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--subscribers", type=int, default=None, help="live subscribers (default 100)")
    p.add_argument("--rate", type=float, default=None, help="live appends per second (default 100)")
    p.add_argument("--seconds", type=float, default=None, help="live duration in seconds (default 10)")
    p.add_argument("--procs", type=int, default=None, help="subscriber processes (default 4)")
    p.add_argument("--burst-subscribers", type=int, default=None, help="burst subscribers (default 1000)")
    p.add_argument(
        "--burst-appends",
        type=int,
        default=None,
        help="appends per burst (default 200; at least 100,000 / subscribers)",
    )
    p.add_argument("--replay", type=int, default=None, help="events in the replayed session (default 50000)")
    p.add_argument(
        "--idle", type=int, default=None, help="idle subscribers for the RSS figure (default 1000)"
    )
    p.add_argument(
        "--runs",
        type=int,
        default=None,
        help="side-by-side runs of live and burst, each on a fresh process pair; the ratios "
        "are reported as their median [min-max] (default 5; 1 with --quick)",
    )
    p.add_argument(
        "--sections",
        default=",".join(SECTIONS),
        help=f"comma-separated, of {', '.join(SECTIONS)} (default all)",
    )
    p.add_argument(
        "--profile-hub",
        metavar="FILE",
        default=None,
        help="run the hub under cProfile, stats to FILE (the last run's; slows the hub down)",
    )
    p.add_argument(
        "--anchors",
        default=",".join(ANCHORS),
        help="comma-separated bare servers to run beside the hub, of baseline (websockets) and "
        "picows (default both)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON line at the end")
    p.add_argument("--quick", action="store_true", help="a small fast run, for smoke testing")
    # Worker modes (this script runs itself as subscriber processes and as the baseline).
    p.add_argument("--worker", choices=["sub", *ANCHORS], help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    p.add_argument("--session", help=argparse.SUPPRESS)
    p.add_argument("--conns", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--expect", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--timeout", type=float, default=600.0, help=argparse.SUPPRESS)
    p.add_argument("--hold", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    quick = args.quick
    defaults = {
        "subscribers": 20 if quick else 100,
        "rate": 50.0 if quick else 100.0,
        "seconds": 2.0 if quick else 10.0,
        "procs": 2 if quick else 4,
        "burst_subscribers": 100 if quick else 1000,
        "burst_appends": 50 if quick else 200,
        "replay": 5_000 if quick else 50_000,
        "idle": 100 if quick else 1000,
        "runs": 1 if quick else 5,
    }
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.worker is None and (
        min(args.subscribers, args.procs, args.burst_subscribers, args.burst_appends, args.replay, args.idle)
        < 1
        or args.rate <= 0
        or args.seconds <= 0
        or args.runs < 1
    ):
        p.error("counts, --runs, --rate and --seconds must be positive")
    sections = [x.strip() for x in args.sections.split(",") if x.strip()]
    unknown = [x for x in sections if x not in SECTIONS]
    if unknown or not sections:
        p.error(
            f"--sections: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(SECTIONS)}"
        )
    args.sections = sections
    anchors = [x.strip() for x in args.anchors.split(",") if x.strip()]
    if any(x not in ANCHORS for x in anchors) or len(set(anchors)) != len(anchors):
        p.error(f"--anchors: choose from {', '.join(ANCHORS)}, each once")
    args.anchors = anchors
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker == "sub":
        return asyncio.run(subscriber_worker(args))
    if args.worker == "baseline":
        return asyncio.run(anchors.websockets_server(args.port))
    if args.worker == "picows":
        return asyncio.run(anchors.picows_server(args.port))
    raise_nofile()  # the hub and the baseline inherit it
    started = perf()
    machine = machine_info()
    result: dict[str, Any] = {
        "bench": "sessionhub-hub",
        "machine": machine,
        "params": {
            k: getattr(args, k)
            for k in (
                "subscribers",
                "rate",
                "seconds",
                "procs",
                "burst_subscribers",
                "burst_appends",
                "replay",
                "idle",
                "quick",
                "runs",
                "sections",
                "anchors",
            )
        },
    }
    say(
        f"machine: {machine['nproc']} CPU ({machine['cpu']}), {machine['mem_gib']} GiB, "
        f"Python {machine['python']}, SQLite {machine['sqlite']}, websockets "
        f"{machine['packages']['websockets']}, picows {machine['packages']['picows']} (aiofastnet "
        f"{machine['packages']['aiofastnet']}), uvicorn {machine['packages']['uvicorn']}; "
        f"repository at {machine['commit']}; "
        f"load average {machine['loadavg_start']}"
    )
    tmp = Path(tempfile.mkdtemp(prefix="sessionhub-bench-hub-"))
    try:
        result.update(asyncio.run(bench(args, tmp)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print_table(summary_rows(result, args), args)
    result["machine"]["loadavg_end"] = loadavg()
    result["wall_s"] = r3(perf() - started)
    say(
        f"\nload average at the end {result['machine']['loadavg_end']}; "
        f"total wall time {result['wall_s']:.1f} s"
    )
    if args.json:
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
