"""The hub's Prometheus metrics."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from ..bus import RemoteBus
from .outbox import Held


class Admission(Protocol):
    """What the metrics read of hub/server/admission.py's ``Admission`` (a Protocol: the
    adapters may import this module, and not that one)."""

    @property
    def limit(self) -> int | None: ...
    @property
    def open(self) -> int: ...
    @property
    def refused_websocket(self) -> int: ...
    @property
    def refused_http(self) -> int: ...


class Metrics:
    """Prometheus metrics of one app (its own registry, so several apps can coexist)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.connections = Gauge(
            "sessionhub_connections", "Open WebSocket connections", registry=self.registry
        )
        self.subscriptions = Gauge("sessionhub_subscriptions", "Active subscriptions", registry=self.registry)
        self.delivered = Counter(
            "sessionhub_events_delivered", "Event frames queued to subscribers", registry=self.registry
        )
        self.evictions = Counter(
            "sessionhub_evictions",
            "Connections evicted (close code 4008): too slow, or over a byte limit; once each",
            registry=self.registry,
        )
        self.sse_dropped = Counter(
            "sessionhub_sse_dropped",
            "Chat SSE readers dropped: over outbox_bytes unsent (behind), or a send not taken "
            "for send_timeout (timeout); the reply went on for everyone else",
            ["reason"],
            registry=self.registry,
        )
        self.tail_evictions = Counter(
            "sessionhub_tail_evictions",
            "Events dropped from tail caches to stay within tail_bytes or tail_bytes_total",
            registry=self.registry,
        )
        self.reads_paused = Counter(
            "sessionhub_reads_paused",
            "Times a connection's socket stopped being read: max_in_flight requests unanswered",
            registry=self.registry,
        )
        self.bad_frames = Counter(
            "sessionhub_bad_frames",
            "Frames answered with an error before running",
            ["code"],
            registry=self.registry,
        )
        self.op_seconds = Histogram(
            "sessionhub_op_seconds",
            "Time to run one request",
            ["op"],
            registry=self.registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0),
        )

    def watch_held(self, held: Held) -> None:
        """Export the bytes the hub holds for its peers (read at scrape time)."""
        for name, help_, attr in (
            ("sessionhub_outbox_bytes", "Frames queued in outboxes, in bytes", "outbox"),
            ("sessionhub_waiting_bytes", "Replies waiting for room in an outbox, in bytes", "waiting"),
            ("sessionhub_replay_bytes", "Backlog held by catching-up subscriptions, in bytes", "replay"),
            ("sessionhub_tail_bytes", "Event frames cached by stream tails, in bytes", "tail"),
        ):
            gauge = Gauge(name, help_, registry=self.registry)
            gauge.set_function(functools.partial(_read_held, held, attr))

    def watch_sse(self, held: Held) -> None:
        """Export what chat SSE readers have queued (read at scrape time)."""
        Gauge(
            "sessionhub_sse_bytes",
            "Chunks queued for chat SSE readers, in bytes (a chunk shared by readers counts once per reader)",
            registry=self.registry,
        ).set_function(functools.partial(_read_held, held, "outbox"))

    def watch_admission(self, admission: Admission) -> None:
        """Export the connections served, the limit and the refusals (read at scrape time)."""
        Gauge(
            "sessionhub_connections_admitted",
            "Connections served now against max_connections: WebSockets and HTTP requests, not the probes",
            registry=self.registry,
        ).set_function(lambda: float(admission.open))
        Gauge(
            "sessionhub_max_connections", "The connection limit (0: none)", registry=self.registry
        ).set_function(lambda: float(admission.limit or 0))
        self.registry.register(_Refused(admission))

    def watch_bus(self, bus: RemoteBus) -> None:
        """Export a cross-node bus's state (read at scrape time)."""
        Gauge(
            "sessionhub_bus_connected", "1 while the cross-node bus listens", registry=self.registry
        ).set_function(lambda: float(bus.connected))
        Gauge(
            "sessionhub_bus_reconnects", "Times the bus listener was re-established", registry=self.registry
        ).set_function(lambda: float(bus.reconnects))
        Gauge(
            "sessionhub_relay_dropped",
            "Relayed frames (stream deltas, presence) dropped: send failures or backlog",
            registry=self.registry,
        ).set_function(lambda: float(bus.relay_dropped))


def _read_held(held: Held, attr: str) -> float:
    return float(getattr(held, attr))


class _Refused(Collector):
    """``sessionhub_connections_refused_total{kind}``: counted by the admission gate itself
    (a plain int per refusal), read here at scrape time."""

    def __init__(self, admission: Admission) -> None:
        self.admission = admission

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "sessionhub_connections_refused",
            "Connections refused at max_connections: WebSockets closed with 1013, HTTP requests answered 503",
            labels=["kind"],
        )
        family.add_metric(["websocket"], self.admission.refused_websocket)
        family.add_metric(["http"], self.admission.refused_http)
        yield family
