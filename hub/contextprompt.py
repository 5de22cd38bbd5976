"""How context blocks read to a model: the system prompt's format and the keys of keyed
entries, to the character of the original (spec §7–§8).

The 46-``═`` rule, ``LABEL (description) [pct% — t/max tokens] [tag]`` headers with
JavaScript half-up rounding, empty read-only blocks omitted, sections joined by a blank
line; an entry's key is its title's slug, else a slug of its content plus a 32-bit FNV-1a
hash in base 36 (over UTF-16 code units, as JavaScript counts).
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterable

from protocol import ContextBlock

from .tokens import JS_WHITESPACE

__all__ = [
    "REMINDER_PREAMBLE",
    "SEPARATOR",
    "context_entry_key",
    "prompt_renders_block",
    "render_section",
    "render_system_prompt",
    "usage_percent",
]

SEPARATOR = "═" * 46

# -- entry keys ----------------------------------------------------------------------------

_NON_SLUG = re.compile(r"[^a-z0-9]+")


def _utf16_prefix(text: str, units: int) -> str:
    data = text.encode("utf-16-le", "surrogatepass")[: units * 2]
    return data.decode("utf-16-le", "surrogatepass")


def _slugify(text: str) -> str:
    slug = _NON_SLUG.sub("-", _utf16_prefix(text, 60).lower())
    if slug.startswith("-"):
        slug = slug[1:]
    if slug.endswith("-"):
        slug = slug[:-1]
    return slug


def _base36(value: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    if value == 0:
        return "0"
    out = []
    while value:
        value, rem = divmod(value, 36)
        out.append(digits[rem])
    return "".join(reversed(out))


def _stable_hash(text: str) -> str:
    """32-bit FNV-1a over UTF-16 code units, in lowercase base 36."""
    data = text.encode("utf-16-le", "surrogatepass")
    h = 0x811C9DC5
    for i in range(0, len(data), 2):
        h ^= data[i] | (data[i + 1] << 8)
        h = (h * 0x01000193) & 0xFFFFFFFF
    return _base36(h)


def context_entry_key(title: str | None, content: str) -> str:
    """The key of a skill or search entry: the title's slug (same title → same entry,
    updated in place), else a slug of the content plus its hash."""
    if title is not None and title.strip(JS_WHITESPACE):  # JavaScript's trim()
        return _slugify(title) or "entry-" + _stable_hash(title)
    return (_slugify(content) or "entry") + "-" + _stable_hash(content)


# -- rendering ---------------------------------------------------------------------------


def _round_half_up(value: float) -> int:
    return math.floor(value + 0.5)


def usage_percent(tokens: int, max_tokens: int) -> int:
    return _round_half_up(tokens / max_tokens * 100)


def _tag(block: ContextBlock) -> str:
    if block.is_searchable:
        return "[searchable]"
    if block.is_skill:
        return "[loadable]"
    if not block.writable:
        return "[readonly]"
    return "[writable]"


def render_section(block: ContextBlock) -> str:
    """One block's section of the prompt: its header between two rules, then its content."""
    header = block.label.upper()
    if block.description:
        header += f" ({block.description})"
    if block.max_tokens:
        pct = usage_percent(block.tokens, block.max_tokens)
        header += f" [{pct}% — {block.tokens}/{block.max_tokens} tokens]"
    header += " " + _tag(block)
    return f"{SEPARATOR}\n{header}\n{SEPARATOR}\n{block.content}"


def render_system_prompt(blocks: Iterable[ContextBlock], remind: Collection[str] = ()) -> str:
    """The system prompt for these blocks, in order. An empty read-only block is left out,
    unless it is a ``remind`` block (``when_changed="remind"``): those always render, so
    that :func:`prompt_renders_block` can tell its section apart (agents 0.32)."""
    sections = []
    for block in blocks:
        shown = block.content != "" or block.writable or block.is_searchable or block.is_skill
        if shown or block.label in remind:
            sections.append(render_section(block))
    return "\n\n".join(sections)


#: What a reminder says before the blocks that changed (agents 0.32's REMINDER_PREAMBLE).
REMINDER_PREAMBLE = (
    "These context blocks changed after the system prompt was written. "
    "Their current values below replace the ones in the system prompt."
)


def prompt_renders_block(prompt: str, block: ContextBlock) -> bool:
    """Whether ``prompt`` holds ``block``'s section exactly as it renders now."""
    return f"\n\n{render_section(block)}\n\n{SEPARATOR}\n" in f"\n\n{prompt}\n\n{SEPARATOR}\n"
