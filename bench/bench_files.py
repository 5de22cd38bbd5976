"""Files in messages (docs/files.md): transfer rates, and bytes on disk.

Prints figures, asserts nothing. Run from the repository root:

    .venv/bin/python bench/bench_files.py [--mb 20] [--runs 5] [--json]

1. Transfer: ``sessionhub serve`` on a fresh SQLite file, and beside it, in the same run, a
   plain Starlette app on uvicorn (a handler that streams the body to a file, and
   ``FileResponse`` for the download): each its own process, the client here. ``--runs``
   uploads and downloads of one ``--mb`` MB random file to each, alternating; reported: the
   median MB/s of each and the hub's as a fraction of plain Starlette's (target >= 0.7).
2. Footprint: 100 messages sharing 10 random 200 KB images (inline ``data:`` URLs, so
   every message sends its image's bytes), in a fresh SQLite file, against the same 100
   messages without the file parts plus the images' own size; reported: the ratio of the
   two files' sizes (target <= 1.05).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx2

ROOT = Path(__file__).resolve().parents[1]

PLAIN_APP = """
import sys
from starlette.applications import Starlette
from starlette.responses import FileResponse, JSONResponse
from starlette.routing import Route
import uvicorn

PATH = sys.argv[2]

async def up(request):
    with open(PATH, "wb") as f:
        async for chunk in request.stream():
            f.write(chunk)
    return JSONResponse({"ok": True}, status_code=201)

async def down(request):
    return FileResponse(PATH, media_type="application/octet-stream")

app = Starlette(routes=[Route("/up", up, methods=["POST"]), Route("/f", down)])
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait(port: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def _start(tmp: Path, hub_port: int, plain_port: int, mb: int) -> tuple[subprocess.Popen[bytes], ...]:
    hub = subprocess.Popen(
        [sys.executable, "-m", "hub.apps.cli", "serve", "--db", str(tmp / "hub.db"), "--port", str(hub_port),
         "--max-file-bytes", f"{mb + 1}M", "--log-level", "warning"],
        cwd=ROOT,
    )  # fmt: skip
    plain = subprocess.Popen([sys.executable, "-c", PLAIN_APP, str(plain_port), str(tmp / "plain.bin")])
    return hub, plain


def _disk(tmp: Path, name: str) -> int:
    """The database file and its WAL."""
    return sum(p.stat().st_size for p in tmp.glob(f"{name}.db*"))


async def _timed(coro: Any) -> float:
    started = time.perf_counter()
    await coro
    return time.perf_counter() - started


async def transfer(mb: int, runs: int, tmp: Path) -> dict[str, Any]:
    blob = os.urandom(mb << 20)
    hub_port, plain_port = _free_port(), _free_port()
    hub, plain = _start(tmp, hub_port, plain_port, mb)
    try:
        _wait(hub_port)
        _wait(plain_port)
        figures: dict[str, list[float]] = {"hub_up": [], "plain_up": [], "hub_down": [], "plain_down": []}
        async with httpx2.AsyncClient(timeout=120) as http:
            hub_base, plain_base = f"http://127.0.0.1:{hub_port}", f"http://127.0.0.1:{plain_port}"
            url = ""
            for _ in range(runs):

                async def up_hub() -> None:
                    nonlocal url
                    r = await http.post(
                        f"{hub_base}/files", content=blob, headers={"content-type": "image/png"}
                    )
                    assert r.status_code == 201, r.text
                    url = r.json()["url"]

                async def up_plain() -> None:
                    r = await http.post(f"{plain_base}/up", content=blob)
                    assert r.status_code == 201

                async def down(address: str) -> None:
                    size = 0
                    async with http.stream("GET", address) as r:
                        async for chunk in r.aiter_raw():
                            size += len(chunk)
                    assert size == len(blob), size

                figures["hub_up"].append(mb / await _timed(up_hub()))
                figures["plain_up"].append(mb / await _timed(up_plain()))
                figures["hub_down"].append(mb / await _timed(down(hub_base + url)))
                figures["plain_down"].append(mb / await _timed(down(f"{plain_base}/f")))
        medians = {k: round(statistics.median(v), 1) for k, v in figures.items()}
        return {
            **{f"{k}_mb_s": v for k, v in medians.items()},
            "upload_ratio": round(medians["hub_up"] / medians["plain_up"], 2),
            "download_ratio": round(medians["hub_down"] / medians["plain_down"], 2),
        }
    finally:
        for proc in (hub, plain):
            proc.terminate()
            proc.wait(10)


async def footprint(tmp: Path) -> dict[str, Any]:
    from hub import SqliteStore

    images = [os.urandom(200_000) for _ in range(10)]

    def message(i: int, with_file: bool) -> dict[str, Any]:
        parts: list[dict[str, Any]] = [{"type": "text", "text": f"message {i}: look at this picture"}]
        if with_file:
            url = "data:image/png;base64," + base64.b64encode(images[i % 10]).decode()
            parts.append({"type": "file", "mediaType": "image/png", "filename": f"{i % 10}.png", "url": url})
        return {"id": f"m{i}", "role": "user", "parts": parts}

    sizes = {}
    for name, with_file in (("files", True), ("text", False)):
        path = tmp / f"{name}.db"
        async with await SqliteStore.open(path) as store:
            from protocol import coerce_message

            for i in range(100):
                await store.append_messages("s1", [coerce_message(message(i, with_file))])
        sizes[name] = _disk(tmp, name)
    baseline = sizes["text"] + sum(len(i) for i in images)
    return {
        "images_bytes": sum(len(i) for i in images),
        "db_with_files_bytes": sizes["files"],
        "db_text_only_bytes": sizes["text"],
        "ratio": round(sizes["files"] / baseline, 3),
        "inline_would_be_bytes": sizes["text"] + 100 * len(images[0]) * 4 // 3,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=20)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = {
            "transfer": await transfer(args.mb, args.runs, Path(tmp)),
            "footprint": await footprint(Path(tmp)),
        }
    if args.json:
        print(json.dumps(result))
        return
    t, f = result["transfer"], result["footprint"]
    print(f"transfer of a {args.mb} MB file, median of {args.runs} (MB/s):")
    up = f"hub {t['hub_up_mb_s']:8.1f}   plain Starlette {t['plain_up_mb_s']:8.1f}"
    down = f"hub {t['hub_down_mb_s']:8.1f}   FileResponse    {t['plain_down_mb_s']:8.1f}"
    print(f"  upload    {up}   ratio {t['upload_ratio']}")
    print(f"  download  {down}   ratio {t['download_ratio']}")
    print("footprint of 100 messages sharing 10 images of 200 KB:")
    text = f"text only {f['db_text_only_bytes']:,} B + images {f['images_bytes']:,} B"
    print(f"  with files {f['db_with_files_bytes']:,} B; {text}")
    print(f"  ratio {f['ratio']} (inline data: URLs would take ~{f['inline_would_be_bytes']:,} B)")


if __name__ == "__main__":
    asyncio.run(main())
