"""The external services some tests need: Postgres and Redis, from the environment.

``SESSIONHUB_TEST_POSTGRES`` and ``SESSIONHUB_TEST_REDIS`` name them (``.ci/run`` exports
both); the defaults are this machine's. A test that needs one that does not answer is
skipped with the reason, and ``.ci/run`` fails the build when anything was skipped for
that reason (``SERVICE_SKIP`` is the marker it looks for).
"""

from __future__ import annotations

import functools
import os
import socket
from urllib.parse import urlsplit

import pytest

__all__ = ["SERVICE_SKIP", "postgres_dsn", "redis_url"]

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


def postgres_dsn() -> str:
    """The test Postgres DSN, or skip the calling test."""
    dsn = os.environ.get("SESSIONHUB_TEST_POSTGRES", DEFAULT_POSTGRES)
    if not _reachable(dsn, 5432):
        pytest.skip(f"{SERVICE_SKIP}: Postgres not reachable at {dsn} (set SESSIONHUB_TEST_POSTGRES)")
    return dsn


def redis_url() -> str:
    """The test Redis URL, or skip the calling test."""
    url = os.environ.get("SESSIONHUB_TEST_REDIS", DEFAULT_REDIS)
    if not _reachable(url, 6379):
        pytest.skip(f"{SERVICE_SKIP}: Redis not reachable at {url} (set SESSIONHUB_TEST_REDIS)")
    return url
