// ClientConnection: the client's protocol state, sans I/O (no socket, no timers), a port of
// protocol/clientconn.py's, checked against it by the shared vectors (tests/vectors/).

/** The Map key of the registry stream (its session_id is null). */
export const REGISTRY = "\u0000registry";
/** A stream's Map key, from its session id (null or undefined: the registry). */
export const keyOf = (sessionId) => (sessionId === null || sessionId === undefined ? REGISTRY : sessionId);
/** A stream's session id, from its Map key. */
export const idOf = (key) => (key === REGISTRY ? null : key);

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
