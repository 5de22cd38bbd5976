"""What ``serve`` does to the hub's manager: the compaction of its options and the
session templates of its configuration file (:mod:`hub.apps.templatefile`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING

from .templatefile import build_templates

if TYPE_CHECKING:
    from ..manager import SessionManager
    from .serve_compaction import ServeCompaction

__all__ = ["configure_manager"]


def configure_manager(
    args: argparse.Namespace, compaction: ServeCompaction | None
) -> Callable[[SessionManager], None] | None:
    """``create_app``'s ``configure_manager``; None when there is nothing to configure."""
    file = getattr(args, "templates", None)
    specs = [] if file is None else file.templates
    default = None if file is None else file.default_template
    if compaction is None and not specs:
        return None

    def configure(manager: SessionManager) -> None:
        if compaction is not None:
            compaction.configure(manager)
        if specs:
            manager.with_templates(build_templates(specs, manager), default)

    return configure
