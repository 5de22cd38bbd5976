"""``serve --workers N``: N hub processes on one port, each a node of the multi-node design.

One Python process serves one core and, here, at most its file-descriptor limit of
connections. ``--workers N`` starts N processes that each bind the same address with
``SO_REUSEPORT``, so the kernel spreads new connections over them (by a hash of the
connection, evenly, with no accept lock), and each runs the whole hub: its own
connections, tails and limits. They share the state the way several machines do
(docs/nodes.md): a Postgres store and a Postgres or Redis bus. On SQLite or the memory bus
the processes would not see each other's writes, so that is refused in one line.

The parent only supervises: it keeps the port bound (so ``--port 0`` picks one port for
all), forwards SIGINT/SIGTERM as SIGTERM (each worker drains: 1001 to its clients), and
when one worker exits on its own it stops the others and exits with 3.
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import sys
from collections.abc import Callable
from typing import Any

from .options import positive

__all__ = ["add_options", "become_worker", "reuse_port_socket", "run_workers", "workers_problem"]


def add_options(serve: argparse.ArgumentParser) -> None:
    serve.add_argument(
        "--workers",
        type=positive,
        default=1,
        help="hub processes on one port (SO_REUSEPORT), each a node: needs a Postgres --db and a "
        "Postgres or Redis --bus (default: 1)",
    )


def workers_problem(args: argparse.Namespace, db: object, bus: object) -> str | None:
    """Why ``--workers`` cannot run with this store and bus (the bus already made)."""
    if args.workers == 1:
        return None
    from hub.bus import RemoteBus

    from .backends import is_postgres

    if not is_postgres(str(db)):
        return (
            f"--workers {args.workers} needs a Postgres --db: on SQLite each process would serve "
            "alone (see docs/nodes.md)"
        )
    if not isinstance(bus, RemoteBus):
        return (
            f"--workers {args.workers} needs a bus that crosses processes (--bus postgres or "
            "redis://...): the memory bus rings one process only"
        )
    if not hasattr(socket, "SO_REUSEPORT"):
        return f"--workers {args.workers} needs SO_REUSEPORT, which this platform lacks"
    return None


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` with ``SO_REUSEPORT`` (not listening yet)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def become_worker() -> None:
    """In a worker: leave the terminal's process group (the parent forwards Ctrl-C once,
    as SIGTERM, rather than each worker getting it twice) and die with the parent."""
    os.setpgrp()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: a killed parent leaves no worker
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:  # the parent died before prctl took
        sys.exit(0)


def run_workers(args: argparse.Namespace, target: Callable[[argparse.Namespace], Any]) -> int:
    """Start ``args.workers`` processes running ``target(args)`` on one port; supervise them."""
    try:
        held = reuse_port_socket(args.host, args.port)
    except OSError as exc:
        print(f"sessionhub: cannot bind {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    one = copy.copy(args)
    one.port = held.getsockname()[1]
    context = multiprocessing.get_context("spawn")
    workers = [
        context.Process(target=target, args=(one,), name=f"sessionhub-worker-{i}")
        for i in range(args.workers)
    ]
    stopping = False

    def stop(_sig: int = signal.SIGTERM, _frame: object = None) -> None:
        nonlocal stopping
        stopping = True
        for worker in workers:
            if worker.pid is not None and worker.exitcode is None:
                os.kill(worker.pid, signal.SIGTERM)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        for worker in workers:
            worker.start()
        pids = ", ".join(str(w.pid) for w in workers)
        print(
            f"sessionhub: {args.workers} workers on http://{args.host}:{one.port} (pids {pids})",
            file=sys.stderr,
            flush=True,
        )
        failed = 0
        while any(w.exitcode is None for w in workers):
            alive = [w.sentinel for w in workers if w.exitcode is None]
            multiprocessing.connection.wait(alive, timeout=1.0)
            for worker in workers:
                if worker.exitcode is not None and not stopping:
                    print(
                        f"sessionhub: worker {worker.pid} exited with {worker.exitcode}: stopping the others",
                        file=sys.stderr,
                    )
                    failed = 3
                    stop()
        for worker in workers:
            worker.join()
        return failed
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        held.close()
