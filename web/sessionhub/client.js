// HubClient: one hub connection across reconnects (the socket, its backoff and failover over
// several URLs, requests and their replies, subscriptions and their positions), performing the
// effects of its ClientConnection (./connection.js).

import { ClientConnection, REGISTRY, idOf, keyOf } from "./connection.js";
import { ConnectionLost, HubError, PositionLost, errorFrom } from "./errors.js";

/** How long before subscribing again to a stream the hub ended with an `unsubscribed` frame. */
const RESUBSCRIBE_AFTER_MS = 1000;


// The options object of a method; a bare value (readEvents(id, 5), as Python's positional
// after_seq) would otherwise be read as "no options" and silently mean the defaults.
function optionsOf(value, method) {
  if (value === null || typeof value !== "object" || Array.isArray(value)) {
    throw new HubError("invalid", `${method} takes an options object, got ${JSON.stringify(value)}`);
  }
  return value;
}

// A reply of another shape than the op's is the hub's fault, not the caller's: "internal".
function integer(value, op) {
  if (!Number.isInteger(value)) throw new HubError("internal", `${op} replied with ${JSON.stringify(value)}, not an integer`);
  return value;
}

function list(value, op) {
  if (!Array.isArray(value)) throw new HubError("internal", `${op} replied with ${JSON.stringify(value)}, not a list`);
  return value;
}

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

/**
 * A subscription handle: `position` is {epoch, seq} of the last event delivered;
 * `close()` unsubscribes. Handlers: onEvent(event), onReset(frame) (the subscription ends
 * unless `reload`), onError(HubError) (the hub refused or ended it), onReady({epoch, last_seq}).
 */
class Subscription {
  constructor(client, key, options) {
    this.client = client;
    this.key = key;
    this.sessionId = idOf(key);
    this.options = options;
    this.active = true;
  }

  get position() {
    const p = this.client.protocol.positions.get(this.key);
    return p ? { epoch: p.epoch, seq: p.seq } : null;
  }

  async close() {
    if (!this.active) return;
    this.active = false;
    const client = this.client;
    if (client.subscriptions.get(this.key) === this) client.subscriptions.delete(this.key);
    if (client.protocol.positions.has(this.key) && client.socketOpen()) {
      try {
        await client._send(...client.protocol.unsubscribe(this.sessionId));
      } catch {
        // the connection dropped: nothing is followed on the next socket anyway
      }
    } else {
      client.protocol.forget(this.sessionId);
    }
  }
}

/** One hub URL, or a non-empty list of them, as a list. */
function urlList(url) {
  const urls = typeof url === "string" ? [url] : Array.isArray(url) ? [...url] : [];
  if (urls.length === 0 || !urls.every((u) => typeof u === "string" && u)) {
    throw new HubError("invalid", `HubClient needs one hub URL or a non-empty list of them, not ${JSON.stringify(url)}`);
  }
  return urls;
}

/**
 * One hub connection across reconnects.
 *
 * new HubClient(url, {token, name, role, sessions, reconnect, maxBackoff, firstBackoff,
 *                     stableAfter, openTimeout, WebSocket})
 * `url` is one hub URL or a list of them (the nodes of one deployment): connect() opens the
 * first that answers, and each reconnect attempt moves on to the next, round robin
 * (`client.url` is the one in use).
 * Events (client.on(name, fn)): "state" ({state, attempt, delay, reason}), "stream" (stream
 * frames), "presence" (presence frames), "reconnect" (after a new socket is up and the
 * subscriptions were resent), "summarize" (summarize frames).
 */
export class HubClient {
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
        reject(new ConnectionLost(`no connection to the hub within ${this.openTimeout} ms`));
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

  // -- requests -----------------------------------------------------------------------
  /** Send one request; resolves with its result, rejects with HubError / ConnectionLost. */
  async request(op, fields = {}) {
    await this._ready();
    return this._send(...this.protocol.request(op, fields));
  }

  ping() {
    return this.request("ping");
  }

  /** Who is on the session: [{connection_id, name, role, streaming: [message id]}]. */
  presence(sessionId) {
    return this.request("presence", { session_id: sessionId });
  }

  /**
   * The hub's token estimate of the branch ending at `leafId` (default: the latest leaf)
   * plus the system prompt, as compaction decisions use it: an integer.
   */
  async estimateTokens(sessionId, options = {}) {
    const { leafId = null } = optionsOf(options, "estimateTokens");
    return integer(await this.request("estimate_tokens", { session_id: sessionId, leaf_id: leafId }), "estimate_tokens");
  }

  /**
   * Replace the token in band (an `auth` request) before it expires: the connection and
   * its subscriptions go on, and every later reconnect presents the new token. Resolves
   * with {sub, exp, ended}; subscriptions the new token does not cover (`ended`) get
   * onError(HubError "forbidden"). A refused token rejects with HubError "forbidden" and
   * the old one stays. While the socket is down the token is kept for the next one.
   */
  async renew(token) {
    if (!this.socketOpen()) {
      this.token = token;
      return { sub: null, exp: null, ended: [] };
    }
    let result;
    try {
      result = await this._send(...this.protocol.request("auth", { token }));
    } catch (err) {
      if (!(err instanceof ConnectionLost)) throw err;
      this.token = token; // the next socket presents it
      return { sub: null, exp: null, ended: [] };
    }
    this.token = token;
    for (const sessionId of result?.ended ?? []) {
      const key = keyOf(sessionId);
      this.protocol.positions.delete(key);
      this.protocol.presence.delete(key);
      const sub = this.subscriptions.get(key);
      if (sub) {
        this.subscriptions.delete(key);
        sub.active = false;
        const what = key === REGISTRY ? "the registry" : key;
        sub.options.onError?.(new HubError("forbidden", `the renewed token does not cover ${what}: subscription ended`));
      }
    }
    return result;
  }

