"""Tokens with per-session scopes (HS256 JWT, via pyjwt).

A token's ``scopes`` claim maps session ids (or ``*`` for every session) to one of three
levels, each including the ones before it:

- ``read``: get, history, branches, search, subscribe, presence;
- ``write``: every mutation inside a session (append, upsert, update, delete, clear,
  context writes, tool execution, compaction, usage);
- ``admin``: what creates, renames, ends or deletes sessions (create, rename, end,
  delete, fork, compact_and_split), the registry stream (subscribed to or read) and, on
  ``*``, export, import and pruning the event logs.

Operations not about one session (``list``, cross-session ``search``, the manager's tools)
need the level on ``*``. Being sent a session's summary prompts (a ``hello`` with
``summarizer: true``) needs ``write`` on that session: a summarizer reads the history and
writes the overlay. ``ping`` and ``auth`` (presenting a new token) need no grant.
Verification failures never say why: a forged, expired or malformed token is simply
:class:`~protocol.errors.Forbidden`. docs/security.md has the whole model.
"""

from __future__ import annotations

import collections
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jwt

from protocol.errors import Forbidden, InvalidInput
from protocol.ops import BY_NAME, LEVELS, Level

if TYPE_CHECKING:  # a typing name only (pyjwt 2.8, the oldest supported, may lack it)
    from jwt.types import Options

__all__ = ["LEVELS", "OP_LEVELS", "Grant", "VerifiedTokens", "issue_token", "parse_ttl", "verify_token"]

_RANK = {level: i for i, level in enumerate(LEVELS)}
_ALGORITHM = "HS256"

#: The level each operation needs (on its session, or on ``*`` when it has none): the
#: requests' declarations (:data:`protocol.ops.DECLARED`), and one that is no request.
OP_LEVELS: dict[str, Level] = {
    **{name: op.level for name, op in BY_NAME.items()},
    # being sent this session's summary prompts (a hello with ``summarizer: true``)
    "summarize": "write",
}
#: Ops allowed to any live grant whatever its scopes (``ping``; ``auth``, which checks
#: the token it brings).
_OPEN = frozenset(name for name, op in BY_NAME.items() if op.check == "open")


@dataclass(frozen=True)
class Grant:
    """What a verified token allows."""

    subject: str
    scopes: Mapping[str, Level]
    expires_at: float

    def level(self, session_id: str | None) -> int:
        """The rank of the best level this grant has on ``session_id`` (``None``: ``*``)."""
        best = -1
        for key in ("*", session_id):
            if key is not None and key in self.scopes:
                best = max(best, _RANK[self.scopes[key]])
        return best

    def allows(
        self, op: str, session_id: str | None, *, registry: bool = False, now: float | None = None
    ) -> bool:
        """Whether ``op`` on ``session_id`` is allowed at ``now`` (default: the wall clock;
        ``registry``: the registry stream, which needs ``admin`` on ``*``). Unknown ops are
        refused."""
        if (time.time() if now is None else now) >= self.expires_at:
            return False
        needed = OP_LEVELS.get(op)
        if needed is None:
            return False
        if op in _OPEN:
            return True
        if registry:
            return self.level(None) >= _RANK["admin"]
        return self.level(session_id) >= _RANK[needed]

    def expired(self, now: float | None = None) -> bool:
        return (time.time() if now is None else now) >= self.expires_at

    def summarizes(self, now: float | None = None) -> bool:
        """Whether this grant may summarize some session (``write`` on any session or on
        ``*``) at ``now``: what a ``hello`` with ``summarizer: true`` needs."""
        return (time.time() if now is None else now) < self.expires_at and any(
            _RANK[v] >= _RANK["write"] for v in self.scopes.values()
        )


def issue_token(
    secret: str,
    scopes: Mapping[str, str],
    *,
    subject: str = "sessionhub",
    ttl: float = 3600.0,
    now: float | None = None,
) -> str:
    """A signed token granting ``scopes`` (``{session id or "*": "read"|"write"|"admin"}``)."""
    if not secret:
        raise InvalidInput("a token needs a non-empty secret")
    for key, level in scopes.items():
        if level not in _RANK:
            raise InvalidInput(f"scope for {key!r} must be one of read, write, admin; got {level!r}")
    issued = time.time() if now is None else now
    claims: dict[str, Any] = {
        "sub": subject,
        "iat": int(issued),
        "exp": int(issued + ttl),
        "scopes": dict(scopes),
    }
    return jwt.encode(claims, secret, algorithm=_ALGORITHM)


