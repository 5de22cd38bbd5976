"""``serve --max-connections`` and the descriptor limit (hub/apps/serve_limits.py): the
soft limit raised to the hard one, a default that leaves a reserve, an ask beyond the
descriptors capped and said in one line; and a real ``serve`` that refuses past its limit."""

from __future__ import annotations

import contextlib
import resource
from pathlib import Path

import websockets
from websockets.exceptions import ConnectionClosed

from hub.apps.serve_limits import Descriptors, connection_limit, raise_descriptors, reserve
from hub.server.admission import CLOSE_FULL, FULL_REASON
from tests.apps.test_cli import serve


def test_the_soft_limit_is_raised_to_the_hard_one() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        if hard != resource.RLIM_INFINITY and hard > 256:
            resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        fds = raise_descriptors()
        assert fds.problem is None
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == fds.soft
        if hard != resource.RLIM_INFINITY:
            assert fds.soft == fds.hard == hard
    finally:
        resource.setrlimit(
            resource.RLIMIT_NOFILE, (max(soft, resource.getrlimit(resource.RLIMIT_NOFILE)[0]), hard)
        )


def test_the_default_limit_leaves_a_reserve_and_says_so_in_one_line() -> None:
    limit, line = connection_limit(None, Descriptors(20_000, 20_000))
    assert limit == 20_000 - reserve(20_000) == 19_500
    assert line == (
        "up to 19500 connections per process (file descriptors: 20000 (hard limit 20000); "
        "--max-connections sets fewer)"
    )
    assert connection_limit(None, Descriptors(1024, 1024))[0] == 1024 - 64


def test_an_ask_within_the_descriptors_is_kept_one_beyond_is_capped_in_one_line() -> None:
    assert connection_limit(5000, Descriptors(20_000, 20_000))[0] == 5000
    limit, line = connection_limit(50_000, Descriptors(20_000, 20_000))
    assert limit == 19_500
    assert "\n" not in line
    assert line.startswith("--max-connections 50000 needs about 51250 descriptors")
    assert "serving at most 19500; raise the hard limit (ulimit -Hn, LimitNOFILE=)" in line
    failed = Descriptors(1024, 20_000, "cannot raise it to 20000: not allowed")
    assert "cannot raise it to 20000" in connection_limit(None, failed)[1]


async def test_serve_max_connections_refuses_the_next_socket_with_1013(tmp_path: Path) -> None:
    async with (
        serve("--db", str(tmp_path / "hub.db"), "--max-connections", "1") as url,
        websockets.connect(url) as held,
    ):
        await held.send('{"op": "ping", "id": 1}')
        await held.recv()
        async with websockets.connect(url) as refused:
            with contextlib.suppress(ConnectionClosed):
                await refused.recv()
        assert (refused.close_code, refused.close_reason) == (CLOSE_FULL, FULL_REASON)
