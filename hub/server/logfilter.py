"""Keep clients from flooding the server log.

uvicorn logs a full traceback (``logger.exception``) on ``uvicorn.error`` for every text
frame that is not valid UTF-8 (``websockets_sansio_impl.send_receive_event_to_app``), then
closes the connection with 1007. Any unauthenticated client can send one per connection.
:class:`PeerNoiseFilter` turns each into one line without the traceback and lets at most
``burst`` such lines through per ``window`` seconds; the next line after a quiet spell says
how many were suppressed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

__all__ = ["PeerNoiseFilter", "install_log_filters"]

#: Messages uvicorn logs with a traceback for what is the peer's fault, not the server's.
PEER_NOISE = frozenset({"Invalid UTF-8 sequence received from client."})

_LOGGERS = ("uvicorn.error",)


class PeerNoiseFilter(logging.Filter):
    """One line per bad frame (no traceback), at most ``burst`` lines per ``window`` s."""

    def __init__(
        self, window: float = 60.0, burst: int = 1, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__("sessionhub.peer-noise")
        self.window = window
        self.burst = burst
        self.clock = clock
        self._window_start = -float("inf")
        self._passed = 0
        self.suppressed = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg not in PEER_NOISE:
            return True
        now = self.clock()
        if now - self._window_start >= self.window:
            self._window_start = now
            self._passed = 0
        if self._passed >= self.burst:
            self.suppressed += 1
            return False
        self._passed += 1
        note = ""
        if self.suppressed:
            note = f" ({self.suppressed} more since the last such line)"
            self.suppressed = 0
        # The traceback is uvicorn's own decode of the frame: it tells the operator nothing.
        record.exc_info = None
        record.exc_text = None
        record.msg = (
            f"{record.msg.rstrip('.')}: closed with 1007{note}; "
            f"at most {self.burst} such line(s) per {self.window:g}s"
        )
        record.args = None
        return True


def install_log_filters(window: float = 60.0, burst: int = 1) -> None:
    """Put one :class:`PeerNoiseFilter` on uvicorn's loggers (once: calling again is a no-op).

    A filter on the logger itself, not a handler, so that it holds whatever handlers
    uvicorn's or the application's logging configuration installs later (``dictConfig``
    replaces handlers but keeps a logger's filters)."""
    for name in _LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, PeerNoiseFilter) for f in logger.filters):
            logger.addFilter(PeerNoiseFilter(window, burst))
