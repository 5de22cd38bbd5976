"""Memory of a ``sessionhub serve`` process under peers that read slowly or not at all.

Prints figures, never asserts. Run from the repository root:

    .venv/bin/python bench/bench_memory.py [--repo PATH] [--quick] [--json]

``--repo`` serves the hub from another checkout (to compare with the code before a
change); the clients always run from here. Each scenario starts a fresh hub on a fresh
SQLite file, samples its VmRSS every 20 ms, and reports the peak above the RSS it had
once started (MiB), with what the peers saw:

1. follow: one subscriber, reading, follows a session while a writer appends
   512 KiB messages (the tail cache is what grows).
2. replay: a session of 512 KiB messages is written first; one subscriber replays it
   from seq 0, reading one frame per 10 ms (the replay and the outbox are what grow).
3. stalled: one connection that never reads, with 4 subscriptions, while a writer
   appends 256 KiB messages to the 4 sessions; then the connection reads: what close
   code it sees (4008, or 1006 for a TCP connection that died without a close frame).
4. ping flood: one connection sends pings without reading a reply, for a fixed time;
   meanwhile another client pings every 20 ms: its round trips (p50, max), and how many
   pings the flood got into the hub's socket.
5. http bodies: one 128 MiB ``POST /api/chat`` without a token, then six 64 MiB ones at
   once, each body really sent until its answer comes: the answers, and how much of each
   body was sent by then.
6. sse stalled: a poster and 40 resumers of an 8 MiB chat reply (64 KiB deltas from a
   ``HubClient`` responder), none reading: how many are still connected 15 s after the
   reply ended (a reader the hub dropped has its connection cut).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

REPO = Path(__file__).resolve().parent.parent
KiB = 1 << 10
MiB = 1 << 20


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Hub:
    def __init__(self, proc: asyncio.subprocess.Process, port: int) -> None:
        self.proc = proc
        self.url = f"ws://127.0.0.1:{port}/ws"
        self.port = port
        self.peak = 0
        self.base = 0
        self._sampler: asyncio.Task[None] | None = None

    async def _sample(self) -> None:
        while True:
            with contextlib.suppress(OSError, RuntimeError):
                self.peak = max(self.peak, rss_kib(self.proc.pid))
            await asyncio.sleep(0.02)

    def start_sampling(self) -> None:
        self.base = rss_kib(self.proc.pid)
        self.peak = self.base
        self._sampler = asyncio.get_running_loop().create_task(self._sample())

    def peak_mib(self) -> float:
        return round((self.peak - self.base) / 1024, 1)

    async def stop(self) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
        if self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), 20)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


@contextlib.asynccontextmanager
async def hub(repo: Path, tmp: Path, extra: list[str]) -> AsyncIterator[Hub]:
    port = free_port()
    db = tmp / f"hub-{port}.db"
    proc = await asyncio.create_subprocess_exec(
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
        cwd=repo,
        env={**os.environ, "PYTHONPATH": str(repo)},
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    h = Hub(proc, port)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                async with connect(h.url, proxy=None) as ws:
                    await call(ws, "ping")
                break
            except OSError:
                if time.monotonic() > deadline or proc.returncode is not None:
                    raise RuntimeError("the hub did not start") from None
                await asyncio.sleep(0.1)
        yield h
    finally:
        await h.stop()


_ids = iter(range(1, 1 << 62))


async def call(ws: ClientConnection, op: str, **fields: Any) -> Any:
    rid = next(_ids)
    await ws.send(json.dumps({"op": op, "id": rid, **fields}))
    while True:
        frame = json.loads(await ws.recv())
        if frame.get("id") == rid:
            if frame["frame"] == "error":
                raise RuntimeError(frame)
            return frame["result"]


def message(i: int, body: str) -> dict[str, Any]:
    return {"id": f"m{i}", "role": "user", "parts": [{"type": "text", "text": body}]}


def body_of(size: int) -> str:
    return random.Random(size).randbytes(size // 2).hex()


async def stalled(h: Hub) -> ClientConnection:
    """A peer that reads nothing (small receive buffer: the kernel absorbs little)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * KiB)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", h.port))
    return await connect(h.url, sock=sock, proxy=None, compression=None, max_queue=1, max_size=None)


async def read_close(ws: ClientConnection, timeout: float = 30) -> tuple[int, int]:
    frames = 0
    with contextlib.suppress(ConnectionClosed, TimeoutError):
        async with asyncio.timeout(timeout):
            async for _ in ws:
                frames += 1
    rcvd = ws.protocol.close_rcvd
    return frames, rcvd.code if rcvd is not None else 1006


