"""``sessionhub.toml``: the hub configured in one file (``serve --config FILE`` or
``$SESSIONHUB_CONFIG``), checked as strictly as the wire protocol checks a frame.

The file has ``[serve]`` (every ``serve`` option, named as the flag with ``_`` for ``-``),
``[compaction]`` (the summarizer and when sessions compact), ``default_template`` and
``[templates.NAME]`` with its ``[[templates.NAME.blocks]]`` (:mod:`hub.apps.templatefile`).
Every mistake is one :class:`Problem` with its key path; unknown keys are mistakes too,
so a typo never silently means "the default". A typed flag overrides the environment,
which overrides the file, which overrides the built-in default.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import serve, serve_compaction
from .configkeys import Problem, shown
from .configkeys import unknown_key as known
from .templatefile import TemplateSpec, read_templates

__all__ = [
    "COMPACTION_KEYS",
    "CONFIG_ENV",
    "ENV_DEFAULTS",
    "HubFile",
    "Problem",
    "add_config_option",
    "apply_config",
    "load",
    "serve_actions",
]

#: Where ``serve`` finds its file when ``--config`` is not given.
CONFIG_ENV = "SESSIONHUB_CONFIG"

#: Options whose default comes from the environment (which beats the file).
ENV_DEFAULTS = {
    "db": "SESSIONHUB_DB",
    "bus": "SESSIONHUB_BUS",
    "auth_secret": "SESSIONHUB_AUTH_SECRET",
    "summarizer": "SESSIONHUB_SUMMARIZER",
    "summarizer_url": "SESSIONHUB_SUMMARIZER_URL",
    "summarizer_model": "SESSIONHUB_SUMMARIZER_MODEL",
}

#: ``[compaction]``'s keys and the serve option each one sets (``api_key_env`` is the file's
#: own: the name of the variable holding the summarizer's key, never the key).
COMPACTION_KEYS = {
    "summarizer": "summarizer",
    "url": "summarizer_url",
    "model": "summarizer_model",
    "timeout": "summarizer_timeout",
    "threshold": "compact_after",
    "tail_tokens": "compact_tail_tokens",
    "api_key_env": "summarizer_api_key_env",
}
_TOP = ("serve", "compaction", "default_template", "templates")
_NOT_IN_FILE = {"help", "config", "summarizer_api_key_env"}
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass
class HubFile:
    """A checked file: option values by serve's ``dest``, the templates, the problems."""

    path: str
    values: dict[str, Any] = field(default_factory=dict)
    templates: list[TemplateSpec] = field(default_factory=list)
    default_template: str | None = None
    problems: list[Problem] = field(default_factory=list)


