"""``serve --max-connections``: how many connections one process can hold, from its
file-descriptor limit, and the one line that says what it cannot.

Every connection is a descriptor, and a process out of them cannot accept, open its
database or a log file: the hub then degrades every connection instead of refusing the
next one. So ``serve`` first raises its soft ``RLIMIT_NOFILE`` to the hard limit (a process
may; raising the hard one needs privileges: ``ulimit -Hn``, systemd's ``LimitNOFILE=``),
keeps :func:`reserve` descriptors for the rest (the store's pool, the bus, the listening
socket, HTTP keep-alive), and refuses connections past the remainder (hub/server/admission.py).
"""

from __future__ import annotations

import argparse
import resource
from dataclasses import dataclass
from pathlib import Path

from .options import positive

__all__ = ["Descriptors", "add_options", "connection_limit", "raise_descriptors", "reserve"]

#: The most a soft limit is raised to when the hard one is unlimited (the kernel's usual
#: ``fs.nr_open``); /proc/sys/fs/nr_open says the exact one where readable.
_UNLIMITED_TARGET = 1 << 20


def add_options(serve: argparse.ArgumentParser) -> None:
    serve.add_argument(
        "--max-connections",
        type=positive,
        default=None,
        help="connections one process serves at once (WebSockets and HTTP requests); past it a "
        "WebSocket is closed with 1013 and a request answered 503 (default: from the "
        "file-descriptor limit, raised to the hard limit)",
    )


@dataclass(frozen=True)
class Descriptors:
    """The file-descriptor limit after :func:`raise_descriptors`."""

    soft: int
    hard: int | None  # None: unlimited
    #: Why the soft limit could not reach the hard one, if it could not.
    problem: str | None = None


def _nr_open() -> int:
    try:
        return int(Path("/proc/sys/fs/nr_open").read_text())
    except (OSError, ValueError):
        return _UNLIMITED_TARGET


def raise_descriptors() -> Descriptors:
    """Raise the soft descriptor limit as far as this process may (the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    unlimited = hard == resource.RLIM_INFINITY
    target = min(_nr_open(), _UNLIMITED_TARGET) if unlimited else hard
    if soft == resource.RLIM_INFINITY or soft >= target:
        return Descriptors(target if soft == resource.RLIM_INFINITY else soft, None if unlimited else hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as exc:
        return Descriptors(soft, None if unlimited else hard, f"cannot raise it to {target}: {exc}")
    return Descriptors(target, None if unlimited else hard)


def reserve(descriptors: int) -> int:
    """Descriptors kept for what is not a connection: 1/40 of them, at least 64."""
    return max(64, descriptors // 40)


def connection_limit(asked: int | None, fds: Descriptors) -> tuple[int, str]:
    """The limit to serve with, and the one line that says it (and what it cannot)."""
    room = max(1, fds.soft - reserve(fds.soft))
    hard = "unlimited" if fds.hard is None else str(fds.hard)
    where = f"file descriptors: {fds.soft} (hard limit {hard})"
    if fds.problem is not None:
        where += f"; {fds.problem}"
    if asked is None:
        return room, f"up to {room} connections per process ({where}; --max-connections sets fewer)"
    if asked > room:
        return room, (
            f"--max-connections {asked} needs about {asked + reserve(asked)} descriptors, more than "
            f"{where} allow: serving at most {room}; raise the hard limit (ulimit -Hn, LimitNOFILE=)"
        )
    return asked, f"up to {asked} connections per process ({where})"
