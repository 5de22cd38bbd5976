"""One log line per database outage, not one traceback per failed operation.

A database that restarts fails every operation in flight and every one tried until it is
back: thousands in a few seconds. Each of them is answered (``unavailable``) to its caller;
the log needs to say once that the database went away, how often it refused meanwhile, and
when it came back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

__all__ = ["FaultLog"]

log = logging.getLogger("sessionhub.store")


class FaultLog:
    """The outage state of one store: :meth:`failed` on each unreachable-database error,
    :meth:`recovered` on each operation that worked."""

    __slots__ = ("_down_since", "_every", "_failures", "_label", "_last_line", "_on_recovery")

    def __init__(
        self, label: str, *, every: float = 10.0, on_recovery: Callable[[], None] | None = None
    ) -> None:
        self._label = label
        self._on_recovery = on_recovery
        self._every = every  # at most one line per this many seconds while it stays down
        self._down_since: float | None = None
        self._last_line = 0.0
        self._failures = 0

    @property
    def down(self) -> bool:
        return self._down_since is not None

    def failed(self, cause: str) -> None:
        """``cause``: the error's one line, as the caller was answered."""
        now = time.monotonic()
        self._failures += 1
        if self._down_since is None:
            self._down_since = self._last_line = now
            log.warning("%s", cause)
        elif now - self._last_line >= self._every:
            self._last_line = now
            log.warning(
                "%s still unavailable after %.1f s (%d operations refused): %s",
                self._label,
                now - self._down_since,
                self._failures,
                cause,
            )

    def recovered(self) -> None:
        if self._down_since is None:
            return
        log.warning(
            "%s available again after %.1f s (%d operations refused)",
            self._label,
            time.monotonic() - self._down_since,
            self._failures,
        )
        self._down_since = None
        self._failures = 0
        if self._on_recovery is not None:
            self._on_recovery()
