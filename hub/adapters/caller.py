"""Who is calling an adapter's HTTP door: its origin, its token, and what that token allows.

Every door applies the same rules before it reads a body (docs/security.md, "Every door"):
a browser page from an origin the hub does not allow is refused; with an auth secret, the
``Authorization: Bearer`` token is verified first (a stranger's body is never read), and
each action needs the scope the equivalent WebSocket op needs (:meth:`Caller.check`, by
the op's name: ``hub.auth.OP_LEVELS``, declared in ``protocol/ops.py``). Each door renders
a refusal in its own protocol's form.
"""

from __future__ import annotations

from dataclasses import dataclass

from starlette.datastructures import Headers

from protocol import Forbidden

from ..auth import Grant, verify_token
from ..server.config import HubConfig
from ..store.clientwrites import WRITER, Writer

__all__ = ["Caller", "bearer", "caller", "cors_headers", "origin_allowed", "writing"]


def bearer(headers: Headers) -> str | None:
    """The token of ``Authorization: Bearer <token>``, or None."""
    header = headers.get("authorization", "")
    return header[7:].strip() if header[:7].lower() == "bearer " else None


@dataclass(frozen=True)
class Caller:
    """A verified caller: ``grant`` is None when the hub has no auth secret (``auth``
    False: everything is allowed)."""

    auth: bool
    grant: Grant | None

    def allows(self, op: str, session_id: str | None) -> bool:
        """Whether the token may do what the WebSocket op ``op`` does on ``session_id``."""
        return not self.auth or (self.grant is not None and self.grant.allows(op, session_id))

    def check(self, op: str, session_id: str | None) -> None:
        """:class:`~protocol.Forbidden` unless :meth:`allows`."""
        if not self.allows(op, session_id):
            raise Forbidden("forbidden")


#: The caller of a hub without an auth secret, and of code that runs outside a request.
ANYONE = Caller(False, None)


def caller(headers: Headers, config: HubConfig) -> Caller:
    """The request's caller; :class:`~protocol.Forbidden` for a missing or bad token when
    the hub has an auth secret (checked before the body is read). It is also the writer
    of what the request appends (:func:`writing`)."""
    if config.auth_secret is None:
        return writing(ANYONE, config)
    return writing(Caller(True, verify_token(config.auth_secret, bearer(headers))), config)


def writing(who: Caller, config: HubConfig) -> Caller:
    """``who``, made the writer of what this task (and the tasks it starts) writes: a message
    may reference a stored file only if its writer may read it (hub/store/attachments.py),
    and loses the metadata keys the hub reserves (hub/store/clientwrites.py)."""
    reserved = frozenset(config.reserved_metadata_keys)
    WRITER.set(Writer(who.auth, who.grant, reserved, config.max_upload_bytes_per_token))
    return who


def origin_allowed(headers: Headers, config: HubConfig) -> bool:
    """Whether a browser page may drive the hub through this door: no ``Origin`` (not a
    browser), the request's own host, or one of ``allowed_origins`` (``*``: any)."""
    origin = headers.get("origin")
    if origin is None or origin.split("://", 1)[-1] == headers.get("host", ""):
        return True
    allowed = config.allowed_origins
    return origin in allowed or "*" in allowed


def cors_headers(headers: Headers, config: HubConfig, *, expose: str = "") -> dict[str, str] | None:
    """CORS headers for an allowed cross-origin browser, ``{}`` for same-origin or
    non-browser clients, None for an origin that is not allowed (refuse it)."""
    if not origin_allowed(headers, config):
        return None
    origin = headers.get("origin")
    if origin is None or origin.split("://", 1)[-1] == headers.get("host", ""):
        return {}
    cors = {
        "access-control-allow-origin": origin,
        "access-control-allow-headers": "authorization, content-type",
        "access-control-allow-methods": "GET, POST, OPTIONS",
        "access-control-max-age": "600",
        "vary": "Origin",
    }
    if expose:
        cors["access-control-expose-headers"] = expose
    return cors
