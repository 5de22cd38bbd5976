"""Session templates: the context blocks (and prompt cache) a new session starts with,
chosen by name when it is created (``SessionManager.create(..., template=)``).

A manager given templates records each session's template in the store (one context row,
``_template_<session id>``), so the choice survives restarts and every node of a shared
store builds the session alike; a session with no recorded template (created before the
templates were configured) gets the default one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from protocol import InvalidInput

from .context import ContextConfig

__all__ = ["TEMPLATE_KEY_PREFIX", "Template", "TemplateBlock", "Templates", "template_key"]

#: The context row that names a session's template.
TEMPLATE_KEY_PREFIX = "_template_"


def template_key(session_id: str) -> str:
    return f"{TEMPLATE_KEY_PREFIX}{session_id}"


@dataclass(frozen=True)
class TemplateBlock:
    """One block of a template. ``provider=None`` is a writable row of the store per
    session; ``content`` is that block's first content, written when the session is created."""

    label: str
    description: str | None = None
    max_tokens: int | None = None
    provider: object | None = None
    content: str | None = None

    def config(self) -> ContextConfig:
        return ContextConfig(self.label, self.description, self.max_tokens, self.provider)


@dataclass(frozen=True)
class Template:
    """A named set of blocks, in the order the prompt renders them."""

    name: str
    blocks: tuple[TemplateBlock, ...] = ()
    cached_prompt: bool = False
    description: str | None = field(default=None, compare=False)

    def contexts(self) -> list[ContextConfig]:
        return [b.config() for b in self.blocks]


class Templates:
    """The templates of a manager and the default one (None: a session created without
    ``template`` gets no template's blocks)."""

    def __init__(self, templates: Iterable[Template], default: str | None = None) -> None:
        self.by_name: Mapping[str, Template] = {t.name: t for t in templates}
        if default is not None and default not in self.by_name:
            raise InvalidInput(f"default template {default!r} is not one of the templates: {self.names()}")
        self.default = default

    def names(self) -> str:
        return ", ".join(sorted(self.by_name)) or "none"

    def pick(self, name: object) -> Template | None:
        """The template ``create`` asked for (``None``: the default); unknown is
        :class:`~protocol.errors.InvalidInput` naming the ones there are."""
        if name is None:
            return None if self.default is None else self.by_name[self.default]
        if not isinstance(name, str):
            raise InvalidInput(f"template must be a string or None, got {type(name).__name__}")
        template = self.by_name.get(name)
        if template is None:
            raise InvalidInput(f"unknown template {name!r}; this hub's templates: {self.names()}")
        return template

    def recorded(self, name: str | None) -> Template | None:
        """The template a session recorded (a name no longer configured: the default)."""
        template = None if name is None else self.by_name.get(name)
        if template is None and self.default is not None:
            return self.by_name[self.default]
        return template

    def store_labels(self) -> set[str]:
        """Every label kept as a per-session row of the store, to delete with a session."""
        return {b.label for t in self.by_name.values() for b in t.blocks if b.provider is None}
