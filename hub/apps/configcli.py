"""The configuration file's commands: ``sessionhub init [FILE]`` (a commented starter),
``sessionhub config check FILE`` (every mistake, one line each), and what ``serve`` does
with ``--config``: fill its options from the file, and on ``--log-level debug`` print the
configuration in effect, secrets masked."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from .configfile import COMPACTION_KEYS, add_config_option, apply_config, serve_actions
from .starter import STARTER

__all__ = ["add_commands", "effective_config", "prepare_serve", "run"]

#: Options never printed as they are.
_SECRETS = {"auth_secret"}


def add_commands(command: Callable[[str, str], argparse.ArgumentParser]) -> None:
    init = command("init", "write a commented starter sessionhub.toml (docs/configuration.md)")
    init.add_argument("file", nargs="?", default="sessionhub.toml", help="where (default: %(default)s)")
    init.add_argument("--force", action="store_true", help="overwrite FILE if it exists")
    config = command("config", "check a configuration file")
    actions = config.add_subparsers(dest="config_command", required=True)
    check = actions.add_parser("check", help="print every mistake of FILE, one line each (exit 2 if any)")
    check.add_argument("file", metavar="FILE")


def add_serve_option(serve: argparse.ArgumentParser) -> None:
    add_config_option(serve)


def run(args: argparse.Namespace) -> int:
    if args.command == "init":
        return _init(args.file, args.force)
    return _check(args.file)


def _init(path: str, force: bool) -> int:
    if os.path.exists(path) and not force:
        print(f"sessionhub: {path} exists; pass --force to overwrite it", file=sys.stderr)
        return 2
    try:
        with open(path, "w", encoding="utf-8") as file:
            file.write(STARTER)
    except OSError as exc:
        print(f"sessionhub: cannot write {path}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(
        f"wrote {path}; check it with: sessionhub config check {path}; run: sessionhub serve --config {path}"
    )
    return 0


def _check(path: str) -> int:
    from .configfile import load

    hub = load(path)
    for problem in hub.problems:
        print(problem.line(path), file=sys.stderr)
    if hub.problems:
        return 2
    names = ", ".join(t.name for t in hub.templates) or "none"
    default = f", default {hub.default_template}" if hub.default_template else ""
    print(f"{path}: ok ({len(hub.values)} options set; templates: {names}{default})")
    return 0


def prepare_serve(args: argparse.Namespace) -> int | None:
    """Apply the configuration file to serve's ``args``; an exit code when it is unusable."""
    hub = apply_config(args)
    if hub is not None and hub.problems:
        for problem in hub.problems:
            print(f"sessionhub: {problem.line(hub.path)}", file=sys.stderr)
        return 2
    if args.log_level == "debug":
        print(effective_config(args), file=sys.stderr)
    return None


def _masked_dsn(value: str) -> str:
    parts = urlsplit(value)
    if parts.password is None:
        return value
    host = parts.hostname or ""
    netloc = f"{parts.username}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def _show(dest: str, value: Any) -> str:
    if value is not None and dest in _SECRETS:
        return '"***"'
    if isinstance(value, str) and "://" in value:
        value = _masked_dsn(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value)


def effective_config(args: argparse.Namespace) -> str:
    """The options in effect (defaults, file, environment and flags merged), TOML-shaped."""
    by_dest = {dest: key for key, dest in COMPACTION_KEYS.items()}
    lines = ["sessionhub: effective configuration (secrets masked):", "[serve]"]
    compaction = ["[compaction]"]
    for action in serve_actions():
        value = getattr(args, action.dest, None)
        if action.dest in by_dest:
            if value is not None:
                compaction.append(f"{by_dest[action.dest]} = {_show(action.dest, value)}")
        elif value is not None:
            lines.append(f"{action.dest} = {_show(action.dest, value)}")
    compaction.append(f"api_key_env = {json.dumps(args.summarizer_api_key_env)}")
    lines += compaction
    file = getattr(args, "templates", None)
    if file is not None:
        if file.default_template:
            lines.append(f"default_template = {json.dumps(file.default_template)}")
        for spec in file.templates:
            blocks = ", ".join(b.label for b in spec.blocks) or "no blocks"
            cache = "; prompt cache" if spec.prompt_cache else ""
            lines.append(f"[templates.{spec.name}]  # {blocks}{cache}")
    return "\n".join(lines)
