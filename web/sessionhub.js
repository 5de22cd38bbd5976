// sessionhub.js: the hub's wire protocol for browsers and Node, no dependencies.
//
// One WebSocket per client. Requests carry ids and resolve with their reply (or reject with
// a HubError carrying the wire `code`). Subscriptions remember the (epoch, seq) of the last
// event they delivered: after a dropped connection (any close: a draining hub's 1001 too) the
// client reconnects with jittered exponential backoff, to the next of its hub URLs when it has
// several, and resubscribes from there, so every event is delivered once, in order. A request
// in flight when the socket drops rejects with ConnectionLost (it is not retried: it may have
// been applied). Same guarantees as the Python client (clients/client.py); the protocol state is
// a port of protocol/clientconn.py's ClientConnection. See docs/js-client.md.
//
// This file is the entry: import from it (the hub serves it at /sessionhub.js). The parts,
// ES modules under sessionhub/ that it loads with no build step: errors.js (HubError and the
// rest), connection.js (ClientConnection, the sans-I/O protocol state), link.js (HubLink: the
// socket, its reconnects and the frames in), client.js (HubClient, the API over it), live.js
// (LiveMessages, applyDelta).

export { ClientConnection } from "./sessionhub/connection.js";
export { CONNECTION_LOST_CODE, ConnectionLost, HubError, PositionLost, errorFrom } from "./sessionhub/errors.js";
export { HubClient } from "./sessionhub/client.js";
export { nextBackoff } from "./sessionhub/link.js";
export { LiveMessages, applyDelta } from "./sessionhub/live.js";
export { PresenceList } from "./presence.js";

/** The hub's WebSocket URL for a page served by the hub (http -> ws, https -> wss). */
export function hubUrlFor(location) {
  const url = new URL("/ws", location.href);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  url.hash = "";
  url.search = "";
  return url.toString();
}
