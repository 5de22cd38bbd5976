"""CPU instructions per server request and per fan-out delivery, counted by valgrind.

Prints figures, asserts nothing. Run from the repository root:

    .venv/bin/python bench/bench_server_instructions.py [--n 1000] [--offers 100] [--tree PATH] [--json]

``bench/bench_instructions.py`` counts the engine's operations; this counts the server's own
path, where a change to the connection's state machine or its shell would show: a real
``Hub`` over a SQLite file, 100 real ``Connection`` shells (auth on, each with a token) over
a stand-in socket whose ASGI send only counts, and

- ``ping``: ``--n`` request frames read by ``receive`` (decoded, judged by the state
  machine, run, answered, drained), on one connection;
- ``offer``: ``--offers`` event frames offered to each of the 100 connections (the tail's
  live fan-out: queue, eager drain, send).

Each runs in a process under ``valgrind --tool=callgrind`` twice, with the work and without
(set-up only), and ``PYTHONHASHSEED=0``; the difference divided by the count is the cost of
one. The same tree, inputs and environment give the same count whatever else the machine
does. ``--tree`` measures another checkout of this layout (``hub.server.socket_shell``) in
the same run, for a before and after. Needs valgrind.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import asyncio, sys, tempfile
from pathlib import Path
what, n = sys.argv[1], int(sys.argv[2])
from hub.auth import issue_token
from hub.manager import SessionManager
from hub.server.asgiscope import RAW_SEND
from hub.server.config import HubConfig
from hub.server.hub import Hub
from hub.server.ops import receive
from hub.server.socket_shell import Connection
from hub.store.sqlite import SqliteStore

SECRET = "a secret of thirty-two bytes or more, for HS256"


class Socket:
    def __init__(self):
        self.sent = 0

        async def raw(message):
            self.sent += 1

        self.scope = {RAW_SEND: raw}


async def main():
    with tempfile.TemporaryDirectory() as tmp:
        store = await SqliteStore.open(Path(tmp) / "h.db")
        hub = Hub(store, SessionManager(store), HubConfig(auth_secret=SECRET))
        token = issue_token(SECRET, {"*": "admin"}, ttl=3600)
        conns = []
        for _ in range(100):
            c = Connection(hub, Socket())
            c.open(token)
            conns.append(c)
        frames = [f'{{"op":"ping","id":{i}}}' for i in range(n)]
        event = ('{"frame":"event","stream":"session","session_id":"s","seq":1,"epoch":"e",'
                 '"type":"x","data":{},"created_at":"t"}')
        for _ in range(3):
            await asyncio.sleep(0)
        if what == "ping":
            for text in frames:
                receive(hub.ops, conns[0], text)
                await asyncio.sleep(0)
                await asyncio.sleep(0)
            assert conns[0].websocket.sent == n, conns[0].websocket.sent
        elif what == "offer":
            for _ in range(n):
                for c in conns:
                    c.offer(event)
            assert sum(c.websocket.sent for c in conns) == 100 * n
        for c in conns:
            if c.expiry is not None:
                c.expiry.cancel()
        await hub.retention.close()
        await hub.store_watch.close()
        await hub.turns.close()
        await hub.tails.close()
        await store.close()


asyncio.run(main())
"""


def count(tree: Path, what: str, n: int) -> int:
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            "-c",
            CHILD,
            what,
            str(n),
        ],
        cwd="/tmp",
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    found = re.search(r"Collected : (\d+)", out.stderr)
    if found is None:
        raise RuntimeError(out.stderr[-2000:])
    return int(found.group(1))


def measure(tree: Path, n: int, offers: int) -> dict[str, float]:
    base = count(tree, "nothing", 0)
    return {
        "ping": (count(tree, "ping", n) - base) / n,
        "offer": (count(tree, "offer", offers) - base) / (100 * offers),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=1000, help="ping requests")
    parser.add_argument("--offers", type=int, default=100, help="events offered to each of 100 connections")
    parser.add_argument("--tree", type=Path, help="another checkout to measure beside this one")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("needs valgrind (apt-get install -y valgrind)")
    trees = {"this": ROOT} | ({"tree": args.tree.resolve()} if args.tree else {})
    results = {name: measure(tree, args.n, args.offers) for name, tree in trees.items()}
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print("instructions per operation (callgrind, PYTHONHASHSEED=0)")
    for name, figures in results.items():
        ping, offer = figures["ping"], figures["offer"]
        print(f"  {name:5} request dispatch (ping) {ping:>10,.0f}   fan-out delivery {offer:>8,.0f}")


if __name__ == "__main__":
    main()