@contextlib.contextmanager
def _pristine_environment() -> Iterator[None]:
    """The built-in defaults, as a fresh shell without SESSIONHUB_* would see them."""
    saved = {name: os.environ.pop(name) for name in ENV_DEFAULTS.values() if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def serve_actions(*, pristine: bool = False) -> list[argparse.Action]:
    """``serve``'s options as argparse declares them (defaults without the environment's
    when ``pristine``: what the docs show)."""
    parser = argparse.ArgumentParser(add_help=False)
    with _pristine_environment() if pristine else contextlib.nullcontext():
        serve.add_options(parser)
    return [a for a in parser._actions if a.dest not in _NOT_IN_FILE and a.option_strings]


def _value(action: argparse.Action, raw: object) -> tuple[Any, str | None]:
    """``raw`` (a TOML value) as the option's value, or why it cannot be."""
    if isinstance(action, argparse._StoreTrueAction):
        return (
            (raw, None)
            if isinstance(raw, bool)
            else (None, f"must be true or false, got {shown(action.dest, raw)}")
        )
    if isinstance(action, argparse._AppendAction):
        if not isinstance(raw, list) or not all(isinstance(v, str) for v in raw):
            return None, f"must be a list of strings, got {shown(action.dest, raw)}"
        return list(raw), None
    convert = action.type
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        return None, f"must be a string or a number, got {shown(action.dest, raw)}"
    if convert is int and not isinstance(raw, int):
        return None, f"must be a whole number, got {shown(action.dest, raw)}"
    if convert is float and isinstance(raw, str):
        return None, f"must be a number, got {shown(action.dest, raw)}"
    if convert is None and not isinstance(raw, str):
        return None, f"must be a string, got {shown(action.dest, raw)}"
    value: Any = raw
    if callable(convert) and convert not in (int, float):
        try:
            value = convert(str(raw))
        except (argparse.ArgumentTypeError, ValueError) as exc:
            return None, str(exc)
    elif convert is float:
        value = float(raw)
    if action.choices is not None and value not in action.choices:
        return None, f"must be one of {', '.join(map(str, action.choices))}, got {shown(action.dest, raw)}"
    return value, None


def _table(data: Mapping[str, Any], key: str, problems: list[Problem]) -> Mapping[str, Any]:
    table = data.get(key, {})
    if not isinstance(table, dict):
        problems.append(Problem(key, f"must be a table ([{key}]), got {table!r}"))
        return {}
    return table


def _options(data: Mapping[str, Any], hub: HubFile) -> None:
    actions = {a.dest: a for a in serve_actions()}
    compaction_dests = set(COMPACTION_KEYS.values())
    serve_keys = sorted(d for d in actions if d not in compaction_dests)
    for key, raw in _table(data, "serve", hub.problems).items():
        if key not in serve_keys:
            hub.problems.append(Problem(f"serve.{key}", known(serve_keys, key.replace("-", "_"))))
            continue
        value, problem = _value(actions[key], raw)
        if problem:
            hub.problems.append(Problem(f"serve.{key}", problem))
        else:
            hub.values[key] = value
    for key, raw in _table(data, "compaction", hub.problems).items():
        dest = COMPACTION_KEYS.get(key)
        if dest is None:
            hub.problems.append(Problem(f"compaction.{key}", known(sorted(COMPACTION_KEYS), key)))
            continue
        if dest == "summarizer_api_key_env":
            if not isinstance(raw, str) or not _ENV_NAME.fullmatch(raw):
                hub.problems.append(
                    Problem(f"compaction.{key}", f"must name an environment variable, got {shown(dest, raw)}")
                )
            else:
                hub.values[dest] = raw
            continue
        value, problem = _value(actions[dest], raw)
        if problem:
            hub.problems.append(Problem(f"compaction.{key}", problem))
        else:
            hub.values[dest] = value


def _key_path(dest: str) -> str:
    for key, target in COMPACTION_KEYS.items():
        if target == dest:
            return f"compaction.{key}"
    return f"serve.{dest}"


def _cross_checks(hub: HubFile) -> None:
    """What only the options together can say (serve's own checks, worded for the file)."""
    args = defaults()
    vars(args).update(hub.values)
    args.typed = []
    problem = serve.serve_problem(args)
    if problem is None:
        return
    path = ""
    for action in serve_actions():
        for flag in action.option_strings:
            pattern = re.escape(flag) + r"(?![\w-])(?: \(\$\w+\))?"
            if re.search(pattern, problem):
                path = path or _key_path(action.dest)
                problem = re.sub(pattern, _key_path(action.dest), problem)
    hub.problems.append(Problem(path, problem))


def defaults() -> argparse.Namespace:
    """Every serve option at its default (the environment's where it gives one)."""
    args = argparse.Namespace(**{a.dest: a.default for a in serve_actions()})
    args.summarizer_api_key_env = serve_compaction.API_KEY_ENV
    return args


def load(path: str) -> HubFile:
    """Read and check ``path``; every mistake is in ``problems`` (none: usable)."""
    hub = HubFile(path)
    try:
        with open(path, "rb") as file:
            data = tomllib.load(file)
    except OSError as exc:
        hub.problems.append(Problem("", f"cannot read it: {exc.strerror or exc}"))
        return hub
    except tomllib.TOMLDecodeError as exc:
        hub.problems.append(Problem("", f"not valid TOML: {exc}"))
        return hub
    for key in data:
        if key not in _TOP:
            hub.problems.append(Problem(key, known(list(_TOP), key)))
    _options(data, hub)
    hub.templates, hub.default_template = read_templates(
        data, os.path.dirname(os.path.abspath(path)), hub.problems
    )
    if not hub.problems:
        _cross_checks(hub)
    return hub


def add_config_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help=f"read the options and session templates from this TOML file; flags override it "
        f"(default: ${CONFIG_ENV}; docs/configuration.md)",
    )


def _typed_dests(argv: Sequence[str]) -> set[str]:
    """The options typed on the command line (which beat the file)."""
    shadow = argparse.ArgumentParser(add_help=False)
    serve.add_options(shadow)
    add_config_option(shadow)
    for action in shadow._actions:
        action.default = argparse.SUPPRESS
    words = list(argv)
    if "serve" in words:
        words = words[words.index("serve") + 1 :]
    typed, _ = shadow.parse_known_args(words)
    return set(vars(typed))


def apply_config(args: argparse.Namespace) -> HubFile | None:
    """Fill ``args`` from the file ``--config`` or ``$SESSIONHUB_CONFIG`` names (None: no
    file). Typed flags and the environment's values stay; the caller reports ``problems``."""
    path = args.config or os.environ.get(CONFIG_ENV) or None
    args.summarizer_api_key_env = serve_compaction.API_KEY_ENV
    args.templates = None
    if path is None:
        return None
    hub = load(path)
    if hub.problems:
        return hub
    typed = _typed_dests(args.typed)
    for dest, value in hub.values.items():
        env = ENV_DEFAULTS.get(dest)
        if dest in typed or (env is not None and os.environ.get(env)):
            continue
        setattr(args, dest, value)
    args.templates = hub
    return hub
