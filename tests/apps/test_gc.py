"""``sessionhub gc`` (hub/apps/cli.py) and the hub's pruner collecting files (docs/files.md):
exactly the files nothing references, never one within the grace."""

from __future__ import annotations

import base64
import hashlib
import os
from datetime import timedelta
from pathlib import Path

from prometheus_client import CollectorRegistry

from hub import SqliteStore
from hub.server.pruner import Retention
from protocol import Message
from tests.apps.test_cli import run


def _with_file(id_: str, data: bytes) -> Message:
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    return Message(id=id_, role="user", parts=[{"type": "file", "mediaType": "image/png", "url": url}])


async def test_gc_and_the_pruner_collect_exactly_the_unreferenced(tmp_path: Path) -> None:
    db = tmp_path / "hub.db"
    kept, loose, dropped = os.urandom(100), os.urandom(101), os.urandom(102)
    sha = [hashlib.sha256(b).hexdigest() for b in (kept, loose, dropped)]
    async with await SqliteStore.open(db) as store:
        await store.append_messages("s1", [_with_file("m1", kept), _with_file("m2", dropped)])
        await store.put_file(sha[1], "image/png", loose)
    # Within the grace (the default hour) nothing goes, referenced or not.
    done = run("gc", "--db", str(db))
    assert done.returncode == 0 and "collected 0 unreferenced files" in done.stdout, done.stderr
    done = run("gc", "--db", str(db), "--grace", "0")
    assert done.returncode == 0 and "collected 1 unreferenced files" in done.stdout, done.stderr
    async with await SqliteStore.open(db) as store:
        assert [await store.file_info(s) is not None for s in sha] == [True, False, True]
        await store.delete_messages("s1", ["m2"])
        # The pruner: dropping the deleted message's event drops the last reference.
        pruner = Retention(store, CollectorRegistry(), keep_per_session=0, file_grace=timedelta(0))
        await pruner.run_once()
        assert [await store.file_info(s) is not None for s in sha] == [True, False, False]
        assert pruner.files_collected._value.get() == 1
