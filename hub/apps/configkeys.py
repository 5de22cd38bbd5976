"""What the checks of ``sessionhub.toml`` share: a mistake with its key path, the
"unknown key" message that names the nearest known one, and a value as a message may show it
(never a secret's)."""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["SECRET_KEYS", "Problem", "shown", "unknown_key"]

#: The keys whose value is a secret, or may be one by mistake (a key pasted where its
#: variable's name belongs): a message about them never shows the value.
SECRET_KEYS = frozenset({"auth_secret", "summarizer_api_key_env"})

_PASSWORD = re.compile(r"(://[^/@\s:'\"]*):[^/@\s'\"]*@")


@dataclass(frozen=True)
class Problem:
    """One mistake: its key path (``templates.chat.blocks[0].label``) and what is wrong."""

    path: str
    message: str

    def line(self, file: str) -> str:
        return f"{file}: {self.path}: {self.message}" if self.path else f"{file}: {self.message}"


def shown(key: str, raw: object) -> str:
    """``raw``, the value of ``key``, as a mistake's message shows it: a secret key's by its
    type alone, any other's with the passwords of its URLs masked (``postgresql://u:***@h``),
    so that ``config check``'s output and logs never carry a secret."""
    if key in SECRET_KEYS:
        return f"a {type(raw).__name__} (not shown: the value may be a secret)"
    return _PASSWORD.sub(r"\1:***@", repr(raw))


def unknown_key(keys: Sequence[str], key: str) -> str:
    near = difflib.get_close_matches(key, keys, n=1)
    return f"unknown key (did you mean {near[0]}?)" if near else f"unknown key (known: {', '.join(keys)})"
