"""What the checks of ``sessionhub.toml`` share: a mistake with its key path, and the
"unknown key" message that names the nearest known one."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Problem", "unknown_key"]


@dataclass(frozen=True)
class Problem:
    """One mistake: its key path (``templates.chat.blocks[0].label``) and what is wrong."""

    path: str
    message: str

    def line(self, file: str) -> str:
        return f"{file}: {self.path}: {self.message}" if self.path else f"{file}: {self.message}"


def unknown_key(keys: Sequence[str], key: str) -> str:
    near = difflib.get_close_matches(key, keys, n=1)
    return f"unknown key (did you mean {near[0]}?)" if near else f"unknown key (known: {', '.join(keys)})"
