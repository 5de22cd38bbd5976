"""How long the store's connections may wait, on the server and on the client.

A node cut off from Postgres (its bytes held, its connections open) must not hold other
nodes' session locks, and its own clients must get an answer. The server does not know
the node is gone: a transaction whose next command never arrives sits "idle in
transaction" with its advisory lock, and a backend's socket is probed by the server only
after ``tcp_keepalives_idle`` (the machine's default: 2 hours). So every connection of the
store carries its own limits, whatever the server's configuration:

- on the server (startup parameters, this session only): ``statement_timeout``,
  ``lock_timeout``, ``idle_in_transaction_session_timeout`` (ends the partitioned node's
  backend, which releases its locks), ``tcp_keepalives_*`` and ``tcp_user_timeout`` (end a
  backend whose peer vanished while it was sending or waiting);
- on the client: ``command_timeout`` bounds every query and commit (the store then answers
  ``unavailable``), ``connect_timeout`` every new connection, and the socket gets the same
  keepalives and user timeout as the server's side.

Each can be changed in the DSN's query (``postgresql://host/db?lock_timeout=2s&command_timeout=5``)
or with ``PostgresStore.connect(server_settings=..., command_timeout=...)``; an empty value
(``?tcp_user_timeout=``) sends nothing, for a server or pooler that refuses the parameter.
"""

from __future__ import annotations

import contextlib
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from protocol import InvalidInput

__all__ = ["COMMAND_TIMEOUT", "CONNECT_TIMEOUT", "SERVER_DEFAULTS", "Limits", "limits", "set_keepalives"]

#: Sent with every connection of the store. The hub's transactions are a few round trips
#: with nothing in between, so 5 s idle inside one means its node stopped talking.
SERVER_DEFAULTS: Mapping[str, str] = {
    "statement_timeout": "30s",
    "lock_timeout": "10s",
    "idle_in_transaction_session_timeout": "5s",
    "tcp_keepalives_idle": "10",
    "tcp_keepalives_interval": "5",
    "tcp_keepalives_count": "3",
    "tcp_user_timeout": "20000",
}
#: Client side, seconds: longer than ``statement_timeout``, so that a slow statement is
#: ended by the server with an error first; this one fires when no answer can come.
COMMAND_TIMEOUT = 35.0
CONNECT_TIMEOUT = 10.0

_CLIENT_KEYS = ("command_timeout", "connect_timeout")
_UNITS = {"ms": 0.001, "s": 1.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
_VALUE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|min|h|d)?\s*")


@dataclass(frozen=True)
class Limits:
    """What :func:`limits` made of a DSN: the DSN to hand asyncpg (without the parameters
    taken out of it), the server settings, and the client's timeouts in seconds."""

    dsn: str
    server_settings: dict[str, str]
    command_timeout: float | None
    connect_timeout: float


def limits(
    dsn: str,
    server_settings: Mapping[str, str] | None = None,
    command_timeout: float | None = None,
    connect_timeout: float | None = None,
) -> Limits:
    """The defaults, overridden by the DSN's query, overridden by the arguments given
    (``server_settings``; a timeout not None, ``0`` for none)."""
    parts = urlsplit(dsn)
    settings = dict(SERVER_DEFAULTS)
    client = {"command_timeout": str(COMMAND_TIMEOUT), "connect_timeout": str(CONNECT_TIMEOUT)}
    kept = []
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key in SERVER_DEFAULTS:
            settings[key] = value
        elif key in client:
            client[key] = value
        else:
            kept.append((key, value))  # asyncpg's own (sslmode, ...) or other server settings
    settings.update(server_settings or {})
    command = _client_seconds("command_timeout", client["command_timeout"], command_timeout)
    connect = _client_seconds("connect_timeout", client["connect_timeout"], connect_timeout)
    return Limits(
        dsn=urlunsplit(parts._replace(query=urlencode(kept))),
        server_settings={key: value for key, value in settings.items() if value != ""},
        command_timeout=command,
        # asyncpg has no "wait forever" for a connect: a day stands for it.
        connect_timeout=connect or 86400.0,
    )


def _client_seconds(key: str, value: str, given: float | None) -> float | None:
    """Seconds, or None for no limit (``0`` or empty)."""
    seconds = float(given) if given is not None else _seconds(value, 1.0)
    if seconds is None or seconds < 0:
        raise InvalidInput(f"{key}={value!r} is not a number of seconds (e.g. 5, 2.5, 500ms)")
    return seconds or None


def _seconds(value: str, unit: float) -> float | None:
    """A Postgres duration (``10``, ``10s``, ``500ms``, ``1min``) in seconds; ``unit`` is
    the setting's own for a bare number. None when unreadable (Postgres refuses it then)."""
    if value.strip() == "":
        return 0.0
    match = _VALUE.fullmatch(value)
    if match is None:
        return None
    number, suffix = match.groups()
    return float(number) * (_UNITS[suffix] if suffix else unit)


def set_keepalives(sock: socket.socket | None, settings: Mapping[str, str]) -> None:
    """Give the client's socket the keepalives and user timeout the server's side has, so
    that a node notices a vanished database as soon as the database notices it (asyncpg
    sets none: MagicStack/asyncpg#606)."""
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    idle = _seconds(settings.get("tcp_keepalives_idle", ""), 1.0)
    interval = _seconds(settings.get("tcp_keepalives_interval", ""), 1.0)
    count = _seconds(settings.get("tcp_keepalives_count", ""), 1.0)
    user = _seconds(settings.get("tcp_user_timeout", ""), 0.001)
    # Linux names; elsewhere only SO_KEEPALIVE (with the system's timings) applies.
    options = [
        (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPIDLE", None), idle),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPINTVL", None), interval),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPCNT", None), count),
        (
            socket.IPPROTO_TCP,
            getattr(socket, "TCP_USER_TIMEOUT", None),
            None if user is None else user * 1000,
        ),
    ]
    for level, option, value in options:
        if option is not None and value:  # 0 or unreadable: the system's default
            with contextlib.suppress(OSError):
                sock.setsockopt(level, option, max(1, int(value)))
