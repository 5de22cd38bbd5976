// HubLink: the socket under a HubClient, kept open across drops: opening it over one hub URL
// or several (failover, round robin), the hello, reconnects with jittered exponential backoff,
// resubscribing from each stream's position, requests waiting for a socket, and the frames in,
// whose effects (computed by its ClientConnection, ./connection.js) it performs.

import { ClientConnection, idOf } from "./connection.js";
import { ConnectionLost, HubError, PositionLost, errorFrom } from "./errors.js";

/** How long before subscribing again to a stream the hub ended with an `unsubscribed` frame. */
const RESUBSCRIBE_AFTER_MS = 1000;

/** Send on a socket that may be closing: false (and nothing sent) if it refuses. */
function sendQuietly(ws, data) {
  try {
    ws.send(data);
    return true;
  } catch {
    return false;
  }
}

/** Exponential backoff: 0, then first, doubling, capped (ms). */
export function nextBackoff(previous, first, cap) {
  return Math.min(cap, Math.max(first, previous * 2));
}

const STATES = ["connecting", "open", "reconnecting", "closed"];

/** One hub URL, or a non-empty list of them, as a list. */
function urlList(url) {
  const urls = typeof url === "string" ? [url] : Array.isArray(url) ? [...url] : [];
  if (urls.length === 0 || !urls.every((u) => typeof u === "string" && u)) {
    throw new HubError("invalid", `HubClient needs one hub URL or a non-empty list of them, not ${JSON.stringify(url)}`);
  }
  return urls;
}

/** The socket of a HubClient (./client.js documents the options) and what comes in on it. */
export class HubLink {
  constructor(url, options = {}) {
    this.urls = urlList(url);
    this.at = 0; // index in urls of the current (or next) attempt
    this.token = options.token ?? null;
    this.name = options.name ?? null;
    this.role = options.role ?? null;
    this.sessions = options.sessions ?? [];
    this.reconnect = options.reconnect ?? true;
    this.firstBackoff = options.firstBackoff ?? 50;
    this.maxBackoff = options.maxBackoff ?? 5000;
    this.stableAfter = options.stableAfter ?? 1000;
    this.openTimeout = options.openTimeout ?? 10000;
    this.WebSocket = options.WebSocket ?? globalThis.WebSocket;
    this.random = options.random ?? Math.random;
    this.timers = options.timers ?? { setTimeout: (f, ms) => setTimeout(f, ms), clearTimeout: (t) => clearTimeout(t) };
    if (!this.WebSocket) throw new Error("no WebSocket: pass options.WebSocket");
    this.protocol = new ClientConnection();
    this.futures = new Map(); // request id -> {resolve, reject}
    this.subscriptions = new Map(); // key -> Subscription
    this.listeners = new Map();
    this.socket = null;
    this.state = "closed";
    this.closed = false;
    this.lastClose = null; // why the last socket ended ("1013: reason")
    this.reconnects = 0;
    this.attempt = 0;
    this.backoff = 0;
    this.openedAt = 0;
    this.retryTimer = null;
    this.waiters = []; // requests made while (re)connecting
    this.opening = null; // connect()'s outcome, while it tries the URLs
  }

  /** The hub URL in use (or tried next, while reconnecting). */
  get url() {
    return this.urls[this.at];
  }

  // -- events -------------------------------------------------------------------------
  on(name, fn) {
    if (!this.listeners.has(name)) this.listeners.set(name, new Set());
    this.listeners.get(name).add(fn);
    return () => this.listeners.get(name).delete(fn);
  }

  _emit(name, value) {
    for (const fn of this.listeners.get(name) ?? []) {
      try {
        fn(value);
      } catch (err) {
        queueMicrotask(() => {
          throw err;
        });
      }
    }
  }

  _setState(state, extra = {}) {
    if (!STATES.includes(state)) throw new Error(state);
    this.state = state;
    this._emit("state", { state, ...extra });
  }

  socketOpen() {
    return this.socket !== null && this.socket.readyState === 1 && this.state === "open";
  }

