"""What several ``sessionhub`` commands parse alike: the argument types (sizes, ages,
counts), ``--db``, the token's default, and the check of an HS256 secret.

Kept apart from the commands so that ``serve`` (:mod:`hub.apps.serve`) and the others
(:mod:`hub.apps.cli`) read their options the same way without importing each other.
"""

from __future__ import annotations

import argparse
import os

__all__ = [
    "MIN_SECRET_BYTES",
    "TOKEN",
    "add_db_option",
    "age",
    "age_or_zero",
    "positive",
    "secret_problem",
    "size",
    "whole",
]

#: HS256 keys shorter than the hash are guessable offline from one token (RFC 7518 3.2).
MIN_SECRET_BYTES = 32

#: ``--token``'s default for the commands that talk to a hub.
TOKEN = os.environ.get("SESSIONHUB_TOKEN") or None

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def add_db_option(parser: argparse.ArgumentParser) -> None:
    """``--db``, as every command that opens the store takes it."""
    parser.add_argument(
        "--db",
        default=os.environ.get("SESSIONHUB_DB") or "sessionhub.db",
        help="SQLite file (a path or sqlite:///PATH) or postgresql:// DSN "
        "(default: $SESSIONHUB_DB or %(default)s)",
    )


def secret_problem(secret: str | None, where: str) -> str | None:
    """What is wrong with ``secret`` as an HS256 key (``where`` names its source), or None."""
    if secret is not None and len(secret.encode()) < MIN_SECRET_BYTES:
        return (
            f"{where} is {len(secret.encode())} bytes; HS256 needs at least {MIN_SECRET_BYTES} "
            "(make one with: python -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    return None


def size(text: str) -> int:
    """A byte count: 1048576, 512K, 16M, 1G (also KiB, MiB, GiB)."""
    value = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = value[-1:] if value[-1:] in ("K", "M", "G") else ""
    try:
        number = int(value[: len(value) - len(unit)])
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (say 65536, 512K, 16M or 1G)") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"a size must be at least 1 byte, not {text!r}")
    return number * _UNITS[unit]


def age(text: str) -> float:
    """An age in seconds: 90s, 15m, 12h, 30d, 2w."""
    from protocol.errors import InvalidInput

    from ..retention import parse_age

    try:
        return parse_age(text).total_seconds()
    except InvalidInput as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def age_or_zero(text: str) -> float:
    """:func:`age`, or ``0`` for none at all."""
    return 0.0 if text.strip() == "0" else age(text)


def whole(text: str) -> int:
    """A count of at least 0."""
    try:
        number = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, not {number}")
    return number


def positive(text: str) -> int:
    """A count of at least 1."""
    try:
        number = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {number}")
    return number