def verify_token(secret: str, token: str | None, now: float | None = None) -> Grant:
    """The grant of a valid token; :class:`Forbidden` (saying nothing more) otherwise.
    ``now``: the time its ``exp`` is judged at (default: the wall clock), so that a caller
    that reads no clock (:class:`protocol.serverconn.ServerConnection`) can verify."""
    claims, grant = _signed(secret, token)
    if not _current(claims, time.time() if now is None else now):
        raise Forbidden("forbidden")
    return grant


class VerifiedTokens:
    """:func:`verify_token` for one secret, remembering the tokens whose signature it has
    checked: many connections present the same token (a dashboard's, a deployment's
    workers'), and the HMAC and JSON decoding are most of a connect's verification cost.

    Only the signature and the claims' shape are remembered, never a verdict on time:
    ``exp``, ``nbf`` and ``iat`` are judged again on every use, so a remembered token
    expires exactly when an unremembered one does. The key is the whole token string, so a
    forged token (another signature) is never a hit. At most ``size`` tokens are kept, the
    least recently used dropped first, so a flood of distinct tokens costs only misses."""

    __slots__ = ("_known", "secret", "size")

    def __init__(self, secret: str, size: int = 1024) -> None:
        self.secret = secret
        self.size = size
        self._known: collections.OrderedDict[str, tuple[Mapping[str, Any], Grant]] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._known)

    def verify(self, token: str | None, now: float | None = None) -> Grant:
        """As :func:`verify_token` with this secret."""
        if not token:
            raise Forbidden("forbidden")
        known = self._known.get(token)
        if known is None:
            known = _signed(self.secret, token)
            self._known[token] = known
            if len(self._known) > self.size:
                self._known.popitem(last=False)
        else:
            self._known.move_to_end(token)
        claims, grant = known
        if not _current(claims, time.time() if now is None else now):
            # Past exp it never verifies again; before nbf/iat it stays (it may verify later).
            if grant.expired(time.time() if now is None else now):
                self._known.pop(token, None)
            raise Forbidden("forbidden")
        return grant


def _signed(secret: str, token: str | None) -> tuple[Mapping[str, Any], Grant]:
    """A token's claims and grant once its signature and claims' shape are checked; its
    times (exp, iat, nbf) are not judged here but by :func:`_current`, at the caller's time."""
    if not token:
        raise Forbidden("forbidden")
    options: Options = {
        "require": ["exp", "sub"],
        "verify_exp": False,
        "verify_iat": False,
        "verify_nbf": False,
    }
    try:
        claims = jwt.decode(token, secret, algorithms=[_ALGORITHM], options=options, leeway=0)
    except jwt.PyJWTError:
        raise Forbidden("forbidden") from None
    exp = claims["exp"]
    if isinstance(exp, bool) or not isinstance(exp, int | float):
        raise Forbidden("forbidden")
    scopes = claims.get("scopes")
    if not isinstance(scopes, dict) or not all(isinstance(k, str) and v in _RANK for k, v in scopes.items()):
        raise Forbidden("forbidden")
    return claims, Grant(subject=str(claims["sub"]), scopes=scopes, expires_at=float(exp))


def _current(claims: Mapping[str, Any], now: float) -> bool:
    """What pyjwt checks at the wall clock, judged at ``now``: before exp, not issued or
    valid only in the future (no leeway)."""

    def number(name: str) -> float | None:
        value = claims.get(name)
        return None if isinstance(value, bool) or not isinstance(value, int | float) else float(value)

    exp, iat, nbf = number("exp"), number("iat"), number("nbf")
    if exp is None or exp <= now:
        return False
    if "iat" in claims and (iat is None or iat > now):
        return False
    return not ("nbf" in claims and (nbf is None or nbf > now))


_TTL = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")


def parse_ttl(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``1h``, ``7d`` → seconds."""
    found = _TTL.match(text)
    if not found:
        raise InvalidInput(f"ttl must look like 90s, 15m, 1h or 7d; got {text!r}")
    value, unit = float(found.group(1)), found.group(2) or "s"
    return value * {"s": 1, "m": 60, "h": 3600, "d": 86400}[unit]
