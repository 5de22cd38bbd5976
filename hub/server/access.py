"""A connection's access: which requests its grant allows, the grant's expiry, and the
``auth`` op that renews it in band (docs/security.md).

The token functions (:func:`hub.auth.verify_token`, :data:`hub.auth.OP_LEVELS`) judge a
token; this applies their judgement to one socket, as each op's declaration
(:mod:`protocol.ops`) says: the scope it needs, on the session its field names. A token
that reaches its ``exp`` without an ``auth`` renewal closes the socket with 4001: nothing,
not even a subscription opened before, outlives it.
"""

from __future__ import annotations

import asyncio
import time

from protocol import Forbidden
from protocol import frames as f
from protocol.connection import StreamKey
from protocol.ops import declared

from ..auth import Grant, verify_token
from .connection import CLOSE_TOKEN_EXPIRED, Connection

__all__ = ["allowed", "auth", "set_grant"]


def auth(connection: Connection, request: f.Auth) -> None:
    """The ``auth`` op. Run in the reader, not in a task: the requests read after it are
    judged by the new grant."""
    connection.spawn(connection.send(_renew(connection, request)))


def allowed(connection: Connection, request: f.Request) -> bool:
    """Whether the connection's grant allows ``request``, as its declaration says
    (:mod:`protocol.ops`: the level, the field naming its session, the kind of check)."""
    op = declared(request)
    if op is None:  # undeclared: nothing says what it needs (tests/project/test_ops_declared.py)
        return False
    if op.check == "open":
        return True
    grant = connection.grant
    if grant is None or grant.expired():
        return False
    if op.check == "own":
        return True
    name = str(type(request).__struct_config__.tag)
    target = None if op.session is None else getattr(request, op.session)
    if op.check == "announce":
        if getattr(request, "summarizer", False) and not grant.summarizes():
            return False  # a summarizer needs write somewhere (prompts: on their session)
        return all(grant.allows(name, sid) for sid in target or ())
    session_id = target if isinstance(target, str) else None
    return grant.allows(name, session_id, registry=op.null == "registry" and target is None)


def set_grant(connection: Connection, grant: Grant | None) -> None:
    """Make ``grant`` this connection's. When it expires, unless an ``auth`` request
    has replaced it, the socket is closed with 4001: nothing, not even a subscription
    opened before, outlives the token."""
    connection.grant = grant
    if connection.expiry is not None:
        connection.expiry.cancel()
        connection.expiry = None
    if grant is not None and not connection.closed:
        _watch_expiry(connection, grant)


def _watch_expiry(connection: Connection, grant: Grant) -> None:
    delay = max(0.0, grant.expires_at - time.time())
    connection.expiry = asyncio.get_running_loop().call_later(delay, _expired, connection, grant)


def _expired(connection: Connection, grant: Grant) -> None:
    connection.expiry = None
    if connection.closed or connection.grant is not grant:
        return
    if time.time() < grant.expires_at:  # the loop's clock ran ahead of the wall clock
        _watch_expiry(connection, grant)
        return
    reason = "token expired: connect with a new token, or renew it (auth) before exp"
    connection.spawn(connection.close(CLOSE_TOKEN_EXPIRED, reason))


def _renew(connection: Connection, request: f.Auth) -> f.ReplyFrame | f.ErrorFrame:
    """Replace the grant with the token's, if it verifies; end what it does not cover."""
    secret = connection.hub.config.auth_secret
    if secret is None:  # no auth: tokens are not checked and nothing expires
        return f.ReplyFrame(id=request.id, result={"sub": None, "exp": None, "ended": []})
    try:
        grant = verify_token(secret, request.token)
    except Forbidden:
        return f.ErrorFrame(id=request.id, code="forbidden", message="forbidden")
    set_grant(connection, grant)
    ended = _end_uncovered(connection, grant)
    result = {"sub": grant.subject, "exp": int(grant.expires_at), "ended": ended}
    return f.ReplyFrame(id=request.id, result=result)


def _end_uncovered(connection: Connection, grant: Grant) -> list[StreamKey]:
    """End the subscriptions and presence announcements ``grant`` does not allow; the
    streams ended (the ``auth`` reply lists them: no event of theirs follows it)."""
    ended: list[StreamKey] = []
    for key in list(dict.fromkeys([*connection.subscriptions, *connection.parked])):
        if grant.allows("subscribe", key, registry=key is None):
            continue
        ended.append(key)
        if key is not None:
            connection.presence_watch = connection.presence_watch - {key}
        task = connection.subscriptions.pop(key, None)
        if task is not None:
            task.cancel()  # its done callback does the bookkeeping
        if connection.unpark(key) and task is None:
            connection.subscription_done(key)
    for sid in connection.announced:
        if not grant.allows("presence", sid):
            connection.announced = connection.announced - {sid}
            if not connection.follows(sid):
                connection.hub.presence.leave(connection, sid)
    return ended