async def follow(repo: Path, tmp: Path, n: int) -> dict[str, Any]:
    body = body_of(512 * KiB)
    async with (
        hub(repo, tmp, []) as h,
        connect(h.url, proxy=None, max_size=None) as writer,
        connect(h.url, proxy=None, max_size=None, compression=None) as reader,
    ):
        sid = (await call(writer, "create", name="follow"))["id"]
        await call(reader, "subscribe", session_id=sid, after_seq=0)
        h.start_sampling()
        got = 0

        async def read() -> None:
            nonlocal got
            async for raw in reader:
                if json.loads(raw).get("frame") == "event":
                    got += 1
                    if got >= n + 1:
                        return

        task = asyncio.create_task(read())
        for i in range(n):
            await call(writer, "append", session_id=sid, message=message(i, body))
        async with asyncio.timeout(60):
            await task
        await asyncio.sleep(0.5)
        return {"messages": n, "size_kib": 512, "peak_rss_mib": h.peak_mib()}


async def replay(repo: Path, tmp: Path, n: int) -> dict[str, Any]:
    body = body_of(512 * KiB)
    async with hub(repo, tmp, []) as h, connect(h.url, proxy=None, max_size=None) as writer:
        sid = (await call(writer, "create", name="replay"))["id"]
        for i in range(n):
            await call(writer, "append", session_id=sid, message=message(i, body))
        async with connect(h.url, proxy=None, max_size=None, compression=None, max_queue=1) as slow:
            h.start_sampling()
            await call(slow, "subscribe", session_id=sid, after_seq=0)
            got = 0
            started = time.monotonic()
            with contextlib.suppress(ConnectionClosed):
                while got < n and time.monotonic() - started < 8:
                    await slow.recv()
                    got += 1
                    await asyncio.sleep(0.01)
            return {"messages": n, "size_kib": 512, "read": got, "peak_rss_mib": h.peak_mib()}


async def stall(repo: Path, tmp: Path, n: int) -> dict[str, Any]:
    body = body_of(256 * KiB)
    async with hub(repo, tmp, []) as h, connect(h.url, proxy=None, max_size=None) as writer:
        sids = [(await call(writer, "create", name=f"s{i}"))["id"] for i in range(4)]
        slow = await stalled(h)
        for sid in sids:
            await call(slow, "subscribe", session_id=sid, after_seq=0)
        h.start_sampling()
        started = time.monotonic()

        async def write() -> float:
            for i in range(n):
                for sid in sids:
                    await call(writer, "append", session_id=sid, message=message(i, body))
            return time.monotonic() - started

        appends = asyncio.create_task(write())
        evicted_after = await evicted(h, 60)
        await asyncio.sleep(1.0)  # the peer comes back to read 1 s after its eviction
        frames, code = await read_close(slow)
        elapsed = await appends
        return {
            "subscriptions": 4,
            "messages": 4 * n,
            "size_kib": 256,
            "append_s": round(elapsed, 1),
            "evicted_after_s": evicted_after,
            "frames_read_after": frames,
            "close_code": code,
            "peak_rss_mib": h.peak_mib(),
        }


async def evicted(h: Hub, timeout: float) -> float | None:
    """Seconds until /metrics counts an eviction (None: none within ``timeout``)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        reader, writer = await asyncio.open_connection("127.0.0.1", h.port)
        writer.write(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        text = (await reader.read()).decode()
        writer.close()
        for line in text.splitlines():
            if line.startswith("sessionhub_evictions_total ") and float(line.split()[1]) >= 1:
                return round(time.monotonic() - started, 1)
        await asyncio.sleep(0.2)
    return None


async def flood_worker(port: int, seconds: float) -> None:
    """In its own process, so that its send loop does not starve the measuring client."""
    h = Hub(None, port)  # type: ignore[arg-type]
    ws = await stalled(h)
    frame = json.dumps({"op": "ping", "id": 1})
    sent = 0
    started = time.monotonic()
    with contextlib.suppress(ConnectionClosed, TimeoutError):
        async with asyncio.timeout(seconds):
            while True:
                await ws.send(frame)
                sent += 1
    _, code = await read_close(ws, timeout=15)
    print(json.dumps({"sent": sent, "close_code": code, "send_s": round(time.monotonic() - started, 1)}))


async def flood(repo: Path, tmp: Path, seconds: float) -> dict[str, Any]:
    async with hub(repo, tmp, []) as h, connect(h.url, proxy=None) as other:
        h.start_sampling()
        worker = await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            "--flood-worker",
            str(h.port),
            str(seconds),
            stdout=asyncio.subprocess.PIPE,
        )
        await asyncio.sleep(0.5)
        times: list[float] = []
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            t = time.perf_counter()
            try:
                async with asyncio.timeout(30):
                    await call(other, "ping")
            except TimeoutError:
                times.append(30.0)
                break
            times.append(time.perf_counter() - t)
            await asyncio.sleep(0.02)
        out, _ = await worker.communicate()
        report = json.loads(out)
        return {
            "seconds": seconds,
            "pings_sent": report["sent"],
            "other_pings": len(times),
            "other_ping_p50_ms": round(statistics.median(times) * 1000, 2),
            "other_ping_max_ms": round(max(times) * 1000, 1),
            "close_code": report["close_code"],
            "peak_rss_mib": h.peak_mib(),
        }


def _http_head(method: str, path: str, port: int, headers: dict[str, str]) -> bytes:
    lines = [
        f"{method} {path} HTTP/1.1",
        f"host: 127.0.0.1:{port}",
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def _post_until_answered(port: int, total: int) -> tuple[int, int]:
    """POST ``total`` bytes without a token, sending until the status line comes back:
    (status, bytes sent by then)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = {"content-type": "application/json", "content-length": str(total)}
    answer = asyncio.ensure_future(reader.readline())
    sent = 0
    try:
        writer.write(_http_head("POST", "/api/chat", port, head))
        piece = b" " * (64 * KiB)
        with contextlib.suppress(ConnectionError):
            while sent < total and not answer.done():
                writer.write(piece)
                sent += len(piece)
                await writer.drain()
        status = await asyncio.wait_for(answer, 60)
        return int(status.split()[1]), sent
    finally:
        answer.cancel()
        writer.close()


