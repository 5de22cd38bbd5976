"""What a connection needs of its hub (:class:`ConnectionHost`): a Protocol, so that the
connection's shell (hub/server/socket_shell.py) does not import the hub, which imports it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from ..auth import VerifiedTokens
from ..store.base import Store
from .config import HubConfig
from .metrics import Metrics
from .outbox import Held
from .presence import Presence
from .streams import Streams
from .tails import Tails
from .turndispatch import Turns

if TYPE_CHECKING:
    from .workers import WorkerSummarizer

__all__ = ["ConnectionHost"]


class ConnectionHost(Protocol):
    """What a connection (and the ops run on it) needs of its hub: the limits, the byte
    accounting, the metrics, the tails, presence, streams, turns, the store; :class:`~hub.server.
    hub.Hub` is the one implementation."""

    @property
    def config(self) -> HubConfig: ...
    @property
    def tokens(self) -> VerifiedTokens | None:
        """The hub's token verifier (None: no auth secret, tokens are not checked)."""
        ...

    @property
    def held(self) -> Held: ...
    @property
    def metrics(self) -> Metrics: ...
    @property
    def tails(self) -> Tails: ...
    @property
    def presence(self) -> Presence: ...
    @property
    def streams(self) -> Streams: ...
    @property
    def turns(self) -> Turns: ...
    @property
    def store(self) -> Store: ...
    @property
    def worker_summarizer(self) -> WorkerSummarizer | None: ...
    @property
    def closing(self) -> bool:
        """Draining: requests read from now on are refused."""
        ...

    def check_total(self) -> None:
        """Evict the heaviest connections while the hub holds over ``outbox_bytes_total``."""
        ...
