"""asyncpg's errors as the store's answers, each with a one-line cause.

A failure is either the database's verdict on a healthy connection (a constraint, a bad
value: the transaction was rolled back and the server said so), or the database being out
of reach (the connection lost, the server shutting down or refusing connections, a
timeout): :class:`~protocol.StoreUnavailable`. For a write interrupted that way, what
became of it depends on when: before its COMMIT was sent the server rolls the transaction
back when the connection goes (``not_applied``); once the COMMIT is on its way it may have
committed (``unknown``), and saying "rolled back" then would be a lie.
"""

from __future__ import annotations

import logging

import asyncpg
from asyncpg import exceptions as pg

from protocol import InvalidInput, StoreError, StoreUnavailable

__all__ = ["install_log_filter", "is_lost", "is_unreachable", "translate"]

#: Errors after which the connection is gone: a retry needs a fresh one.
_LOST: tuple[type[BaseException], ...] = (
    OSError,  # refused, reset, unreachable (ConnectionError is one)
    pg.PostgresConnectionError,  # SQLSTATE class 08, and asyncpg's "connection was closed"
    pg.AdminShutdownError,
    pg.CrashShutdownError,
    pg.CannotConnectNowError,
    pg.IdleInTransactionSessionTimeoutError,
    pg.InternalClientError,  # the protocol lost track of the connection's state
)

#: The database's refusals that say "not now" on a connection that still works.
_BUSY: tuple[type[BaseException], ...] = (
    TimeoutError,  # waiting for a pooled connection, or connecting
    pg.QueryCanceledError,  # a statement timeout
    pg.LockNotAvailableError,  # a lock timeout
    pg.TooManyConnectionsError,
    pg.InsufficientResourcesError,  # out of memory, disk full on the server
)


def is_lost(exc: BaseException, *, gone: bool = False) -> bool:
    """``gone``: the connection was found closed (or taken back by the pool, which it does
    when the connection dies under its user): then asyncpg's complaint about using it
    (an ``InterfaceError``) is the lost connection too, not a bug."""
    if isinstance(exc, pg.DataError | TimeoutError):
        # TimeoutError is an OSError, but a timeout is the database not answering, not a
        # lost connection: retrying would wait as long again (_BUSY has it).
        return False
    return isinstance(exc, _LOST) or (gone and isinstance(exc, asyncpg.InterfaceError))


def is_unreachable(exc: BaseException, *, gone: bool = False) -> bool:
    return is_lost(exc, gone=gone) or isinstance(exc, _BUSY)


def cause(exc: BaseException) -> str:
    """What happened, in one line that names no driver internals."""
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, pg.CannotConnectNowError):
        return "the server is starting up or shutting down"
    if isinstance(exc, pg.AdminShutdownError | pg.CrashShutdownError):
        return "the server is shutting down"
    if isinstance(exc, pg.IdleInTransactionSessionTimeoutError):
        return "the server ended an idle transaction"
    if isinstance(exc, TimeoutError):
        return "timed out waiting for the database"
    if isinstance(exc, pg.QueryCanceledError):
        return "a statement timed out"
    if isinstance(exc, pg.LockNotAvailableError):
        return "a lock wait timed out"
    if isinstance(exc, pg.InsufficientResourcesError):
        return f"the server is out of resources (SQLSTATE {exc.sqlstate})"
    if isinstance(exc, OSError) and exc.strerror:
        return f"the connection failed: {exc.strerror.lower()}"
    return "the connection was lost"


def translate(
    exc: BaseException, *, write: bool = False, committing: bool = False, gone: bool = False
) -> StoreError | InvalidInput:
    """The store's answer to ``exc``, raised by a read or a ``write`` (``committing``: its
    COMMIT had been sent; ``gone``: its connection was found dead)."""
    if isinstance(exc, pg.DataError):
        return InvalidInput(f"postgres refused the value: {exc}")
    if is_unreachable(exc, gone=gone):
        # A client-side timeout leaves the COMMIT's fate as unknown as a lost connection.
        if committing and (is_lost(exc, gone=gone) or isinstance(exc, TimeoutError)):
            return StoreUnavailable(
                f"postgres unavailable: {cause(exc)} while committing; the write may have been "
                "applied (an idempotent retry tells)",
                "unknown",
            )
        written = "; nothing was written" if write else ""
        return StoreUnavailable(f"postgres unavailable: {cause(exc)}{written}", "not_applied")
    if isinstance(exc, asyncpg.PostgresError):
        return StoreError(f"postgres: {exc} (SQLSTATE {exc.sqlstate}); rolled back")
    return StoreError(f"postgres: {type(exc).__name__}; rolled back")


class _OneLine(logging.Filter):
    """asyncpg's pool logs a traceback each time it fails to reconnect its floor of
    connections (``min_size``): while the server is down, that is expected, and the cause
    is one line, at most one per ``window`` seconds (the store logs the outage itself)."""

    def __init__(self, window: float = 60.0) -> None:
        super().__init__("sessionhub.asyncpg-outage")
        self.window = window
        self._last = -window

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is None or not is_unreachable(exc):
            return True
        if record.created - self._last < self.window:
            return False
        self._last = record.created
        record.msg = f"{record.getMessage()} ({cause(exc)}; at most one such line per {self.window:g} s)"
        record.args = None
        record.exc_info = None
        record.exc_text = None
        return True


def install_log_filter() -> None:
    """Put the filter on asyncpg's pool logger (once: calling again is a no-op). On the
    logger itself, so that it holds whatever handlers a logging configuration installs."""
    logger = logging.getLogger("asyncpg.pool")
    if not any(isinstance(f, _OneLine) for f in logger.filters):
        logger.addFilter(_OneLine())
