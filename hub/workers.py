"""Compatibility alias: :class:`WorkerSummarizer` lives in :mod:`hub.server.workers`.

Kept so that ``from hub.workers import WorkerSummarizer`` (docs/compaction.md) goes on
working; new code imports it from ``hub.server.workers``. This module is outside the
engine's layer contract (pyproject.toml, ``[tool.importlinter]``): it is a name, not code.
"""

from __future__ import annotations

from .server.workers import WorkerSummarizer

__all__ = ["WorkerSummarizer"]
