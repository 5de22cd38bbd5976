"""What some tests need from outside Python: Postgres and Redis (from the environment),
Chromium and Node.

``SESSIONHUB_TEST_POSTGRES`` and ``SESSIONHUB_TEST_REDIS`` name them; the defaults are
this machine's. A test that needs one that does not answer is skipped with the reason,
unless ``SESSIONHUB_REQUIRE_SERVICES=1`` (``.ci/run`` sets it): then it fails, so CI can
never pass with those tests silently skipped.
"""

from __future__ import annotations

import functools
import os
import shutil
import socket
from pathlib import Path
from urllib.parse import urlsplit

import pytest

__all__ = ["SERVICE_SKIP", "chromium", "node", "postgres_dsn", "redis_url", "unavailable"]

SERVICE_SKIP = "service unavailable"

DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"
DEFAULT_REDIS = "redis://127.0.0.1:6379/0"


@functools.cache
def _reachable(url: str, default_port: int) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or default_port), 1.0):
            return True
    except OSError:
        return False


def unavailable(reason: str) -> None:
    """Skip the calling test for ``reason`` (fail it under SESSIONHUB_REQUIRE_SERVICES=1)."""
    if os.environ.get("SESSIONHUB_REQUIRE_SERVICES") == "1":
        pytest.fail(f"{reason}, and SESSIONHUB_REQUIRE_SERVICES=1 forbids skipping", pytrace=False)
    pytest.skip(f"{SERVICE_SKIP}: {reason}")


def postgres_dsn() -> str:
    """The test Postgres DSN, or skip (or fail, see above) the calling test."""
    dsn = os.environ.get("SESSIONHUB_TEST_POSTGRES", DEFAULT_POSTGRES)
    if not _reachable(dsn, 5432):
        unavailable(f"Postgres not reachable at {dsn} (set SESSIONHUB_TEST_POSTGRES)")
    return dsn


def redis_url() -> str:
    """The test Redis URL, or skip (or fail, see above) the calling test."""
    url = os.environ.get("SESSIONHUB_TEST_REDIS", DEFAULT_REDIS)
    if not _reachable(url, 6379):
        unavailable(f"Redis not reachable at {url} (set SESSIONHUB_TEST_REDIS)")
    return url


CHROMIUM = Path("/usr/bin/chromium")


def chromium() -> Path:
    """Debian's Chromium (``.ci/run`` installs it), or skip (or fail) the calling test."""
    if not CHROMIUM.exists():
        unavailable(f"needs Debian's chromium at {CHROMIUM} (apt-get install -y chromium)")
    return CHROMIUM


def node() -> str:
    """The ``node`` executable, or skip (or fail) the calling test."""
    found = shutil.which("node")
    if found is None:
        unavailable("needs node on PATH")
    assert found is not None
    return found
