// HubClient: the client's API over its HubLink (./link.js: the socket, reconnects, the frames
// in): requests and their shortcuts, subscriptions and their handles, renewing the token, the
// event-log reads and streaming a message.

import { REGISTRY, idOf, keyOf } from "./connection.js";
import { ConnectionLost, HubError } from "./errors.js";
import { HubLink } from "./link.js";


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
export class HubClient extends HubLink {
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
   * toolPart(), part() (any other part), resetStep() (all sent without waiting) and
   * end(status) (waits for every delta's reply).
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
      part: (part) => delta({ kind: "part", part }),
      resetStep: () => delta({ kind: "reset" }),
      end: async (status = "finished") => {
        await Promise.allSettled([...inflight]);
        if (failure) status = "aborted";
        await this.request("stream_end", { session_id: sessionId, message_id: messageId, status });
        if (failure) throw failure;
      },
    };
  }
}
