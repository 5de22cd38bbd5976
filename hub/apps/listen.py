"""``serve``'s listening socket, bound before uvicorn starts: a port that is taken is one
line and exit code 3, not uvicorn's startup and shutdown around a bind error."""

from __future__ import annotations

import errno
import socket

__all__ = ["bind"]


def bind(host: str, port: int) -> socket.socket | str:
    """A socket listening on ``host:port`` (0: a free port), or the line saying why not."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        return f"cannot listen on {host}:{port}: {exc.strerror or exc}"
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
        sock.bind(address)
        sock.listen(2048)
        sock.set_inheritable(True)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            return f"cannot listen on {host}:{port}: the port is taken (another hub? pick another --port)"
        return f"cannot listen on {host}:{port}: {exc.strerror or exc}"
    return sock
