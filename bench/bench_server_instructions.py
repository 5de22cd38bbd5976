"""CPU instructions per server request and per fan-out delivery, counted by valgrind.

Prints figures, asserts nothing. Run from the repository root:

    .venv/bin/python bench/bench_server_instructions.py [--n 1000] [--offers 100] [--connects 300]
                                                        [--what ping,offer,connect] [--tree PATH] [--json]

``bench/bench_instructions.py`` counts the engine's operations; this counts the server's own
path, where a change to the connection's state machine or its shell would show: a real
``Hub`` over a SQLite file, 100 real ``Connection`` shells (auth on, each with a token) over
a stand-in socket whose ASGI send only counts, and

- ``ping``: ``--n`` request frames read by ``receive`` (decoded, judged by the state
  machine, run, answered, drained), on one connection;
- ``offer``: ``--offers`` event frames offered to each of the 100 connections (the tail's
  live fan-out: queue, eager drain, send);
- ``connect``: ``--connects`` new connections, each opened with the same token (as a
  deployment's subscribers share one) and subscribed from 0 to a session whose tail is
  already followed (a first subscriber in the set-up): the shell, the token, the
  ``subscribe`` up to its reply and the backlog's event sent, so the subscriber is live.
  The store's reader thread is waited on, not spun for: its own instructions count (the
  whole process is counted), which is what a read off the event loop costs.

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
        self.want = 0
        self.done = None

        async def raw(message):
            self.sent += 1
            if self.done is not None and self.sent >= self.want and not self.done.done():
                self.done.set_result(None)

        self.scope = {RAW_SEND: raw}

    def expect(self, n):
        # A future done once n messages went out: awaited, so no spinning is counted.
        self.want = n
        self.done = asyncio.get_running_loop().create_future()
        return self.done


async def connect(hub, token, frame):
    # One connection as Hub.serve makes it, subscribed: its reply and the backlog sent.
    socket = Socket()
    sent = socket.expect(2)
    c = Connection(hub, socket)
    c.open(token)
    hub.connections.add(c)
    receive(hub.ops, c, frame)
    await sent
    return c


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
        sid = (await hub.manager.create("followed")).id
        subscribe = '{"op":"subscribe","id":1,"session_id":"%s","after_seq":0}' % sid
        subscribers = [await connect(hub, token, subscribe)]  # the session's tail runs from here
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
        elif what == "connect":
            for _ in range(n):
                subscribers.append(await connect(hub, token, subscribe))
        for c in conns + subscribers:
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


def measure(tree: Path, what: list[str], n: int, offers: int, connects: int) -> dict[str, float]:
    base = count(tree, "nothing", 0)
    per = {"ping": (n, n), "offer": (offers, 100 * offers), "connect": (connects, connects)}
    return {name: (count(tree, name, per[name][0]) - base) / per[name][1] for name in what}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=1000, help="ping requests")
    parser.add_argument("--offers", type=int, default=100, help="events offered to each of 100 connections")
    parser.add_argument("--connects", type=int, default=300, help="connections opened and subscribed")
    parser.add_argument("--what", default="ping,offer,connect", help="scenarios (default %(default)s)")
    parser.add_argument("--tree", type=Path, help="another checkout to measure beside this one")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("needs valgrind (apt-get install -y valgrind)")
    trees = {"this": ROOT} | ({"tree": args.tree.resolve()} if args.tree else {})
    what = [w.strip() for w in args.what.split(",") if w.strip()]
    if unknown := set(what) - {"ping", "offer", "connect"}:
        parser.error(f"--what: unknown scenarios {sorted(unknown)}")
    results = {name: measure(tree, what, args.n, args.offers, args.connects) for name, tree in trees.items()}
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print("instructions per operation (callgrind, PYTHONHASHSEED=0)")
    for name, figures in results.items():
        labels = {
            "ping": "request dispatch (ping)",
            "offer": "fan-out delivery",
            "connect": "connect + subscribe",
        }
        print(f"  {name:5} " + "   ".join(f"{labels[w]} {v:>10,.0f}" for w, v in figures.items()))


if __name__ == "__main__":
    main()
