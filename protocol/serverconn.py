"""Sans-I/O server side of one client connection: frames and clock ticks in, effects out.

:class:`ServerConnection` is the state of one socket as the protocol sees it: who the peer
said it is (``hello``), the grant of its token and when that expires (``auth`` renews it),
the streams it follows and from which position, how many of its requests are unanswered,
and the sessions it is present on. It decides; the hub's I/O shell
(``hub.server.peer.Connection``) performs what it decides: it sends the frames, arms the
expiry timer, stops subscription tasks, tells presence, closes the socket. Nothing here
awaits, reads a clock (the caller passes ``now``) or knows the hub; ``tests/vectors/
server_connection.json`` holds the cases, run by ``tests/protocol/test_server_vectors.py``.

What stays with the shell, because it is I/O or on the fan-out path: the subscription
tasks and live tail registrations (a live event's seq is kept by the tail, not here: one
write per event per subscriber is what fan-out must not pay), the outbox and its byte
accounting, the export/import in progress.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Literal, Protocol, TypeVar

from .codec import FrameError, decode_request
from .errors import Forbidden
from .frames import (
    Auth,
    ErrorCode,
    ErrorFrame,
    Hello,
    ReplyFrame,
    Request,
    ResetFrame,
    Subscribe,
    Unsubscribe,
)
from .ops import declared

__all__ = [
    "CLOSE_TOKEN_EXPIRED",
    "ArmExpiry",
    "Close",
    "EndSubscription",
    "GrantLike",
    "Join",
    "Leave",
    "Reannounce",
    "Refused",
    "Resume",
    "Send",
    "ServerConnection",
    "ServerEffect",
    "StreamKey",
    "Subscription",
    "Verify",
]

#: A subscription's stream: a session id, or None for the registry.
StreamKey = str | None

#: Close code for a connection whose token reached its ``exp`` without an ``auth`` renewal.
CLOSE_TOKEN_EXPIRED = 4001
EXPIRED_REASON = "token expired: connect with a new token, or renew it (auth) before exp"


class GrantLike(Protocol):
    """What a verified token allows (``hub.auth.Grant`` is the one implementation): judged
    at the ``now`` given, so that the state machine reads no clock."""

    @property
    def subject(self) -> str: ...
    @property
    def expires_at(self) -> float: ...
    def allows(
        self, op: str, session_id: str | None, *, registry: bool = False, now: float | None = None
    ) -> bool: ...
    def summarizes(self, now: float | None = None) -> bool: ...


G = TypeVar("G", bound=GrantLike)

#: Verifies a token at a time: its grant, or :class:`~protocol.errors.Forbidden`. A pure
#: function of the token and ``now`` (``hub.auth.verify_token`` with the hub's secret).
Verify = Callable[[str | None, float], G]


# -- effects ----------------------------------------------------------------------------------
#
# What the shell does. A request that may run is no effect object: ``receive_text`` returns
# the decoded request itself (running it is the common case; it allocates nothing more).


@dataclass(frozen=True, slots=True)
class Refused:
    """The frame does not run: send ``frame``. ``reason``: ``bad_frame`` (malformed, or a
    subscribe/unsubscribe the connection's subscriptions refuse: counted by code),
    ``draining`` (the hub stops taking requests), ``forbidden`` (the grant does not allow it)."""

    frame: ErrorFrame
    reason: Literal["bad_frame", "draining", "forbidden"]


@dataclass(frozen=True, slots=True)
class Send:
    """Send this frame (a reply, an error, a reset)."""

    frame: ReplyFrame | ErrorFrame | ResetFrame


@dataclass(frozen=True, slots=True)
class Close:
    """Close the socket with ``code``, after what is queued."""

    code: int
    reason: str


@dataclass(frozen=True, slots=True)
class ArmExpiry:
    """Call :meth:`ServerConnection.tick` at ``at`` (epoch seconds); replaces any timer
    armed before. ``at`` None: no timer (no grant)."""

    at: float | None


@dataclass(frozen=True, slots=True)
class EndSubscription:
    """Stop following ``key`` now (its task, its live registration): a renewed grant does
    not cover it. No event of it may follow the ``auth`` reply."""

    key: StreamKey


@dataclass(frozen=True, slots=True)
class Join:
    """Put the connection on ``session_id``'s presence."""

    session_id: str


@dataclass(frozen=True, slots=True)
class Leave:
    """Take the connection off ``session_id``'s presence."""

    session_id: str


@dataclass(frozen=True, slots=True)
class Reannounce:
    """The connection's name or role may have changed: announce it again on every session
    it is present on."""


@dataclass(frozen=True, slots=True)
class Resume:
    """Fewer than ``max_in_flight`` requests are unanswered again: read the next frame."""


ServerEffect = Refused | Send | Close | ArmExpiry | EndSubscription | Join | Leave | Reannounce | Resume

_RESUME = Resume()
_REANNOUNCE = Reannounce()


@dataclass(slots=True)
class Subscription:
    """A stream followed: where its subscribe asked to start (``after_seq``, ``epoch``:
    None for a fresh start), whether it asked for the session's presence frames, and the
    epoch the hub serves it from once opened."""

    after_seq: int
    epoch: str | None
    presence: bool
    serving: str | None = None


def _error(rid: str | int | None, code: ErrorCode, message: str) -> ErrorFrame:
    return ErrorFrame(id=rid, code=code, message=message)


class ServerConnection(Generic[G]):
    """One client connection, server side: the state the protocol defines, no I/O. ``G``:
    the grant type its ``verify`` returns."""

    __slots__ = (
        "announced",
        "grant",
        "in_flight",
        "max_frame_bytes",
        "max_in_flight",
        "max_subscriptions",
        "name",
        "presence_watch",
        "role",
        "subscriptions",
        "summarizer",
        "verify",
    )

    def __init__(
        self,
        *,
        max_frame_bytes: int = 1 << 20,
        max_subscriptions: int = 64,
        max_in_flight: int = 64,
        verify: Verify[G] | None = None,
    ) -> None:
        self.max_frame_bytes = max_frame_bytes
        self.max_subscriptions = max_subscriptions
        self.max_in_flight = max_in_flight
        #: None: auth is off (every request runs, nothing expires).
        self.verify = verify
        self.grant: G | None = None
        self.subscriptions: dict[StreamKey, Subscription] = {}
        #: Sessions whose joins and leaves a subscription asked for (a frozenset: presence
        #: fan-out tests membership on every connection, and thousands share the empty one).
        self.presence_watch: frozenset[str] = frozenset()
        self.name: str | None = None
        self.role: str | None = None
        self.announced: frozenset[str] = frozenset()  # sessions declared with hello
        self.summarizer = False  # declared with hello: this peer writes summaries
        self.in_flight = 0

    # -- frames in ------------------------------------------------------------------------

    def receive_text(self, data: str | bytes, now: float, draining: bool = False) -> Request | Refused:
        """The request to run, or why it does not. A subscribe that runs is a subscription
        from now on (an ``unsubscribe`` read next finds it); an unsubscribe that runs has
        ended it."""
        try:
            request = decode_request(data, self.max_frame_bytes)
        except FrameError as exc:
            return Refused(exc.frame, "bad_frame")
        kind = type(request)  # one look at the type: this runs for every request read
        if kind is Subscribe or kind is Unsubscribe:
            return self._receive_subscription(request, now, draining)  # type: ignore[arg-type]
        if draining:
            # Refused when read; requests read before the drain began run to the end.
            return Refused(_error(request.id, "unavailable", "the hub is shutting down"), "draining")
        if self.verify is not None and not self.allowed(request, now):
            # One message whatever the reason (no token, bad signature, expired, no scope).
            return Refused(_error(request.id, "forbidden", "forbidden"), "forbidden")
        return request

    def _receive_subscription(
        self, request: Subscribe | Unsubscribe, now: float, draining: bool
    ) -> Request | Refused:
        """A subscribe or unsubscribe: first what the connection's subscriptions refuse
        (counted as bad frames), then the draining and access refusals; changed only if it
        runs."""
        key = request.session_id
        if isinstance(request, Subscribe):
            refusal = self._refuse_subscribe(request)
            if refusal is not None:
                return Refused(refusal, "bad_frame")
        elif key not in self.subscriptions:
            return Refused(_error(request.id, "not_found", "not subscribed to this stream"), "bad_frame")
        if draining:
            return Refused(_error(request.id, "unavailable", "the hub is shutting down"), "draining")
        if self.verify is not None and not self.allowed(request, now):
            return Refused(_error(request.id, "forbidden", "forbidden"), "forbidden")
        if isinstance(request, Subscribe):
            self.subscriptions[key] = Subscription(request.after_seq, request.epoch, request.presence)
            if request.presence and key is not None:
                self.presence_watch = self.presence_watch | {key}
        else:
            self._forget(key)
        return request

    def _refuse_subscribe(self, request: Subscribe) -> ErrorFrame | None:
        if request.session_id in self.subscriptions:
            return _error(request.id, "invalid", "already subscribed to this stream")
        if len(self.subscriptions) >= self.max_subscriptions:
            message = f"at most {self.max_subscriptions} subscriptions per connection"
            return _error(request.id, "too_many", message)
        if request.after_seq < 0:
            return _error(request.id, "invalid", "after_seq must be >= 0")
        return None

    def allowed(self, request: Request, now: float) -> bool:
        """Whether the grant allows ``request`` at ``now``, as its declaration says
        (:mod:`protocol.ops`: the level, the field naming its session, the kind of check)."""
        op = declared(request)
        if op is None:  # undeclared: nothing says what it needs (tests/project/test_ops_declared.py)
            return False
        if op.check == "open":
            return True
        grant = self.grant
        if grant is None or now >= grant.expires_at:
            return False
        if op.check == "own":
            return True
        name = str(type(request).__struct_config__.tag)
        target = None if op.session is None else getattr(request, op.session)
        if op.check == "announce":
            if getattr(request, "summarizer", False) and not grant.summarizes(now):
                return False  # a summarizer needs write somewhere (prompts: on their session)
            return all(grant.allows(name, sid, now=now) for sid in target or ())
        session_id = target if isinstance(target, str) else None
        return grant.allows(name, session_id, registry=op.null == "registry" and target is None, now=now)

    # -- auth ----------------------------------------------------------------------------------

    def connect(self, token: str | None, now: float) -> list[ServerEffect]:
        """The socket opened with ``token``. A bad one does not close it: each request is
        refused ``forbidden`` (an ``auth`` request may still bring a good one)."""
        if self.verify is None:
            return []
        try:
            self.grant = self.verify(token, now)
        except Forbidden:
            return []
        return [ArmExpiry(self.grant.expires_at)]

    def renew(self, request: Auth, now: float) -> list[ServerEffect]:
        """The ``auth`` op: the token's grant replaces the connection's, if it verifies;
        what it does not cover ends (the reply lists the streams ended: no event of theirs
        follows it). The requests read after it are judged by the new grant."""
        if self.verify is None:  # no auth: tokens are not checked and nothing expires
            return [Send(ReplyFrame(id=request.id, result={"sub": None, "exp": None, "ended": []}))]
        try:
            grant = self.verify(request.token, now)
        except Forbidden:
            return [Send(_error(request.id, "forbidden", "forbidden"))]
        self.grant = grant
        effects: list[ServerEffect] = [ArmExpiry(grant.expires_at)]
        ended: list[StreamKey] = []
        for key in list(self.subscriptions):
            if not grant.allows("subscribe", key, registry=key is None, now=now):
                ended.append(key)
                self._forget(key)
                effects.append(EndSubscription(key))
        for sid in sorted(self.announced):
            if not grant.allows("presence", sid, now=now):
                self.announced = self.announced - {sid}
                if sid not in self.subscriptions:
                    effects.append(Leave(sid))
        result = {"sub": grant.subject, "exp": int(grant.expires_at), "ended": ended}
        effects.append(Send(ReplyFrame(id=request.id, result=result)))
        return effects

    def tick(self, now: float) -> list[ServerEffect]:
        """The expiry timer fired: a grant past its ``exp`` closes the socket with 4001
        (nothing, not even a subscription opened before, outlives the token); one not yet
        past it (the timer's clock ran ahead of the wall clock) arms the timer again."""
        grant = self.grant
        if grant is None:
            return []
        if now < grant.expires_at:
            return [ArmExpiry(grant.expires_at)]
        return [Close(CLOSE_TOKEN_EXPIRED, EXPIRED_REASON)]

    def may_summarize(self, session_id: str | None, now: float) -> bool:
        """Whether this connection may be sent summary prompts about ``session_id`` (None:
        a session not named, judged on ``*``) and answer them: ``write`` on it."""
        if self.verify is None:
            return True
        return self.grant is not None and self.grant.allows("summarize", session_id, now=now)

    # -- subscriptions -------------------------------------------------------------------------

    def follows(self, key: StreamKey) -> bool:
        return key in self.subscriptions

    def opened(self, request: Subscribe, epoch: str, first_seq: int, last_seq: int) -> Send:
        """The stream ``request`` subscribes to stands at ``epoch``, ``first_seq``..
        ``last_seq``: the reply to it (the stream is served from there), or the ``reset``
        for a position the log cannot serve (another epoch, pruned, the future)."""
        seq, asked = request.after_seq, request.epoch
        if (asked is not None and last_seq > 0 and asked != epoch) or seq > last_seq or seq < first_seq - 1:
            return self.reset(request.session_id, seq, epoch, first_seq, last_seq)
        sub = self.subscriptions.get(request.session_id)
        if sub is not None:
            # An empty stream has no epoch yet: its first event brings it.
            sub.serving = epoch if last_seq > 0 else None
        return Send(ReplyFrame(id=request.id, result={"epoch": epoch, "last_seq": last_seq}))

    def reset(self, key: StreamKey, after_seq: int, epoch: str, first_seq: int, last_seq: int) -> Send:
        """The ``reset`` frame for a subscription whose position the log cannot serve."""
        frame = ResetFrame(
            session_id=key,
            after_seq=after_seq,
            epoch=epoch,
            first_seq=first_seq,
            last_seq=last_seq,
            message="the log cannot serve events after this position; reload and resubscribe",
        )
        return Send(frame)

    def ended(self, key: StreamKey) -> Leave | None:
        """A subscription ended (unsubscribed, reset, an error, the grant): it no longer
        counts, and the connection leaves the session unless ``hello`` announced it."""
        self._forget(key)
        if key is not None and key not in self.announced:
            return Leave(key)
        return None

    def _forget(self, key: StreamKey) -> None:
        self.subscriptions.pop(key, None)
        if key is not None and key in self.presence_watch:
            self.presence_watch = self.presence_watch - {key}

    # -- presence ------------------------------------------------------------------------------

    def hello(self, request: Hello) -> list[ServerEffect]:
        """Who this connection is, and the sessions it is on without subscribing."""
        self.name, self.role = request.name, request.role
        self.summarizer = request.summarizer
        before = self.announced
        self.announced = frozenset(request.sessions)
        effects: list[ServerEffect] = [
            Leave(sid) for sid in sorted(before - self.announced) if sid not in self.subscriptions
        ]
        effects.append(_REANNOUNCE)
        effects.extend(Join(sid) for sid in sorted(self.announced))
        return effects

    # -- requests in flight --------------------------------------------------------------------

    @property
    def reading(self) -> bool:
        """Whether the next frame may be read: fewer than ``max_in_flight`` requests are
        unanswered (past it the socket is not read, and the peer's sends back up)."""
        return self.in_flight < self.max_in_flight

    def started(self) -> None:
        """A request (or a reply to send) is in flight."""
        self.in_flight += 1

    def finished(self) -> Resume | None:
        """One is answered; :class:`Resume` while that leaves room to read (the shell
        wakes its reader if it waits)."""
        self.in_flight -= 1
        return _RESUME if self.in_flight < self.max_in_flight else None