async def http_bodies(repo: Path, tmp: Path) -> dict[str, Any]:
    async with hub(repo, tmp, ["--auth-secret", "bench-secret-of-at-least-32-bytes-long!"]) as h:
        h.start_sampling()
        one = await _post_until_answered(h.port, 128 * MiB)
        six = await asyncio.gather(*(_post_until_answered(h.port, 64 * MiB) for _ in range(6)))
        await asyncio.sleep(0.2)
        return {
            "answers": [one[0], *(s for s, _ in six)],
            "mib_sent_before_answer": [one[1] // MiB, *(n // MiB for _, n in six)],
            "peak_rss_mib": h.peak_mib(),
        }


async def _sse_unread(port: int, path: str, body: bytes = b"") -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * KiB)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, ("127.0.0.1", port))
    method = "POST" if body else "GET"
    head = {"content-type": "application/json", "content-length": str(len(body))}
    await loop.sock_sendall(sock, _http_head(method, path, port, head) + body)
    return sock


async def _cut(sock: socket.socket, timeout: float) -> bool:
    """Whether the hub ended the connection: reading what is buffered reaches its end."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout):
            while await loop.sock_recv(sock, 1 << 20):
                pass
    except TimeoutError:
        return False
    except ConnectionError:
        return True
    return True


async def sse_stalled(repo: Path, tmp: Path, resumers: int) -> dict[str, Any]:
    from clients import HubClient

    size = 8 * MiB
    async with hub(repo, tmp, []) as h, HubClient(h.url, name="bench", role="worker") as worker:
        ended = asyncio.Event()

        async def answer() -> None:
            async for turn in worker.turns():
                async with turn.reply() as st:
                    await asyncio.sleep(0.5)  # the resumers join meanwhile
                    for _ in range(size // (64 * KiB)):
                        await st.text("x" * (64 * KiB))
                ended.set()
                return

        responder = asyncio.create_task(answer())
        await asyncio.sleep(0.3)
        h.start_sampling()
        chat = {"id": "bench-sse", "messages": [message(1, "hello")]}
        poster = await _sse_unread(h.port, "/api/chat", json.dumps(chat).encode())
        await asyncio.sleep(0.2)
        readers = [poster] + [
            await _sse_unread(h.port, "/api/chat/bench-sse/stream") for _ in range(resumers)
        ]
        await asyncio.wait_for(ended.wait(), 120)
        await responder
        await asyncio.sleep(15)
        cut = [await _cut(sock, 2) for sock in readers]
        for sock in readers:
            sock.close()
        return {
            "readers": len(readers),
            "still_connected_15s_after": cut.count(False),
            "peak_rss_mib": h.peak_mib(),
        }


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repo", type=Path, default=REPO, help="checkout to serve the hub from")
    parser.add_argument("--quick", action="store_true", help="smaller runs")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--only", action="append", help="run only this scenario (repeatable)")
    parser.add_argument("--flood-worker", nargs=2, metavar=("PORT", "SECONDS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.flood_worker:
        await flood_worker(int(args.flood_worker[0]), float(args.flood_worker[1]))
        return
    scale = 4 if args.quick else 1
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        scenarios: dict[str, Callable[[], Awaitable[dict[str, Any]]]] = {
            "follow": lambda: follow(args.repo, Path(tmp), 400 // scale),
            "replay": lambda: replay(args.repo, Path(tmp), 400 // scale),
            "stalled": lambda: stall(args.repo, Path(tmp), 200 // scale),
            "ping_flood": lambda: flood(args.repo, Path(tmp), 20 / scale),
            "http_bodies": lambda: http_bodies(args.repo, Path(tmp)),
            "sse_stalled": lambda: sse_stalled(args.repo, Path(tmp), 40 // scale),
        }
        for name, run in scenarios.items():
            if args.only and name not in args.only:
                continue
            results[name] = await run()
            if not args.json:
                print(name, results[name], flush=True)
    if args.json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