  /**
   * Follow a session's events (sessionId null: the registry) after `afterSeq`, across
   * reconnects. options: {afterSeq, epoch, presence, reload, onEvent, onReset, onError,
   * onReady}. With `reload`, a reset calls onReset(frame) and continues from the reset's
   * last_seq by itself (reload your snapshot in onReset); without, the subscription ends.
   */
  subscribe(sessionId, options = {}) {
    const key = keyOf(sessionId);
    if (this.subscriptions.has(key)) {
      throw new HubError("invalid", `already subscribed to ${key === REGISTRY ? "the registry" : key}`);
    }
    const sub = new Subscription(this, key, options);
    this.subscriptions.set(key, sub);
    const [id, data] = this.protocol.subscribe(
      idOf(key),
      options.afterSeq ?? 0,
      options.epoch ?? null,
      !!options.presence,
      !!options.reload,
    );
    if (this.socketOpen()) {
      this.socket.send(data);
    } else {
      // Registered: the next (re)connect resubscribes from the position.
      this.protocol.abandon(id);
      if (this.state === "closed" && !this.closed) this.connect().catch(() => {});
    }
    return sub;
  }

  // -- event logs: one read, not a subscription -------------------------------------------
  /**
   * The session's logged events after `afterSeq`, at most `limit` (the hub serves at most
   * 10,000 a read), oldest first, as event frames carry them ({stream, session_id, seq,
   * epoch, type, data, created_at}). A position the log cannot serve rejects with
   * PositionLost; `sessionId` null reads the registry (readRegistryEvents).
   */
  async readEvents(sessionId, options = {}) {
    const { afterSeq = 0, limit = 1000 } = optionsOf(options, "readEvents");
    return list(await this.request("read_events", { session_id: sessionId, after_seq: afterSeq, limit }), "read_events");
  }

  /** Registry changes after `afterSeq` (admin on `*`): readEvents of the registry. */
  readRegistryEvents(options = {}) {
    return this.readEvents(null, options);
  }

  /**
   * Prune every event log of the hub (admin on `*`): events older than `olderThan` (an age
   * in seconds, or a Date / ISO-8601 time, naive meaning UTC) and those beyond the newest
   * `keepPerSession` of each log, `batch` rows a transaction. Resolves with {events, streams}.
   */
  async pruneEvents(options = {}) {
    const { olderThan = null, keepPerSession = null, batch = 1000 } = optionsOf(options, "pruneEvents");
    let age = olderThan;
    if (age instanceof Date) {
      if (Number.isNaN(age.getTime())) throw new HubError("invalid", "olderThan is an invalid Date");
      age = age.toISOString(); // a time is exact; only an age is judged by the hub's clock
    } else if (typeof age === "number" ? !Number.isFinite(age) : age !== null && typeof age !== "string") {
      // NaN and Infinity would travel as JSON null: no age at all, so prune by nothing asked
      throw new HubError("invalid", `olderThan must be seconds, a Date or an ISO-8601 string, got ${String(age)}`);
    }
    const result = await this.request("prune_events", { older_than: age, keep_per_session: keepPerSession, batch });
    if (result === null || typeof result !== "object") throw new HubError("internal", "prune_events replied with no {events, streams}");
    return { events: integer(result.events ?? 0, "prune_events"), streams: integer(result.streams ?? 0, "prune_events") };
  }

  // -- streamed messages ----------------------------------------------------------------
  /**
   * Stream a message into a session: resolves to a writer with text(), reasoning(),
   * toolPart() (sent without waiting) and end(status) (waits for every delta's reply).
   */
  async streamMessage(sessionId, messageId, { role = "assistant", parentId, metadata } = {}) {
    const fields = { session_id: sessionId, message_id: messageId, role };
    if (parentId !== undefined) fields.parent_id = parentId;
    if (metadata !== undefined) fields.metadata = metadata;
    await this.request("stream_start", fields);
    const inflight = new Set();
    let failure = null;
    const delta = (extra) => {
      if (failure) throw failure;
      const p = this.request("stream_delta", { session_id: sessionId, message_id: messageId, ...extra });
      inflight.add(p);
      p.catch((err) => (failure = failure ?? err)).finally(() => inflight.delete(p));
      return p;
    };
    return {
      text: (text) => delta({ kind: "text", text }),
      reasoning: (text) => delta({ kind: "reasoning", text }),
      toolPart: (part) => delta({ kind: "tool", part }),
      end: async (status = "finished") => {
        await Promise.allSettled([...inflight]);
        if (failure) status = "aborted";
        await this.request("stream_end", { session_id: sessionId, message_id: messageId, status });
        if (failure) throw failure;
      },
    };
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

