"""Real faults for the fault matrix: a Postgres cluster of the test's own, and a TCP proxy.

``ScratchPostgres`` is a cluster made with the installed ``initdb`` and run with ``pg_ctl``
on a free port, so a test can stop, restart or SIGKILL the database under load without
touching the machine's own service. ``TcpProxy`` sits between a process and a server (or
between clients and several hub nodes, as a round-robin balancer) and can hold bytes with
the connections open (a partition as a node sees it: nothing arrives, nothing fails), cut
every connection, or refuse new ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import shutil
import signal
import socket
import struct
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

from tests.support.nodes import free_port
from tests.support.services import unavailable

__all__ = ["ScratchPostgres", "ScratchRedis", "TcpProxy", "scratch_postgres", "scratch_redis"]


def _pg_bin(name: str) -> str:
    found = shutil.which(name) or next(
        iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))[-1:]), None
    )
    if found is None:
        unavailable(f"needs Postgres' {name} (apt-get install -y postgresql)")
    assert found is not None
    return found


class ScratchPostgres:
    """A throwaway Postgres cluster on 127.0.0.1 with trust auth for user ``postgres``.

    As root, the cluster runs as the ``postgres`` system user (Postgres refuses root).
    ``fsync=off`` keeps it fast: the faults here kill processes, never the machine.
    """

    def __init__(self, root: Path, port: int | None = None, settings: dict[str, str] | None = None) -> None:
        self.root = root
        self.data = root / "data"
        self.port = port or free_port()
        self.settings = {
            "fsync": "off",
            "synchronous_commit": "off",
            "max_connections": "200",
            **(settings or {}),
        }
        self._as_postgres = os.geteuid() == 0

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _cmd(self, *args: str) -> list[str]:
        return ["runuser", "-u", "postgres", "--", *args] if self._as_postgres else list(args)

    async def _run(self, *args: str, check: bool = True) -> int:
        proc = await asyncio.create_subprocess_exec(
            *self._cmd(*args), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        out, _ = await proc.communicate()
        if check and proc.returncode != 0:
            raise RuntimeError(f"{args[0]} failed ({proc.returncode}):\n{out.decode(errors='replace')}")
        return proc.returncode or 0

    async def init(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if self._as_postgres:
            shutil.chown(self.root, "postgres", "postgres")
        await self._run(_pg_bin("initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")

    async def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 " + " ".join(
            f"-c {key}={value}" for key, value in self.settings.items()
        )
        await self._run(
            _pg_bin("pg_ctl"),
            "-D",
            str(self.data),
            "-o",
            options,
            "-l",
            str(self.root / "log"),
            "-w",
            "start",
        )

    async def stop(self, mode: str = "fast") -> None:
        """``mode`` is pg_ctl's: ``smart``, ``fast`` (disconnect clients) or ``immediate``."""
        await self._run(_pg_bin("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop", check=False)

    async def restart(self, mode: str = "fast") -> None:
        await self.stop(mode)
        await self.start()

    async def kill(self) -> None:
        """SIGKILL the postmaster and its backends, as a crash does, and wait until they are gone
        (a backend left running would keep the shared memory and refuse the next start)."""
        try:
            postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        except (FileNotFoundError, ValueError, IndexError):
            return
        pids = [postmaster, *_children(postmaster)]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for _ in range(200):
            if not any(_alive(pid) for pid in pids):
                return
            await asyncio.sleep(0.05)

    @property
    def server_log(self) -> str:
        try:
            return (self.root / "log").read_text(errors="replace")
        except FileNotFoundError:
            return ""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _children(parent: int) -> list[int]:
    found = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = Path(stat).read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == parent:
                found.append(int(stat.split("/")[2]))
    return found


@contextlib.asynccontextmanager
async def scratch_postgres(settings: dict[str, str] | None = None) -> AsyncIterator[ScratchPostgres]:
    """A started ``ScratchPostgres`` in a temporary folder, stopped and removed at the end."""
    root = Path(tempfile.mkdtemp(prefix="sessionhub-pg-"))
    os.chmod(root, 0o755)
    cluster = ScratchPostgres(root / "cluster", settings=settings)
    try:
        await cluster.init()
        await cluster.start()
        yield cluster
    finally:
        await cluster.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)


