"""``/healthz`` and ``/readyz``: JSON in every state, whatever the database is doing.

Both read the store for real (a broken database shows up here, not on the first user),
bounded in time, and answer 503 with a ``reason`` while the hub shuts down or the store
cannot be read. ``/healthz`` also answers 503 ``degraded`` while a cross-node bus
reconnects; ``/readyz`` does not, since the node still serves then (its followers poll
the log), so a balancer keeps sending it traffic. ``/readyz`` answers 503 ``full`` while
the hub is at ``max_connections`` (hub/server/admission.py), so a balancer sends new
clients elsewhere; ``/healthz`` does not, since a full node is alive.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.responses import JSONResponse

from protocol import SessionHubError

from ..bus import RemoteBus
from .hub import Hub

__all__ = ["HEALTH_TIMEOUT", "health"]

#: How long the store may take to answer the probe's read before it counts as down.
HEALTH_TIMEOUT = 5.0


async def health(hub: Hub, *, ready: bool) -> JSONResponse:
    if hub.closing:
        return JSONResponse(
            {"status": "shutting down", "reason": "the hub is shutting down"}, status_code=503
        )
    try:
        async with asyncio.timeout(HEALTH_TIMEOUT):
            await hub.store.get_session("")
    except TimeoutError:
        return _down(f"the store did not answer within {HEALTH_TIMEOUT:g} s")
    except SessionHubError as exc:  # the store's translated error, its cause in one line
        return _down(str(exc))
    admission = hub.admission
    # `compaction`: whether `compact` can run here (the inspector offers it only then).
    body: dict[str, Any] = {
        "status": "ok",
        "connections": len(hub.connections),
        "compaction": hub.manager.can_compact,
        "admitted": admission.open,
        "max_connections": admission.limit,
    }
    if ready and admission.full:
        body["status"] = "full"
        body["reason"] = f"at the connection limit ({admission.limit})"
        return JSONResponse(body, status_code=503)
    ring = hub.store.bus
    if isinstance(ring, RemoteBus):
        body["bus"] = {
            "kind": type(ring).__name__,
            "connected": ring.connected,
            "reconnects": ring.reconnects,
        }
        if not ring.connected and not ready:
            body["status"] = "degraded"
            return JSONResponse(body, status_code=503)
    return JSONResponse(body)


def _down(reason: str) -> JSONResponse:
    return JSONResponse({"status": "unavailable", "reason": reason}, status_code=503)
