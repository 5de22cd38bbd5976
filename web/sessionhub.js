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

/**
 * Error frames become HubError: `code` is the wire code (invalid, not_found, forbidden...),
 * `detail` the frame's structured detail ({session_id} for an unknown session, {field,
 * problem} for an invalid message) or null.
 */
export class HubError extends Error {
  constructor(code, message, detail = null) {
    super(message);
    this.name = "HubError";
    this.code = code;
    this.detail = detail ?? null;
  }
}

/** The code of ConnectionLost: a wire code (the same as the Python client's), not a new one. */
export const CONNECTION_LOST_CODE = "unavailable";

/** The socket dropped before the reply came (or the client is closed). Code `unavailable`. */
export class ConnectionLost extends HubError {
  constructor(message = "the connection to the hub was lost") {
    super(CONNECTION_LOST_CODE, message);
    this.name = "ConnectionLost";
  }
}

/**
 * The error an error frame (or a failed effect: {code, message, detail}) stands for: a
 * PositionLost for a `not_found` carrying a position (a `read_events` of a lost position),
 * as the Python client rebuilds it from the same detail; else a HubError.
 */
export function errorFrom({ code, message, detail }) {
  const d = detail ?? null;
  const seqs = d ? [d.after_seq, d.first_seq, d.last_seq] : [];
  if (code === "not_found" && typeof d?.stream === "string" && typeof d.epoch === "string" && seqs.every(Number.isInteger)) {
    const sessionId = d.stream === "registry" ? null : d.stream;
    const [after_seq, first_seq, last_seq] = seqs;
    return new PositionLost({ frame: "reset", session_id: sessionId, after_seq, epoch: d.epoch, first_seq, last_seq, message });
  }
  return new HubError(code, message, d);
}

/**
 * A position the event log cannot serve (pruned, another epoch, beyond the end): a
 * subscription's `reset` frame, or a `readEvents` refused for it. `frame` is the reset frame
 * (one is made up for a read); reload a snapshot and go on from `lastSeq` in `epoch`.
 */
export class PositionLost extends HubError {
  constructor(frame) {
    const stream = frame.session_id === null || frame.session_id === undefined ? "registry" : frame.session_id;
    const detail = { stream, after_seq: frame.after_seq, epoch: frame.epoch, first_seq: frame.first_seq, last_seq: frame.last_seq };
    super("reset", frame.message || "position lost", detail);
    this.name = "PositionLost";
    this.frame = frame;
    this.epoch = frame.epoch;
    this.firstSeq = frame.first_seq;
    this.lastSeq = frame.last_seq;
  }
}

export { PresenceList } from "./presence.js";

/** How long before subscribing again to a stream the hub ended with an `unsubscribed` frame. */
const RESUBSCRIBE_AFTER_MS = 1000;

const REGISTRY = "\u0000registry"; // Map key for the registry stream (session_id null)
const keyOf = (sessionId) => (sessionId === null || sessionId === undefined ? REGISTRY : sessionId);
const idOf = (key) => (key === REGISTRY ? null : key);

/**
 * Sans-I/O client state: request ids, pending requests, each followed stream's position
 * (the epoch taken from the subscribe reply), what each subscribe waits for, the reset
 * and reload rule, and the hello and summary frames. Frames in, effects out; a port of
 * protocol/clientconn.py's ClientConnection, checked against it by tests/vectors/.
 */
export class ClientConnection {
  constructor() {
    this.nextId = 1;
    this.pending = new Set();
    this.positions = new Map(); // key -> {epoch, seq}
    this.presence = new Set(); // keys followed with presence frames
    this.reload = new Set(); // keys that continue by themselves after a reset
    this.subscribing = new Map(); // subscribe request id -> key, awaiting the reply
  }

  request(op, fields = {}) {
    const id = this.nextId++;
    this.pending.add(id);
    return [id, JSON.stringify({ op, id, ...fields })];
  }

  /** No reply to `id` is awaited any more (unsent, or given up). */
  abandon(id) {
    this.pending.delete(id);
    this.subscribing.delete(id);
  }

  subscribe(sessionId, afterSeq = 0, epoch = null, presence = false, reload = false) {
    const key = keyOf(sessionId);
    let position = this.positions.get(key);
    if (!position) {
      position = { epoch: epoch ?? null, seq: afterSeq };
      this.positions.set(key, position);
    }
    if (presence) this.presence.add(key);
    if (reload) this.reload.add(key);
    this._dropSubscribing(key); // an earlier subscribe's reply no longer counts
    const fields = { session_id: idOf(key), after_seq: position.seq, epoch: position.epoch };
    if (this.presence.has(key)) fields.presence = true;
    const [id, data] = this.request("subscribe", fields);
    this.subscribing.set(id, key);
    return [id, data];
  }

