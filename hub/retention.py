"""Event retention policy: ages as operators write them (``30d``) and the cutoff they
mean. The hub's background pruner is :class:`hub.server.pruner.Retention`; see
docs/operations.md.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from protocol import InvalidInput

__all__ = ["parse_age", "prune_cutoff"]

_AGE = re.compile(r"(\d+(?:\.\d+)?)\s*(s|m|h|d|w)", re.IGNORECASE)
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_age(text: str) -> timedelta:
    """``90s``, ``15m``, ``12h``, ``30d``, ``2w`` as a timedelta; InvalidInput otherwise."""
    found = _AGE.fullmatch(text.strip())
    if found is None:
        raise InvalidInput(f"not an age: {text!r} (say 90s, 15m, 12h, 30d or 2w)")
    seconds = float(found.group(1)) * _UNIT[found.group(2).lower()]
    if seconds <= 0:
        raise InvalidInput(f"an age must be more than 0, not {text!r}")
    try:
        return timedelta(seconds=seconds)
    except OverflowError:
        raise InvalidInput(f"age {text!r} is too long") from None


def prune_cutoff(older_than: datetime | timedelta | None) -> datetime | None:
    """An age as the time before which events go (a datetime passes through)."""
    if isinstance(older_than, timedelta):
        return datetime.now(UTC) - older_than
    return older_than
