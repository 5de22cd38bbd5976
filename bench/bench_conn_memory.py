"""What one idle subscribed connection holds in the hub, by the file that allocated it.

Runs the hub under uvicorn in this process with ``tracemalloc`` on, subscribes N raw
``websockets`` connections (bench/bench_hub.py's subscriber process) to one session, and
prints the Python allocations still held per connection, grouped by file. Prints figures,
asserts nothing. From the repository root:

    .venv/bin/python bench/bench_conn_memory.py [N] [WS]    # default 2000 hub (serve --ws)
"""

from __future__ import annotations

import asyncio
import gc
import sys
import tempfile
import tracemalloc
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from hub.apps.serve import ws_protocol  # noqa: E402
from tests.support.hubtest import Client, served  # noqa: E402


async def subscribers(url: str, sid: str, n: int) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(HERE / "bench_hub.py"), "--worker", "sub", "--url", url, "--session", sid,
        "--conns", str(n), "--hold", stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    print(f"subscribers: {(await proc.stdout.readline()).decode().strip()}")
    return proc


async def main(n: int, ws: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        # --ws as `sessionhub serve` takes it: hub (the default), websockets-sansio, websockets.
        options = {"ws": ws_protocol(ws), "log_level": "warning"}
        async with served(db=Path(tmp) / "hub.db", options=options) as h, Client.connect(h.ws_url) as c:
            sid = (await c.call("create", name="memory"))["id"]
            procs = [await subscribers(h.ws_url, sid, 20)]  # warm-up: code paths and caches
            gc.collect()
            tracemalloc.start(12)
            before = tracemalloc.take_snapshot()
            procs.append(await subscribers(h.ws_url, sid, n))
            await asyncio.sleep(1)
            gc.collect()
            after = tracemalloc.take_snapshot()
            tracemalloc.stop()
            total = sum(s.size_diff for s in after.compare_to(before, "filename"))
            print(f"held per connection: {total / n / 1024:.1f} KiB (Python allocations)")
            for stat in after.compare_to(before, "filename")[:20]:
                name = stat.traceback[0].filename.split("site-packages/")[-1]
                print(f"  {stat.size_diff / n:7.0f} B  {name}")
            for proc in procs:
                assert proc.stdin is not None
                proc.stdin.write(b"\n")
                await proc.stdin.drain()
                await proc.communicate()


if __name__ == "__main__":
    asyncio.run(
        main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000, sys.argv[2] if len(sys.argv) > 2 else "hub")
    )