  unsubscribe(sessionId) {
    this.forget(sessionId);
    return this.request("unsubscribe", { session_id: idOf(keyOf(sessionId)) });
  }

  /** Stop following a stream without telling the hub (no socket, or the hub ended it). */
  forget(sessionId) {
    const key = keyOf(sessionId);
    this.positions.delete(key);
    this.presence.delete(key);
    this.reload.delete(key);
    this._dropSubscribing(key);
  }

  /** Follow nothing any more (the client cannot go on). */
  clear() {
    for (const key of [...this.positions.keys()]) this.forget(idOf(key));
  }

  /** After a reconnect: one subscribe per followed stream, from its last seq. */
  resubscribe() {
    this.pending.clear();
    this.subscribing.clear();
    return [...this.positions.keys()].map((key) => [key, ...this.subscribe(idOf(key))]);
  }

  /** The first frame on every socket (id "hello", its reply not awaited), or null. */
  hello(name = null, role = null, sessions = [], summarizer = false) {
    if (name === null && role === null && !sessions.length && !summarizer) return null;
    return JSON.stringify({ op: "hello", id: "hello", name, role, sessions: [...sessions], summarizer });
  }

  /** A worker's answer to a summarize frame: its summary, or why there is none. */
  summary(requestId, summary = null, error = null) {
    const answer = { op: "summary", id: `summary-${requestId}`, request_id: requestId };
    if (error !== null) answer.error = error;
    else answer.summary = summary;
    return JSON.stringify(answer);
  }

  /** One incoming text frame -> an effect {kind, ...}. */
  receive(text) {
    const frame = JSON.parse(text);
    switch (frame.frame) {
      case "reply": {
        if (!this.pending.has(frame.id)) return { kind: "ignored", reason: "reply to an unknown request" };
        this.pending.delete(frame.id);
        const key = this.subscribing.get(frame.id);
        if (key === undefined) return { kind: "resolved", id: frame.id, result: frame.result };
        this.subscribing.delete(frame.id);
        const position = this.positions.get(key);
        const epoch = frame.result?.epoch;
        if (position && position.epoch === null && typeof epoch === "string") position.epoch = epoch;
        return { kind: "subscribed", key, result: frame.result };
      }
      case "error": {
        const failure = { id: frame.id ?? null, code: frame.code, message: frame.message, detail: frame.detail ?? null };
        if (failure.id === null) return { kind: "failed", ...failure };
        this.pending.delete(failure.id);
        const key = this.subscribing.get(failure.id);
        if (key === undefined) return { kind: "failed", ...failure };
        this.subscribing.delete(failure.id);
        this.forget(idOf(key));
        return { kind: "subscribe_failed", key, ...failure };
      }
      case "event": {
        const key = frame.stream === "registry" ? REGISTRY : frame.session_id;
        const position = this.positions.get(key);
        if (!position) return { kind: "ignored", reason: "event for a stream not followed" };
        if (position.epoch === frame.epoch && frame.seq <= position.seq) {
          return { kind: "ignored", reason: "already delivered" };
        }
        position.epoch = frame.epoch;
        position.seq = frame.seq;
        return { kind: "delivered", key, event: frame };
      }
      case "presence":
        return { kind: "presence", frame };
      case "stream":
        return { kind: "stream", frame };
      case "summarize":
        return { kind: "summarize", frame };
      case "turn":
        return { kind: "turn", frame };
      case "reset": {
        // A reset answers the subscribe request in place of its reply.
        const key = keyOf(frame.session_id);
        this._dropSubscribing(key);
        this.positions.delete(key);
        if (!this.reload.has(key)) {
          this.forget(idOf(key));
          return { kind: "reset", key, frame, resubscribe: null };
        }
        return { kind: "reset", key, frame, resubscribe: this.subscribe(idOf(key), frame.last_seq, frame.epoch) };
      }
      case "unsubscribed": {
        // The hub could not read the log for a while: the position is kept, and the shell
        // subscribes again after a pause. It may answer the subscribe in place of its reply.
        const key = keyOf(frame.session_id);
        this._dropSubscribing(key);
        if (!this.positions.has(key)) return { kind: "ignored", reason: "unsubscribed from a stream not followed" };
        return { kind: "unsubscribed", key, frame };
      }
      default:
        return { kind: "ignored", reason: `unknown frame ${frame.frame}` };
    }
  }

