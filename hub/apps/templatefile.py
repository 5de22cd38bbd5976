"""``[templates.NAME]`` of ``sessionhub.toml``: session templates, each a list of blocks
(``[[templates.NAME.blocks]]``) read top to bottom as the prompt they render.

A block is a label with an optional description and token budget, and at most one source:
``text`` or ``file`` (read-only unless ``readonly = false``, which makes it the first content
of a writable block), ``skills`` (a folder of documents, loadable), ``search = true`` (the
store's searchable entries for the label, shared by the sessions), or none: writable memory,
one row of the store per session. Checked here, built into :class:`hub.templates.Template`
when the hub's store exists (:func:`build_templates`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .configkeys import Problem
from .configkeys import unknown_key as known

if TYPE_CHECKING:
    from ..manager import SessionManager
    from ..templates import Template

__all__ = ["BLOCK_KEYS", "TEMPLATE_KEYS", "BlockSpec", "TemplateSpec", "build_templates", "read_templates"]

#: Every key of a template and of a block, with its default and meaning (docs/configuration.md).
TEMPLATE_KEYS = {
    "description": ("none", "what the template is for (shown by `sessionhub config check`)"),
    "prompt_cache": (
        "false",
        "persist each session's frozen prompt in the store, so it survives restarts byte for byte",
    ),
    "blocks": ("[]", "the context blocks, one `[[templates.NAME.blocks]]` table each, in prompt order"),
}
BLOCK_KEYS = {
    "label": ("required", "the block's name: the prompt's header and the tools' `label`"),
    "description": ("none", "shown in the header, `LABEL (description)`"),
    "max_tokens": ("none", "the block's budget, enforced on every write and shown as a percentage"),
    "readonly": (
        "true with `text`/`file`, else false",
        "`false` with `text` or `file`: a writable block starting with that content",
    ),
    "text": ("none", "the block's content, inline"),
    "file": ("none", "a file holding the content (relative to the configuration file), read at each load"),
    "skills": ("none", "a folder of documents, one per file: a loadable block (`load_context`)"),
    "search": ("false", "`true`: a searchable block over the store's entries for this label"),
}
_SOURCES = ("text", "file", "skills", "search")


@dataclass(frozen=True)
class BlockSpec:
    label: str
    description: str | None
    max_tokens: int | None
    readonly: bool
    text: str | None = None
    file: str | None = None
    skills: str | None = None
    search: bool = False


@dataclass(frozen=True)
class TemplateSpec:
    name: str
    description: str | None
    prompt_cache: bool
    blocks: tuple[BlockSpec, ...]


def _block(raw: object, path: str, base: str, problems: list[Problem]) -> BlockSpec | None:
    from ..tokens import estimate_string_tokens

    if not isinstance(raw, dict):
        problems.append(Problem(path, f"must be a table, got {raw!r}"))
        return None
    before = len(problems)

    def bad(key: str, message: str) -> None:
        problems.append(Problem(f"{path}.{key}", message))

    for key in raw:
        if key not in BLOCK_KEYS:
            bad(key, known(list(BLOCK_KEYS), key))
    label = raw.get("label")
    if not isinstance(label, str) or not label.strip():
        bad(
            "label",
            "required: a non-empty string" if label is None else f"must be a non-empty string, got {label!r}",
        )
    elif label.startswith("_"):
        bad("label", f"{label!r} must not start with _ (the store's own rows do)")
    for key in ("description", "text", "file", "skills"):
        if key in raw and not isinstance(raw[key], str):
            bad(key, f"must be a string, got {raw[key]!r}")
    max_tokens = raw.get("max_tokens")
    if max_tokens is not None and (type(max_tokens) is not int or max_tokens < 1):
        bad("max_tokens", f"must be a whole number above 0, got {max_tokens!r}")
    for key in ("readonly", "search"):
        if key in raw and not isinstance(raw[key], bool):
            bad(key, f"must be true or false, got {raw[key]!r}")
    sources = [k for k in _SOURCES if k in raw and raw[k] is not False]
    if len(sources) > 1:
        bad(sources[1], f"a block has one source: {' and '.join(sources)} are two")
    readonly = raw.get("readonly", any(k in sources for k in ("text", "file")))
    if readonly is True and not any(k in sources for k in ("text", "file")):
        bad("readonly", 'a read-only block needs its content: text = "..." or file = "PATH"')
    if "readonly" in raw and any(k in sources for k in ("skills", "search")):
        bad("readonly", f"does not apply to a {sources[0]} block")
    text = raw.get("text") if isinstance(raw.get("text"), str) else None
    file = None
    if isinstance(raw.get("file"), str):
        file = os.path.join(base, raw["file"])
        try:
            with open(file, encoding="utf-8") as handle:
                content = handle.read()
        except (OSError, UnicodeError) as exc:
            bad("file", f"cannot read {raw['file']!r}: {getattr(exc, 'strerror', None) or exc}")
        else:
            if readonly is False:
                text, file = content, None
    skills = None
    if isinstance(raw.get("skills"), str):
        skills = os.path.join(base, raw["skills"])
        if not os.path.isdir(skills):
            bad("skills", f"{raw['skills']!r} is not a folder")
    if text is not None and type(max_tokens) is int and readonly is False:
        tokens = estimate_string_tokens(text)
        if tokens > max_tokens:
            bad("max_tokens", f"the block's first content is {tokens} tokens, over max_tokens {max_tokens}")
    if len(problems) > before:
        return None
    return BlockSpec(
        label=str(label),
        description=raw.get("description"),
        max_tokens=max_tokens,
        readonly=bool(readonly),
        text=text,
        file=file,
        skills=skills,
        search=raw.get("search") is True,
    )


def read_templates(
    data: Mapping[str, Any], base: str, problems: list[Problem]
) -> tuple[list[TemplateSpec], str | None]:
    """The checked ``templates`` and ``default_template`` (paths relative to ``base``);
    mistakes go to ``problems``."""
    specs: list[TemplateSpec] = []
    default_name: str | None = None
    templates = data.get("templates", {})
    if not isinstance(templates, dict):
        problems.append(Problem("templates", f"must be a table of templates, got {templates!r}"))
        templates = {}
    for name, raw in templates.items():
        path = f"templates.{name}"
        if not isinstance(raw, dict):
            problems.append(Problem(path, f"must be a table ([templates.{name}]), got {raw!r}"))
            continue
        for key in raw:
            if key not in TEMPLATE_KEYS:
                problems.append(Problem(f"{path}.{key}", known(list(TEMPLATE_KEYS), key)))
        if "prompt_cache" in raw and not isinstance(raw["prompt_cache"], bool):
            problems.append(
                Problem(f"{path}.prompt_cache", f"must be true or false, got {raw['prompt_cache']!r}")
            )
        if "description" in raw and not isinstance(raw["description"], str):
            problems.append(Problem(f"{path}.description", f"must be a string, got {raw['description']!r}"))
        blocks_raw = raw.get("blocks", [])
        if not isinstance(blocks_raw, list):
            problems.append(
                Problem(f"{path}.blocks", "must be an array of tables ([[templates.NAME.blocks]])")
            )
            blocks_raw = []
        blocks: list[BlockSpec] = []
        labels: set[str] = set()
        for i, block_raw in enumerate(blocks_raw):
            block = _block(block_raw, f"{path}.blocks[{i}]", base, problems)
            if block is None:
                continue
            if block.label in labels:
                problems.append(
                    Problem(f"{path}.blocks[{i}].label", f"{block.label!r} is already a block of {name}")
                )
            labels.add(block.label)
            blocks.append(block)
        specs.append(
            TemplateSpec(
                name,
                raw.get("description") if isinstance(raw.get("description"), str) else None,
                raw.get("prompt_cache") is True,
                tuple(blocks),
            )
        )
    default = data.get("default_template")
    if default is not None:
        if not isinstance(default, str):
            problems.append(Problem("default_template", f"must be a template's name, got {default!r}"))
        elif default not in templates:
            names = ", ".join(sorted(templates)) or "none"
            problems.append(
                Problem("default_template", f"{default!r} is not a template (templates: {names})")
            )
        else:
            default_name = default
    return specs, default_name


def build_templates(specs: list[TemplateSpec], manager: SessionManager) -> list[Template]:
    """The engine's templates of checked specs, their providers on the manager's store."""
    from ..providers import FileText, ReadonlyText, StoreSearchProvider
    from ..skills import FileSkillProvider
    from ..templates import Template, TemplateBlock

    searches: dict[str, StoreSearchProvider] = {}
    built = []
    for spec in specs:
        blocks = []
        for b in spec.blocks:
            provider: object | None = None
            content = None
            if b.skills is not None:
                provider = FileSkillProvider(b.skills)
            elif b.search:
                # One provider per label: two templates searching "wiki" search one index.
                provider = searches.setdefault(b.label, StoreSearchProvider(manager.store, b.label))
            elif b.readonly:
                provider = FileText(b.file) if b.file is not None else ReadonlyText(b.text)
            else:
                content = b.text
            blocks.append(TemplateBlock(b.label, b.description, b.max_tokens, provider, content))
        built.append(Template(spec.name, tuple(blocks), spec.prompt_cache, spec.description))
    return built