  // -- connecting ---------------------------------------------------------------------
  /** Open the socket; resolves once it is open (rejects with ConnectionLost if it cannot). */
  connect() {
    this.closed = false;
    this._setState("connecting");
    return new Promise((resolve, reject) => {
      // Each URL once before giving up (the reconnects go on meanwhile, as after a drop).
      let untried = this.urls.length;
      this.opening = (ok, reason, final = false) => {
        if (!ok && --untried > 0 && !final) return;
        this.opening = null;
        if (ok) resolve();
        else reject(new ConnectionLost(`cannot connect to the hub: ${reason}`));
      };
      this._open();
    });
  }

  _open() {
    let ws;
    const protocols = this.token ? ["sessionhub", `bearer.${this.token}`] : undefined;
    try {
      ws = protocols ? new this.WebSocket(this.url, protocols) : new this.WebSocket(this.url);
    } catch (err) {
      // A URL the WebSocket refuses will not work later either: no retry.
      this.opening?.(false, String(err && err.message), true);
      return;
    }
    this.socket = ws;
    let opened = false;
    ws.onopen = () => {
      if (this.socket !== ws) return;
      // A socket closed as it opened (a draining hub closes with 1001 at once) takes no
      // frame: its close event follows, and counts as one more failed attempt.
      if (!this._hello(ws)) {
        try {
          ws.close();
        } catch {
          // already closing
        }
        return;
      }
      opened = true;
      this.openedAt = Date.now();
      const again = !this.opening;
      this._resume(ws);
      if (again) this.reconnects += 1;
      this.attempt = 0;
      this.opening?.(true);
    };
    ws.onmessage = (msg) => {
      if (this.socket !== ws) return;
      this._receive(typeof msg.data === "string" ? msg.data : String(msg.data));
    };
    ws.onerror = () => {};
    ws.onclose = (ev) => {
      if (this.socket !== ws) return;
      const reason = `${ev?.code ?? 1006}: ${ev?.reason || "connection closed"}`;
      // A request that then finds no socket within openTimeout says why (a full hub's 1013).
      this.lastClose = reason;
      this._lost(reason);
      if (!opened) this.opening?.(false, reason);
      this._scheduleReconnect(reason, opened);
    };
  }

  /** The first frame, when there is one; false if the socket would not take it. */
  _hello(ws) {
    const hello = this.protocol.hello(this.name, this.role, this.sessions);
    return hello === null || sendQuietly(ws, hello);
  }

  _resume(ws) {
    const frames = this.protocol.resubscribe();
    const again = this.reconnects > 0 || this.state === "reconnecting";
    this._setState("open");
    for (const [, , data] of frames) {
      if (!sendQuietly(ws, data)) break; // closing: its close event reconnects again
    }
    const waiters = this.waiters;
    this.waiters = [];
    for (const w of waiters) w.resolve();
    if (again) this._emit("reconnect", { reconnects: this.reconnects });
  }

  /** Fail every request in flight with ConnectionLost. */
  _lost(reason) {
    this.socket = null;
    const futures = this.futures;
    this.futures = new Map();
    for (const f of futures.values()) f.reject(new ConnectionLost(`the connection to the hub was lost (${reason})`));
    this.protocol.pending.clear();
  }

  _scheduleReconnect(reason, wasOpen) {
    if (this.closed) {
      this._setState("closed", { reason });
      return;
    }
    // Without reconnect, connect() still tries each URL once (this.opening is set until then).
    if (!this.reconnect && !this.opening) {
      this.closed = true;
      this._failWaiters(new ConnectionLost(`the connection to the hub was lost (${reason})`));
      for (const sub of this.subscriptions.values()) sub.options.onError?.(new ConnectionLost(reason));
      this.subscriptions.clear();
      this.protocol.clear();
      this._setState("closed", { reason });
      return;
    }
    const stable = wasOpen && Date.now() - this.openedAt >= this.stableAfter;
    this.backoff = stable ? 0 : nextBackoff(this.backoff, this.firstBackoff, this.maxBackoff);
    const delay = this.backoff ? this.backoff * (0.5 + this.random() * 0.5) : 0;
    this.attempt += 1;
    this._setState("reconnecting", { attempt: this.attempt, delay, reason });
    this.retryTimer = this.timers.setTimeout(() => {
      this.retryTimer = null;
      if (this.closed) return;
      // Each attempt to the next node: the one that dropped us may be draining.
      this.at = (this.at + 1) % this.urls.length;
      this._open();
    }, delay);
  }

  _failWaiters(error) {
    const waiters = this.waiters;
    this.waiters = [];
    for (const w of waiters) w.reject(error);
  }