  _dropSubscribing(key) {
    for (const [id, k] of [...this.subscribing]) {
      if (k === key) {
        this.subscribing.delete(id);
        this.pending.delete(id);
      }
    }
  }
}

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

/**
 * Messages being streamed, as a reader sees them: feed every stream frame to apply(); it
 * returns the message as it stands. Deltas apply once each, in index order; a delta that
 * arrives before the state it follows waits for it. applyEvent() takes the logged
 * message.updated / stream.ended events (a stream that ended while the client was away).
 */
export class LiveMessages {
  constructor() {
    this.messages = new Map();
    this.index = new Map();
    this.status = new Map();
    this.early = new Map();
  }

  apply(frame) {
    const mid = frame.message_id;
    if (["start", "state", "end"].includes(frame.action) && frame.message) {
      if (!(frame.action === "state" && (this.index.get(mid) ?? -1) >= frame.index)) {
        this.messages.set(mid, { ...frame.message, parts: (frame.message.parts ?? []).map((p) => ({ ...p })) });
        this.index.set(mid, frame.index);
        // A message held without an end is "streaming" (the Python client agrees).
        if (frame.status) this.status.set(mid, frame.status);
        else if (frame.action !== "end") this.status.set(mid, "streaming");
      }
    } else if (frame.action === "delta") {
      if (!this.early.has(mid)) this.early.set(mid, new Map());
      for (const d of frame.deltas ?? []) this.early.get(mid).set(Number(d.index), d);
    }
    const early = this.early.get(mid) ?? new Map();
    while (this.index.has(mid) && early.has(this.index.get(mid) + 1)) {
      const next = this.index.get(mid) + 1;
      LiveMessages.applyDelta(this.messages.get(mid), early.get(next));
      early.delete(next);
      this.index.set(mid, next);
    }
    for (const i of [...early.keys()]) if (i <= (this.index.get(mid) ?? -1)) early.delete(i);
    return this.messages.get(mid) ?? null;
  }

  applyEvent(event) {
    if (event.type === "message.updated") {
      const m = event.data?.message;
      if (m && this.index.has(m.id)) {
        this.messages.set(m.id, { ...m, parts: (m.parts ?? []).map((p) => ({ ...p })) });
        return this.messages.get(m.id);
      }
    } else if (event.type === "stream.ended") {
      const mid = String(event.data?.message_id);
      if (this.index.has(mid)) {
        this.status.set(mid, String(event.data.status));
        this.index.set(mid, Math.max(this.index.get(mid), Number(event.data.deltas ?? 0)));
        this.early.delete(mid);
        return this.messages.get(mid);
      }
    }
    return null;
  }

  /** One delta onto a message; one that is not valid is skipped (the hub validated them). */
  static applyDelta(message, delta) {
    try {
      applyDelta((message.parts ??= []), delta.kind, delta.text, delta.part);
    } catch (err) {
      if (!(err instanceof HubError)) throw err;
    }
  }
}

/**
 * Grow `parts` by one delta, the rule of protocol/deltas.py: text and reasoning extend the
 * last part of their kind; a tool part replaces the part with its toolCallId (or is added).
 * A delta that is none of these throws HubError("invalid") and changes nothing.
 */
export function applyDelta(parts, kind, text, part) {
  if (kind === "text" || kind === "reasoning") {
    if (typeof text !== "string") throw new HubError("invalid", `a ${kind} delta needs \`text\``);
    const last = parts[parts.length - 1];
    if (last && last.type === kind && typeof last.text === "string") last.text += text;
    else parts.push({ type: kind, text });
    return;
  }
  const tool = part !== null && typeof part === "object" && !Array.isArray(part) ? part.type : undefined;
  if (typeof tool !== "string" || !(tool.startsWith("tool-") || tool === "dynamic-tool")) {
    throw new HubError("invalid", "a tool delta needs a `part` of type `tool-<name>` or `dynamic-tool`");
  }
  const callId = part.toolCallId ?? null;
  const i = callId === null ? -1 : parts.findIndex((p) => p.toolCallId === callId);
  if (i >= 0) parts[i] = { ...part };
  else parts.push({ ...part });
}

/** The hub's WebSocket URL for a page served by the hub (http -> ws, https -> wss). */
export function hubUrlFor(location) {
  const url = new URL("/ws", location.href);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  url.hash = "";
  url.search = "";
  return url.toString();
}