class TcpProxy:
    """A TCP proxy on 127.0.0.1 in front of one upstream, or several (round robin, skipping
    the ones that refuse: a balancer).

    - ``hold()``: stop moving bytes both ways; connections stay open and nothing fails (what
      a partitioned peer sees). New connections are accepted and held too. ``release()``.
    - ``cut()``: reset every open connection (RST, as a dropped route or a killed peer).
    - ``refuse(True)``: close new connections at once.
    """

    def __init__(self, *upstreams: tuple[str, int]) -> None:
        assert upstreams
        self.upstreams = list(upstreams)
        self.port = 0
        self.accepted = 0
        self._next = 0
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._refusing = False
        self._server: asyncio.Server | None = None
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    async def start(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port or 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self.cut()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def __aenter__(self) -> TcpProxy:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def hold(self) -> None:
        self._flowing.clear()

    def release(self) -> None:
        self._flowing.set()

    def refuse(self, refusing: bool = True) -> None:
        self._refusing = refusing

    def cut(self) -> None:
        for client, upstream in list(self._pairs):
            for writer in (client, upstream):
                _reset(writer)
        self._pairs.clear()

    @property
    def open_connections(self) -> int:
        return len(self._pairs)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self._refusing:
            _reset(writer)
            return
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        for _ in range(len(self.upstreams)):
            host, port = self.upstreams[self._next % len(self.upstreams)]
            self._next += 1
            try:
                upstream = await asyncio.open_connection(host, port)
                break
            except OSError:
                continue
        if upstream is None:
            _reset(writer)
            return
        up_reader, up_writer = upstream
        pair = (writer, up_writer)
        self._pairs.add(pair)
        forward = asyncio.ensure_future(self._pump(reader, up_writer))
        backward = asyncio.ensure_future(self._pump(up_reader, writer))
        for task in (forward, backward):
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        try:
            await asyncio.wait({forward, backward}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._pairs.discard(pair)
            for task in (forward, backward):
                task.cancel()
            for w in (writer, up_writer):
                w.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while True:
                await self._flowing.wait()
                data = await reader.read(65536)
                if not data:
                    return
                # A hold that began while this read waited keeps the bytes here.
                await self._flowing.wait()
                writer.write(data)
                await writer.drain()


def _reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.close()


# -- a Redis of the test's own ----------------------------------------------------------------


class ScratchRedis:
    """A ``redis-server`` on a free port with no persistence, which a test can SIGKILL and
    start again on the same port (the machine's own Redis is never touched)."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.proc: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self, timeout: float = 10.0) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            unavailable("needs redis-server (apt-get install -y redis-server)")
        assert binary is not None
        self.proc = await asyncio.create_subprocess_exec(
            binary,
            *("--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"),
            *("--daemonize", "no", "--logfile", ""),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        async with asyncio.timeout(timeout):
            while not await self._answers():
                if self.proc.returncode is not None:
                    raise RuntimeError(f"redis-server exited with {self.proc.returncode}")
                await asyncio.sleep(0.02)

    async def _answers(self) -> bool:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        except OSError:
            return False
        try:
            writer.write(b"PING\r\n")
            return await reader.readline() == b"+PONG\r\n"
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def kill(self) -> None:
        """SIGKILL, as a crash does; every client's connection drops."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.returncode is None:
            proc.kill()
            await proc.wait()


@contextlib.asynccontextmanager
async def scratch_redis() -> AsyncIterator[ScratchRedis]:
    server = ScratchRedis()
    try:
        await server.start()
        yield server
    finally:
        await server.kill()
