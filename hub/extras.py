"""Optional backends, loaded on first use: Postgres (``sessionhub[postgres]``, asyncpg) and
Redis (``sessionhub[redis]``, redis-py). ``import hub`` on SQLite loads neither."""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["EXTRAS", "MissingExtra", "load"]

#: Which third-party modules each extra brings.
EXTRAS: dict[str, tuple[str, ...]] = {"postgres": ("asyncpg",), "redis": ("redis",)}


class MissingExtra(ImportError):
    """A backend was asked for whose extra is not installed; the message says what to install."""

    def __init__(self, extra: str, module: str) -> None:
        super().__init__(
            f"the {extra} backend needs {module!r}, which is not installed: pip install 'sessionhub[{extra}]'"
        )
        self.extra = extra
        self.module = module


def load(module: str, extra: str) -> ModuleType:
    """Import ``module`` (one of sessionhub's), raising :class:`MissingExtra` when what is
    missing is a dependency of ``extra`` rather than a bug."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").split(".")[0]
        if missing in EXTRAS[extra]:
            raise MissingExtra(extra, missing) from None
        raise