  /** Close the socket; requests in flight fail with ConnectionLost; no reconnect. */
  close() {
    this.closed = true;
    if (this.retryTimer !== null) this.timers.clearTimeout(this.retryTimer);
    this.retryTimer = null;
    const ws = this.socket;
    this._lost("the client was closed");
    this.opening?.(false, "the client was closed", true);
    this._failWaiters(new ConnectionLost("the client is closed"));
    this._setState("closed", { reason: "closed by the client" });
    if (ws) {
      try {
        ws.close(1000, "bye");
      } catch {
        // already closing
      }
    }
  }

  /** Wait for an open socket (requests made while reconnecting wait, up to openTimeout). */
  _ready() {
    if (this.closed) return Promise.reject(new ConnectionLost("the client is closed"));
    if (this.socketOpen()) return Promise.resolve();
    return new Promise((resolve, reject) => {
      const waiter = { resolve: () => (done(), resolve()), reject: (e) => (done(), reject(e)) };
      const timer = this.timers.setTimeout(() => {
        this.waiters = this.waiters.filter((w) => w !== waiter);
        const last = this.lastClose ? `; the last one ended (${this.lastClose})` : "";
        reject(new ConnectionLost(`no connection to the hub within ${this.openTimeout} ms${last}`));
      }, this.openTimeout);
      const done = () => this.timers.clearTimeout(timer);
      this.waiters.push(waiter);
    });
  }

  _send(id, data) {
    return new Promise((resolve, reject) => {
      this.futures.set(id, { resolve, reject });
      try {
        this.socket.send(data);
      } catch (err) {
        this.futures.delete(id);
        reject(new ConnectionLost(String(err && err.message)));
      }
    });
  }

  // -- frames in ----------------------------------------------------------------------
  _receive(text) {
    let effect;
    try {
      effect = this.protocol.receive(text);
    } catch {
      return; // unreadable frame: ignored, as the Python client does
    }
    switch (effect.kind) {
      case "delivered": {
        const sub = this.subscriptions.get(effect.key);
        sub?.options.onEvent?.(effect.event);
        break;
      }
      case "subscribed":
        this.subscriptions.get(effect.key)?.options.onReady?.(effect.result);
        break;
      case "resolved": {
        const f = this.futures.get(effect.id);
        if (f) {
          this.futures.delete(effect.id);
          f.resolve(effect.result);
        }
        break;
      }
      case "failed": {
        const f = effect.id === null ? undefined : this.futures.get(effect.id);
        if (f) {
          this.futures.delete(effect.id);
          f.reject(errorFrom(effect));
        }
        break;
      }
      case "subscribe_failed": {
        // The hub ended (or refused) the subscription: so does the client.
        const sub = this.subscriptions.get(effect.key);
        if (!sub) return;
        this.subscriptions.delete(sub.key);
        sub.active = false;
        sub.options.onError?.(errorFrom(effect));
        break;
      }
      case "reset": {
        const sub = this.subscriptions.get(effect.key);
        if (!sub) return;
        if (effect.resubscribe === null) {
          this.subscriptions.delete(sub.key);
          sub.active = false;
          if (sub.options.onReset) sub.options.onReset(effect.frame);
          else sub.options.onError?.(new PositionLost(effect.frame));
          return;
        }
        sub.options.onReset?.(effect.frame);
        if (this.socketOpen()) this.socket.send(effect.resubscribe[1]);
        break;
      }
      case "unsubscribed": {
        const sub = this.subscriptions.get(effect.key);
        if (!sub) return;
        const socket = this.socket;
        this.timers.setTimeout(() => {
          // Unless the caller left it, or the socket went (a reconnect resubscribes anyway).
          if (this.subscriptions.get(effect.key) !== sub || this.socket !== socket || !this.socketOpen()) return;
          if (!this.protocol.positions.has(effect.key)) return;
          this.socket.send(this.protocol.subscribe(idOf(effect.key))[1]);
        }, RESUBSCRIBE_AFTER_MS);
        break;
      }
      case "presence":
        this._emit("presence", effect.frame);
        break;
      case "stream":
        this._emit("stream", effect.frame);
        break;
      case "summarize":
        this._emit("summarize", effect.frame);
        break;
      case "turn":
        this._emit("turn", effect.frame);
        break;
      default:
        break;
    }
  }
}
